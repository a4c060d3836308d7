"""A posted non-blocking collective: issued now, completed by ``wait()`` — what ``--overlap-grad-reduce`` and
``--overlap-param-gather`` need to run a DP bucket's reduction beside the backward (Megatron-LM's overlap).

``Group.iall_reduce`` / ``ireduce_scatter`` / ``iall_gather`` post the buffer-based MPI call (``Iallreduce``,
``Ireduce_scatter_block``, ``Iallgather``) and return a ``Pending``; ``wait()`` waits for it politely
(``tpsim.comm.waiting.wait_politely``: sleep-polling, so a rank waiting for its bucket never spins the core
another rank computes on) and returns the result. The call is traced *when it is issued*, under the scope and
phase open then, with the same fields as its blocking twin (the FORMULA CHECK counts it the same way) and
``overlap`` True when it was issued to overlap compute; its ``duration`` is set at ``wait()``: issue to
completion. A ``Pending`` is waited once; a second ``wait()`` returns the same result.

On a CPU, MPICH advances a non-blocking collective only inside MPI calls (the sleep-poll's ``Test``, a later
collective) unless ``MPIR_CVAR_ASYNC_PROGRESS=1`` gives it a progress thread, which needs a spare core: the wall
clock shows little real overlap. The virtual clock (``tpsim.live_pipeline.clock``) models the GPU case either way.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from tpsim.comm.waiting import wait_politely


class Pending:
    """One posted collective: ``wait()`` completes it and returns what ``finish()`` makes of the receive buffer."""

    __slots__ = ("request", "event", "t", "finish", "result", "done")

    def __init__(self, request, event, t: float, finish: Callable[[], np.ndarray]) -> None:
        self.request, self.event, self.t, self.finish = request, event, t, finish
        self.result, self.done = None, False

    def wait(self) -> np.ndarray:
        """Wait (sleep-polling) until the collective is complete; its result (in place for an all-reduce)."""
        if not self.done:
            wait_politely(self.request)
            self.done = True
            self.result = self.finish()
            if self.event is not None:  # issue to completion, the time a reader sees it outstanding
                self.event.duration = time.perf_counter() - self.t
        return self.result

    def __repr__(self) -> str:
        op = self.event.op if self.event is not None else "collective"
        return f"Pending({op}, {'done' if self.done else 'posted'})"
