"""ZeRO-3's per-piece collectives on the comm stream, prefetched one piece ahead: the one rule the planner and
the live clock price an action by (``tpsim.plan.zero3_time``, ``tpsim.live_pipeline.clock``).

Under ZeRO-3 (Rajbhandari et al. 2019, arXiv:1910.02054, §5.3; PyTorch FSDP's FULL_SHARD with backward and
forward prefetch) an action's pieces (``tpsim.pipeline.overlap``: the embedding, each layer, the head) each
need their parameters all-gathered before they compute (``before``), and a backward piece's gradients are
reduce-scattered after it (``after``). One comm stream per GPU runs them in issue order:

    piece i's compute starts when piece i − 1's ends and piece i's gather has arrived;
    piece i + 1's gather is issued when piece i's compute starts (one piece ahead: two in memory at once);
    piece i's reduce-scatter is issued when its compute ends.

The first gather waits in full (nothing computes before it), each later one only for what its predecessor's
compute does not hide; the action ends when its compute and its stream are both done (the last
reduce-scatter's tail included), so nothing of one action's stream spills into the next. An action that gathers
nothing (a split backward's W: dW needs no parameters) runs its pieces back to back, its reduce-scatters behind
them.

    start_0 = start + before_0
    start_i = max(end_{i−1}, gather_i's end),      end_i = start_i + compute_i
    action end = max(end_last, the stream's end)       exposed = action end − start − Σ compute_i

MPI-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class StreamSpan(NamedTuple):
    """One collective on the comm stream: ``kind`` "gather" or "scatter" of piece ``piece`` (its index in the
    action's execution order), from ``start`` to ``end``."""

    kind: str
    piece: int
    start: float
    end: float


class Prefetched(NamedTuple):
    """One action under the rule (module docstring): each piece's compute end, the stream's spans (a collective
    of 0 seconds leaves none), and the action's end."""

    ends: tuple[float, ...]
    spans: tuple[StreamSpan, ...]
    end: float


def prefetched(start: float, before: Sequence[float] | None, compute: Sequence[float],
               after: Sequence[float]) -> Prefetched:
    """An action from ``start`` of pieces costing ``compute`` (execution order), piece i waiting for its gather
    of ``before[i]`` seconds and followed by its reduce-scatter of ``after[i]`` (module docstring). ``before``
    None: the action gathers nothing (a split backward's W, ZeRO-2), so no piece waits for the stream; a gather
    of 0 seconds is still issued on it, behind what the stream holds."""
    n, spans, ends = len(compute), [], []

    def issue(kind: str, piece: int, at: float, seconds: float) -> float:
        if seconds:
            spans.append(StreamSpan(kind, piece, at, at + seconds))
        return at + seconds

    free = arrived = issue("gather", 0, start, before[0]) if n and before is not None else start
    t = start
    for i in range(n):
        begin = t if t >= arrived else arrived
        if i + 1 < n and before is not None:  # prefetch the next piece's gather while this one computes
            free = arrived = issue("gather", i + 1, free if free >= begin else begin, before[i + 1])
        t = begin + compute[i]
        ends.append(t)
        free = issue("scatter", i, free if free >= t else t, after[i])
    return Prefetched(tuple(ends), tuple(spans), t if t >= free else free)
