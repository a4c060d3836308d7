"""ZeRO-3's per-piece collectives on the comm stream, prefetched one piece ahead: what each action exposes.

Under ZeRO-3 (Rajbhandari et al. 2019, arXiv:1910.02054, §5.3 and §7) every piece of a virtual stage
(``tpsim.plan.zero3.piece_elements``: the embedding, each layer, the head) is all-gathered over the d = dp·cp
ranks before its forward and again before its backward — its parameters' bytes, α-β on the DP link — and its
gradients are reduce-scattered after its backward (the gradients' bytes). One comm stream per GPU runs them in
issue order, the way a prefetching FSDP does:

    piece i's compute starts when piece i − 1's ends and piece i's gather has arrived;
    piece i + 1's gather is issued when piece i's compute starts (one piece ahead: two in memory at once);
    piece i's reduce-scatter is issued when its backward ends.

The first piece's gather of every action waits in full (nothing computes before it), each later one only for
what its predecessor's compute does not hide, and the action ends when its compute and its stream are both done
(the last reduce-scatter's tail included): ``tpsim.pipeline.prefetch``'s rule, by which the live clock prices
its ZeRO-3 actions too. Pieces cost what the planner's clock charges them (their kernels,
their TP collectives, a layer's exposed CP messages: ``tpsim.plan.dp_overlap.piece_costs``). Per micro-batch:

    F  gathers before each piece                           (forward order)
    B  gathers before each piece, reduce-scatters after    (backward order; the backward unsplit: B + W)
       split backward (ZB-H1): B gathers, W reduce-scatters (dW needs no parameters)

``exposed = action's end − Σ its pieces' costs``, added to that action's cost on the virtual clock and reported
as ``time_s["zero3_gather"]``. The stream is priced per action, every micro-batch: a schedule does not keep a
gathered piece between micro-batches (m × 2 gathers a piece a step, ``tpsim.plan.comm.dp_collectives``). MPI-free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tpsim.pipeline.prefetch import prefetched
from tpsim.pipeline.stage_clock import compiled
from tpsim.plan.comm import links, ring_seconds
from tpsim.plan.dp_overlap import piece_costs
from tpsim.gpus import GPU
from tpsim.plan.layout import Layout
from tpsim.plan.memory import STATE_BYTES
from tpsim.plan.models import ModelSpec
from tpsim.plan.zero3 import piece_buckets


def prefetched_end(before: Sequence[float] | None, compute: Sequence[float], after: Sequence[float]) -> float:
    """The end of one action from 0 under ``tpsim.pipeline.prefetch``'s rule (the live clock's too): pieces
    costing ``compute``, each waiting for its ``before`` gather (issued one piece ahead) and followed by its
    ``after`` reduce-scatter, on one comm stream (``before`` None: nothing gathered)."""
    return prefetched(0.0, before, compute, after).end


def exposed(before: Sequence[float] | None, compute: Sequence[float], after: Sequence[float]) -> float:
    """Seconds the stream adds to the action: its end − its pieces' costs."""
    return prefetched_end(before, compute, after) - sum(compute)


def piece_seconds(model: ModelSpec, lay: Layout, gpu: GPU, stage: int) -> tuple[list[float], list[float]]:
    """Each piece's (all-gather, reduce-scatter) seconds in forward order, α-β over dp·cp on the DP link: one
    collective a bucket, as a live run issues them (``tpsim.plan.zero3.piece_buckets``)."""
    p_bytes, g_bytes, _ = STATE_BYTES[lay.dtype]
    link, d = links(lay, gpu)["dp"], lay.grad_replicas
    pieces = piece_buckets(model, lay, stage)
    return ([sum(ring_seconds("all_gather", n * p_bytes, d, link) for n in gathered) for gathered, _ in pieces],
            [sum(ring_seconds("reduce_scatter", n * g_bytes, d, link) for n in scattered) for _, scattered in pieces])


def stage_zero3(model: ModelSpec, lay: Layout, gpu: GPU, tables: dict) -> np.ndarray:
    """Seconds ZeRO-3's stream exposes in one micro-batch's F, B and W: ``[rank][chunk][op]`` (zeros below
    stage 3 or at dp·cp = 1); ``tables``: one layer's and the head's seconds (``tpsim.plan.pipeline``)."""
    out = np.zeros((lay.pp, lay.vp, 3))
    if not lay.zero_stage.gathers_around_units or lay.grad_replicas == 1:
        return out
    split = compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp).splits_backward
    for r in range(lay.pp):
        for c in range(lay.vp):
            stage = c * lay.pp + r
            gather, scatter = piece_seconds(model, lay, gpu, stage)
            none = [0.0] * len(gather)
            forward = piece_costs(model, lay, gpu, stage, "F", tables)[1][::-1]  # backward order reversed
            backward = piece_costs(model, lay, gpu, stage, "B", tables)[1]
            out[r, c, 0] = exposed(gather, forward, none)
            out[r, c, 1] = exposed(gather[::-1], backward, none if split else scatter[::-1])
            if split:
                out[r, c, 2] = exposed(None, piece_costs(model, lay, gpu, stage, "W", tables)[1], scatter[::-1])
    return out
