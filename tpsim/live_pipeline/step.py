"""One pipeline training step's gradients: micro-batches through the schedule, the same global-batch loss.

A DP replica's rows are cut into m micro-batches of b = B / (dp·m) rows. The loss of the step is, as without a
pipeline (``tpsim.train.step``), the mean over every valid token of the global batch:

    n_dj = valid tokens of micro-batch j of replica d,  N = Σ_dj n_dj,   L = Σ_dj n_dj·L_dj / N
    dL/dθ = (1/dp)·Σ_d Σ_j (dp·n_dj/N)·∇L_dj    → micro-batch j's backward starts from dp·n_dj/N, then DDP's mean

The counts come from the labels, so the last stage knows N before any forward: one all-reduce of [Σ_j n_dj] over
DP (when dp > 1), then the schedule (``tpsim.live_pipeline.executor``), then one all-reduce of [Σ_j n_dj·L_dj] for the
loss, which a broadcast over the pipeline group hands to every stage (with N), so every rank reports the same
number — all traced as scope "loss_normalizer", phase "dp_sync". The broadcast is waited on politely (sleep-polling,
``tpsim.comm.waiting``): it is the first collective after the schedule, the stages reach it as the drain frees
them, stage 0 last, and a stage spinning there would take the core stage 0 drains on (measured at PP 4 × TP 2: the
last stage spun 16 ms of each 89 ms step in it). After the last backward:

    tied word embedding   its gradient summed over the embedding group (first + last stage; Megatron's
                          ``_allreduce_word_embedding_grads``), scope = the embedding's path, phase "dp_sync"
    DP sync               the buckets, as without a pipeline (or ZeRO-1's reduce-scatter)

then the optimizer step of ``tpsim.train.step.apply_update``, whose gradient norm sums over every stage.

On a clock that prices collectives (``--clock GPU``, ``tpsim.live_pipeline.clock``) each of these — the normalizer, the
loss's all-reduce and broadcast, the embedding's all-reduce, the DP sync (ZeRO-1: its reduce-scatter) — ends at
its group's latest clock plus its traced calls' α-β cost: the clocks are exchanged first (an all-reduce of one
float, max, untraced: clock bookkeeping, like a message's stamp, is not model traffic), so the normalizer
starts the last stage's schedule late, and ``result.clock.time`` is the step's virtual time from the batch read
to the DP sync; the optimizer step costs nothing on it (the clip norm's all-reduce is not charged), but ZeRO-1's
parameter all-gathers are (``param_gathers``): after the DP sync, or with ``--overlap-param-gather`` on the comm
stream from the step's start, gating micro-batch 0's forward (``tpsim.pipeline.overlap``); with
``--overlap-grad-reduce`` the DP buckets run on the comm stream from their pieces' ends (``dp_sync``). Under
ZeRO-3 every F and B is priced piece by piece with its all-gathers and reduce-scatters on the comm stream
(``ShardedPieces``, ``LiveClock.sharded_action``: the planner's rule, ``tpsim.pipeline.prefetch``), and after the
schedule only the tied embedding's held bucket is left to reduce-scatter, once its sum is done. Under ZeRO-2 each
micro-batch's reduce-scatters run on the comm stream from the pieces that finished their buckets (``dp_sync``).
Under the unit clock nothing is exchanged and nothing charged.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import numpy as np

from tpsim.comm import Group, ProcessGrid
from tpsim.cost import wire_bytes
from tpsim.nn.dropout import DropoutPlan
from tpsim.phases import DP_SYNC
from tpsim.pipeline.overlap import comm_stream, forward_gates, forward_order
from tpsim.live_pipeline.buckets import Pieces, ShardedPieces, bucket_specs
from tpsim.live_pipeline.chunk import PipelineShard
from tpsim.live_pipeline.clock import LiveClock
from tpsim.live_pipeline.executor import Executor, ExecutorResult
from tpsim.train.protocol import zero_of

LOSS_SCOPE = "loss_normalizer"


def split_microbatches(x: np.ndarray, m: int) -> list[np.ndarray]:
    """``x: [B/dp, ...]`` -> m consecutive pieces ``[B/(dp·m), ...]`` (the rows must divide by m)."""
    if len(x) % m:
        raise ValueError(f"{len(x)} rows do not split into {m} equal micro-batches")
    return list(np.split(np.asarray(x), m))


@contextmanager
def on_clock(clock: LiveClock, group: Group, name: str, *, patient: bool = False):
    """The collectives of the block, over ``group``, on ``clock`` (the module docstring): first the group's
    latest clock (untraced), then the block, then clock = that latest + the cost of what it traced (a group of
    one: nothing to wait for, nothing to pay)."""
    if not clock.prices_collectives or group.size == 1:
        yield
        return
    tracer = group.tracer
    with tracer.paused():
        latest = float(group.all_reduce(np.array([clock.time]), op="max", patient=patient)[0])
    since = len(tracer.events)
    yield
    clock.collective(name, latest, tracer.events[since:])


def _normalizer(grid: ProcessGrid, n_local: int, clock: LiveClock) -> int:
    """N, the global batch's valid tokens: the last stage's Σ_j n_dj summed over DP (× CP: each CP rank counts
    its own tokens)."""
    if grid.replicas == 1:
        return n_local
    with grid.tracer.region(scope=LOSS_SCOPE, phase=DP_SYNC), on_clock(clock, grid.dp_group, "loss normalizer"):
        return int(grid.dp_group.all_reduce(np.array([n_local], dtype=np.float64))[0])


def _global_loss(grid: ProcessGrid, weighted: float, n_global: int, clock: LiveClock) -> tuple[float, int]:
    """The last stage's Σ n_dj·L_dj over DP, ÷ N, then on every stage: ``(loss, N)``."""
    total = np.array([weighted, n_global], dtype=np.float64)
    tracer = grid.tracer
    with tracer.region(scope=LOSS_SCOPE, phase=DP_SYNC):
        if grid.last_stage and grid.replicas > 1:
            with on_clock(clock, grid.dp_group, "loss all-reduce"):
                total[0] = grid.dp_group.all_reduce(total[:1])[0]
        if grid.pp > 1:  # the stages reach it as the drain frees them: wait by sleeping
            with on_clock(clock, grid.pp_group, "loss broadcast", patient=True):
                grid.pp_group.broadcast(total, root=grid.pp - 1, patient=True)
    n = int(total[1])
    return (float(total[0] / n) if n else 0.0), n


def allreduce_word_embedding_grads(shard: PipelineShard, grid: ProcessGrid, clock: LiveClock) -> None:
    """The tied embedding's gradient summed over the first and the last stage (both then hold the full one)."""
    emb = shard.shared_embedding
    if emb is None:
        return
    group = grid.embedding_group
    with grid.tracer.region(scope=emb.path, phase=DP_SYNC), on_clock(clock, group, "embedding all-reduce"):
        group.all_reduce(emb.grads["weight"], op="sum", inplace=True)


def pipeline_grads(shard: PipelineShard, executor: Executor, grid: ProcessGrid, grad_sync,
                   ids_local: np.ndarray | None, labels_local: np.ndarray | None, *, rows: np.ndarray,
                   rng=None, step: int = 0, loss_scale: float = 1.0) -> tuple[float, int, ExecutorResult]:
    """Gradients of the global-batch mean loss, accumulated over the micro-batches and DP-synced; returns
    ``(loss, valid tokens N, ExecutorResult)``, loss and N the same on every rank.

    ``ids_local`` (stage 0) and ``labels_local`` (last stage): this replica's rows ``int [B/dp, s]`` (None where
    the stage does not read them); ``rows``: their positions in the global batch (dropout masks are keyed by
    them). ``loss_scale``: float16's S, the backward starts from S·seed. ``grad_sync``: a ``GradSync`` or ZeRO-1's
    optimizer over the DP group, or None when dp == 1.
    """
    m, clock = executor.schedule.microbatches, LiveClock(executor.costs, grid.pp_rank)
    rows_mb = split_microbatches(rows, m)
    plans = [DropoutPlan(rng, step, r) for r in rows_mb]
    ids_mb = split_microbatches(ids_local, m) if grid.first_stage else None
    labels_mb, seeds, counts, n_global = None, None, [], 0
    if grid.last_stage:
        labels_mb = split_microbatches(labels_local, m)
        ignore = shard.chunks[-1].loss.ignore_index
        counts = [int(np.count_nonzero(lab != ignore)) for lab in labels_mb]
        n_global = _normalizer(grid, sum(counts), clock)
        seeds = [(grid.replicas * n / n_global if n_global else 0.0) * loss_scale for n in counts]
    if grad_sync is not None:  # (--overlap-param-gather: each layer waits for its all-gathers at its forward)
        grad_sync.start_step()
    shard.zero_grad()
    gathers = param_gathers(shard, grad_sync, grid, clock)  # ZeRO-1's all-gathers (and the forward's gates)
    overlapped = grad_sync is not None and grad_sync.overlap and clock.prices_collectives
    sharded = sharded_on_clock(grad_sync, grid, clock)
    result = executor.run(ids_mb, labels_mb, plans, seeds, clock=clock, grad_sync=grad_sync,
                          pieces=Pieces(shard) if overlapped or clock.gates is not None else None,
                          sharded=ShardedPieces(shard, grad_sync) if sharded else None)
    weighted = sum(n * result.losses[j] for j, n in enumerate(counts) if n)  # 0 off the last stage
    loss, n_global = _global_loss(grid, weighted, n_global, clock)
    allreduce_word_embedding_grads(shard, grid, clock)
    if grad_sync is not None:
        held_left = sharded and zero_of(grad_sync).buckets_at_units and shard.shared_embedding is not None
        with (on_clock(clock, grid.dp_group, "held bucket reduce-scatter") if held_left  # ZeRO-3: the one left
              else nullcontext()):
            grad_sync.release()  # the tied embedding's bucket, held until its sum over the embedding group
        dp_sync(shard, grad_sync, grid, clock, sharded, m)
    if gathers is not None and clock.gates is None:  # no overlap: the all-gathers after the (free) optimizer
        clock.param_gather(gathers)
    return loss, n_global, result


def sharded_on_clock(grad_sync, grid: ProcessGrid, clock: LiveClock) -> bool:
    """Does this step price ZeRO-2/3's collectives inside the actions (a clock that prices collectives, d > 1)?"""
    return zero_of(grad_sync).reduces_every_microbatch and grid.replicas > 1 and clock.prices_collectives


def param_gathers(shard: PipelineShard, grad_sync, grid: ProcessGrid, clock: LiveClock) -> list[float] | None:
    """ZeRO-1's (and ZeRO-2's) parameter all-gathers of the optimizer step before this one, each priced on the DP
    link (None: another stage, dp 1, or a clock that prices no collective). The clock prices every step as one
    that follows an optimizer step: with ``--overlap-param-gather`` they run on the comm stream from the step's
    start and gate the pieces of micro-batch 0's forward (``clock.gates``, ``tpsim.pipeline.overlap.forward_gates``)."""
    if not clock.prices_collectives or grid.replicas == 1 or not zero_of(grad_sync).gathers_after_step:
        return None
    d = grid.replicas  # the DP group: DP x CP
    seconds = [clock.costs.collective("all_gather", "dp", d, wire_bytes("all_gather", n, d))
               for n in grad_sync.gather_bytes()]
    if grad_sync.overlap_param_gather:
        stream = comm_stream(forward_order(len(seconds)), [0.0] * len(seconds), seconds, 0.0)
        clock.gates = forward_gates(bucket_specs(shard, grad_sync), stream)
    return seconds


def dp_sync(shard: PipelineShard, grad_sync, grid: ProcessGrid, clock: LiveClock, sharded: bool = False,
            microbatches: int = 1) -> None:
    """The DP gradient sync, and on a clock that prices collectives its buckets on the comm stream
    (``LiveClock.dp_sync``): each priced from its trace record on the DP link; with ``--overlap-grad-reduce``
    each ready at the end of the piece that finished its last gradient (the tied embedding's once its sum over
    the embedding group is done), run in issue order; without, one after another from the DP group's latest clock.
    ``sharded`` (ZeRO-2/3): every bucket was reduce-scattered already, the owned slices are only ÷ d; under
    ZeRO-2 on the comm stream, every micro-batch's from the end of the piece that finished it (``zero2_sync``)."""
    if not clock.prices_collectives or grid.replicas == 1 or (sharded and zero_of(grad_sync).buckets_at_units):
        grad_sync.sync()
        return
    with grid.tracer.paused():
        latest = float(grid.dp_group.all_reduce(np.array([clock.time]), op="max")[0])
    after_embedding = clock.time
    grad_sync.sync()
    events = grad_sync.bucket_events
    if any(events.get(b) is None for b in range(len(grad_sync.buckets))):
        raise RuntimeError("a clock that prices collectives reads the DP buckets from the trace: enable the tracer")
    seconds = [clock.priced([events[b]]) for b in range(len(grad_sync.buckets))]
    if sharded:  # ZeRO-2: each bucket every micro-batch, the held one once (after the embedding group's sum)
        specs = bucket_specs(shard, grad_sync, held=True)
        ready = [[max(clock.every_end[j, b.stage, b.piece], after_embedding) if b.held else
                  clock.every_end[j, b.stage, b.piece] for b in specs] for j in range(microbatches)]
        clock.zero2_sync(latest, ready, seconds, {i for i, b in enumerate(specs) if b.held})
        return
    if not grad_sync.overlap:
        clock.dp_sync(latest, list(range(len(seconds))), None, seconds)
        return
    ready = []
    for b, spec in enumerate(bucket_specs(shard, grad_sync, held=True)):
        if (spec.stage, spec.piece) not in clock.piece_end:
            raise RuntimeError(f"DP bucket {b}: its last gradient's piece {spec.piece} of virtual stage {spec.stage} "
                               "never ran on the clock")
        t = clock.piece_end[spec.stage, spec.piece]
        ready.append(max(t, after_embedding) if spec.held else t)
    clock.dp_sync(latest, grad_sync.issue_order, ready, seconds)
