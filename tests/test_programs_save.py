"""The demo's ``--save DIR``: the trained model as a Hugging Face folder, seen at work, read back everywhere."""

from __future__ import annotations

import json
import re

import pytest

from launch_program import run_mpi

pytestmark = pytest.mark.slow

# 4 digits over 9 symbols: the default model reverses them after 80 steps (loss 2.34 -> 0.03, ~15 s on 2 cores)
SMALL = ["--seq-len", "8", "--vocab", "10"]
ANSWER = re.compile(r"^  ([\d,]+) → ([\d,]+)  \(expected ([\d,]+): (right|wrong)\)$", re.MULTILINE)


def test_saved_model_reverses_with_generate_and_loads_with_init_from(tmp_path):
    model = tmp_path / "model"
    r = run_mpi(4, ["-m", "tpsim.demo", "--tp", "2", "--dp", "2", "--steps", "80", *SMALL, "--save", str(model),
                    "--out", str(tmp_path / "out")], timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {p.name for p in model.iterdir()} == {"config.json", "model.safetensors", "optimizer.safetensors",
                                                 "training_state.json"}  # the model, then its training checkpoint
    answers = ANSWER.findall(r.stdout)
    assert len(answers) == 3 and "3 of 3 right" in r.stdout, r.stdout
    assert "FORMULA CHECK: all" in r.stdout, "saving is not training traffic"
    steps = {json.loads(line)["step"] for line in (tmp_path / "out" / "comm.jsonl").read_text().splitlines()}
    assert steps <= set(range(81)), "nothing traced after the run's own verification step"

    # tpsim.generate on the folder at another TP size: the answer the demo printed, which is the reversal
    prompt, answer, expected, _ = answers[0]
    g = run_mpi(2, ["-m", "tpsim.generate", "--init-from", str(model), "--prompt", prompt,
                    "--max-new-tokens", "4", "--json"], timeout=120)
    assert g.returncode == 0, g.stdout + g.stderr
    tokens = json.loads(g.stdout.strip().splitlines()[-1])["tokens"][0]
    assert ",".join(map(str, tokens)) == answer == expected

    # --init-from DIR --steps 0: the trained weights again (an untrained model reverses none of step 0's prompts)
    again = run_mpi(2, ["-m", "tpsim.demo", "--tp", "2", "--steps", "0", *SMALL, "--init-from", str(model),
                        "--out", str(tmp_path / "again")], timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "VERDICT: MATCH" in again.stdout and "3 of 3 right" in again.stdout, again.stdout


def test_save_needs_the_gpt_scenario(tmp_path):
    r = run_mpi(1, ["-m", "tpsim.demo", "--scenario", "mlp", "--save", str(tmp_path / "m")], timeout=60)
    assert r.returncode == 2 and "--save writes the trained GPT" in r.stderr, r.stdout + r.stderr
