"""The live virtual clock: modelled time on every pipeline rank, so a bubble can be measured on live ranks.

Wall-clock time on an oversubscribed CPU cannot show a bubble (an idle rank hands its core to a busy one). So
each rank keeps a clock of *modelled* time, charged exactly as the MPI-free clock charges a schedule
(``tpsim.pipeline.clock``; the live run uses its ``unit(schedule)`` costs, the textbook's picture):

    F, B, W: clock += t_op + Σ α-β time of the collectives traced inside it    (unit: 1 and 2 a stage, a chunk
                                                                                1/v of that; collectives free)
             (--tp-comm-overlap: a collective pipelined with GEMMs, its exposed time, tpsim.plan.tp_overlap)
    SEND: the message carries the sender's clock (8 bytes after the payload, not counted as model traffic)
    RECV: clock = max(own clock, the sender's + α + β·bytes)    (unit: messages free; the wait is idle time)
          (F, B, W and RECV by the one cost rule of every clock, ``tpsim.pipeline.cost_rule``)
    a collective after the schedule: clock = the group's latest clock + its α-β cost   (unit: not charged)
    ZeRO-3's F, B, W: piece by piece, the all-gathers and reduce-scatters on the comm stream, prefetched one piece
             ahead (``sharded_action``, ``tpsim.pipeline.prefetch``: the planner's rule)
    ZeRO-2's reduce-scatters: each bucket's, every micro-batch, on the comm stream from the end of the piece that
             finished it (``zero2_sync``, ``tpsim.pipeline.overlap.zero2_stream``); the clock waits before the step

The data still moves through real MPI, so numbers stay real and the time is deterministic: the same run gives
the same timeline on any machine, loaded or not — and the same numbers as ``simulate(schedule, costs)``, since
the costs are the same functions. Under ``--clock GPU`` the costs are the planner's for the run's layout
(``tpsim.plan.of_run.clock_costs``): per-stage F, B and W from its kernels on the GPU's roofline; each collective
traced inside an action (the TP group's, and the KV heads' gradient sum) steps·α + wire bytes·β on the link the
planner gives its group (``tpsim.cost``, the same formulas); each message α + β·bytes on the pipeline's link.
Every TP rank of a stage runs the same actions with the same collectives, so a TP group's latest arrival is its
own clock: inside an action nothing needs exchanging. After the schedule the clocks of a group differ (the
first and the last stage in the embedding group), so ``tpsim.live_pipeline.step`` exchanges them untraced and ends the
collective at the latest plus its cost (``LiveClock.collective``).

Every compute action, receive and collective after the schedule leaves a ``VirtualSpan`` (its start and end on
this clock: a receive that ends later than it starts waited), the "virtual clock" tracks of ``timeline.json``.
``schedule_end`` is the clock when the rank's last action ran: the bubble is measured there — T = the largest
``schedule_end`` of the pipeline; a rank was busy v·m·(t_F + t_B) of it (its chunks' share) and idle the rest.
The idle share is the formula of ``tpsim.predict.pipeline.bubble_fraction``: (p − 1)/(m + p − 1) for AFAB and
1F1B, (p − 1)/(v·m + p − 1) interleaved (Narayanan et al. 2021, §2.2). ``time`` after the step is the step's
virtual time, its collectives included. MPI-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from tpsim.pipeline.clock import Costs
from tpsim.pipeline.cost_rule import arrival, begin
from tpsim.pipeline.overlap import Stream, after_compute, comm_stream, gated_ends, piece_ends, zero2_stream
from tpsim.pipeline.prefetch import prefetched


class VirtualSpan(NamedTuple):
    """One action on the virtual clock: ``op`` F, B, W, RECV_F or RECV_B of (``microbatch``, ``chunk``), from
    ``start`` to ``end`` (a receive: the time it waited for its message, 0 when the message was there); a
    collective after the schedule: ``op`` its name, ``microbatch`` −1, from this rank's clock to its end."""

    op: str
    microbatch: int
    chunk: int
    start: float
    end: float


@dataclass
class LiveClock:
    """One rank's modelled time in a step: ``time`` now, ``busy`` spent computing (the rest was waiting), and the
    ``spans`` of its compute actions and receives in the order they ran. ``costs``: what each action costs
    (``tpsim.pipeline.clock.Costs``), ``rank``: this pipeline rank. ``comm``: the part of ``busy`` its
    collectives took; ``schedule_end``: the clock when its schedule ended (set by the executor)."""

    costs: Costs
    rank: int
    time: float = 0.0
    busy: float = 0.0
    comm: float = 0.0
    schedule_end: float = 0.0
    spans: list[VirtualSpan] = field(default_factory=list)
    piece_end: dict[tuple[int, tuple], float] = field(default_factory=dict)  # (stage, piece) -> its last end
    every_end: dict[tuple[int, int, tuple], float] = field(default_factory=dict)  # (micro-batch, stage, piece) -> end
    dp: Stream | None = None  # the DP gradient buckets on the comm stream (``dp_sync``)
    gates: dict[tuple[int, tuple], float] | None = None  # --overlap-param-gather: (stage, piece) -> its gather's end
    gather_exposed: float = 0.0  # ZeRO-1's parameter all-gather: the forward's waits, or all of it after the sync
    sharded_exposed: float = 0.0  # ZeRO-2/3's collectives inside the actions: what the stream did not hide
    sharded_spans: list[VirtualSpan] = field(default_factory=list)  # their spans on the comm stream

    @property
    def prices_collectives(self) -> bool:
        return self.costs.collective is not None

    def priced(self, events) -> float:
        """Seconds of the collective calls ``events`` (``tpsim.comm.tracer.CommEvent``s) one after the other."""
        price, t = self.costs.collective, 0.0
        for e in events:
            gemms = getattr(e, "gemms", ())  # a step of a collective pipelined with GEMMs (--tp-comm-overlap):
            if not gemms:
                t += price(e.op, e.group, e.group_size, e.wire_bytes)
            elif e.overlap_step == e.overlap_steps:  # priced once, at its last step: its exposed time
                t += price(e.op, e.group, e.group_size, e.wire_bytes * e.overlap_steps, gemms=gemms)
        return t

    def compute(self, op: str, chunk: int, microbatch: int, collectives=()) -> None:
        """A forward or backward of (micro-batch, chunk) ran, issuing the traced ``collectives``: the clock moves
        by its cost (plus theirs, when the costs price collectives)."""
        cost, start = self.costs.compute[op](self.rank, chunk, microbatch), self.time
        if self.prices_collectives:
            comm = self.priced(collectives)
            cost += comm
            self.comm += comm
        self.time = start + cost  # the cost rule (tpsim.pipeline.cost_rule): it waits for nothing, so it starts now
        self.busy += cost
        self.spans.append(VirtualSpan(op, microbatch, chunk, start, self.time))

    def pieces(self, op: str, chunk: int, stage: int, keys: list[tuple], scoped: list[tuple]) -> None:
        """The action just charged (the last micro-batch's final backward on ``chunk``, virtual stage ``stage``)
        spread over its pieces ``keys`` in execution order (``tpsim.pipeline.overlap``): each its compute seconds
        (``costs.pieces``; unit costs: the action's equally over its layers) plus the α-β time of ``scoped``,
        the ``(piece, event)`` of every collective traced inside it. Records each piece's end."""
        span = self.spans[-1]
        seconds, _ = self._piece_seconds(op, chunk, span.microbatch, keys, scoped)
        for key, end in zip(keys, piece_ends(span.start, seconds)):
            self.piece_end[stage, key] = self.every_end[span.microbatch, stage, key] = end

    def _piece_seconds(self, op: str, chunk: int, microbatch: int, keys: list[tuple], scoped: list[tuple]):
        """Each piece's seconds, ``keys`` in backward order (``pieces``' rule), and the collectives' part."""
        if self.costs.pieces is not None:
            seconds = list(self.costs.pieces(op, self.rank, chunk))
        else:
            layers = sum(k[0] == "layer" for k in keys)
            cost = self.costs.compute[op](self.rank, chunk, microbatch)
            seconds = [cost / layers if k[0] == "layer" else 0.0 for k in keys]
        comm = 0.0
        if self.prices_collectives:
            at = {k: i for i, k in enumerate(keys)}
            for key, e in scoped:
                if key not in at:
                    raise ValueError(f"a collective of scope {e.scope!r} belongs to piece {key}, not one of {keys}")
                price = self.priced([e])
                seconds[at[key]] += price
                comm += price
        return seconds, comm

    def gated_forward(self, chunk: int, stage: int, keys: list[tuple], scoped: list[tuple]) -> None:
        """Micro-batch 0's forward on ``chunk`` under ``--overlap-param-gather``: its pieces (``keys`` in backward
        order, run reversed) one after another, each no earlier than its gate (``gates``); the waits add to
        ``gather_exposed``, the pieces to ``busy``."""
        seconds, comm = self._piece_seconds("F", chunk, 0, keys, scoped)
        start = self.time
        ends, waited = gated_ends(start, seconds[::-1], [self.gates.get((stage, k), 0.0) for k in keys[::-1]])
        self.time, self.gather_exposed = ends[-1], self.gather_exposed + waited
        self.busy += sum(seconds)
        self.comm += comm
        self.spans.append(VirtualSpan("F", 0, chunk, start, self.time))

    def sharded_action(self, op: str, chunk: int, microbatch: int, keys: list[tuple], scoped: list[tuple],
                       gathers: list[tuple], scatters: list[tuple], unshard: bool) -> None:
        """A forward or backward of (micro-batch, chunk) under ZeRO-2/3 (``tpsim.pipeline.prefetch``): its pieces
        (``keys`` in backward order; F runs them reversed) each its compute seconds and ``scoped`` TP
        collectives, ZeRO-3's all-gathers (``gathers``: ``(piece, event)``) before their pieces, prefetched one
        ahead — the action an UNSHARD sits on (``unshard``; a W gathers nothing) —, the reduce-scatters
        (``scatters``) after theirs, on the comm stream; the action ends when both streams are done. Its whole length is
        busy (the planner charges the exposed part to the action too)."""
        seconds, comm = self._piece_seconds(op, chunk, microbatch, keys, scoped)
        order = keys[::-1] if op == "F" else keys
        at, compute = {k: i for i, k in enumerate(order)}, seconds[::-1] if op == "F" else seconds
        before, after = [0.0] * len(order), [0.0] * len(order)
        for side, placed in ((before, gathers), (after, scatters)):
            for key, e in placed:
                side[at[key]] += self.priced([e])
        start = self.time
        run = prefetched(start, before if unshard else None, compute, after)
        self.time = run.end
        exposed = run.end - start - sum(compute)
        self.busy += run.end - start
        self.comm += comm + exposed
        self.sharded_exposed += exposed
        self.spans.append(VirtualSpan(op, microbatch, chunk, start, self.time))
        self.sharded_spans += [VirtualSpan(f"{'all-gather' if s.kind == 'gather' else 'reduce-scatter'} "
                                           f"{' '.join(map(str, order[s.piece]))}", microbatch, -1, s.start, s.end)
                               for s in run.spans]

    def param_gather(self, seconds: list[float]) -> None:
        """ZeRO-1's all-gathers without the overlap: after the DP sync (the optimizer costs nothing here), all
        exposed."""
        start = self.time
        stream = after_compute(len(seconds), seconds, start)
        self.time, self.gather_exposed = stream.end, stream.exposed
        self.spans.append(VirtualSpan("param all-gather", -1, 0, start, self.time))

    def dp_sync(self, latest: float, order: list[int], ready: list[float] | None, seconds: list[float]) -> None:
        """The DP gradient buckets of the step: ``seconds[b]`` each on the DP link; ``ready`` (overlapped: each
        bucket's ready time, ``order`` the issue order) on the comm stream, else one after another from
        ``latest`` (the DP group's latest clock); the clock then waits for the stream (``tpsim.pipeline.overlap``)."""
        start = self.time
        self.dp = after_compute(len(seconds), seconds, latest) if ready is None else \
            comm_stream(order, ready, seconds, latest)
        self.time = self.dp.end
        self.spans.append(VirtualSpan("DP sync" if ready is None else "DP exposed", -1, 0, start, self.time))

    def zero2_sync(self, latest: float, ready: list[list[float]], seconds: list[float], once: set[int]) -> None:
        """ZeRO-2's reduce-scatters of the step on the comm stream (``tpsim.pipeline.overlap.zero2_stream``, the
        planner's rule): ``ready[j][b]`` bucket b's in micro-batch j's backward, each ``seconds[b]``, a bucket in
        ``once`` (the held one) once; the clock then waits for the stream from ``latest``."""
        start = self.time
        self.dp = zero2_stream(ready, seconds, latest, once)
        self.time = self.dp.end
        self.spans.append(VirtualSpan("DP exposed", -1, 0, start, self.time))

    def comm_spans(self) -> list[VirtualSpan]:
        """The comm stream's spans of the step (chunk −1: drawn on the "comm" track): ZeRO-2/3's collectives
        inside the actions, then one per DP bucket."""
        if self.dp is None:
            return list(self.sharded_spans)
        return self.sharded_spans + [VirtualSpan(f"DP bucket {s.bucket}" + (f" of micro-batch {s.microbatch}"
                                                 if s.microbatch >= 0 else ""), -1, -1, s.start, s.end)
                                     for s in self.dp.spans]

    def collective(self, name: str, latest: float, events) -> None:
        """A collective after the schedule, ``events`` its traced calls: it ends at ``latest`` (the group's
        latest clock, this one's included) plus their cost."""
        start = self.time
        self.time = begin(start, latest) + self.priced(events)  # latest ≥ this clock: the group's, its own included
        self.spans.append(VirtualSpan(name, -1, 0, start, self.time))

    def arrive(self, sent: float, message: tuple[str, int, int], chunk: int = 0) -> None:
        """``message`` (direction, micro-batch, sender's virtual stage), sent at the sender's ``sent``, arrived for
        this rank's ``chunk``: nothing here can start before it has crossed the link."""
        c, start = self.costs, self.time
        self.time = begin(start, arrival(sent, c.alpha + c.beta * c.message_bytes(*message)))
        self.spans.append(VirtualSpan(f"RECV_{message[0]}", message[1], chunk, start, self.time))


def bubble_measured(clocks: list[tuple[float, float]]) -> tuple[float, float]:
    """``(T, idle share)`` from every stage's ``(final time, busy)`` of one pipeline: T the latest clock, the
    idle share Σ (T − busy_i) / (p·T)."""
    end = max(t for t, _ in clocks)
    return end, sum(end - busy for _, busy in clocks) / (len(clocks) * end)
