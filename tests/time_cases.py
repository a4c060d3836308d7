"""Steps for the reference clock (``reference_clock``) built from what each of tpsim's clocks is given.

``planner_step(model, lay, gpu, buckets)`` turns a planner layout into the reference's inputs: the schedule's
compute orders, each action's pieces with their seconds (compute and TP collectives: the planner's own
``piece_costs``), the messages, the loss normalizer's late start, the collectives after the schedule, ZeRO-3's
per-piece gathers and reduce-scatters and the DP buckets with their reduce (one collective; ZeRO-2 runs one every
micro-batch) and all-gather seconds. Only the numbers come from the planner; how they make a step's time is the
reference's. ``random_buckets`` cuts a pipeline rank's parameters into buckets at random points, tensor by
tensor, so that a piece can sit in several buckets and a bucket can span several pieces and chunks, as a live
``GradSync`` packs them.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from reference_clock import Bucket, Collective, Step
from tpsim.pipeline.clock import Costs
from tpsim.pipeline.overlap import BucketSpec, backward_pieces, comm_stream, forward_gates, forward_order
from tpsim.pipeline.schedules import compute_orders
from tpsim.plan import dp_overlap, param_gather, zero3_time
from tpsim.plan.kernel_time import head_seconds, layer_seconds
from tpsim.plan.pipeline import message_costs
from tpsim.plan.pipeline_comm import after_schedule, loss_normalizer_s, start_times
from tpsim.live_pipeline.clock import LiveClock


def rank_pieces(stage_layers: list[range], pp: int, vp: int, rank: int) -> list[tuple[int, tuple]]:
    """``(virtual stage, piece)`` of one pipeline rank in the order its gradients are packed: its chunks last to
    first, each's backward pieces in execution order."""
    last = pp * vp - 1
    return [(c * pp + rank, key) for c in reversed(range(vp))
            for key in backward_pieces(stage_layers[c * pp + rank], c * pp + rank == 0, c * pp + rank == last)]


def random_buckets(rng: random.Random, pieces: list[tuple[int, tuple]], n: int, tied: set) -> list[tuple]:
    """``n`` buckets (or fewer, when the rank has fewer tensors) cut at random from 1–3 tensors a piece, each of
    random bytes, as ``(BucketSpec, the pieces it holds)``: the spec's piece is its last tensor's (the backward
    finishes it last), ``first_use`` the same (the earliest forward piece reading it), ``held`` whether it holds a
    piece of ``tied``."""
    tensors = [where for where in pieces for _ in range(rng.randint(1, 3))]
    n = min(n, len(tensors))
    cuts = sorted(rng.sample(range(1, len(tensors)), n - 1)) if n > 1 else []
    out = []
    for lo, hi in zip([0, *cuts], [*cuts, len(tensors)]):
        group = tensors[lo:hi]
        nbytes = rng.randint(1, 64) * 2 ** rng.randint(8, 20)
        out.append((BucketSpec(nbytes, *group[-1], bool(tied & set(group)), group[-1]), tuple(dict.fromkeys(group))))
    return out


def planner_step(model, lay, gpu, buckets: list[list[tuple]] | None) -> Step:
    """The reference's inputs for ``lay`` (module docstring); ``buckets``: each pipeline rank's ``(BucketSpec,
    the pieces it holds)`` (``random_buckets``), or None."""
    orders = compute_orders(lay.schedule, lay.pp, lay.microbatches, lay.vp)
    split = any(op == "W" for order in orders for op, _, _ in order)
    tables = {"layer": layer_seconds(model, lay, gpu), "head": head_seconds(model, lay, gpu)}
    stages = lay.pp * lay.vp
    pieces, zero3 = {}, {}
    for s in range(stages):
        for op in ("F", "B", "W") if split else ("F", "B"):
            keys, seconds, _ = dp_overlap.piece_costs(model, lay, gpu, s, op, tables)
            work = list(zip(keys, seconds))
            pieces[s, op] = work[::-1] if op == "F" else work
        if lay.zero == 3 and lay.grad_replicas > 1:
            gather, scatter = zero3_time.piece_seconds(model, lay, gpu, s)
            forward = [key for key, _ in pieces[s, "F"]]
            zero3.update({(s, key): (g, r) for key, g, r in zip(forward, gather, scatter)})
    message = message_costs(model, lay, gpu)
    messages = {(s, d): float(message[s][i]) for s in range(stages) for i, d in enumerate("FB")}
    costs, p = after_schedule(model, lay, gpu, [0.0] * lay.pp), lay.pp
    normalizer = loss_normalizer_s(lay, gpu)
    after = [Collective("loss all-reduce", {p - 1: normalizer}),
             Collective("loss broadcast", {r: costs["loss_s"][r] - (normalizer if r == p - 1 else 0.0)
                                           for r in range(p)})]
    tied = {r: e for r, e in enumerate(costs["embedding_s"]) if e}
    if tied:
        after.append(Collective("embedding all-reduce", tied))
    if lay.zero == 3:  # the tied embedding's held bucket, reduce-scattered over DP once its sum is done
        after += [Collective("held bucket reduce-scatter", {r: t}) for r, t in enumerate(costs["dp_s"]) if t]
    mine = ()
    if buckets is not None and lay.zero < 3:
        gathers = [param_gather.gather_seconds(lay, gpu, [b for b, _ in rank]) for rank in buckets]
        mine = tuple(tuple(Bucket(dp_overlap.bucket_seconds(lay, gpu, b.nbytes), where,
                                  gathers[r][i] if lay.zero else 0.0, b.held) for i, (b, where) in enumerate(rank))
                     for r, rank in enumerate(buckets))
    return Step(lay.pp, lay.vp, lay.microbatches, tuple(map(tuple, orders)), pieces, messages,
                tuple(start_times(lay, gpu)), tuple(after), mine, lay.zero if lay.grad_replicas > 1 else 0,
                zero3, lay.overlap_grad_reduce and lay.grad_replicas > 1, lay.overlap_param_gather)


class Priced(NamedTuple):
    """A collective for a replayed ``LiveClock``: its seconds ride in ``wire_bytes`` (``replay_costs`` prices a
    call at its wire bytes)."""

    op: str
    group: str
    group_size: int
    wire_bytes: float


def replay_costs(step: Step) -> Costs:
    """The clocks' ``Costs`` of ``step``: each action the sum of its pieces, ``pieces`` in backward order (a
    forward's reversed, as ``LiveClock`` reads them), each message its seconds (β = 1 s a "byte"), a collective
    its ``Priced`` seconds."""
    pp = step.pp

    def seconds(op: str, r: int, c: int) -> list[float]:
        work = [t for _, t in step.pieces.get((c * pp + r, op), ())]
        return work[::-1] if op == "F" else work
    return Costs({op: (lambda op: lambda r, c, j: sum(seconds(op, r, c)))(op) for op in ("F", "B", "W")},
                 alpha=0.0, beta=1.0, message_bytes=lambda d, j, s: step.message.get((s, d), 0.0),
                 collective=lambda op, group, size, wire, gemms=(): wire, pieces=seconds)


def bucket_spec(bucket: Bucket, step: Step) -> BucketSpec:
    """A reference bucket as the clocks' ``BucketSpec``: its piece the last its rank's backward reaches, its first
    use the earliest forward piece holding it."""
    def backward_rank(where):  # higher virtual stages first, then each stage's backward order
        stage, key = where
        return -stage, [k for k, _ in step.pieces[stage, "B"]].index(key)

    def forward_rank(where):
        stage, key = where
        return stage, [k for k, _ in step.pieces[stage, "F"]].index(key)
    last = max(bucket.holds, key=backward_rank)
    return BucketSpec(0, *last, bucket.held, min(bucket.holds, key=forward_rank))


def sharded_events(step: Step, stage: int, op: str, split: bool) -> tuple[list, list]:
    """ZeRO-3's collectives of one action as ``LiveClock.sharded_action`` takes them: ``(piece, Priced)`` of the
    all-gather before each piece of an F or B, and of the reduce-scatter after each piece of the backward that
    makes the gradients (W when split, else B)."""
    order = [k for k, _ in step.pieces[stage, op]]
    gathers = [(k, Priced("all_gather", "dp", 2, step.zero3[stage, k][0])) for k in order] if op != "W" else []
    scatters = [(k, Priced("reduce_scatter", "dp", 2, step.zero3[stage, k][1])) for k in order] \
        if op == ("W" if split else "B") else []
    return gathers, scatters


def live_replay(step: Step) -> list[LiveClock]:
    """Every pipeline rank's ``LiveClock`` driven as ``tpsim.live_pipeline.executor`` and ``tpsim.live_pipeline.step``
    drive it: the loss normalizer before the schedule, each action charged (micro-batch 0's forward through the
    all-gathers' gates under ZeRO-1's overlap; under ZeRO-3 with its gathers and scatters on the comm stream), each
    receive arriving with its sender's stamp, each chunk's last gradient-producing action spread over its pieces, then
    the collectives after the schedule, the DP buckets ready at their pieces' ends (the held one after the collectives)
    and the all-gathers after the sync. ZeRO 0–1: the live clock does not yet issue ZeRO-2's reduce-scatters every
    micro-batch."""
    pp, stages = step.pp, step.pp * step.vp
    split = any(op == "W" for order in step.orders for op, _, _ in order)
    costs = replay_costs(step)
    clocks = [LiveClock(costs, r) for r in range(pp)]
    keys = {s: [k for k, _ in step.pieces[s, "B"]] for s in range(stages)}
    buckets = step.buckets or tuple(() for _ in range(pp))
    for r, clock in enumerate(clocks):
        if step.start and step.start[r]:
            clock.collective("loss normalizer", clock.time, [Priced("all_reduce", "dp", 2, step.start[r])])
        if step.zero in (1, 2) and step.overlap_param_gather and buckets[r]:
            gathers = [b.gather for b in buckets[r]]
            stream = comm_stream(forward_order(len(gathers)), [0.0] * len(gathers), gathers, 0.0)
            clock.gates = forward_gates([bucket_spec(b, step) for b in buckets[r]], stream)
    stamps: dict = {}
    at, left = [0] * pp, sum(len(o) for o in step.orders)
    while left:
        for r, order in enumerate(step.orders):
            while at[r] < len(order):
                op, j, c = order[at[r]]
                s, clock = c * pp + r, clocks[r]
                sender = s - 1 if op == "F" else s + 1
                if op != "W" and 0 <= sender < stages:
                    if (op, j, sender) not in stamps:
                        break
                    clock.arrive(stamps[op, j, sender], (op, j, sender), chunk=c)
                if step.zero == 3:
                    clock.sharded_action(op, c, j, keys[s], [], *sharded_events(step, s, op, split), op != "W")
                elif op == "F" and j == 0 and clock.gates is not None:
                    clock.gated_forward(c, s, keys[s], [])
                else:
                    clock.compute(op, c, j)
                if (j == step.microbatches - 1 or step.zero == 2) and op == ("W" if split else "B"):
                    clock.pieces(op, c, s, keys[s], [])
                stamps[op, j, s] = clock.time
                at[r] += 1
                left -= 1
    for clock in clocks:
        clock.schedule_end = clock.time
    for coll in step.after:
        latest = max(clocks[r].time for r in coll.seconds)
        for r, seconds in coll.seconds.items():
            clocks[r].collective(coll.name, latest, [Priced("all_reduce", "pp", 2, seconds)])
    for r, clock in enumerate(clocks):
        if not buckets[r]:
            continue
        latest = clock.time
        ready = [max([clock.piece_end[w] for w in b.holds] + ([latest] if b.held else [])) for b in buckets[r]]
        order = sorted(range(len(ready)), key=lambda b: (ready[b], b))
        if step.zero == 2:  # every micro-batch's, the held bucket once (tpsim.live_pipeline.step.dp_sync)
            every = [[max([clock.every_end[j, *w] for w in b.holds] + ([latest] if b.held else []))
                      for b in buckets[r]] for j in range(step.microbatches)]
            clock.zero2_sync(latest, every, [b.seconds for b in buckets[r]],
                             {i for i, b in enumerate(buckets[r]) if b.held})
        else:
            clock.dp_sync(latest, order, ready if step.overlap_grad_reduce else None, [b.seconds for b in buckets[r]])
        if step.zero in (1, 2) and not step.overlap_param_gather:
            clock.param_gather([b.gather for b in buckets[r]])
    return clocks
