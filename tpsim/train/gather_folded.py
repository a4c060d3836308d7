"""Full tensors of a model whose experts are folded over other ranks than its dense shards (Parallel Folding).

A dense shard is gathered over TP along its Partition (``tpsim.hf.checkpoint.gather_full``); an expert's ETP shards
over ETP, and a layer's experts over EP to EP rank 0 — the stage's first rank is EP rank 0, ETP rank 0 and TP rank
0 (``tpsim.comm.grid``), so that rank ends with every tensor of its stage. Collective over each group; the caller
pauses the tracer (a file or a check, not model traffic).
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.ep.params import expert_param_names
from tpsim.hf.checkpoint import gather_full


def gather_folded(model, local: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
                  grid: ProcessGrid) -> dict[str, np.ndarray]:
    """``local`` (shard-shaped arrays by parameter name) as full tensors: the dense ones on every TP rank, the
    experts' on EP rank 0 and ETP rank 0 of each expert group (all of the layer's there)."""
    experts, parts = expert_param_names(model), dict(model.named_partitions())
    dense = {n: a for n, a in local.items() if n not in experts}
    out = gather_full(dense, parts, {n: shapes[n] for n in dense}, grid.tp_group)
    if experts:
        held = {n: a for n, a in local.items() if n in experts}
        full = gather_full(held, parts, {n: shapes[n] for n in held}, grid.group("etp"))
        for piece in grid.group("ep").gather_objects(full if grid.etp_rank == 0 else {}, root=0) or []:
            out.update(piece)
    return out
