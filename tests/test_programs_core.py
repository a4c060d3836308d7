"""Whole programs under mpiexec: the demo's verdict, clean configuration errors, no hang on a failure."""

from __future__ import annotations

import json

import pytest

from mpirun import ROOT, run_mpi

pytestmark = pytest.mark.slow


def test_demo_8_ranks_matches_serial_and_writes_records(tmp_path):
    r = run_mpi(8, ["-m", "tpsim.demo", "--out", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    assert "TP(4) x DP(2) = 8 ranks" in r.stdout
    assert "TP group 1: ranks [4, 5, 6, 7]" in r.stdout and "DP group 3: ranks [3, 7]" in r.stdout
    assert "VERDICT: MATCH" in r.stdout
    lines = (tmp_path / "comm.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    assert {r["rank"] for r in recs} == set(range(8))
    fwd = [x for x in recs if x["phase"] == "forward" and x["rank"] == 0]
    assert [(x["op"], x["scope"]) for x in fwd] == [("all_reduce", "mlp.c_proj")]


@pytest.mark.parametrize("args, message", [
    (["--tp", "3"], "world size 4 is not divisible by --tp 3"),
    (["--tp", "2", "--dp", "3"], "--tp 2 x --dp 3 = 6 does not match the world size 4"),
    (["--hidden", "0"], "--hidden must be >= 1"),
    (["--dtype", "float16"], "invalid choice: 'float16'"),
])
def test_bad_configuration_is_one_line_on_rank_zero_and_exits_nonzero(args, message):
    r = run_mpi(4, ["-m", "tpsim.demo", *args], timeout=60)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert errors == [f"tpsim.demo: error: {message}"] or (len(errors) == 1 and message in errors[0]), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_exception_on_one_rank_ends_the_whole_job_within_seconds():
    r = run_mpi(4, [str(ROOT / "tests" / "programs" / "raise_on_one_rank.py"), "2"], timeout=60)
    assert r.returncode != 0
    assert "[rank 2] RuntimeError: deliberate failure on rank 2" in r.stderr
    assert r.seconds < 15, f"took {r.seconds:.1f}s to end the job"
