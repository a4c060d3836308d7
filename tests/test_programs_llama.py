"""The demo with ``--arch llama`` under mpiexec: step 0 equals serial, FORMULA CHECK, the ``kv`` sub-group."""

from __future__ import annotations

import pytest

from launch_program import run_mpi

pytestmark = pytest.mark.slow


def test_llama_demo_matches_serial_and_the_formulas(tmp_path):
    """4 ranks: TP 4 x DP 1, sequence-parallel, 4 heads and the default 2 KV heads, each replicated on 2 ranks."""
    r = run_mpi(4, ["-m", "tpsim.demo", "--arch", "llama", "--steps", "2", "--sequence-parallel",
                    "--out", str(tmp_path)])
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "Llama: 2 layers" in out and "2 KV heads (1 per TP rank, each replicated on 2 ranks)" in out
    assert "VERDICT: MATCH" in out and "FORMULA CHECK: all" in out, out
    assert "model.layers.1.self_attn" in out and " kv " in out, "the kv sub-group's all-reduce is in the table"


def test_llama_demo_refuses_what_it_cannot_do(tmp_path):
    r = run_mpi(2, ["-m", "tpsim.demo", "--arch", "llama", "--dropout", "0.1", "--out", str(tmp_path)])
    assert r.returncode == 2 and "--arch llama has no dropout" in r.stdout + r.stderr
