"""Run one pipeline rank's action list (``tpsim.pipeline``): the schedule is data, this is its interpreter.

For every action of ``schedule.ranks[pp_rank]``, in order, on model chunk ``action.chunk`` (virtual stage
v = chunk·pp + pp_rank):

    RECV_F j   receive micro-batch j's input activation from virtual stage v − 1     (waits for it)
    F j        chunk forward on it (stage 0: on micro-batch j's token ids); keep the cache for B
    SEND_F j   post the output activation to virtual stage v + 1                   (never waits)
    RECV_B j   receive the gradient of micro-batch j's output from virtual stage v + 1
    B j        chunk backward from it (the last stage: from the loss seed); free the cache at once
    W j        (a split backward, ZB-H1) the weight gradients B j left: B ran inside ``deferred_weight_grads``
               (``tpsim.nn.module``), so it computed the input gradient only and queued every layer's W
               with the tensors it reads; W runs that queue
    SEND_B j   post the input's gradient to virtual stage v − 1

and, in a run with a gradient group, the collectives the pass of ``tpsim.pipeline.collectives`` placed on the
compute actions (the lists must carry exactly ZeRO's stage's, a ``ConfigError`` otherwise), each run with the
compute action it serves:

    UNSHARD j     ZeRO-3: the F or B after it gathers each unit's parameters as it reaches it (the units' hooks,
                  ``tpsim.train.zero3``), and the clock prefetches those gathers one piece ahead; ZeRO-1/2: the
                  F after it is where the last step's all-gathers are waited for (``--overlap-param-gather``)
    RESHARD j     the gathered parameters of the F or B before it freed (``release_params``)
    REDUCE_GRAD j the gradient sync is armed for the backward before it (its buckets issued as they are
                  finished, ``tpsim.train.grad_ready``; ZeRO-2/3: reduce-scattered into the owned slices), and
                  ends with it (``disarm``: the last layer's buckets, anything left)

A compute action and its collectives are charged to the clock together, as one action (its gathers before it,
its reduce-scatters after it, on the comm stream). Gradients add up over the micro-batches (every layer's
backward adds, ``tpsim.nn.module``). A message is tagged
by (direction, micro-batch, sender's virtual stage), so it meets exactly the RECV the schedule names; posted
sends are completed at the end of the step. Activations and caches live per (micro-batch, chunk) from F to B:
``peak_in_flight`` is the most this rank held at once (1F1B: min(p − i, m) on stage i; AFAB: m; interleaved:
(micro-batch, chunk) pairs, ``tpsim.predict.pipeline.peak_in_flight``); with a split backward a micro-batch is
held until its W, whose queue keeps W's inputs (ZB-H1: min(p, m), as ``tpsim.pipeline.clock.in_flight``).

Every schedule is checked (``tpsim.pipeline.check.check``) before the executor takes it: a list that would
hang, or leave a micro-batch half done, is a one-line ``ConfigError`` before any message moves.

Traced: every send and recv under scope "pipeline", phase forward (activations) or backward (gradients). Each
message also carries its sender's virtual clock (``tpsim.live_pipeline.clock``: by default the unit costs of
``tpsim.pipeline.clock.unit`` — a stage's F 1, B 2, a chunk's 1/v of that, messages free; under ``--clock GPU``
the planner's costs), so the result holds this rank's modelled time of the step, how much of it was busy, and
the virtual span of every compute action and receive (``result.clock.spans``). A clock that prices collectives
(a GPU's) charges each compute action the collectives the tracer recorded while it ran, so it needs the tracer
enabled (a ``RuntimeError`` otherwise: an untraced step would run on a clock with its collectives free).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from tpsim.comm import Group
from tpsim.nn.module import deferred_weight_grads
from tpsim.phases import BACKWARD, FORWARD
from tpsim.errors import ConfigError
from tpsim.pipeline.actions import COLLECTIVES, Schedule
from tpsim.pipeline.check import check
from tpsim.pipeline.collectives import served, with_collectives, without_collectives
from tpsim.pipeline.clock import Costs, unit
from tpsim.live_pipeline.clock import LiveClock
from tpsim.live_pipeline.in_flight import InFlight
from tpsim.train.protocol import zero_of

PIPELINE_SCOPE = "pipeline"
FORWARD_MESSAGE, BACKWARD_MESSAGE = 0, 1


def message_tag(direction: int, microbatch: int, sender_stage: int, stages: int) -> int:
    """The MPI tag of one message: (direction, micro-batch, virtual stage of its sender), one number."""
    return (microbatch * stages + sender_stage) * 2 + direction


def action_tag(schedule, rank: int, action) -> int:
    """The tag a SEND of ``rank`` posts its message under, or a RECV asks for: the ``message_tag`` of the message
    it moves (``Schedule.message``), so a send and the receive it pairs with name the same tag."""
    direction, microbatch, sender = schedule.message(rank, action)
    return message_tag(FORWARD_MESSAGE if direction == "F" else BACKWARD_MESSAGE, microbatch, sender, schedule.stages)


@dataclass
class ExecutorResult:
    """What one rank's schedule produced: the last stage's per-micro-batch mean losses, the peak of micro-batches
    held at once, and the order of compute actions actually run (``"F3.0"``: forward of micro-batch 3, chunk 0)."""

    losses: dict[int, float] = field(default_factory=dict)
    peak_in_flight: int = 0
    peak_layer_bytes: int = 0  # the most bytes of layer activations held at once (``tpsim.live_pipeline.in_flight``)
    ran: list[str] = field(default_factory=list)
    clock: LiveClock | None = None  # modelled time: its end and its busy part


def _ran(out: ExecutorResult, op: str, chunk: int, microbatch: int, collectives) -> list:
    """Compute action ``op`` of (micro-batch, chunk) ran, issuing the traced ``collectives``: listed, and charged
    (a DP bucket it issued to overlap, ``--overlap-grad-reduce``, runs on the comm stream, not in the action)."""
    out.ran.append(f"{op}{microbatch}.{chunk}")
    inside = [e for e in collectives if not e.overlap]
    out.clock.compute(op, chunk, microbatch, inside)
    return inside


class Executor:
    """Interprets ``schedule`` on this rank: ``chunks[c]`` is model chunk c, ``pp_group`` the pipeline group,
    ``boundary`` the shape of one micro-batch's activation between stages ([b, s, h]; SP: [b, s/t, h]) in
    ``dtype`` (the model's), which its gradient shares. ``costs``: the virtual clock's (default
    ``tpsim.pipeline.clock.unit(schedule)``). ``ConfigError`` for a schedule ``check`` refuses."""

    def __init__(self, schedule: Schedule, chunks: list, pp_group: Group, boundary: tuple[int, ...], dtype, *,
                 costs: Costs | None = None) -> None:
        check(schedule)
        if pp_group.size != schedule.pp:
            raise ValueError(f"a schedule for pp {schedule.pp} on a pipeline group of {pp_group.size} ranks")
        if len(chunks) != schedule.vp:
            raise ValueError(f"the schedule has {schedule.vp} chunks per rank, this rank holds {len(chunks)}")
        from mpi4py import MPI  # the tag space: MPI promises at least 32767
        top = message_tag(BACKWARD_MESSAGE, schedule.microbatches - 1, schedule.stages - 1, schedule.stages)
        if top > MPI.COMM_WORLD.Get_attr(MPI.TAG_UB):
            raise ValueError(f"{schedule.microbatches} micro-batches x {schedule.stages} stages need tags up to {top}, "
                             "beyond this MPI's upper bound")
        self.schedule, self.chunks, self.group = schedule, list(chunks), pp_group
        self.rank = pp_group.rank
        self.boundary, self.dtype = tuple(boundary), np.dtype(dtype)
        self.costs = unit(schedule) if costs is None else costs
        self._place(schedule)

    def _place(self, schedule: Schedule) -> None:
        """Run ``schedule``'s lists: this rank's actions, and the compute action each collective sits on."""
        check(schedule)
        self.schedule, self.actions = schedule, schedule.ranks[self.rank]
        self.attached: dict[int, set[str]] = {}  # compute action index -> the collectives placed on it
        for i, a in enumerate(self.actions):
            if a.op in COLLECTIVES:
                host = served(schedule, self.rank, i)
                self.attached.setdefault(self.actions.index(host), set()).add(a.op)

    def collectives_for(self, grad_sync) -> None:
        """The lists carry exactly the collectives of ``grad_sync``'s ZeRO stage (none without a sync): placed
        by the pass (``with_collectives``) when the schedule carries none, else one line naming both when they
        differ, before anything runs."""
        plain = without_collectives(self.schedule)
        want = plain if grad_sync is None else with_collectives(plain, zero_of(grad_sync))
        if want == self.schedule:
            return
        if not self.schedule.has_collectives:
            self._place(want)
            return
        what = "no gradient sync" if grad_sync is None else f"ZeRO-{zero_of(grad_sync).stage}"
        raise ConfigError(f"{self.schedule.name}: its collectives are not the ones {what} places "
                          "(tpsim.pipeline.collectives.with_collectives)")

    def _backward(self, chunk, dy, cache, weights: dict, key: tuple[int, int]):
        """B: the chunk's backward; for a split schedule the input gradient only, run under a deferral whose
        queue (``weights[key]``) keeps every layer's weight gradient, and what it reads, for the W action."""
        if not self.schedule.splits_backward:
            return chunk.backward(dy, cache)
        with deferred_weight_grads(chunk) as weights[key]:
            return chunk.backward(dy, cache)

    def _receive(self, a, received: dict, clock: LiveClock) -> None:
        """RECV_F / RECV_B: wait for the message, keep it for the F or B that reads it, move the clock to it."""
        j, c, forward = a.microbatch, a.chunk, a.op == "RECV_F"
        with self.group.tracer.region(scope=PIPELINE_SCOPE, phase=FORWARD if forward else BACKWARD):
            x, sent = self.group.recv(self.boundary, self.dtype, a.peer, action_tag(self.schedule, self.rank, a),
                                      microbatch=j, chunk=c, stamped=True)
        received["F" if forward else "B", j, c] = x
        clock.arrive(sent, self.schedule.message(self.rank, a), chunk=c)

    def _send(self, a, produced: dict, stamp: float) -> None:
        """SEND_F / SEND_B: post what the F or B of (a.microbatch, a.chunk) produced, stamped with this clock."""
        j, c = a.microbatch, a.chunk
        direction, phase = (FORWARD_MESSAGE, FORWARD) if a.op == "SEND_F" else (BACKWARD_MESSAGE, BACKWARD)
        x = produced.pop(("F" if direction == FORWARD_MESSAGE else "B", j, c))
        if x.shape != self.boundary or x.dtype != self.dtype:
            raise ValueError(f"{a}: sends {x.dtype} {x.shape}, the receiver expects {self.dtype} {self.boundary}")
        with self.group.tracer.region(scope=PIPELINE_SCOPE, phase=phase):
            self.group.send(x, a.peer, action_tag(self.schedule, self.rank, a), microbatch=j, chunk=c, stamp=stamp)

    def final(self, a) -> bool:
        """Is ``a`` the last micro-batch's last gradient-producing action on its chunk (B, or W when split)?"""
        return a.microbatch == self.schedule.microbatches - 1 and a.op == ("W" if self.schedule.splits_backward
                                                                             else "B")

    @contextmanager
    def _producing(self, i: int, grad_sync):
        """Around compute action ``i``: the gradient sync armed while it runs when a REDUCE_GRAD sits on it, and
        that REDUCE_GRAD run when it ends (``disarm``); a RESHARD on it frees its gathered parameters then."""
        on = self.attached.get(i, ())
        if "REDUCE_GRAD" in on:
            grad_sync.arm()
        try:
            yield
        finally:
            if "RESHARD" in on:
                grad_sync.release_params()
            if "REDUCE_GRAD" in on:
                grad_sync.disarm()

    def _forward_on_clock(self, out: ExecutorResult, a, v: int, events: list, pieces, sharded, unshard: bool) -> None:
        """An F on the clock: the one an UNSHARD sits on through the parameter all-gather's gates when the clock
        has them (ZeRO-1/2); under ZeRO-3 with its all-gathers prefetched (``_charged``)."""
        if sharded is not None and sharded.gathers:
            self._charged(out, a, v, events, sharded, unshard)
            return
        if pieces is None or not unshard or out.clock.gates is None:
            _ran(out, "F", a.chunk, a.microbatch, events)
            return
        out.ran.append(f"F0.{a.chunk}")
        inside = [e for e in events if not e.overlap]
        out.clock.gated_forward(a.chunk, v, pieces.keys[v], pieces.scoped(inside, v))

    def _charged(self, out: ExecutorResult, a, v: int, events: list, sharded, unshard: bool) -> list:
        """A B or W on the clock: as ``_ran`` charges it; under ZeRO-3 (``sharded``: the shard's ``ShardedPieces``)
        piece by piece with its ZeRO collectives on the comm stream (``LiveClock.sharded_action``); under ZeRO-2
        without its reduce-scatters, each piece's end kept for them (``LiveClock.zero2_sync``)."""
        if sharded is None:
            return _ran(out, a.op, a.chunk, a.microbatch, events)
        rest, gathers, scatters = sharded.split([e for e in events if not e.overlap], v, a.op)
        keys, scoped = sharded.pieces.keys[v], sharded.pieces.scoped(rest, v)
        if not sharded.gathers:  # ZeRO-2: its reduce-scatters ride the DP stream from its pieces' ends (zero2_sync)
            _ran(out, a.op, a.chunk, a.microbatch, rest)
            if a.op == ("W" if self.schedule.splits_backward else "B"):
                out.clock.pieces(a.op, a.chunk, v, keys, scoped)
            return rest
        out.ran.append(f"{a.op}{a.microbatch}.{a.chunk}")
        out.clock.sharded_action(a.op, a.chunk, a.microbatch, keys, scoped, gathers, scatters, unshard)
        return rest

    def _pieces(self, out: ExecutorResult, a, v: int, inside: list, pieces) -> None:
        """A chunk's ``final`` B or W on the clock piece by piece (``LiveClock.pieces``), when ``pieces`` is given."""
        if pieces is not None and self.final(a):
            out.clock.pieces(a.op, a.chunk, v, pieces.keys[v], pieces.scoped(inside, v))

    def run(self, inputs: list[np.ndarray], labels: list[np.ndarray] | None, plans: list, seeds: list[float] | None,
            clock: LiveClock | None = None, grad_sync=None, pieces=None, sharded=None) -> ExecutorResult:
        """One step's schedule. ``inputs[j]``: micro-batch j's token ids (on the rank holding stage 0); ``labels[j]``
        and ``seeds[j]`` (the loss gradient the backward starts from) on the last stage's; ``plans[j]``: its dropout
        plan (its global rows); ``clock``: this rank's, already charged by the step (default: a fresh one at 0);
        ``grad_sync``: the DP sync, armed around each action a REDUCE_GRAD sits on (None: no gradient group, no
        collectives in the lists); ``pieces``, ``sharded``: the shard's."""
        sch, tracer = self.schedule, self.group.tracer
        received: dict[tuple[str, int, int], np.ndarray] = {}  # ("F" | "B", j, c) -> input or output gradient
        produced: dict[tuple[str, int, int], np.ndarray] = {}  # ("F" | "B", j, c) -> what a SEND will post
        caches: dict[tuple[int, int], object] = {}
        weights: dict[tuple[int, int], object] = {}  # (j, c) -> the WeightGradients its B left for its W
        out = ExecutorResult(clock=LiveClock(self.costs, self.rank) if clock is None else clock)
        if out.clock.prices_collectives and not tracer.enabled:
            raise RuntimeError("a clock that prices collectives reads them from the trace: enable the tracer")
        in_flight = InFlight()  # (j, c) from its F until the backward that frees it: B, or W when split
        self.collectives_for(grad_sync)
        for i, a in enumerate(self.actions):
            if a.op in COLLECTIVES:
                continue  # run with the compute action it sits on (_producing, the clock's charge)
            j, c, since = a.microbatch, a.chunk, len(tracer.events)
            v = sch.virtual_stage(self.rank, c)
            chunk = self.chunks[c]
            unshard = "UNSHARD" in self.attached.get(i, ())
            if a.op in ("RECV_F", "RECV_B"):
                self._receive(a, received, out.clock)
            elif a.op == "F":
                x = inputs[j] if v == 0 else received.pop(("F", j, c))
                with self._producing(i, grad_sync):
                    y, caches[j, c] = chunk.forward(x, labels[j] if chunk.last else None, plans[j])
                if chunk.last:
                    out.losses[j] = float(y)
                else:
                    produced["F", j, c] = y
                in_flight.take((j, c), caches[j, c].h)
                self._forward_on_clock(out, a, v, tracer.events[since:], pieces, sharded, unshard)
            elif a.op == "B":
                dy = seeds[j] if chunk.last else received.pop(("B", j, c))
                with self._producing(i, grad_sync):
                    dx = self._backward(chunk, dy, caches.pop((j, c)), weights, (j, c))  # the cache goes now
                if not sch.splits_backward:
                    in_flight.free((j, c))
                if v > 0:
                    produced["B", j, c] = dx
                self._pieces(out, a, v, self._charged(out, a, v, tracer.events[since:], sharded, unshard), pieces)
            elif a.op == "W":
                with self._producing(i, grad_sync):
                    chunk.backward_weights(weights.pop((j, c)))  # and with them, what they held
                in_flight.free((j, c))
                self._pieces(out, a, v, self._charged(out, a, v, tracer.events[since:], sharded, False), pieces)
            else:  # SEND_F / SEND_B
                self._send(a, produced, out.clock.time)
        self.group.wait_sends()
        out.clock.schedule_end = out.clock.time
        out.peak_in_flight, out.peak_layer_bytes = in_flight.peak_pairs, in_flight.peak_bytes
        left = [*received, *produced, *caches, *(("W", j, c) for j, c in weights)]
        if left:
            raise RuntimeError(f"pipeline rank {self.rank}: the schedule left {left[:4]} unused (an F without its B, "
                               "a B without its W, or a message received and never used)")
        return out
