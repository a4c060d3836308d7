"""The 1F1B schedule in the few shapes lesson 16 uses, read off ``tpsim.pipeline`` (which has every schedule).

Narayanan et al. 2021 (arXiv:2104.04473), §2.2.1: stage i of p runs p − i − 1 warm-up forwards, then
alternates one forward and one backward, then drains the backwards left (Megatron-LM's warm-up count
``p − rank − 1``). So stage i has run p − i forwards when its first backward comes, and holds at most min(p − i, m)
micro-batches' activations. With every forward taking ``tf`` and every backward ``tb``, each stage is busy
m·(tf + tb) and idle (p − 1)·(tf + tb) of the step: the bubble, (p − 1)/m of the compute. The times come from
``tpsim.pipeline.clock`` running the checked action lists (no formula), so the lesson can check that claim;
communication takes no time here.

    actions(p, m)[i]          [("F", 0), ("F", 1), ..., ("B", 0), ...]   stage i's order
    simulate(p, m, tf, tb)    {(stage, kind, micro-batch): (start, end)}
    grid(p, m, tf, tb)        one text row per stage, one column per time unit: "F3", "B3", or "." idle
"""

from __future__ import annotations

from tpsim.pipeline import clock
from tpsim.pipeline.actions import COMPUTE
from tpsim.pipeline.grid import format_grid
from tpsim.pipeline.schedules import build


def actions(p: int, m: int) -> list[list[tuple[str, int]]]:
    """Each stage's 1F1B order of ``("F" | "B", micro-batch)`` (its sends and receives left out)."""
    return [[(a.op, a.microbatch) for a in rank if a.op in COMPUTE] for rank in build("1f1b", p, m).ranks]


def depends_on(p: int, stage: int, kind: str, j: int) -> tuple[int, str, int] | None:
    """What action ``(stage, kind, j)`` waits for: the previous stage's forward of j, the next stage's backward
    of j (the last stage: its own forward of j); ``None`` for the first stage's forwards."""
    if kind == "F":
        return (stage - 1, "F", j) if stage > 0 else None
    return (stage + 1, "B", j) if stage < p - 1 else (stage, "F", j)


def timeline(p: int, m: int, tf: float = 1, tb: float = 2) -> clock.Timeline:
    return clock.simulate(build("1f1b", p, m), clock.uniform(tf, tb))


def simulate(p: int, m: int, tf: float = 1, tb: float = 2) -> dict[tuple[int, str, int], tuple[float, float]]:
    """Start and end of every forward and backward on the virtual clock."""
    t = timeline(p, m, tf, tb)
    return {(stage, a.op, a.microbatch): span for stage, (acts, spans) in enumerate(zip(t.schedule.ranks, t.spans))
            for a, span in zip(acts, spans) if a.op in COMPUTE}


def in_flight(p: int, m: int) -> list[int]:
    """The most micro-batches each stage holds activations for at once (forwards run, backwards not yet)."""
    return clock.in_flight(build("1f1b", p, m))


def idle(p: int, m: int, tf: float = 1, tb: float = 2) -> list[float]:
    """Each stage's idle time between the step's first action and its last (the bubble, stage by stage)."""
    return timeline(p, m, tf, tb).idle


def grid(p: int, m: int, tf: float = 1, tb: float = 2) -> list[str]:
    """The schedule drawn: row i is stage i, a column per time unit (a backward fills ``tb`` of them)."""
    return format_grid(timeline(p, m, tf, tb), width=None, quantum=1, name="stage")
