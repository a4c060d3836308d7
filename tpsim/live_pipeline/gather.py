"""A pipeline's full tensors in one place: each stage gathers its shards over TP, the stages meet on rank 0.

A mixture of experts' experts are gathered over their own groups: an expert's ETP shards over ETP, the experts of
a layer over EP (to the stage's first rank, which is EP rank 0 and ETP rank 0: ``tpsim.comm.grid``).

Untraced (the tracer paused): gathering for a file or a check is not training traffic. Every rank calls it; the
TP × DP × PP world rank 0 gets the whole model's tensors by serial name, the others None.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.train.gather_folded import gather_folded
from tpsim.live_pipeline.chunk import PipelineShard


def gather_stages(shard: PipelineShard, grid: ProcessGrid, which: str = "params") -> dict[str, np.ndarray] | None:
    """Every parameter (or gradient) of the model as its full serial tensor on rank 0; None elsewhere."""
    with grid.tracer.paused():
        shapes = shard.config.param_shapes()
        local = dict(shard.named_parameters() if which == "params" else shard.named_grads())
        mine = gather_folded(shard, local, shapes, grid)  # experts over ETP and EP (tpsim.train.gather_folded)
        first_chain = grid.replica_rank == 0 and grid.tp_rank == 0  # rank 0's pipeline group: one rank per stage
        stages = grid.pp_group.gather_objects(mine if first_chain else {}, root=0)
    if grid.rank != 0:
        return None
    out: dict[str, np.ndarray] = {}
    for tensors in stages:
        out.update(tensors)  # a tied embedding comes from the first and the last stage: the same numbers
    return {name: out[name] for name in shard.config.param_shapes()}
