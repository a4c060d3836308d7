"""Whole programs under mpiexec: the demo's verdicts, clean configuration errors, no hang on a failure."""

from __future__ import annotations

import json

import numpy as np
import pytest

from launch_program import ROOT, run_mpi, without_launcher_notices
from tpsim.demo.cli import build_parser

pytestmark = pytest.mark.slow


def metrics(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def guided(tmp_path_factory):
    """The demo with no flags on 8 ranks (the defaults are what is tested), once; the tests below read its output
    and its run folder: (completed launch, folder)."""
    out = tmp_path_factory.mktemp("guided")
    r = run_mpi(8, ["-m", "tpsim.demo", "--out", str(out)], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r, out


def test_guided_demo_8_ranks_is_2_dp_x_4_tp_and_passes_its_checks(guided):
    """No flags: 2 DP x 4 TP in Megatron's order, step 0 equals serial, replicas agree, the per-layer table."""
    out = guided[0].stdout
    assert "TP(4) x DP(2) = 8 ranks" in out
    assert "TP group 1: ranks [4, 5, 6, 7]" in out and "DP group 3: ranks [3, 7]" in out
    assert "VERDICT: MATCH" in out and "OK: replicas consistent" in out
    assert "transformer.h.1.mlp" in out and "dp_sync" in out, "the per-layer table is printed"
    assert "(rank 0's largest: " in out and "on this rank" not in out


def test_guided_demo_writes_its_files_and_traces_every_rank(guided):
    folder = guided[1]
    for name in ("comm.jsonl", "metrics.jsonl", "loss.png", "comm_bytes.png"):
        assert (folder / name).stat().st_size > 0, name
    recs = [json.loads(line) for line in (folder / "comm.jsonl").read_text().splitlines()]
    assert {x["rank"] for x in recs} == set(range(8))


def test_guided_demo_trains_and_counts_its_tokens(guided):
    """Every default step in metrics.jsonl, the loss falls clearly; tokens: the target tokens the loss counts;
    tokens_per_s: every position processed (global batch x seq)."""
    m = metrics(guided[1])
    default_steps = build_parser().get_default("steps")
    assert len(m) == default_steps and m[-1]["loss"] < 0.5 * m[0]["loss"], "the loss falls clearly"
    assert all(row["tokens_processed"] == 16 * 16 and row["tokens"] < row["tokens_processed"] for row in m)
    assert all(abs(row["tokens_per_s"] * row["seconds"] - row["tokens_processed"]) < 1e-6 for row in m)


def test_guided_demo_ends_with_what_it_showed_and_what_to_try_next(guided):
    r, folder = guided
    summary, next_line = r.stdout.rstrip().splitlines()[-2:]
    assert summary.startswith("summary: TP(4) x DP(2), 100 steps, loss 3.4527 -> ") and "every check holds" in summary
    assert next_line.startswith(f"next: tpsim report {folder} --by kind")


SMALL_WORLD = ["-m", "tpsim.demo", "--steps", "3"]  # no other flag: the defaults at each world size


@pytest.fixture(scope="module")
def small_world(tmp_path_factory):
    """The demo with no flags but ``--steps 3`` at world size n, once per n: (launch, run folder)."""
    made = {}

    def run(n: int):
        if n not in made:
            folder = tmp_path_factory.mktemp(f"world{n}")
            made[n] = run_mpi(n, [*SMALL_WORLD, "--out", str(folder)]), folder
        return made[n]
    return run


@pytest.mark.parametrize("n, tp, dp", [(1, 1, 1), (2, 2, 1), (3, 1, 3)])
def test_demo_runs_at_small_world_sizes(small_world, n, tp, dp):
    """No flags at any world size: TP = gcd(world, 4), the batch rounded up to a multiple of dp (18 at dp 3)."""
    r, _ = small_world(n)
    assert r.returncode == 0, r.stderr
    assert f"TP({tp}) x DP({dp})" in r.stdout and "VERDICT: MATCH" in r.stdout


def test_same_seed_gives_bit_identical_losses(small_world, tmp_path):
    """The TP 2 run above again, the same (default) seed: the same losses to the last bit."""
    first, folder = small_world(2)
    again = run_mpi(2, [*SMALL_WORLD, "--out", str(tmp_path)])
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    assert [m["loss"] for m in metrics(folder)] == [m["loss"] for m in metrics(tmp_path)]


def test_export_with_dp_and_reload_at_another_tp(tmp_path):
    """--export at TP 2 x DP 2 gives the global batch's grads; --init-from at TP 4 reproduces the step-0 loss."""
    exp = tmp_path / "export"
    r = run_mpi(4, ["-m", "tpsim.demo", "--tp", "2", "--dp", "2", "--steps", "0", "--vocab", "13",
                    "--batch-size", "8", "--seq-len", "12", "--hidden", "32",
                    "--export", str(exp), "--out", str(tmp_path / "o1")])
    assert r.returncode == 0, r.stderr
    cfg = json.loads((exp / "config.json").read_text())
    assert cfg["vocab_size"] == 13 and cfg["activation_function"] == "gelu_new" and cfg["tie_word_embeddings"]
    batch, params, grads = (np.load(exp / f) for f in ("batch.npz", "params.npz", "grads.npz"))
    assert batch["input_ids"].shape == batch["labels"].shape == (8, 12)
    assert params["transformer.wte.weight"].shape == grads["transformer.wte.weight"].shape == (13, 32)
    loss = json.loads((exp / "step0.json").read_text())["loss"]
    r2 = run_mpi(4, ["-m", "tpsim.demo", "--tp", "4", "--steps", "0", "--vocab", "13",
                     "--batch-size", "8", "--seq-len", "12", "--hidden", "32",
                     "--init-from", str(exp / "params.npz"), "--export", str(tmp_path / "e2"),
                     "--out", str(tmp_path / "o2")])
    assert r2.returncode == 0, r2.stderr
    assert "VERDICT: MATCH" in r2.stdout
    assert abs(json.loads((tmp_path / "e2" / "step0.json").read_text())["loss"] - loss) <= 1e-12 * loss
    p2 = np.load(tmp_path / "e2" / "params.npz")
    assert all(np.array_equal(params[k], p2[k]) for k in params.files), "the round trip is bit-identical"


def test_mlp_scenario(tmp_path):
    r = run_mpi(8, ["-m", "tpsim.demo", "--scenario", "mlp", "--out", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    assert "VERDICT: MATCH" in r.stdout and (tmp_path / "comm.jsonl").exists()


# one launch per case, by design: each is its own error path, and a program stops at its first error
@pytest.mark.parametrize("args, message", [
    (["--tp", "3"], "world size 4 is not divisible by --tp 3"),
    (["--tp", "2", "--dp", "3"], "--tp 2 x --dp 3 = 6 does not match the world size 4"),
    (["--hidden", "0"], "argument --hidden: '0' is not a whole number >= 1"),
    (["--dtype", "int8"], "invalid choice: 'int8'"),
    (["--heads", "6", "--hidden", "48"], "heads 6 is not divisible by tp 4"),
    (["--hidden", "30", "--heads", "4"], "hidden size 30 is not divisible by heads 4"),
    (["--tp", "2", "--batch-size", "5"], "--batch-size 5 is not divisible by dp 2"),
    (["--dropout", "1.5"], "argument --dropout: '1.5' is not a number in [0, 1)"),
    (["--lr", "nan"], "argument --lr: 'nan' is not a number > 0"),
    (["--steps", "x"], "argument --steps: 'x' is not a whole number >= 0"),
    (["--init-from", "/nonexistent.npz"], "--init-from /nonexistent.npz: no such file"),
])
def test_bad_configuration_is_one_line_on_rank_zero_and_exits_nonzero(args, message):
    r = run_mpi(4, ["-m", "tpsim.demo", *args], timeout=60)
    assert r.returncode != 0
    errors = [line for line in without_launcher_notices(r.stderr).splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("tpsim.demo: error: ") and message in errors[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_exception_on_one_rank_ends_the_whole_job_within_seconds():
    r = run_mpi(4, [str(ROOT / "tests" / "programs" / "raise_on_one_rank.py"), "2"], timeout=60)
    assert r.returncode != 0
    assert "[rank 2] RuntimeError: deliberate failure on rank 2" in r.stderr
    assert r.seconds < 15, f"took {r.seconds:.1f}s to end the job"
