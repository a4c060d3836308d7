"""The planner's ZeRO-1 parameter all-gather on the comm stream (``--overlap-param-gather``), by the rule of
``tpsim.pipeline.overlap`` that a live run's clock follows too.

The optimizer costs nothing on the clock, so its end is the step's start: each bucket's all-gather (its padded
elements in the parameters' dtype: ``gather_bytes``) runs on the comm stream from 0, one after another in the
order the forward reads the buckets (``forward_order``), α-β on the DP link (``gather_stream``). Every step is priced as one that follows an optimizer step, the
first too. Then

    --overlap-param-gather   the forward of micro-batch 0 on each chunk (the first that reads its parameters)
                             runs piece by piece (embedding, layers first to last, head: their compute and TP
                             collectives, ``piece_costs``), each piece starting no earlier than the end of the
                             all-gathers of the buckets it reads first (``forward_gates``); ``gated_timed`` is the
                             planner's timeline with those waits, and they are the exposed all-gather
    without it               the all-gathers run after the DP sync, every second of them exposed

MPI-free.
"""

from __future__ import annotations

import numpy as np

from tpsim.nn.precision import dtype_of, grad_dtype
from tpsim.pipeline.overlap import (BucketSpec, Stream, after_compute, comm_stream, forward_gates, forward_order,
                                    gated_ends)
from tpsim.pipeline.stage_clock import StageTiming, compiled, timed
from tpsim.plan.comm import links, ring_seconds
from tpsim.plan.dp_overlap import piece_costs
from tpsim.gpus import GPU
from tpsim.plan.layout import Layout


def gather_bytes(lay: Layout, grad_nbytes: int) -> int:
    """The all-gather's bytes of a bucket of ``grad_nbytes`` gradient bytes: its elements in the parameters' dtype."""
    param = dtype_of(lay.dtype)
    return grad_nbytes // grad_dtype(param).itemsize * np.dtype(param).itemsize


def gather_seconds(lay: Layout, gpu: GPU, buckets: list[BucketSpec]) -> list[float]:
    """Each bucket's all-gather, α-β on the DP link."""
    link = links(lay, gpu)["dp"]
    return [ring_seconds("all_gather", gather_bytes(lay, b.nbytes), lay.grad_replicas, link) for b in buckets]


def gather_stream(seconds: list[float]) -> Stream:
    """One rank's all-gathers on its comm stream from the optimizer's end (the step's 0), in the order the forward
    reads their buckets (``forward_order``: the embedding's first)."""
    return comm_stream(forward_order(len(seconds)), [0.0] * len(seconds), seconds, 0.0)


def forward_plan(model, lay: Layout, gpu: GPU, tables: dict, buckets: list[list[BucketSpec]],
                 seconds: list[list[float]]) -> dict[tuple[int, int], tuple[list[float], list[float]]]:
    """``(rank, chunk) -> (each forward piece's seconds, each one's gate)`` for the forward of micro-batch 0."""
    out = {}
    for r in range(lay.pp):
        gates = forward_gates(buckets[r], gather_stream(seconds[r]))
        for chunk in range(lay.vp):
            stage = chunk * lay.pp + r
            keys, costs, _ = piece_costs(model, lay, gpu, stage, "F", tables)
            out[r, chunk] = (costs[::-1], [gates.get((stage, k), 0.0) for k in keys[::-1]])
    return out


def gated_timed(c, charged, message, start, plan: dict) -> tuple[StageTiming, list[float]]:
    """``tpsim.pipeline.stage_clock.timed`` with the first forward of each (rank, chunk) run piece by piece through
    its gates (``plan``: ``forward_plan``); also each rank's seconds waited at them (the exposed all-gather)."""
    waited, runs, seen = [0.0] * c.pp, {}, set()

    def gated(r: int, k: int):
        def run(t: float) -> float:
            ends, wait = gated_ends(t, *plan[divmod(k // 3, c.vp)])
            waited[r] += wait
            return ends[-1]
        return run

    for n, (r, k) in enumerate(zip(c.rank, c.cost_entry)):
        if k % 3 == 0 and k not in seen:  # the first F of this (rank, chunk): micro-batch 0's
            seen.add(k)
            runs[n] = gated(r, k)
    return timed(c, charged, message, start, runs), waited


def timer(model, lay: Layout, gpu: GPU, tables: dict, buckets: list[list[BucketSpec]], seconds: list[list[float]]):
    """A ``timed``-shaped function (``c, charged, message, start -> StageTiming``) with this layout's gates."""
    plan = forward_plan(model, lay, gpu, tables, buckets, seconds)

    def timing(c, charged, message, start=None) -> StageTiming:
        return gated_timed(c, charged, message, start, plan)[0]
    timing.waited = lambda charged, message, start: gated_timed(
        compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp), charged, message, start, plan)[1]
    return timing


def terms(lay: Layout, seconds: list[list[float]], timing, charged, message, start, ends: list[float]) -> list[dict]:
    """Each rank's all-gathers (``seconds``): ``comm_s``, ``exposed_s`` (the forward's waits, or all of it after
    the DP sync: ``after_compute``) and ``end_s``, its clock after the step (``ends``: after the DP sync)."""
    if lay.overlap_param_gather:
        waited = timing.waited(charged, message, start)
        return [{"comm_s": sum(s), "exposed_s": w, "end_s": e} for s, w, e in zip(seconds, waited, ends)]
    after = [after_compute(len(s), s, e) for s, e in zip(seconds, ends)]
    return [{"comm_s": a.comm, "exposed_s": a.exposed, "end_s": a.end} for a in after]
