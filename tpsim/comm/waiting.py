"""How a rank waits inside a collective: MPI's own busy loop, or polling that sleeps when the node is full.

MPICH waits for a collective by polling in a loop (yielding now and then). With more ranks than cores —
64 ranks on a 2-core laptop is how tpsim simulates a big world — every waiting rank burns the time slices the
ranks it is waiting *for* need to reach the collective, so the whole world crawls. Measured on 2 cores, 64
ranks, 340 all-reduces with a little NumPy work between them: blocking ``Allreduce`` 17–41 s wall and 31–69
CPU-s, nonblocking ``Iallreduce`` + ``Test`` + a sleep that backs off 14.9–16.2 s wall and 14 CPU-s.

But sleeping costs latency: a woken rank notices a finished collective up to a sleep later. On a quiet 2-core
machine the demo (`--tp 8 --heads 8 --steps 20`) took, spinning vs sleep-polling: 8 ranks 4.6 vs 15.8 s (the
default demo), 16 ranks 4.7 vs 7.8 s, 32 ranks 9.9 vs 10.2 s, 64 ranks 22.6 vs 18.2 s. So sleeping pays only
when far more ranks than cores wait: ``auto`` sleep-polls above ``SLEEP_ABOVE_RANKS_PER_CORE`` ranks per core.

``TPSIM_WAIT``: ``auto`` (default), ``spin`` (always the blocking call) or ``sleep`` (always sleep-poll).
Either way the same MPI reduction runs.
"""

from __future__ import annotations

import os
import time

from mpi4py import MPI

from tpsim.errors import ConfigError

_FIRST_SLEEP, _LONGEST_SLEEP, _SPINS = 20e-6, 1e-3, 10
SLEEP_ABOVE_RANKS_PER_CORE = 16  # measured: 16 per core (32 ranks on 2 cores) is break-even, 32 per core wins


def _ranks_on_this_node() -> int:
    # Hydra (MPICH's launcher) and Open MPI tell each process how many ranks share its node; else assume one node
    local = os.environ.get("MPI_LOCALNRANKS") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    return int(local) if local and local.isdigit() else MPI.COMM_WORLD.Get_size()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check_mode(environ=os.environ) -> str:
    """``TPSIM_WAIT`` (default ``auto``), or a ConfigError naming the allowed values (``run_main`` checks it)."""
    mode = environ.get("TPSIM_WAIT", "auto")
    if mode not in ("auto", "spin", "sleep"):
        raise ConfigError(f"TPSIM_WAIT must be auto, spin or sleep, got {mode!r}")
    return mode


def _decide() -> bool:
    """At import, so it must not raise: an unknown ``TPSIM_WAIT`` acts as ``auto`` until ``check_mode`` refuses it."""
    mode = os.environ.get("TPSIM_WAIT", "auto")
    return mode == "sleep" or (mode != "spin" and _ranks_on_this_node() > SLEEP_ABOVE_RANKS_PER_CORE * _cores())


SLEEP_POLL = _decide()


def wait_politely(request: MPI.Request) -> None:
    """Wait for a point-to-point request by sleep-polling (``_wait``), whatever ``TPSIM_WAIT`` says, unless it is
    ``spin``: a pipeline rank waiting in its bubble would otherwise burn its neighbour's core."""
    if os.environ.get("TPSIM_WAIT", "auto") == "spin":
        request.Wait()
    else:
        _wait(request)


def _wait(request: MPI.Request) -> None:
    """Test until done: a few quick tests, then sleeps that double from 20 µs up to 1 ms."""
    spins, delay = 0, _FIRST_SLEEP
    while not request.Test():
        if spins < _SPINS:
            spins += 1
            continue
        time.sleep(delay)
        delay = min(2 * delay, _LONGEST_SLEEP)


def collective(comm: MPI.Comm, name: str, *args, patient: bool = False, **kwargs) -> None:
    """``comm.<name>(*args)`` (e.g. ``"Allreduce"``), or its nonblocking twin waited on politely (``SLEEP_POLL``).

    ``patient``: sleep-poll whatever ``TPSIM_WAIT`` says — for a collective that waits on long work of one rank
    (the demo's serial reference, trained on rank 0 while the others would spin and steal its core)."""
    if not (SLEEP_POLL or patient):
        getattr(comm, name)(*args, **kwargs)
        return
    _wait(getattr(comm, "I" + name[0].lower() + name[1:])(*args, **kwargs))
