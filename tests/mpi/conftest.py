"""Harness for the every-rank tests: each runs on every rank of one ``mpiexec -n N`` launch of pytest.

- Launch through ``tests/mpi/pytest_on_every_rank.py``: only rank 0 reports to the terminal, the others run
  silently (tests/README.md says how to run and add these tests).
- A test's outcome is agreed by all ranks: after each test every rank shares whether it failed and why, so a
  failure on rank 3 alone fails the test on every rank and rank 0 prints "rank 3: ..." — failures are never
  hidden behind rank 0's pass. A rank that fails prints its own traceback to stderr at once, in case the
  others are left waiting in a collective (pytest-timeout, thread method, then ends the job).
- Grids are built once per TP size (communicators are a finite resource) and their tracers reset per test.
"""

from __future__ import annotations

import sys
import traceback

import pytest
from mpi4py import MPI

from tpsim.comm import ProcessGrid

WORLD = MPI.COMM_WORLD


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    error = None
    try:
        result = yield
    except pytest.skip.Exception:
        raise
    except BaseException as exc:  # noqa: BLE001 - we re-raise below, after agreeing with the other ranks
        error = exc
        sys.stderr.write(f"[rank {WORLD.Get_rank()}] {item.nodeid} failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
    reports = WORLD.allgather(None if error is None else f"{type(error).__name__}: {error}")
    failed = [(r, msg) for r, msg in enumerate(reports) if msg is not None]
    if failed:
        summary = "\n".join(f"rank {r}: {msg}" for r, msg in failed)
        raise AssertionError(f"failed on {len(failed)} of {WORLD.Get_size()} ranks:\n{summary}") from error
    return result


_GRIDS: dict[int, ProcessGrid] = {}


def get_grid(tp: int) -> ProcessGrid:
    if tp not in _GRIDS:
        _GRIDS[tp] = ProcessGrid(tp=tp)
    grid = _GRIDS[tp]
    grid.tracer.reset()
    grid.tracer.enabled = True
    return grid


def tp_sizes() -> list[int]:
    """Every TP size this world can host: at world 8 that is 1, 2, 4, 8 (with DP filling the rest)."""
    n = WORLD.Get_size()
    return [t for t in (1, 2, 4, 8) if n % t == 0]


@pytest.fixture(params=tp_sizes(), ids=lambda t: f"tp{t}")
def grid(request) -> ProcessGrid:
    return get_grid(request.param)


@pytest.fixture
def world_size() -> int:
    return WORLD.Get_size()
