"""The collectives and messages of one pipeline training step, per rank, as ``predict_step`` says them without one.

A pipeline of p ranks (``tpsim.live_pipeline``) with v model chunks each (chunk c of rank r = virtual stage c·p + r; v =
1: the plain pipeline, virtual stage = rank) issues, on the ranks of pipeline rank r (its chunks' layers
``blocks_r``, b = B/(dp·m) rows a micro-batch, m micro-batches):

    layer (layer_of)          phase       op          group      per step, on pipeline rank r
    batch                     data        broadcast   tp         ids int64 [B/dp, s] on the first, labels on the last
    (the model's rows)        ...         ...         tp, kv     ``model_rows`` of blocks_r on b rows, m times; the
                                                                 embedding's on the first, head and loss on the last
    pipeline                  forward     send / recv pp         per chunk, m activations b·s·h·e (÷ t under SP) to
                                                                 virtual stage c·p + r + 1 / from c·p + r − 1 (none
                                                                 past the model's ends)
    pipeline                  backward    send / recv pp         per chunk, m gradients of the same size, back
    loss_normalizer           dp_sync     all_reduce  dp         the last stage: [N] before, [Σ n·L] after (dp > 1)
    loss_normalizer           dp_sync     broadcast   pp         float64 [2] (loss, N) from the last stage to all
    <embedding>               dp_sync     all_reduce  embedding  a tied embedding's gradient shard, first and last
    ddp / zero, loss_scaler   as without a pipeline, over this rank's own gradients (every chunk's)
    clip_grad_norm            optimizer   all_reduce  mp         float64 [1] over TP × PP (ZeRO-1: world)

A send's wire bytes are its bytes, a recv's 0 (``tpsim.cost``), so per pipeline of one DP replica and one TP rank
the messages carry 2·m·(v·p − 1)·b·s·h·e bytes a step (÷ t under SP; v = 1: 2·m·(p − 1)·b·s·h·e), the
formula of ``tpsim.predict.pipeline.p2p_bytes``. A measured trace averages every record over every rank of the
world; so does ``predict_pipeline_step``: each pipeline rank's rows, summed, divided by p (one pipeline rank is
1/p of the ranks). Pure arithmetic, no MPI.
"""

from __future__ import annotations

from dataclasses import replace

from tpsim.nn.precision import accum_itemsize
from tpsim.partition import padded_length, padded_vocab_size
from tpsim.phases import BACKWARD, DATA, DP_SYNC, FORWARD, OPTIMIZER
from tpsim.arch import architecture_of
from tpsim.arch.shape import kv_replicas
from tpsim.config.experts import has_experts
from tpsim.predict.formulas import Prediction, PredictionRows, add_bucketed, model_rows
from tpsim.predict.moe_comm import expert_stage_rows, mlp_copies, moe_predictions
from tpsim.predict.zero_rows import zero2_reduce_scatter, zero_gathers
from tpsim.predict.pipeline import p2p_bytes


def stage_elements(config, tp: int, layers: range, first: bool, last: bool) -> int:
    """Parameter elements one TP rank of a stage holds: its layers, the embedding (and position table) on the
    first, the final norm and the LM head on the last (a tied head: the embedding's shard again, counted there)."""
    h = config.hidden
    vocab = padded_vocab_size(config.vocab, tp) // tp * h
    terms = architecture_of(config).memory
    n = (sum(terms.dense_layer_elements(config, tp, i) for i in layers) if hasattr(terms, "dense_layer_elements")
         else len(layers) * terms.layer_param_elements(config, tp))  # experts: their dense part (moe_comm the rest)
    if first:
        n += vocab + (config.max_positions * h if config.position_table else 0)
    if last:
        n += config.norm_params * h + (vocab if (config.tied and not first) or not config.tied else 0)
    return n


def stage_rows(run, stage: int, chunks: tuple[range, ...], *, clip: bool, update: bool, grad_bytes: int | None,
               buckets: int | None, held: tuple[int, int] | None = None) -> PredictionRows:
    """Every collective and message one rank of pipeline rank ``stage`` issues in one step; ``chunks[c]``: the layers
    of its chunk c (virtual stage c·pp + stage). ``held``: ZeRO-2's held ``(bytes, buckets)`` (zero2_reduce_scatter)."""
    config, par, sch, pipe = run.model, run.parallel, run.schedule, run.pipeline
    tp, dp, pp, m = par.tp, par.dp, par.pp, pipe.microbatches
    first, last = stage == 0, stage == pp - 1  # virtual stage 0 is rank 0's chunk 0, the last the last rank's
    e, acc = run.precision.numpy.itemsize, accum_itemsize(run.precision.numpy)
    b, s, h = run.micro_batch, sch.seq_len // par.cp, config.hidden  # s: a CP rank's tokens
    rows = PredictionRows(tp, dp, kv_replicas(config, tp), pp=pp, cp=par.cp)
    if tp > 1 and (first or last):  # ids on the first stage, labels on the last (Megatron-LM's get_batch)
        rows.add("batch", DATA, "broadcast", "tp", (first + last) * run.local_batch * s * 8)  # pp 1: both, one call
    blocks = [f"{config.layer_names.block}.{i}" for layers in chunks for i in layers]
    copies = mlp_copies(config, chunks)  # a MoE layer's TP-parallel MLPs: its shared experts
    per_micro = PredictionRows(tp, dp, kv_replicas(config, tp), pp=pp, repeat=m, cp=par.cp, mlp_copies=copies)
    dp = par.grad_replicas  # from here on the gradient group: DP x CP
    model_rows(per_micro, config, tp, par.sp, blocks, b=b, s=s, e=e, acc=acc, first=first, last=last,
               overlap=par.tp_comm_overlap, cp_comm=par.cp_comm)
    boundary = b * (s // tp if par.sp else s) * h * e
    stages = pp * len(chunks)
    for c in range(len(chunks)):  # activations go down the pipeline, gradients up, at every chunk's boundaries
        v = c * pp + stage
        for phase, op, needed in ((FORWARD, "send", v < stages - 1), (FORWARD, "recv", v > 0),
                                  (BACKWARD, "send", v > 0), (BACKWARD, "recv", v < stages - 1)):
            if needed:
                per_micro.add("pipeline", phase, op, "pp", boundary)
    rows.rows.update(per_micro.rows)
    if last and dp > 1:
        rows.add("loss_normalizer", DP_SYNC, "all_reduce", "dp", 8, calls=2)
    if pp > 1:  # one stage (pp 1, the --clock path) holds its loss already, and both ends of a tied embedding
        rows.add("loss_normalizer", DP_SYNC, "broadcast", "pp", 2 * 8)
    if config.tied and pp > 1 and (first or last):
        rows.add(config.layer_names.embed, DP_SYNC, "all_reduce", "embedding",
                 padded_vocab_size(config.vocab, tp) // tp * h * acc)
    elements = sum(stage_elements(config, tp, layers, first and c == 0, last and c == len(chunks) - 1)
                   for c, layers in enumerate(chunks))
    if has_experts(config):  # dense buckets' bytes by formula; the expert buckets and norm apart (moe_comm)
        grad_bytes = buckets = expert_stage_rows(run, rows, [i for layers in chunks for i in layers], clip=clip)
    zero = par.zero_stage
    if zero.shards_optimizer:
        total = padded_length(elements, dp) * acc if grad_bytes is None else grad_bytes
        if dp > 1 and zero.reduces_every_microbatch:  # each micro-batch reduce-scatters what it wrote
            tied = config.tied and pp > 1 and (first or last)  # one bucket (the default) holds the embedding
            held = held if held is not None else (total, buckets) if tied else (0, 0)
            rs_bytes, rs_calls = zero2_reduce_scatter(m, total, buckets, held)
            add_bucketed(rows, "zero", DP_SYNC, "reduce_scatter", rs_bytes, rs_calls)
        elif dp > 1:
            add_bucketed(rows, "zero", DP_SYNC, "reduce_scatter", total, buckets)
    elif dp > 1:
        add_bucketed(rows, "ddp", DP_SYNC, "all_reduce", elements * acc if grad_bytes is None else grad_bytes, buckets)
    if update and run.precision.loss_scaling:
        rows.add("loss_scaler", OPTIMIZER, "all_reduce", "world", 8)
    if clip:
        rows.add("clip_grad_norm", OPTIMIZER, "all_reduce",
                 "world" if zero.shards_optimizer else "mp" if pp > 1 else "tp", 8)
    if zero.shards_optimizer and dp > 1:  # a tied head on its own stage (pp > 1) gathers its own copy: no extra
        for phase, n, calls in zero_gathers(config, par.zero, total // acc * e, buckets, tp=tp, dp=dp, e=e,
                                            microbatches=m, tied_head=pp == 1):
            add_bucketed(rows, "zero", phase, "all_gather", n, calls)
    return rows


def predict_pipeline_step(run, *, clip: bool, update: bool = True, grad_bytes: list[int | None] | None = None,
                          buckets: list[int | None] | None = None,
                          held: list[tuple[int, int] | None] | None = None, routing=None) -> list[Prediction]:
    """Every collective and message of one step of a pipeline ``run`` (pp > 1), as per-rank averages over the
    world (the module docstring): ``stage_rows`` of every stage, summed, ÷ pp. ``grad_bytes[i]`` /
    ``buckets[i]``: stage i's DP sync bytes and bucket count (None: its parameters' bytes, count unpredicted);
    ``held[i]``: ZeRO-2's held ``(bytes, buckets)`` on stage i (None: all of a tied stage's, ``stage_rows``).
    ``routing``: a mixture of experts' routing in the step (``tpsim.ep.record.Routing``): its dispatch rows."""
    from tpsim.live_pipeline.split import split_layers

    par, pipe = run.parallel, run.pipeline
    layers = split_layers(run.model.layers, par.pp * pipe.vp, pipe.stage_layers, vp=pipe.vp)
    out: dict[tuple, Prediction] = {}
    for i in range(par.pp):
        mine = stage_rows(run, i, layers[i::par.pp], clip=clip, update=update,
                          grad_bytes=(grad_bytes or [None] * par.pp)[i], buckets=(buckets or [None] * par.pp)[i],
                          held=(held or [None] * par.pp)[i])
        for key, row in mine.rows.items():
            if key not in out:
                out[key] = replace(row, calls=0 if row.calls is not None else None, bytes=0, wire_bytes=0)
            total = out[key]
            total.calls = None if total.calls is None or row.calls is None else total.calls + row.calls
            total.bytes += row.bytes
            total.wire_bytes += row.wire_bytes
    rows = [replace(r, calls=None if r.calls is None else r.calls / par.pp, bytes=r.bytes / par.pp,
                    wire_bytes=r.wire_bytes / par.pp) for r in out.values()]
    return rows + (moe_predictions(run, routing, par.world) if routing is not None else [])


def p2p_bytes_formula(run) -> int:
    """2·m·(v·p − 1)·b·s·h·e: the bytes one pipeline (one DP replica, one TP rank) sends a step (÷ t under SP;
    ``tpsim.predict.pipeline.p2p_bytes``, exact in integers)."""
    par, pipe = run.parallel, run.pipeline
    bytes_ = p2p_bytes(pipe.schedule, par.pp, pipe.microbatches, pipe.vp, micro_batch=run.micro_batch,
                       seq_len=run.schedule.seq_len // par.cp, hidden=run.model.hidden,
                       bytes_per_element=run.precision.numpy.itemsize, tp=par.tp, sequence_parallel=par.sp)
    return int(round(bytes_))
