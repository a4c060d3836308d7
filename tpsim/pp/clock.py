"""The live virtual clock: modelled time on every pipeline rank, so a bubble can be measured on live ranks.

Wall-clock time on an oversubscribed CPU cannot show a bubble (an idle rank hands its core to a busy one). So
each rank keeps a clock of *modelled* time, advanced by unit costs — the textbook's picture:

    F: clock += t_F (1)        B: clock += t_B (2)        messages: free
    SEND: the message carries the sender's clock (8 bytes after the payload, not counted as model traffic)
    RECV: clock = max(own clock, the sender's)             (waiting for the message is idle time)

The data still moves through real MPI, so numbers stay real and the time is deterministic: the same run gives
the same timeline on any machine, loaded or not. After a step, T = the largest clock of the pipeline; a stage
was busy m·(t_F + t_B) of it and idle the rest. With equal stages both AFAB and 1F1B idle
(p − 1)/(m + p − 1) of T (Narayanan et al. 2021, §2.2).
"""

from __future__ import annotations

from dataclasses import dataclass

UNIT_COSTS = {"F": 1.0, "B": 2.0}


@dataclass
class LiveClock:
    """One rank's modelled time in a step: ``time`` now, ``busy`` spent computing (the rest was waiting)."""

    costs: dict | None = None
    time: float = 0.0
    busy: float = 0.0

    def compute(self, op: str) -> None:
        """A forward or backward ran: the clock moves by its cost."""
        cost = (self.costs or UNIT_COSTS)[op]
        self.time += cost
        self.busy += cost

    def arrive(self, sent: float) -> None:
        """A message sent at the sender's ``sent`` arrived: nothing here can start before it."""
        self.time = max(self.time, sent)


def bubble_formula(pp: int, microbatches: int) -> float:
    """(p − 1)/(m + p − 1): the idle share of a step of AFAB or 1F1B with equal stages."""
    return (pp - 1) / (microbatches + pp - 1)


def bubble_measured(clocks: list[tuple[float, float]]) -> tuple[float, float]:
    """``(T, idle share)`` from every stage's ``(final time, busy)`` of one pipeline: T the latest clock, the
    idle share Σ (T − busy_i) / (p·T)."""
    end = max(t for t, _ in clocks)
    return end, sum(end - busy for _, busy in clocks) / (len(clocks) * end)
