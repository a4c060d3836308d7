"""This rank's pipeline chunks, cut from the serial master weights, so a pipeline equals the serial model.

Every rank draws the whole serial model from the run's seed (as the TP build does: ``tpsim.models.build``),
shards it over its TP group with the architecture's own parallel builder, and keeps the layers of its virtual
stages (chunk c of pipeline rank r is virtual stage c·pp + r):

    stage 0            the embedding (wte, and wpe for GPT-2) and its layers
    a middle stage     its layers
    the last stage     its layers, the final norm, the LM head (tied: the embedding's shard again) and the loss

The rest is dropped when this returns. Because the chunks are the TP model's own layer objects, a stage's
parameters, their TP partitions and their trace scopes are exactly those of the TP model.
"""

from __future__ import annotations

import copy

from tpsim.arch import architecture_of
from tpsim.cp.context import core_for
from tpsim.nn.attention import SERIAL_CORE, AttentionCore
from tpsim.live_pipeline.chunk import ModelChunk, PipelineShard, mark_shared_copy
from tpsim.live_pipeline.split import split_layers


def pipeline_from_serial(serial, grid, stage_layers: tuple[range, ...], *,
                         sequence_parallel: bool = False, tp_comm_overlap: bool = False,
                         core: AttentionCore = SERIAL_CORE, dispatcher: str = "alltoall",
                         microbatches: int = 1) -> PipelineShard:
    """This rank's ``PipelineShard`` of ``serial`` on ``grid`` (TP group: the layers' shards; ``grid.pp``
    ranks × len(stage_layers) / pp chunks each). Collective over the TP group (as the TP build is).
    ``core``: the attention core every attention layer and chunk is built with (CP: ``tpsim.cp.context``).
    A mixture of experts' builder also gets the grid (its expert groups), the ``dispatcher`` and the step's
    ``microbatches`` (``tpsim.ep.moe``)."""
    stages = len(stage_layers)
    if stages % grid.pp:
        raise ValueError(f"{stages} virtual stages do not divide over {grid.pp} pipeline ranks")
    arch = architecture_of(serial.config)
    experts = dict(grid=grid, dispatcher=dispatcher, microbatches=microbatches) if arch.experts else {}
    full = arch.parallel(serial, grid.tp_group, sequence_parallel=sequence_parallel,
                         tp_comm_overlap=tp_comm_overlap, core=core, **experts)
    body = full.body()
    wte, wpe, blocks, ln_f = body.parts()
    edge = copy.copy(body)  # the embedding's wiring (wte, wpe, dropout, SP split) without the blocks
    setattr(edge, body.NAMES[2], [])
    tied = full.lm_head.params["weight"] is wte.params["weight"]
    chunks, shared = [], None
    for c in range(stages // grid.pp):
        v = c * grid.pp + grid.pp_rank
        first, last = v == 0, v == stages - 1
        named = {}
        if first:
            named[wte.path] = wte
            if wpe is not None:
                named[wpe.path] = wpe
        elif last and tied:  # the LM head's weight is the embedding's shard: name it so, copy 1 of it
            named[wte.path] = wte
            mark_shared_copy(wte, full.lm_head)
        mine = [blocks[i] for i in stage_layers[v]]
        named.update((b.path, b) for b in mine)
        if last:
            named.update({ln_f.path: ln_f, full.lm_head.path: full.lm_head, full.loss.path: full.loss})
        if tied and grid.pp > 1 and (first or last):
            shared = wte
        chunk = ModelChunk(v, stages, mine, edge=edge if first else None,
                           head=(ln_f, full.lm_head, full.loss) if last else None,
                           region=body.region, group=body.group, core=core, named=named)
        chunk.tracer = grid.tracer
        chunks.append(chunk)
    return PipelineShard(full.config, chunks, stage_layers, shared_embedding=shared)


def build_pipeline(run, grid) -> PipelineShard:
    """This rank's chunks of ``run``'s model (a ``tpsim.config.RunConfig``): the serial master from its seed and
    dtype, the layer split of ``run.pipeline``, sequence parallelism as ``run.parallel.sp`` says."""
    pipe = run.pipeline
    layers = split_layers(run.model.layers, grid.pp * pipe.vp, pipe.stage_layers, vp=pipe.vp)
    par = run.parallel
    core = core_for(grid.cp_group, par.cp_comm, par.cp_layout)
    return pipeline_from_serial(run.serial_model(), grid, layers, sequence_parallel=run.parallel.sp,
                                tp_comm_overlap=run.parallel.tp_comm_overlap, core=core,
                                dispatcher=run.experts.dispatcher, microbatches=pipe.microbatches)
