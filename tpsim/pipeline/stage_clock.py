"""The virtual clock for costs that are constant per stage: a schedule compiled once, then timed in one pass.

The planner times a schedule at real size — p up to ~100 ranks, m up to thousands of micro-batches, hundreds of
layouts a search — with costs that depend only on the (rank, chunk, op) of an action, and messages whose cost
depends only on their direction and sender's virtual stage. ``compiled(name, pp, m, vp)`` takes the compute
orders ``build`` wraps (``tpsim.pipeline.schedules.compute_orders``: the same lists every consumer runs) and
numbers their compute actions in an order they can run in, each with the one it waits for, as
``tpsim.pipeline.actions.with_messages`` places the messages: a RECV just before the F or B that needs it, the
SEND just after the F or B that produced it. So

    F of micro-batch j on virtual stage s > 0     waits for the F of j on stage s − 1, plus one message
    B of j on stage s < last                      waits for the B of j on stage s + 1, plus one message

and every action for the one before it on its rank. ``timed`` runs those nodes through the one cost rule
(``tpsim.pipeline.cost_rule.price``) that ``tpsim.pipeline.clock.simulate`` runs every action of ``build``'s
lists through, so the two clocks agree by construction — this one without the Action objects, the spans and the
message bookkeeping that make that clock cost seconds at m in the thousands (``tests/test_plan_pipeline.py``
still holds the two equal for every schedule under random costs). Compiling is cached; timing is about a
tenth of a microsecond a node. A compute order that lacks an action, repeats one, runs a backward before its
forward or cannot finish is handed to ``tpsim.pipeline.check``, whose one line says what is wrong.

``timed(compiled, compute, message[, start])`` returns the step (makespan), each rank's busy time and end, and
the bubble Σ idle / (pp · step); ``in_flight_peak`` weighs the micro-batches in flight (F run, backward — W when split —
not yet) by a per-chunk weight (its layers' activation bytes) and returns each rank's peak. MPI-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Sequence

import numpy as np

from tpsim.errors import ConfigError
from tpsim.pipeline.actions import COMPUTE
from tpsim.pipeline.check import check
from tpsim.pipeline.cost_rule import price
from tpsim.pipeline.schedules import build, compute_orders

OP_INDEX = {op: i for i, op in enumerate(COMPUTE)}  # F 0, B 1, W 2
ROUNDING = 1e-12  # relative: what summing the same float costs in two orders can differ by
Orders = Sequence[Sequence[tuple[str, int, int]]]


@dataclass(frozen=True)
class Compiled:
    """A schedule's compute actions as flat lists, numbered in an order they can run in. Node n runs on
    ``rank[n]`` and costs entry ``cost_entry[n]`` of the flat [pp, vp, 3] compute costs; it waits for node
    ``waits_for[n]`` (−1: none) plus message ``message[n]`` of the flat [pp·vp, 2] message costs (2 · sender stage
    + direction; −1: none)."""

    name: str
    pp: int
    microbatches: int
    vp: int
    splits_backward: bool
    rank: tuple[int, ...]
    cost_entry: tuple[int, ...]
    waits_for: tuple[int, ...]
    message: tuple[int, ...]
    counts: np.ndarray  # [pp, pp·vp·3]: how often each rank runs each compute cost entry
    sends: tuple[int, ...]  # messages each rank sends a step
    in_flight: tuple[np.ndarray, ...]  # per rank [forwards, vp]: (micro-batch, chunk) pairs in flight per chunk
    # after each F

    @cached_property
    def cost_index(self) -> np.ndarray:
        return np.asarray(self.cost_entry, dtype=np.int64)

    @cached_property
    def message_index(self) -> np.ndarray:
        return np.asarray(self.message, dtype=np.int64)  # −1 (no message) reads the 0 after the last


def refuse(name: str, pp: int, m: int, vp: int) -> None:
    """The checker's one line for lists that cannot be timed (it raises); a plain one if it finds nothing."""
    check(build(name, pp, m, vp))
    raise ConfigError(f"{name}: pp {pp}, m {m}, vp {vp}: the compute orders cannot be timed")


def compile_orders(name: str, pp: int, m: int, vp: int, orders: Orders) -> Compiled:
    """Number every compute action of ``orders`` in a runnable order (the module docstring's dependencies)."""
    last = pp * vp - 1
    split = any(op == "W" for order in orders for op, _, _ in order)
    size = m * vp * (3 if split else 2)
    if any(len(order) != size or len(set(order)) != size for order in orders):
        refuse(name, pp, m, vp)
    stages = pp * vp
    node = [-1] * (3 * m * stages)  # the number of (op, micro-batch j, virtual stage s) at (3·j + op)·stages + s
    rank: list[int] = []
    cost_entry: list[int] = []
    waits_for: list[int] = []
    message: list[int] = []
    pos, moved = [0] * pp, True
    while moved:  # round robin: each rank runs until it waits for a node not numbered yet
        moved = False
        for r, order in enumerate(orders):
            i = pos[r]
            while i < len(order):
                op, j, c = order[i]
                o, s = OP_INDEX[op], c * pp + r
                here = 3 * j * stages + s
                d = h = -1
                if o == 0 and s > 0:
                    d, h = node[here - 1], 2 * (s - 1)  # F of j on stage s - 1, its message forward
                elif o == 1 and s < last:
                    d, h = node[here + stages + 1], 2 * (s + 1) + 1  # B of j on stage s + 1, its message back
                if (h >= 0 and d < 0) or (o and node[here + (o - 1) * stages] < 0):
                    break  # waits for another rank, or its own F (or B) comes later: the checker says which
                node[here + o * stages] = len(rank)
                rank.append(r)
                cost_entry.append((r * vp + c) * 3 + o)
                waits_for.append(d)
                message.append(h)
                i += 1
                moved = True
            pos[r] = i
    if any(pos[r] < len(order) for r, order in enumerate(orders)):
        refuse(name, pp, m, vp)
    counts = np.zeros((pp, pp * vp * 3), dtype=np.int64)
    np.add.at(counts, (np.array(rank), np.array(cost_entry)), 1)
    sends = tuple(sum((op == "F" and c * pp + r < last) + (op == "B" and c * pp + r > 0) for op, _, c in order)
                  for r, order in enumerate(orders))
    in_flight = tuple(in_flight_per_chunk(order, vp, "W" if split else "B") for order in orders)
    return Compiled(name, pp, m, vp, split, tuple(rank), tuple(cost_entry), tuple(waits_for), tuple(message), counts,
                    sends, in_flight)


def in_flight_per_chunk(order: Sequence[tuple[str, int, int]], vp: int, release: str) -> np.ndarray:
    """The pairs in flight per chunk right after each F of one rank (a peak only ever follows an F)."""
    delta = np.zeros((len(order), vp), dtype=np.int64)
    for i, (op, _, c) in enumerate(order):
        delta[i, c] = 1 if op == "F" else -1 if op == release else 0
    forwards = np.array([op == "F" for op, _, _ in order], dtype=bool)
    return np.cumsum(delta, axis=0)[forwards]


@lru_cache(maxsize=64)
def compiled(name: str, pp: int, microbatches: int, vp: int = 1) -> Compiled:
    """Schedule ``name``'s compute orders compiled; cached (``ConfigError`` for sizes it cannot take)."""
    return compile_orders(name, pp, microbatches, vp, compute_orders(name, pp, microbatches, vp))


@dataclass(frozen=True)
class StageTiming:
    step: float  # the makespan: the last action's end on any rank
    busy: tuple[float, ...]
    finish: tuple[float, ...]  # each rank's own end
    starts: tuple[float, ...] = ()  # when each compute node started (``Compiled``'s numbering)

    @property
    def idle(self) -> tuple[float, ...]:
        """step − busy; a difference within rounding of the step (the same costs summed in another order) is 0."""
        return tuple(self.step - b if self.step - b > ROUNDING * self.step else 0.0 for b in self.busy)

    @property
    def bubble_fraction(self) -> float:
        """Σ idle / (pp · step), as ``tpsim.pipeline.clock.Timeline.bubble_fraction``."""
        return sum(self.idle) / (len(self.busy) * self.step) if self.step else 0.0


def node_costs(c: Compiled, compute, message) -> tuple[list[float], list[float]]:
    """Each node's cost and hop (``tpsim.pipeline.cost_rule.price``'s lists) from ``compute[rank][chunk][op]`` and
    ``message[sender stage][direction]`` seconds."""
    table = np.asarray(compute, dtype=float).reshape(c.pp * c.vp * 3)
    hops = np.append(np.asarray(message, dtype=float).reshape(c.pp * c.vp * 2), 0.0)  # hop −1: none, 0 s
    return table[c.cost_index].tolist(), hops[c.message_index].tolist()


def timed(c: Compiled, compute, message, start: Sequence[float] | None = None, runs=None) -> StageTiming:
    """Time ``c`` with ``compute[rank][chunk][op]`` seconds (op F, B, W) and ``message[sender stage][direction]``
    seconds (direction F, B: α + β·bytes of that message) by the one cost rule (``tpsim.pipeline.cost_rule``);
    each rank's clock starts at ``start[rank]`` (default 0: a rank that waits for a collective before its
    schedule starts later). ``runs``: nodes whose end is a function of their start (``cost_rule.price``)."""
    cost, hop = node_costs(c, compute, message)
    out = price(c.rank, c.waits_for, hop, cost, c.pp, None if start is None else [float(t) for t in start], runs)
    busy = (c.counts @ np.asarray(compute, dtype=float).reshape(c.pp * c.vp * 3)).tolist()
    return StageTiming(max(out.clocks, default=0.0), tuple(busy), tuple(out.clocks), tuple(out.starts))


def in_flight_peak(c: Compiled, weights: Sequence[Sequence[float]]) -> list[float]:
    """Each rank's peak of Σ_chunk pairs in flight × ``weights[rank][chunk]`` (weights 1: the peak in flight)."""
    return [float((h @ np.asarray(w, dtype=float)).max()) for h, w in zip(c.in_flight, weights)]
