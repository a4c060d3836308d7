"""The time × rank grid, the picture of every pipeline paper, as text: a row per rank, a column per unit of time.

    rank 0  F0 F1 F2 F3  .  .  . B0 B0 F4 B1 B1 ...

A cell shows the compute action running in that slice of time — ``F3`` the forward of micro-batch 3, ``B3`` its
backward (in a split schedule its input-gradient half), ``W3`` its weight-gradient half — or ``.`` where the rank
is idle. With v > 1 model chunks a cell names the chunk as ``tpsim.pipeline.actions`` does: ``F3`` on chunk 0,
``F3.1`` on chunk 1. An action of cost 2 fills two columns. One column is ``quantum`` of time: by default the
shortest compute action's cost (1/v at unit costs), so every action of the textbook's costs fills whole
columns; with costs that are not multiples of it a cell shows whatever runs at the middle of its slice.

A grid wider than ``width`` characters is cut into blocks of near-equal numbers of columns, one under the other,
each headed by the time it spans. MPI-free.
"""

from __future__ import annotations

from bisect import bisect_right

from tpsim.pipeline.actions import COMPUTE, Action
from tpsim.pipeline.clock import Timeline

IDLE = "."


def label(action: Action) -> str:
    """``F3``, ``B3.1``: the action's compute name (chunk after the dot, none for chunk 0)."""
    return f"{action.op}{action.microbatch}" + (f".{action.chunk}" if action.chunk else "")


def quantum_of(timeline: Timeline) -> float:
    """The shortest compute action's cost: one grid column."""
    costs = [e - s for actions, spans in zip(timeline.schedule.ranks, timeline.spans)
             for a, (s, e) in zip(actions, spans) if a.op in COMPUTE and e > s]
    return min(costs, default=1.0)


def cells(timeline: Timeline, quantum: float | None = None) -> list[list[str]]:
    """``cells[r][t]``: what rank r runs in column t (``IDLE`` if nothing)."""
    q = quantum or quantum_of(timeline)
    columns = round(timeline.step / q)
    out = []
    for actions, spans in zip(timeline.schedule.ranks, timeline.spans):
        work = sorted((s, e, label(a)) for a, (s, e) in zip(actions, spans) if a.op in COMPUTE and e > s)
        starts = [s for s, _, _ in work]
        row = []
        for t in range(columns):
            mid = (t + 0.5) * q
            k = bisect_right(starts, mid) - 1
            row.append(work[k][2] if k >= 0 and work[k][1] > mid else IDLE)
        out.append(row)
    return out


def format_grid(timeline: Timeline, *, width: int | None = 100, quantum: float | None = None,
                name: str = "rank") -> list[str]:
    """The grid as lines: ``rank r`` then its cells, right-aligned in equal columns; cut into blocks of columns
    no wider than ``width`` (None: one block), each block headed by its first column's time."""
    q = quantum or quantum_of(timeline)
    grid = cells(timeline, q)
    pp = timeline.schedule.pp
    heads = [f"{name} {r}" for r in range(pp)]
    head = max(len(h) for h in heads)
    cell = max((len(c) for row in grid for c in row), default=1)
    columns = len(grid[0]) if grid else 0
    fits = columns if width is None else max(1, (width - head - 2) // (cell + 1))
    blocks = -(-columns // fits) if columns else 1
    per_block = -(-columns // blocks) if columns else 1  # blocks of near-equal width
    row_of = lambda h, row: f"{h:<{head}}  " + " ".join(c.rjust(cell) for c in row)  # noqa: E731
    if per_block >= columns:
        return [row_of(h, row) for h, row in zip(heads, grid)]
    lines: list[str] = []
    for first in range(0, columns, per_block):
        last = min(first + per_block, columns)
        lines += [""] if lines else []
        lines.append(f"time {first * q:.4g} to {last * q:.4g}:")
        lines += [row_of(h, row[first:last]) for h, row in zip(heads, grid)]
    return lines
