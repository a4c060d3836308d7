"""The communication tracer: one record per collective call, tagged with the layer and phase that issued it.
A pipeline's point-to-point message is recorded at both ends (``P2PEvent``: op "send" or "recv", the peer, the
micro-batch and the model chunk). A collective pipelined with a GEMM (``--tp-comm-overlap``) is recorded once per
step (``OverlapEvent``: the chunk's bytes and the GEMMs it hid behind).

Layers do not pass their names to the communication layer by hand. They open a *region*:

    with tracer.region(scope=self.path, phase=FORWARD):
        y = tp_group.all_reduce(partial)            # recorded as scope=self.path, phase="forward"

Regions nest; an inner region that leaves ``scope`` or ``phase`` as ``None`` inherits the outer one, so a
training loop can say ``with tracer.region(phase=DP_SYNC)`` around a whole gradient sync. Phase names are the
constants of ``tpsim.phases``. The tracer is an ordinary object owned by the process grid (one per rank), never
module-level state.

*Compute spans* time the work between collectives. ``tracer.span(scope, phase)`` records one ``SpanEvent``
(start, duration) when the block ends; the GPT wiring opens one around every sub-layer call, so spans nest
like the module tree (``transformer.h.0`` contains ``transformer.h.0.attn``). A span only times: it does not
change the scope or phase that collectives inside it are tagged with (that stays the job of ``region``).
Spans and collectives share one clock, so a timeline can lay them side by side.

*Kind spans*: while a span is open the tracer is ``tpsim.kinds``' recorder, so the marks the layers carry
(matmul, elementwise, softmax_norm) are recorded too, with the scope and phase of the innermost open span.
They are many (a few per layer call), so they are kept as plain tuples in ``marks`` and become ``SpanEvent``s
of that ``kind`` only when read (``span_events()``); the spans in ``spans`` have kind "layer".
``tpsim.trace.kind_split`` turns both into the per-layer split of ``tpsim report DIR --by kind``.

Byte accounting (see ``tpsim.cost``): ``bytes`` is the size of the full logical tensor of the collective,
``wire_bytes`` what one rank sends under the bandwidth-optimal (ring) algorithm.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Iterator

from tpsim import kinds
from tpsim.kinds import LAYER


def _fields(event) -> dict:
    """``dataclasses.asdict`` without its recursive deep copy (every field here is a number, string or tuple of
    ints): the records of every step are turned into dicts for the gather to rank 0, ~10x faster this way."""
    return {name: getattr(event, name) for name in event.__slots__}  # slots=True: the fields, in order


@dataclass(slots=True)
class CommEvent:
    """One collective call as seen by one rank."""

    rank: int  # world rank that recorded it
    step: int  # training step (set by the caller with ``tracer.step``)
    phase: str  # a ``tpsim.phases`` name: "forward", "backward", "dp_sync", ... ; "" outside any region
    scope: str  # dotted module path of the issuing layer, e.g. "transformer.h.0.mlp"; "" at top level
    op: str  # "all_reduce", "all_gather", "reduce_scatter", "broadcast", "gather", "barrier"; "send", "recv"
    reduce_op: str  # "sum" / "max" / "min" for reductions, "" otherwise
    group: str  # "tp", "dp", "world"; "pp", "embedding", "mp" with pipelines
    group_size: int
    group_ranks: tuple[int, ...]  # world ranks of the group, in group-rank order
    dtype: str
    shape: tuple[int, ...]  # shape of the logical tensor that ``bytes`` measures
    bytes: int
    wire_bytes: int
    start: float  # seconds since the tracer's t0
    duration: float  # seconds (a non-blocking call: from its issue to the end of its wait)
    overlap: bool = False  # issued non-blocking to run beside compute (--overlap-grad-reduce / -param-gather)

    def as_dict(self) -> dict:
        d = _fields(self)
        d["shape"] = list(self.shape)
        d["group_ranks"] = list(self.group_ranks)
        return d


_COMM_SLOTS = CommEvent.__slots__


@dataclass(slots=True)
class P2PEvent(CommEvent):
    """One point-to-point transfer as seen by one end: op "send" (recorded by the sender) or "recv" (by the
    receiver), so every message is recorded exactly twice. The fields of a collective, and three more."""

    peer: int = -1  # world rank at the other end
    microbatch: int = -1  # the pipeline micro-batch the message belongs to
    chunk: int = 0  # the model chunk (of the sender for a send, of the receiver for a recv)

    def as_dict(self) -> dict:
        d = {name: getattr(self, name) for name in (*_COMM_SLOTS, *P2PEvent.__slots__)}
        d["shape"] = list(self.shape)
        d["group_ranks"] = list(self.group_ranks)
        return d


@dataclass(slots=True)
class OverlapEvent(CommEvent):
    """One step of a collective pipelined with a GEMM (``--tp-comm-overlap``, ``tpsim.tp.collective_matmul``):
    op "all_gather" or "reduce_scatter" of one chunk (``bytes``, ``wire_bytes``: the chunk this rank sent in the
    step, so the steps of one collective add up to its wire bytes). The fields of a collective, and three more."""

    gemms: tuple[tuple[int, int, int], ...] = ()  # (m, n, k) of each [m, k] x [k, n] GEMM the collective overlapped
    overlap_step: int = 0  # this step, 1 .. overlap_steps (the clock prices the collective at its last step)
    overlap_steps: int = 0  # the collective's steps: group size − 1

    def as_dict(self) -> dict:
        d = {name: getattr(self, name) for name in (*_COMM_SLOTS, *OverlapEvent.__slots__)}
        d["shape"] = list(self.shape)
        d["group_ranks"] = list(self.group_ranks)
        d["gemms"] = [list(g) for g in self.gemms]
        return d


@dataclass(slots=True)
class SpanEvent:
    """One timed block of compute (a layer's forward or backward) as seen by one rank."""

    rank: int
    step: int
    phase: str  # "forward", "backward", ... (whatever the opener passed)
    scope: str  # dotted module path, e.g. "transformer.h.0.attn"; "" for the whole model
    start: float  # seconds since the tracer's t0 (the same clock as CommEvent.start)
    duration: float  # seconds
    kind: str = LAYER  # "layer" (a module's forward/backward) or a tpsim.kinds mark inside it: "matmul", ...

    def as_dict(self) -> dict:
        return _fields(self)


class _Span:
    """The context manager behind ``Tracer.span``: a plain class, not a generator, because one opens around
    every layer call and a generator-based context manager costs several times more."""

    __slots__ = ("tracer", "scope", "phase", "t", "outer", "recorder")

    def __init__(self, tracer: "Tracer", scope: str, phase: str) -> None:
        self.tracer, self.scope, self.phase = tracer, scope, phase

    def __enter__(self) -> "_Span":
        tr = self.tracer
        self.outer, tr._open = tr._open, self  # marks inside are tagged with this span's scope and phase
        self.recorder, kinds._recorder = kinds._recorder, tr._record_kind  # kinds.install, minus a call
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc) -> bool:
        end = time.perf_counter()
        tr = self.tracer
        tr._open = self.outer
        kinds._recorder = self.recorder
        # Appended when the span *ends*, so a child comes before its parent; readers sort by start.
        tr.spans.append(SpanEvent(tr.rank, tr.step, self.phase, self.scope, self.t - tr.t0, end - self.t))
        return False


class _Region:
    """The context manager behind ``Tracer.region`` (a plain class for the same reason as ``_Span``: every
    parallel layer opens one per call, traced or not)."""

    __slots__ = ("tracer", "scope", "phase", "saved")

    def __init__(self, tracer: "Tracer", scope: str | None, phase: str | None) -> None:
        self.tracer, self.scope, self.phase = tracer, scope, phase

    def __enter__(self) -> "Tracer":
        tr = self.tracer
        self.saved = tr._scope, tr._phase
        if self.scope is not None:
            tr._scope = self.scope
        if self.phase is not None:
            tr._phase = self.phase
        return tr

    def __exit__(self, *exc) -> bool:
        self.tracer._scope, self.tracer._phase = self.saved
        return False


_NO_SPAN = nullcontext()  # shared and reusable: a disabled tracer allocates nothing per span


class Tracer:
    """Collects ``CommEvent`` and ``SpanEvent`` records for one rank.

    Cheap when disabled: ``record`` returns at once and ``span`` hands back a shared no-op context.
    """

    def __init__(self, rank: int = 0, enabled: bool = True) -> None:
        self.rank = rank
        self.enabled = enabled
        self.step = 0
        self.events: list[CommEvent] = []
        self.spans: list[SpanEvent] = []  # kind "layer"; the marks inside them: ``marks``, ``span_events()``
        self.marks: list[tuple] = []
        self.t0 = time.perf_counter()
        self._scope = ""
        self._phase = ""
        self._open: _Span | None = None  # the innermost open span
        self._record_kind = self._kind_span  # bound once: a span installs it without allocating

    def _kind_span(self, kind: str, start: float, end: float) -> None:
        """``tpsim.kinds``' recorder: a mark inside the innermost open span, as a span of that ``kind``."""
        span = self._open
        if self.enabled and span is not None:  # a tuple in SpanEvent's field order: a fifth of a SpanEvent's cost
            self.marks.append((self.step, span.phase, span.scope, start - self.t0, end - start, kind))

    def span_events(self) -> list[SpanEvent]:
        """The layer spans and the kind marks inside them, all as ``SpanEvent``s (unsorted: readers sort by start)."""
        return self.spans + [SpanEvent(self.rank, *mark) for mark in self.marks]

    # --- where we are -----------------------------------------------------------------------------------------
    @property
    def scope(self) -> str:
        return self._scope

    @property
    def phase(self) -> str:
        return self._phase

    def region(self, scope: str | None = None, phase: str | None = None) -> "_Region":
        """Tag every collective issued inside with ``scope``/``phase`` (``None`` keeps the outer value)."""
        return _Region(self, scope, phase)

    def span(self, scope: str, phase: str):
        """Time the block as a compute span ``(scope, phase)``; spans opened inside it nest inside it."""
        if not self.enabled:
            return _NO_SPAN
        return _Span(self, scope, phase)

    @contextmanager
    def paused(self) -> Iterator["Tracer"]:
        """Do not record collectives or spans inside this block (e.g. a verification pass)."""
        saved = self.enabled
        self.enabled = False
        try:
            yield self
        finally:
            self.enabled = saved

    # --- records ----------------------------------------------------------------------------------------------
    def record(self, **fields) -> CommEvent | None:
        """Append one ``CommEvent`` under the open scope and phase, and return it (None when disabled)."""
        if not self.enabled:
            return None
        event = CommEvent(rank=self.rank, step=self.step, phase=self._phase, scope=self._scope, **fields)
        self.events.append(event)
        return event

    def record_p2p(self, **fields) -> None:
        """A send or a recv (``P2PEvent``): the collective's fields plus peer, microbatch and chunk."""
        if not self.enabled:
            return
        self.events.append(P2PEvent(rank=self.rank, step=self.step, phase=self._phase, scope=self._scope, **fields))

    def record_overlap(self, **fields) -> None:
        """One step of an overlapped collective (``OverlapEvent``): the collective's fields plus the GEMMs."""
        if not self.enabled:
            return
        self.events.append(OverlapEvent(rank=self.rank, step=self.step, phase=self._phase, scope=self._scope,
                                        **fields))

    def reset(self, t0: float | None = None) -> None:
        """Forget all collectives and spans (e.g. at the start of a step); optionally restart the clock."""
        self.events.clear()
        self.spans.clear()
        self.marks.clear()
        if t0 is not None:
            self.t0 = t0

    def select(self, **match) -> list[CommEvent]:
        """Records whose fields equal every given value, e.g. ``select(phase="forward", op="all_reduce")``."""
        return [e for e in self.events if all(getattr(e, k) == v for k, v in match.items())]
