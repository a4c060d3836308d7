"""The batch on a pipeline: the first stage reads the token ids, the last the labels, middle stages nothing.

As Megatron-LM's ``get_batch`` does with pipeline stages: TP rank 0 of the first stage reads this DP replica's
ids and broadcasts them in its TP group, TP rank 0 of the last stage does the same with the labels (int64
[B/dp, s] each, scope "batch", phase "data"; nothing with tp == 1). The rows' positions in the global batch
come with them (dropout masks are keyed by them), on every stage.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.phases import DATA
from tpsim.train.broadcast import dp_slice


def stage_batch(grid: ProcessGrid, read, batch_size: int, seq_len: int, tokens=None):
    """``(ids or None, labels or None, global rows)`` of this DP replica on this stage; ``read()`` returns the
    global batch ``(ids, labels)`` and is called on TP rank 0 of the first and the last stage only. ``tokens``:
    the sequence positions this rank reads (context parallelism; None: all ``seq_len``)."""
    rows = dp_slice(batch_size, grid.dp, grid.dp_rank)
    positions = np.arange(batch_size)[rows]
    need = [grid.first_stage, grid.last_stage]
    if not any(need):
        return None, None, positions
    tokens = np.arange(seq_len) if tokens is None else tokens
    local = (batch_size // grid.dp, len(tokens))
    out = []
    if grid.tp_rank == 0:
        ids, labels = read()
        out = [np.ascontiguousarray(a[rows][:, tokens], dtype=np.int64)
               for a, wanted in zip((ids, labels), need) if wanted]
    if grid.tp > 1:
        packed = np.stack(out) if out else np.empty((sum(need), *local), dtype=np.int64)
        with grid.tracer.region(scope="batch", phase=DATA):
            grid.tp_group.broadcast(packed, root=0)
        out = list(packed)
    it = iter(out)
    return (next(it) if need[0] else None), (next(it) if need[1] else None), positions
