"""Every rank reaches the same verdict: the one way tpsim agrees a check across ranks.

A check that holds on rank 0 may fail on rank 3. If each rank acted on its own verdict, some would exit while
others wait in their next collective forever, and rank 0 would print OK for a run that is wrong elsewhere. So
a check's outcome is combined over the ranks, one small all-reduce per question, and every rank acts on it:

    agree = Agreement()                     # the untraced world group (a lesson's CHECK, an exercise's verdict)
    agree.all_true(ok)                      # True everywhere iff ok on every rank
    agree.reduce([err], op="max")           # the worst value over the ranks, on every rank
    agree.gather(findings)                  # every rank's object, in rank order, on rank 0
    agree.reduce_within([err], seconds=10)  # the same, or None if some rank has not joined after 10 s

By default the agreement runs on a private world group whose tracer is off: a lesson teaching "one all-reduce
per forward" must not see its own checks in the trace. ``Agreement(grid.world)`` agrees on a traced group
instead, under the phase ``VERIFY`` (the demo's comparison with the serial model is part of its record).
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from tpsim.comm.group import Group
from tpsim.comm.half import NATIVE_OPS
from tpsim.comm.tracer import Tracer
from tpsim.phases import VERIFY


def untraced_world() -> Group:
    """All ranks of ``MPI.COMM_WORLD`` as a group whose collectives are never recorded."""
    comm = MPI.COMM_WORLD
    return Group(comm, "world", tuple(range(comm.Get_size())), Tracer(comm.Get_rank(), enabled=False))


class Agreement:
    """Combine a per-rank outcome over ``group`` (default: the untraced world) so every rank holds the same."""

    def __init__(self, group: Group | None = None) -> None:
        self.group = untraced_world() if group is None else group
        self.rank, self.size = self.group.rank, self.group.size

    def all_true(self, ok: bool) -> bool:
        """True on every rank iff ``ok`` holds on every rank."""
        with self.group.tracer.region(phase=VERIFY):
            return self.group.all_true(bool(ok))

    def reduce(self, values, op: str = "max") -> np.ndarray:
        """``values`` (numbers, same length on every rank) combined elementwise by ``op`` ("max", "min", "sum")."""
        with self.group.tracer.region(phase=VERIFY):
            return self.group.all_reduce(np.ascontiguousarray(values), op=op)

    def reduce_within(self, values, seconds: float | None, op: str = "max") -> np.ndarray | None:
        """``reduce`` that a rank may stop waiting for: ``None`` when some rank has not joined it after ``seconds``
        (``None``: as long as it takes), a rank still busy or waiting in a collective this one never reached.
        Untraced. Every rank of one agreement must use this form (MPI does not match a nonblocking reduction
        with a blocking one), and a rank that gets ``None`` must end the job: the reduction is still pending."""
        values = np.ascontiguousarray(values)
        out = np.empty_like(values)
        request = self.group.comm.Iallreduce(values, out, op=NATIVE_OPS[op])
        if seconds is None:
            request.Wait()
            return out
        deadline, delay = time.monotonic() + seconds, 20e-6
        while not request.Test():
            if time.monotonic() > deadline:
                return None
            time.sleep(delay)  # doubling up to 1 ms: a waiting rank leaves the cores to the ones it waits for
            delay = min(2 * delay, 1e-3)
        return out

    def gather(self, obj) -> list | None:
        """Every rank's ``obj`` in rank order on rank 0, ``None`` elsewhere."""
        with self.group.tracer.region(phase=VERIFY):
            return self.group.gather_objects(obj)
