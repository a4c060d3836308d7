"""How a rank waits in a collective: blocking MPI call, or nonblocking + sleeping poll when the node is full."""

import numpy as np
import pytest
from mpi4py import MPI

from tpsim.comm import waiting
from tpsim.errors import ConfigError


@pytest.mark.parametrize("mode, local, cores, expected", [
    ("spin", "64", 2, False), ("sleep", "1", 16, True), ("auto", "64", 2, True), ("auto", "2", 2, False),
    ("auto", "32", 2, False), ("auto", "8", 2, False),  # 16 and 4 ranks per core: spinning is as fast or faster
    ("auto", "", 16, False),  # no launcher variable: the world's size (1 here) against the cores
])
def test_sleep_poll_only_when_asked_or_the_node_is_far_oversubscribed(monkeypatch, mode, local, cores, expected):
    monkeypatch.setenv("TPSIM_WAIT", mode)
    monkeypatch.setenv("MPI_LOCALNRANKS", local)
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)  # as if launched by Hydra (or not at all)
    monkeypatch.setattr(waiting, "_cores", lambda: cores)
    assert waiting._decide() is expected


def test_open_mpis_local_size_counts_like_hydras(monkeypatch):
    """Under Open MPI (no MPI_LOCALNRANKS) the ranks on this node come from OMPI_COMM_WORLD_LOCAL_SIZE."""
    monkeypatch.setenv("TPSIM_WAIT", "auto")
    monkeypatch.delenv("MPI_LOCALNRANKS", raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "64")
    monkeypatch.setattr(waiting, "_cores", lambda: 2)
    assert waiting._decide() is True


def test_unknown_wait_mode_is_a_config_error_but_not_at_import(monkeypatch):
    """Read at import, where raising would be a traceback: it waits as ``auto``; ``check_mode`` (every entry
    point's first step, ``run_main``) refuses it."""
    monkeypatch.setenv("TPSIM_WAIT", "busy")
    monkeypatch.setenv("MPI_LOCALNRANKS", "2")
    monkeypatch.setattr(waiting, "_cores", lambda: 2)
    assert waiting._decide() is False
    with pytest.raises(ConfigError, match="spin or sleep, got 'busy'"):
        waiting.check_mode()


@pytest.mark.parametrize("sleep_poll", [False, True])
def test_both_ways_of_waiting_give_the_collective_result(monkeypatch, sleep_poll):
    monkeypatch.setattr(waiting, "SLEEP_POLL", sleep_poll)
    x = np.arange(6.0)
    out = np.empty_like(x)
    waiting.collective(MPI.COMM_WORLD, "Allreduce", x, out, op=MPI.SUM)
    assert np.array_equal(out, x * MPI.COMM_WORLD.Get_size())
    waiting.collective(MPI.COMM_WORLD, "Bcast", out, root=0)
    waiting.collective(MPI.COMM_WORLD, "Barrier")
