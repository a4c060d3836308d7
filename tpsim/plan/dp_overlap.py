"""The planner's DP gradient sync on the comm stream: ``--overlap-grad-reduce`` priced as a live run's clock
prices it, by the same rule (``tpsim.pipeline.overlap``).

On the planner's pipeline timeline (``tpsim.plan.pipeline``) each virtual stage's last gradient-producing action
— the last micro-batch's B, or W when the schedule splits the backward (ZB-H1) — is spread over its pieces in
execution order (the LM head on the last virtual stage, its layers last to first, the embedding on the first),
each piece costing

    its compute     ``layer_seconds`` / ``head_seconds`` of that op (a schedule that does not split the backward:
                    B + W), the embedding 0
    its collectives the TP collectives of that piece (``pipeline_comm.piece_comm``: a layer's rows, the head's,
                    the embedding's), α-β on the TP link; a layer's also its exposed CP messages
                    (``tpsim.plan.cp_terms``)

A DP bucket (``BucketSpec``: bytes, the virtual stage and piece that finish its last gradient, whether it is the
tied embedding's, which waits for the embedding group's sum) is ready at the end of that piece; each bucket's
all-reduce (ZeRO-1: reduce-scatter) takes its α-β time on the DP link, and ``comm_stream`` runs them in issue
order (ready time, then bucket order: what the live sync does) from the compute clock after the tied embedding's
all-reduce. Without the overlap every bucket runs after that, one after another, all exposed.

ZeRO-2 reduce-scatters every bucket in every micro-batch's backward (``zero2_stream``): bucket b of micro-batch
j is ready at the end of its piece in j's gradient-producing action (B, or W when split), every one of them
spread over its pieces as above; the held bucket goes once, after the embedding group's sum. The live ZeRO-2
issues them so with or without ``--overlap-grad-reduce`` (``tpsim.train.zero2``), and so does the planner.

``stage_buckets`` cuts a rank's parameters into buckets the way the live run does
(``tpsim.partition.assign_buckets``, tensor by tensor at ``--bucket-mb``) when the planner has no live run to ask.
MPI-free.
"""

from __future__ import annotations

from tpsim.cost import ring_steps
from tpsim.plan import cp_terms
from tpsim.partition import assign_buckets, padded_vocab_size
from tpsim.pipeline.overlap import (EMBEDDING, HEAD, BucketSpec, Stream, after_compute, backward_pieces, comm_stream,
                                    layer, piece_ends, zero2_stream)
from tpsim.pipeline.schedules import compute_orders
from tpsim.pipeline.stage_clock import OP_INDEX, compiled, timed
from tpsim.plan.comm import links, ring_seconds
from tpsim.gpus import GPU
from tpsim.plan.layout import Layout, virtual_stage_layers
from tpsim.plan.memory import STATE_BYTES, layer_param_elements
from tpsim.plan.models import ModelSpec
from tpsim.plan.pipeline_comm import piece_comm

__all__ = ["BucketSpec", "backward_starts", "bucket_seconds", "dp_terms", "final_starts", "piece_compute",
           "piece_costs", "rank_entries", "specs", "stage_buckets", "stage_ranges", "stream_dict", "zero2_terms"]


def stage_ranges(model: ModelSpec, lay: Layout) -> list[range]:
    """The model's layer indices on each virtual stage, in stage order."""
    out, at = [], 0
    for n in virtual_stage_layers(model, lay):
        out.append(range(at, at + n))
        at += n
    return out


def piece_costs(model: ModelSpec, lay: Layout, gpu: GPU, stage: int, op: str, tables: dict) -> tuple[list, list, list]:
    """Virtual stage ``stage``'s backward pieces (B or W) in execution order, each one's seconds with its TP
    collectives (a layer's with its exposed CP messages too, ``tpsim.plan.cp_terms``), and without them (compute alone: ``tables``, ``{"layer": layer_seconds, "head": head_seconds}``
    of ``tpsim.plan.pipeline``; unsplit: B + W)."""
    split = compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp).splits_backward
    last = lay.pp * lay.vp - 1
    keys = backward_pieces(stage_ranges(model, lay)[stage], stage == 0, stage == last)
    comm = piece_comm(model, lay, gpu, split)
    i = OP_INDEX[op]
    cp = cp_terms.layer_seconds(model, lay, gpu)["exposed"].get(op, 0.0)  # a layer's CP messages (F, B; W none)

    def compute(kind: str) -> float:
        if kind == "embedding":
            return 0.0
        t = tables[kind]
        return t[op] if split or op == "F" else t["B"] + t["W"]
    return keys, [compute(k[0]) + comm[k[0]][i] + (cp if k[0] == "layer" else 0.0) for k in keys], \
        [compute(k[0]) for k in keys]


def piece_compute(model: ModelSpec, lay: Layout, gpu: GPU, tables: dict):
    """``(op, rank, chunk) -> seconds of each piece`` without collectives: the live clock's ``Costs.pieces``."""
    def pieces(op: str, rank: int, chunk: int) -> list[float]:
        return piece_costs(model, lay, gpu, chunk * lay.pp + rank, op, tables)[2]
    return pieces


def backward_starts(lay: Layout, charged, message, start, timer=timed) -> dict[tuple[int, int], float]:
    """``(virtual stage, micro-batch) -> when that micro-batch's gradient-producing action (B, or W when split)
    starts`` on the planner's timeline of ``charged[rank][chunk][op]`` seconds (compute + collectives; ``timer``:
    ``timed``, or ``tpsim.plan.param_gather``'s with the forward's waits for the parameter all-gather)."""
    c = compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp)
    t = timer(c, charged, message, start)
    orders = compute_orders(lay.schedule, lay.pp, lay.microbatches, lay.vp)
    want, at, out = "W" if c.splits_backward else "B", [0] * lay.pp, {}
    for n, r in enumerate(c.rank):  # a rank's nodes are numbered in its order
        op, j, chunk = orders[r][at[r]]
        at[r] += 1
        if op == want:
            out[chunk * lay.pp + r, j] = t.starts[n]
    return out


def final_starts(lay: Layout, charged, message, start, timer=timed) -> dict[int, float]:
    """When each virtual stage's last gradient-producing action (the last B, or W when split) starts
    (``backward_starts``)."""
    out: dict[int, float] = {}
    for (s, _), t in backward_starts(lay, charged, message, start, timer).items():
        out[s] = max(out.get(s, t), t)
    return out


def rank_entries(model: ModelSpec, lay: Layout, rank: int) -> list[tuple[tuple, int, int]]:
    """``(piece, virtual stage, elements)`` of one pipeline rank's gradients in the order a live ``GradSync`` packs
    them — reverse registration: its chunks last to first; in each, the head (final norm, and the LM head unless
    it is the embedding itself) on the last virtual stage, the layers last to first (each layer's matmul weights
    last to first, then its norms and biases), the embedding (word, positions) on the first."""
    arch, ranges, last = model.architecture, stage_ranges(model, lay), lay.pp * lay.vp - 1
    vocab = padded_vocab_size(model.vocab, lay.tp) // lay.tp * model.hidden
    weights = [k * n for _, k, n in arch.memory.layer_matmuls(model, lay.tp)]
    vectors = layer_param_elements(model, lay.tp) - sum(weights)
    out = []
    for chunk in reversed(range(lay.vp)):
        stage = chunk * lay.pp + rank
        if stage == last:
            out.append((HEAD, stage, arch.config.norm_params * model.hidden
                        + (0 if model.tied and lay.pp == 1 else vocab)))
        for i in reversed(ranges[stage]):
            out += [(layer(i), stage, n) for n in reversed(weights)] + [(layer(i), stage, vectors)]
        if stage == 0:
            out.append((EMBEDDING, stage, vocab + (model.positions * model.hidden if arch.config.position_table
                                                   else 0)))
    return out


MEGATRON_BUCKET_PARAMS = 40_000_000  # Megatron-LM's DDP: max(40 M, 1 M x the DP x CP size) parameters a bucket
MEGATRON_BUCKET_PARAMS_PER_RANK = 1_000_000  # (megatron/core/distributed/distributed_data_parallel.py)


def bucket_cap_bytes(lay: Layout) -> int:
    """The DP bucket cap in bytes: ``--bucket-mb`` MiB when given; else Megatron-LM's own rule — when the
    gradients are reduced during the backward (``--overlap-grad-reduce``, or ZeRO-2/3 in every backward)
    max(40 M, 1 M·d) parameters a bucket at the gradients' bytes, d the DP × CP size (a larger group, larger
    buckets, so that a ring's latency steps stay few beside its bytes), otherwise one bucket a stage."""
    if lay.bucket_mb is not None:
        return int(lay.bucket_mb * 2 ** 20)
    if not (lay.overlap_grad_reduce or lay.zero_stage.reduces_every_microbatch):
        return 2 ** 62  # no stage's gradients reach it: one bucket a stage
    params = max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_RANK * lay.grad_replicas)
    return params * STATE_BYTES[lay.dtype][1]


def stage_buckets(model: ModelSpec, lay: Layout) -> list[list[BucketSpec]]:
    """Each pipeline rank's gradients cut into buckets of at most ``bucket_cap_bytes`` the way ``GradSync`` cuts
    a live run's (``assign_buckets``: in packing order, a tensor larger than the cap alone) — the planner's
    buckets when no live run says how its were cut. A bucket is finished by the piece of its last entry (the
    earliest in the model: the backward reaches it last) and first read in the forward by the same piece; the
    tied embedding's (the first stage's embedding, the last stage's head, pp > 1) waits for the embedding
    group's sum."""
    grad, cap = STATE_BYTES[lay.dtype][1], bucket_cap_bytes(lay)
    out = []
    for r in range(lay.pp):
        entries = rank_entries(model, lay, r)
        tied = {EMBEDDING, HEAD} if model.tied and lay.pp > 1 else set()
        rank = []
        for group in assign_buckets([("", n * grad, "grad") for _, _, n in entries], cap):
            piece, stage, _ = entries[group[-1]]
            held = any(entries[i][0] in tied for i in group)
            rank.append(BucketSpec(sum(entries[i][2] for i in group) * grad, stage, piece, held, (stage, piece)))
        out.append(rank)
    return out


def specs(model: ModelSpec, lay: Layout, dp_buckets) -> list[list[BucketSpec]]:
    """``dp_buckets`` as ``BucketSpec``s: given (a live run's), or cut at real size (``stage_buckets``). Plain
    byte counts serve only without the overlap and below ZeRO-2 (no piece needed)."""
    if dp_buckets is None:
        return stage_buckets(model, lay)
    every = lay.zero_stage.reduces_every_microbatch
    what = f"ZeRO-{lay.zero} (a reduce-scatter every micro-batch)" if every else "--overlap-grad-reduce"
    if (lay.overlap_grad_reduce or every) and any(not isinstance(b, BucketSpec) for r in dp_buckets
                                                          for b in r):
        raise ValueError(f"{what} needs each bucket's piece: give BucketSpecs, not byte counts")
    return [[b if isinstance(b, BucketSpec) else BucketSpec(int(b), r, (), False) for b in rank]
            for r, rank in enumerate(dp_buckets)]


def bucket_seconds(lay: Layout, gpu: GPU, nbytes: float) -> float:
    """One bucket's all-reduce (ZeRO-1/2: reduce-scatter) on the DP link, α-β (``tpsim.cost``); ZeRO-2 runs one
    a micro-batch (``zero2_stream``)."""
    op = lay.zero_stage.grad_collective
    n = lay.grad_replicas  # dp·cp ranks average the gradients
    return ring_seconds(op, nbytes, n, links(lay, gpu)["dp"]) if n > 1 and ring_steps(op, n) else 0.0


def _backward_pieces(model, lay, gpu, tables, buckets: list[BucketSpec]) -> dict[int, tuple[list, list]]:
    """The gradient-producing action's pieces and their seconds on each virtual stage the buckets sit on."""
    op = "W" if compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp).splits_backward else "B"
    return {s: piece_costs(model, lay, gpu, s, op, tables)[:2] for s in {b.stage for b in buckets}}


def _ready(pieces: dict, starts, buckets: list[BucketSpec], held_at: float) -> list[float]:
    """Each bucket's ready time in the backward actions of ``pieces`` starting at ``starts[stage]``; a held one
    no earlier than ``held_at``."""
    ends: dict[tuple, float] = {}
    for s, (keys, seconds) in pieces.items():
        ends.update(((s, k), e) for k, e in zip(keys, piece_ends(starts[s], seconds)))
    return [max(ends[b.stage, b.piece], held_at) if b.held else ends[b.stage, b.piece] for b in buckets]


def zero2_terms(pieces: dict, lay: Layout, starts: dict, buckets: list[BucketSpec], seconds: list[float],
                compute_end: float) -> Stream:
    """One rank's ZeRO-2 stream (module docstring): its buckets ready in every micro-batch's backward (``starts``:
    ``backward_starts``), the held one once, after ``compute_end`` (the embedding group's sum)."""
    ready = [_ready(pieces, {s: starts[s, j] for s in pieces}, buckets, compute_end) for j in range(lay.microbatches)]
    return zero2_stream(ready, seconds, compute_end, {b for b, spec in enumerate(buckets) if spec.held})


def dp_terms(model: ModelSpec, lay: Layout, gpu: GPU, tables: dict, charged, message, start, before_dp: list[float],
             dp_buckets: list[list[BucketSpec]], timer=timed) -> list[Stream]:
    """Each pipeline rank's DP buckets on its comm stream (module docstring), the compute clock before the DP
    sync at ``before_dp[r]``: overlapped when ``lay.overlap_grad_reduce``, else one after another; ``tables``:
    one layer's and the head's F, B, W seconds (``piece_costs``); ZeRO-2: every micro-batch's (``zero2_terms``)."""
    zero2 = lay.zero_stage.reduces_every_microbatch and lay.grad_replicas > 1  # ZeRO-3 never comes here
    every = backward_starts(lay, charged, message, start, timer) if zero2 else {}
    starts = final_starts(lay, charged, message, start, timer) if lay.overlap_grad_reduce and not zero2 else {}
    out = []
    for r, buckets in enumerate(dp_buckets):
        seconds = [bucket_seconds(lay, gpu, b.nbytes) for b in buckets]
        if zero2:
            pieces = _backward_pieces(model, lay, gpu, tables, buckets)
            out.append(zero2_terms(pieces, lay, every, buckets, seconds, before_dp[r]))
            continue
        if not lay.overlap_grad_reduce or lay.grad_replicas == 1:
            out.append(after_compute(len(seconds), seconds, before_dp[r]))
            continue
        ready = _ready(_backward_pieces(model, lay, gpu, tables, buckets), starts, buckets, before_dp[r])
        order = sorted(range(len(buckets)), key=lambda b: (ready[b], b))
        out.append(comm_stream(order, ready, seconds, before_dp[r]))
    return out


def stream_dict(stream: Stream) -> dict:
    """A stream as ``pipeline.json`` / ``tpsim plan --json`` write it."""
    return {"exposed_s": stream.exposed, "hidden_s": stream.hidden, "comm_s": stream.comm,
            "compute_end_s": stream.compute_end, "end_s": stream.end,
            "after_first_ready_s": stream.after_first_ready, "buckets": [span._asdict() for span in stream.spans]}
