"""The collectives and messages of one pipeline training step, per rank, as ``predict_step`` says them without one.

A pipeline of p stages (``tpsim.pp``) issues, on the ranks of stage i (its layers ``blocks_i``, b = B/(dp·m)
rows a micro-batch, m micro-batches):

    layer (layer_of)          phase       op          group      per step, on stage i
    batch                     data        broadcast   tp         ids int64 [B/dp, s] on the first, labels on the last
    (the model's rows)        ...         ...         tp, kv     ``model_rows`` of blocks_i on b rows, m times; the
                                                                 embedding's on the first, head and loss on the last
    pipeline                  forward     send / recv pp         m activations b·s·h·e (÷ t under SP) to stage i+1 /
                                                                 from stage i−1 (none past the ends)
    pipeline                  backward    send / recv pp         m gradients of the same size to i−1 / from i+1
    loss_normalizer           dp_sync     all_reduce  dp         the last stage: [N] before, [Σ n·L] after (dp > 1)
    loss_normalizer           dp_sync     broadcast   pp         float64 [2] (loss, N) from the last stage to all
    <embedding>               dp_sync     all_reduce  embedding  a tied embedding's gradient shard, first and last
    ddp / zero, loss_scaler   as without a pipeline, over this stage's own gradients
    clip_grad_norm            optimizer   all_reduce  mp         float64 [1] over TP × PP (ZeRO-1: world)

A send's wire bytes are its bytes, a recv's 0 (``tpsim.cost``), so per pipeline of one DP replica and one TP rank
the messages carry 2·m·(p − 1)·b·s·h·e bytes a step (÷ t under SP). A measured trace averages every record over
every rank of the world; so does ``predict_pipeline_step``: each stage's rows, summed, divided by p (one stage is
1/p of the ranks). Pure arithmetic, no MPI.
"""

from __future__ import annotations

from dataclasses import replace

from tpsim.nn.precision import accum_itemsize
from tpsim.partition import padded_length, padded_vocab_size
from tpsim.phases import BACKWARD, DATA, DP_SYNC, FORWARD, OPTIMIZER
from tpsim.arch import architecture_of
from tpsim.arch.shape import kv_replicas
from tpsim.predict.formulas import Prediction, _Rows, _bucketed, model_rows


def stage_elements(config, tp: int, layers: range, first: bool, last: bool) -> int:
    """Parameter elements one TP rank of a stage holds: its layers, the embedding (and position table) on the
    first, the final norm and the LM head on the last (a tied head: the embedding's shard again, counted there)."""
    h = config.hidden
    vocab = padded_vocab_size(config.vocab, tp) // tp * h
    n = len(layers) * architecture_of(config).memory.layer_param_elements(config, tp)
    if first:
        n += vocab + (config.max_positions * h if config.position_table else 0)
    if last:
        n += config.norm_params * h + (vocab if (config.tied and not first) or not config.tied else 0)
    return n


def stage_rows(run, stage: int, layers: range, *, clip: bool, update: bool, grad_bytes: int | None,
               buckets: int | None) -> _Rows:
    """Every collective and message one rank of pipeline stage ``stage`` (its ``layers``) issues in one step."""
    config, par, sch, pipe = run.model, run.parallel, run.schedule, run.pipeline
    tp, dp, pp, m = par.tp, par.dp, par.pp, pipe.microbatches
    first, last = stage == 0, stage == pp - 1
    e = run.precision.numpy.itemsize
    acc = accum_itemsize(run.precision.numpy)
    b, s, h = run.micro_batch, sch.seq_len, config.hidden
    rows = _Rows(tp, dp, kv_replicas(config, tp), pp=pp)
    if tp > 1 and (first or last):  # ids on the first stage, labels on the last (Megatron-LM's get_batch)
        rows.add("batch", DATA, "broadcast", "tp", run.local_batch * s * 8)
    per_micro = _Rows(tp, dp, kv_replicas(config, tp), pp=pp, repeat=m)
    blocks = [f"{config.layer_names.block}.{i}" for i in layers]
    model_rows(per_micro, config, tp, par.sp, blocks, b=b, s=s, e=e, acc=acc, first=first, last=last)
    boundary = b * (s // tp if par.sp else s) * h * e
    for phase, to_next in ((FORWARD, True), (BACKWARD, False)):  # activations go down the pipeline, gradients up
        if (not last) if to_next else (not first):
            per_micro.add("pipeline", phase, "send", "pp", boundary)
        if (not first) if to_next else (not last):
            per_micro.add("pipeline", phase, "recv", "pp", boundary)
    rows.rows.update(per_micro.rows)
    if last and dp > 1:
        rows.add("loss_normalizer", DP_SYNC, "all_reduce", "dp", 8, calls=2)
    rows.add("loss_normalizer", DP_SYNC, "broadcast", "pp", 2 * 8)
    if config.tied and (first or last):
        rows.add(config.layer_names.embed, DP_SYNC, "all_reduce", "embedding",
                 padded_vocab_size(config.vocab, tp) // tp * h * acc)
    elements = stage_elements(config, tp, layers, first, last)
    if par.zero:
        total = padded_length(elements, dp) * acc if grad_bytes is None else grad_bytes
        if dp > 1:
            _bucketed(rows, "zero", DP_SYNC, "reduce_scatter", total, buckets)
    elif dp > 1:
        _bucketed(rows, "ddp", DP_SYNC, "all_reduce", elements * acc if grad_bytes is None else grad_bytes, buckets)
    if update and run.precision.loss_scaling:
        rows.add("loss_scaler", OPTIMIZER, "all_reduce", "world", 8)
    if clip:
        rows.add("clip_grad_norm", OPTIMIZER, "all_reduce", "world" if par.zero else "mp", 8)
    if par.zero and dp > 1:
        _bucketed(rows, "zero", OPTIMIZER, "all_gather", total // acc * e, buckets)
    return rows


def predict_pipeline_step(run, *, clip: bool, update: bool = True, grad_bytes: list[int | None] | None = None,
                          buckets: list[int | None] | None = None) -> list[Prediction]:
    """Every collective and message of one step of a pipeline ``run`` (pp > 1), as per-rank averages over the
    world (the module docstring): ``stage_rows`` of every stage, summed, ÷ pp. ``grad_bytes[i]`` /
    ``buckets[i]``: stage i's DP sync bytes and bucket count (None: its parameters' bytes, count unpredicted)."""
    from tpsim.pp.split import split_layers

    par, pipe = run.parallel, run.pipeline
    if pipe.vp != 1:
        raise ValueError("interleaved stages (vp > 1) are not predicted yet")
    layers = split_layers(run.model.layers, par.pp, pipe.stage_layers)
    out: dict[tuple, Prediction] = {}
    for i, stage_layers in enumerate(layers):
        mine = stage_rows(run, i, stage_layers, clip=clip, update=update,
                          grad_bytes=(grad_bytes or [None] * par.pp)[i], buckets=(buckets or [None] * par.pp)[i])
        for key, row in mine.rows.items():
            if key not in out:
                out[key] = replace(row, calls=0 if row.calls is not None else None, bytes=0, wire_bytes=0)
            total = out[key]
            total.calls = None if total.calls is None or row.calls is None else total.calls + row.calls
            total.bytes += row.bytes
            total.wire_bytes += row.wire_bytes
    return [replace(r, calls=None if r.calls is None else r.calls / par.pp, bytes=r.bytes / par.pp,
                    wire_bytes=r.wire_bytes / par.pp) for r in out.values()]


def p2p_bytes_formula(run) -> int:
    """2·m·(p − 1)·b·s·h·e: the bytes one pipeline (one DP replica, one TP rank) sends a step (÷ t under SP)."""
    par, sch = run.parallel, run.schedule
    s = sch.seq_len // par.tp if par.sp else sch.seq_len
    return (2 * run.pipeline.microbatches * (par.pp - 1) * run.micro_batch * s * run.model.hidden
            * run.precision.numpy.itemsize)
