"""Whole programs placed on two "hosts" by MPICH's ``-hosts`` on this one machine: tpsim runs wherever MPI runs,
and the demo's grid table shows the hosts (named by ``TPSIM_FAKE_HOSTS``: both local names resolve to this
machine, whose one processor name the ranks would otherwise report)."""

from __future__ import annotations

import pytest

from launch_program import ROOT
from tpsim.hosts import FAKE_HOSTS_ENV
from tpsim.launcher import MPICH, detect_mpi, launch

pytestmark = pytest.mark.slow


@pytest.mark.skipif(detect_mpi() != MPICH, reason="-hosts is MPICH's (Hydra's) option; this mpiexec is another MPI")
def test_demo_on_two_local_hosts_warns_about_a_tp_group_across_them(tmp_path, monkeypatch):
    hosts = ("-hosts", "localhost,127.0.0.1")
    placed = launch(2, ["-c", "import os; print('ranks on my node:', os.environ['MPI_LOCALNRANKS'])"], timeout=60,
                    mpiexec_flags=hosts)
    assert placed.stdout.splitlines() == ["ranks on my node: 1"] * 2, placed.stdout + placed.stderr  # two "hosts"
    monkeypatch.setenv(FAKE_HOSTS_ENV, "node-a,node-b")
    run = launch(2, ["-m", "tpsim.demo", "--scenario", "mlp", "--tp", "2", "--out", str(tmp_path)],
                 timeout=120, cwd=ROOT, mpiexec_flags=hosts)
    assert not run.timed_out and run.returncode == 0, run.stdout + run.stderr
    assert "dp0   0   1   node-a, node-b" in run.stdout
    assert "WARNING: TP group [0, 1] spans hosts node-a, node-b: its all-reduces cross the slow link" in run.stdout
    assert "MATCH" in run.stdout
