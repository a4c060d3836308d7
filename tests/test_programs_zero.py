"""--zero 2 and --zero 3 through the demo: every check holds (the serial twin at step 0 and after training, the
verify pass on padded buckets, FORMULA CHECK with ZeRO-2's per-micro-batch reduce-scatters and ZeRO-3's gathers,
replicas), with TP, SP, CP, a pipeline and 16 bits; the model-state table checks the sharded columns exactly and
says what was in flight; a save resumes at another DP size and stage; what ZeRO-2/3 cannot take is one line, exit
2, before any work."""

from __future__ import annotations

import pytest

from launch_program import run_mpi, without_launcher_notices

pytestmark = pytest.mark.slow


def check_demo(r, stage: int) -> None:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "every check holds" in r.stdout and "FORMULA CHECK: all" in r.stdout
    assert r.stdout.count("VERDICT: MATCH") >= 2 and "MISMATCH" not in r.stdout and "DIFFERS" not in r.stdout
    assert f"VERDICT: MATCH — ZeRO-{stage}'s padded buckets update the parameters as plain DP x TP does" in r.stdout
    table = r.stdout[r.stdout.index(f"Model state per parameter on rank 0 (ZeRO-{stage} over DP"):]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:6]}
    assert rows["grads"][-1] == "ok" and rows["optimizer"][-1] == "ok"
    assert (rows["params"][-1] == "ok") == (stage == 3)
    assert "in flight in the last step, at most:" in table


@pytest.mark.parametrize("ranks, stage, args", [
    (4, 2, ["--tp", "2", "--dp", "2", "--bucket-mb", "0.05"]),
    (4, 3, ["--tp", "2", "--dp", "2", "--sequence-parallel", "--dtype", "bfloat16"]),
    (4, 2, ["--pp", "2", "--dp", "2", "--bucket-mb", "0.05", "--schedule", "zb-h1", "--arch", "llama"]),
    (4, 3, ["--pp", "2", "--dp", "2"]),
    (8, 3, ["--cp", "2", "--tp", "2", "--dp", "2", "--arch", "llama", "--dtype", "float16"]),
    (8, 3, ["--tp", "2", "--dp", "2", "--pp", "2"]),
], ids=["zero2-tp2", "zero3-sp-bf16", "zero2-pp2-zbh1-llama", "zero3-pp2", "8-ranks-zero3-cp2-tp2-fp16",
        "8-ranks-zero3-tp2-pp2"])
def test_demo_with_zero2_and_zero3_passes_every_check(tmp_path, ranks, stage, args):
    r = run_mpi(ranks, ["-m", "tpsim.demo", "--steps", "3", "--out", str(tmp_path), "--zero", str(stage), *args],
                timeout=300)
    check_demo(r, stage)


def test_a_zero3_save_resumes_at_another_dp_size_and_stage(tmp_path):
    save = tmp_path / "ckpt"
    first = run_mpi(4, ["-m", "tpsim.demo", "--steps", "4", "--out", str(tmp_path / "a"), "--zero", "3", "--tp", "2",
                        "--dp", "2", "--save", str(save)], timeout=300)
    check_demo(first, 3)
    again = run_mpi(4, ["-m", "tpsim.demo", "--steps", "6", "--out", str(tmp_path / "b"), "--zero", "2", "--dp", "4",
                        "--resume", str(save)], timeout=300)
    check_demo(again, 2)
    assert "written by TP 2 x DP 2 ZeRO-3" in again.stdout


# one launch per case, by design: each is its own error path, and a program stops at its first error
@pytest.mark.parametrize("args, message", [
    (["--zero", "4"], "argument --zero: invalid choice: 4"),
    (["--zero", "2", "--overlap-grad-reduce"], "--overlap-grad-reduce with --zero 2: ZeRO-2 reduce-scatters"),
    (["--zero", "3", "--overlap-param-gather"], "--overlap-param-gather (ZeRO's all-gather under the next forward)"),
])
def test_what_zero2_and_zero3_cannot_take_is_one_line_exit_2(args, message):
    r = run_mpi(4, ["-m", "tpsim.demo", *args], timeout=60)
    assert r.returncode == 2
    errors = [line for line in without_launcher_notices(r.stderr).splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("tpsim.demo: error: ") and message in errors[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
