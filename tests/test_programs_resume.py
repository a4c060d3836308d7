"""The demo's training checkpoints: N steps straight, or k steps + ``--save`` and ``--resume`` for the other N − k
on another layout, end in the same place.

Story, per pair of layouts: run N steps on layout A (saved); run k steps on A (saved); resume that on layout B to
N (saved). The resumed run's losses are the straight run's for steps k..N−1, and its final parameters and AdamW
state are the straight run's — float64: within 1e-12 relative to the largest value of each kind (layouts add
their partial sums in other orders, so the last bits differ; on the same layout nothing differs: bit for bit).
Each resumed run also passes its own checks: step k and the final state against a serial twin that starts from
the checkpoint, the FORMULA CHECK (saving and resuming are not training traffic). Then every refusal of
``--resume``: one line, exit 2, before any work, on every rank.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from launch_program import run_mpi
from tpsim.demo.tolerances import TOLERANCE
from tpsim.hf.weights import read_safetensors, safetensors_bytes

pytestmark = pytest.mark.slow

SMALL = ["--layers", "4", "--hidden", "32", "--heads", "4", "--seq-len", "8", "--vocab", "11", "--batch-size", "8"]
N, K = 5, 2
TOL = 1e-12
# bfloat16 on another layout: TP and ZeRO-1 add partial sums in another order, each rounding of a 16-bit value
# may land one unit roundoff (2^-8) elsewhere, as at step 0 — so the step-0 check's bfloat16 tolerance, whose
# derivation is tpsim.train.mixed_precision.TOLERANCE_NOTE; the same layout is still bit for bit.
TOL_BF16 = TOLERANCE["bfloat16"]

LAYOUTS = {  # name: (ranks, flags)
    "pp4": (4, ["--pp", "4", "--tp", "1"]),
    "pp2-tp2-uneven": (4, ["--pp", "2", "--tp", "2", "--pp-layers", "1,3"]),
    "tp4-dp2": (8, ["--tp", "4", "--dp", "2"]),
    "pp2-tp2-dp2-zero1": (8, ["--pp", "2", "--tp", "2", "--dp", "2", "--zero", "1"]),
    "tp2": (2, ["--tp", "2"]),
    "pp2-vp2": (2, ["--pp", "2", "--tp", "1", "--schedule", "interleaved", "--vp", "2", "--microbatches", "2"]),
    "tp2-llama": (2, ["--tp", "2", "--arch", "llama"]),  # HF stores its linears transposed: so does the state
    "pp2-vp2-llama": (2, ["--pp", "2", "--tp", "1", "--schedule", "interleaved", "--vp", "2", "--microbatches", "2",
                          "--arch", "llama"]),
    "pp2-dp2-zero1": (4, ["--pp", "2", "--tp", "1", "--dp", "2", "--zero", "1"]),
    # 2 layers: at 4, step 0's bfloat16 gradient norm is 1.1e-3 from serial's, beyond the demo's 1e-3 for it
    # float16: the loss scale doubles after every 3 clean steps, so a lost growth counter shows after the resume
    "tp2-fp16": (2, ["--tp", "2", "--dtype", "float16", "--layers", "2", "--loss-scale-interval", "3"]),
    "tp2-bf16": (2, ["--tp", "2", "--dtype", "bfloat16", "--layers", "2"]),
    "dp2-zero1-bf16": (2, ["--tp", "1", "--dp", "2", "--zero", "1", "--dtype", "bfloat16", "--layers", "2"]),
}


def demo(layout: str, steps: int, folder, *extra: str):
    """The demo on ``layout`` for ``--steps steps``, its run folder ``folder/run``, its checkpoint ``folder/ckpt``."""
    ranks, flags = LAYOUTS[layout]
    r = run_mpi(ranks, ["-m", "tpsim.demo", *SMALL, *flags, "--steps", str(steps), "--out", str(folder / "run"),
                        "--save", str(folder / "ckpt"), *extra], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Per source layout, once: the straight N-step run and the k-step run whose checkpoint is resumed."""
    made = {}

    def get(layout: str):
        if layout not in made:
            root = tmp_path_factory.mktemp(layout)
            demo(layout, N, root / "straight")
            demo(layout, K, root / "first")
            made[layout] = root
        return made[layout]
    return get


def metrics_of(run_folder) -> list[dict]:
    return [json.loads(line) for line in (run_folder / "metrics.jsonl").read_text().splitlines()]


def losses(run_folder) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in metrics_of(run_folder)}


def worst_by_kind(a: dict, b: dict) -> dict[str, float]:
    """Per kind (the part of the key before the parameter's name: model parameters, exp_avg, ...), the largest
    |a − b| over its tensors relative to the largest |a| of that kind."""
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    kinds: dict[str, list[str]] = {}
    for key in a:
        kind = key.split(".")[0] if key.split(".")[0] in ("exp_avg", "exp_avg_sq", "main_param") else "param"
        kinds.setdefault(kind, []).append(key)
    out = {}
    for kind, keys in kinds.items():
        scale = max(float(np.max(np.abs(a[k].astype(np.float64)))) for k in keys)
        out[kind] = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in keys) / scale
    return out


def saved(folder) -> dict[str, np.ndarray]:
    return {**read_safetensors(folder / "model.safetensors"), **read_safetensors(folder / "optimizer.safetensors")}


def resume_and_compare(source, tmp_path, origin: str, target: str, tol: float | None):
    """Resume ``origin``'s k-step checkpoint on ``target`` to N; compare with ``origin``'s straight run (``tol``
    None: bit for bit). Returns the resumed run's output."""
    root = source(origin)
    r = demo(target, N, tmp_path, "--resume", str(root / "first" / "ckpt"))
    out = r.stdout
    assert f"resumed from {root / 'first' / 'ckpt'}/ at step {K}" in out, out[:2000]
    assert f"Training steps {K}..{N - 1}" in out and f"step {K} equals the serial model" in out, out
    assert "FORMULA CHECK: all" in out, "saving and resuming are not training traffic"
    assert f"steps {K}..{N - 1}, loss" in out and "every check holds" in out, out[-1500:]
    straight, resumed = losses(root / "straight" / "run"), losses(tmp_path / "run")
    assert sorted(resumed) == list(range(K, N)), sorted(resumed)
    records = [json.loads(line) for line in (tmp_path / "run" / "comm.jsonl").read_text().splitlines()]
    traced = {r["step"] for r in records if r["phase"] != "init"}  # the set-up's broadcasts are traced as step 0
    assert traced <= set(range(K, N + 1)), f"traced steps {sorted(traced)}: only the resumed ones (and verify)"
    want, got = saved(root / "straight" / "ckpt"), saved(tmp_path / "ckpt")
    state = json.loads((tmp_path / "ckpt" / "training_state.json").read_text())
    assert state["step"] == N and state["optimizer"]["step_count"] == N, state
    if tol is None:
        assert all(resumed[s] == straight[s] for s in resumed), (resumed, straight)
        bad = [k for k in want if want[k].dtype != got[k].dtype or not np.array_equal(want[k], got[k])]
        assert set(want) == set(got) and not bad, f"not bit-identical: {bad[:5]}"
    else:
        loss_diff = max(abs(resumed[s] - straight[s]) / abs(straight[s]) for s in resumed)
        assert loss_diff <= tol, f"losses differ by {loss_diff:.2e}: {resumed} vs {straight}"
        worst = worst_by_kind(want, got)
        assert max(worst.values()) <= tol, f"final state differs: {worst}"
        assert "VERDICT: MATCH" in out.split("Final state vs the serial model")[-1] or tol == TOL_BF16, out
    return out


@pytest.mark.parametrize("origin, target", [("pp4", "pp2-tp2-uneven"), ("tp4-dp2", "pp2-tp2-dp2-zero1"),
                                            ("tp2", "pp2-vp2"), ("tp2-llama", "pp2-vp2-llama")])
def test_resumed_on_another_layout_ends_where_the_straight_run_ends(source, tmp_path, origin, target):
    out = resume_and_compare(source, tmp_path, origin, target, TOL)
    assert f"after steps {K}..{N - 1} equals the serial model trained the same way" in out, out[-3000:]


@pytest.mark.parametrize("layout", ["tp2", "pp2-dp2-zero1", "tp2-bf16", "tp2-fp16"])
def test_resumed_on_the_same_layout_is_bit_identical(source, tmp_path, layout):
    resume_and_compare(source, tmp_path, layout, layout, None)
    if layout == "tp2-fp16":
        scales = [metrics_of(source(layout) / "straight" / "run"), metrics_of(tmp_path / "run")]
        want = {row["step"]: row["loss_scale"] for row in scales[0] if row["step"] >= K}
        assert {row["step"]: row["loss_scale"] for row in scales[1]} == want, scales
        position = json.loads((source(layout) / "first" / "ckpt" / "training_state.json").read_text())
        saved = position["loss_scaler"]
        assert saved["good_steps"] == K and want[K] == 2 * saved["scale"], (saved, want)  # grew at the 3rd step


def test_bfloat16_resumed_under_zero1_within_the_16_bit_tolerance(source, tmp_path):
    out = resume_and_compare(source, tmp_path, "tp2-bf16", "dp2-zero1-bf16", TOL_BF16)
    state = json.loads((source("tp2-bf16") / "first" / "ckpt" / "training_state.json").read_text())
    assert state["optimizer"]["slots"] == ["exp_avg", "exp_avg_sq", "main_param"], state
    assert f"step {K} equals the serial model within {TOL_BF16:g} (bfloat16" in out, out


# --- refusals -------------------------------------------------------------------------------------------------------
def refused(ranks: int, args: list[str]) -> str:
    """The demo's one error line: exit 2 on every rank, nothing printed to stdout (no work began)."""
    r = run_mpi(ranks, ["-m", "tpsim.demo", *args], timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and not r.stdout.strip(), (r.returncode, r.stdout, r.stderr)
    return lines[0]


@pytest.fixture(scope="module")
def checkpoint(source):
    """The tp2 layout's k-step checkpoint, the one the resumed runs above start from (no test writes into it)."""
    return source("tp2") / "first" / "ckpt"


# one launch per case, by design: each is its own error path, and a program stops at its first error
@pytest.mark.parametrize("extra, words", [
    (["--layers", "2"], "another model — the checkpoint has n_layer 4 (this run: 2)"),
    (["--dtype", "float32"], "the checkpoint trained in --dtype float64, this run asks for float32"),
    (["--arch", "llama"], "the checkpoint is --arch gpt2, this run --arch llama"),
    (["--steps", str(K)], f"the checkpoint reached step {K} and --steps {K} is the total to reach"),
    (["--init-from", "CKPT"], "--resume and --init-from both say where the parameters come from"),
    (["--export", "EXPORT"], "a resumed run has no step 0"),
])
def test_resume_refuses_what_it_cannot_continue(checkpoint, tmp_path, extra, words):
    extra = [str(checkpoint) if a == "CKPT" else str(tmp_path / "e") if a == "EXPORT" else a for a in extra]
    args = [*LAYOUTS["tp2"][1], *SMALL, "--steps", str(N), "--out", str(tmp_path / "run"),
            "--resume", str(checkpoint), *extra]
    assert words in refused(2, args)


def test_resume_refuses_a_folder_without_optimizer_state_or_of_two_saves(checkpoint, tmp_path):
    base = [*LAYOUTS["tp2"][1], *SMALL, "--steps", str(N), "--out", str(tmp_path / "run")]
    model_only = tmp_path / "model-only"
    model_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(checkpoint / name, model_only / name)
    assert "no optimizer state" in refused(2, [*base, "--resume", str(model_only)])
    mixed = tmp_path / "mixed"  # the parameters of another save (here: doubled) with this save's state
    shutil.copytree(checkpoint, mixed)
    tensors = read_safetensors(mixed / "model.safetensors")
    (mixed / "model.safetensors").write_bytes(safetensors_bytes({k: a * 2 for k, a in tensors.items()}))
    assert "the folder mixes two saves" in refused(2, [*base, "--resume", str(mixed)])


def test_resumed_run_keeps_the_saved_batch_and_names_a_changed_setting(checkpoint, tmp_path):
    """Without --batch-size the checkpoint's global batch (8 here, not the default 16); a changed --lr is said."""
    no_batch = SMALL[:SMALL.index("--batch-size")] + SMALL[SMALL.index("--batch-size") + 2:]
    r = run_mpi(2, ["-m", "tpsim.demo", "--tp", "2", *no_batch, "--steps", str(K + 1), "--lr", "1e-3",
                    "--out", str(tmp_path / "run"), "--resume", str(checkpoint)], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "global batch 8 " in r.stdout, r.stdout[:1500]
    assert "changed since the save: --lr 0.001 (saved: 0.003) — the run goes on, but not as the saved one" in r.stdout
    assert f"after steps {K}..{K} equals the serial model trained the same way" in r.stdout, r.stdout[-2500:]
