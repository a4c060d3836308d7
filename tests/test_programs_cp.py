"""--cp through the demo: every check holds for each way of attending across CP ranks (the serial twin at step
0 and after training, FORMULA CHECK with the CP messages, replicas), with TP, SP, ZeRO-1 and a pipeline; the
layout line and the attention work per CP rank are printed (equal under zigzag); an impossible layout is one
line, exit 2, before any work."""

from __future__ import annotations

import pytest

from launch_program import run_mpi, without_launcher_notices

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("ranks, args", [
    (4, ["--cp", "2", "--tp", "2"]),
    (4, ["--cp", "2", "--tp", "2", "--cp-comm", "allgather", "--arch", "llama", "--sequence-parallel"]),
    (4, ["--cp", "2", "--tp", "1", "--cp-comm", "ulysses", "--zero", "1"]),
    (4, ["--cp", "2", "--tp", "1", "--pp", "2", "--arch", "llama"]),
    (8, ["--cp", "2", "--tp", "2", "--dp", "2"]),
    (8, ["--cp", "2", "--tp", "2", "--pp", "2", "--cp-comm", "ulysses", "--heads", "8"]),
], ids=["ring-tp2", "allgather-llama-sp", "ulysses-zero1", "ring-pp2-llama", "8-ranks-cp2-tp2-dp2",
        "8-ranks-cp2-tp2-pp2-ulysses"])
def test_demo_with_cp_passes_every_check(tmp_path, ranks, args):
    r = run_mpi(ranks, ["-m", "tpsim.demo", "--steps", "3", "--out", str(tmp_path), *args], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "every check holds" in r.stdout and "FORMULA CHECK: all" in r.stdout
    assert r.stdout.count("VERDICT: MATCH") >= 2 and "MISMATCH" not in r.stdout
    assert "context parallel: CP(2)" in r.stdout
    work = next(line for line in r.stdout.splitlines() if line.startswith("CP attention work"))
    assert "max/min 1.000" in work  # zigzag: every CP rank computes the same causal pairs


# one launch per case, by design: each is its own error path, and a program stops at its first error
@pytest.mark.parametrize("args, message", [
    (["--cp", "3"], "world size 4 is not divisible by --cp 3"),
    (["--cp", "2", "--seq-len", "6"], "--seq-len 6 is not divisible by 4 (zigzag over cp 2: 2 x cp = 4 chunks)"),
    (["--cp", "4", "--tp", "1", "--cp-comm", "ulysses", "--arch", "llama"],
     "--cp-comm ulysses: 4 query and 2 KV heads per TP rank must both divide by cp 4"),
])
def test_an_impossible_cp_layout_is_one_line_exit_2(args, message):
    r = run_mpi(4, ["-m", "tpsim.demo", *args], timeout=60)
    assert r.returncode == 2
    errors = [line for line in without_launcher_notices(r.stderr).splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("tpsim.demo: error: ") and message in errors[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
