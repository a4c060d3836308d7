"""The broadcasts that make TP × DP start and stay in step: parameters once, the batch every step.

This is the Megatron way of combining DP and TP as §3.1 of the SenseParrots article describes it: DDP's own
parameter broadcast inside the DP group, one more broadcast of the non-parallel layers inside the TP group, and
the batch broadcast inside the TP group before every forward.

Parameters. Every rank may draw its model from the same seed, but a checkpoint loaded on one rank, or any
drift, would leave replicas apart, and DP averaging cannot repair a difference in the *weights*. So at start:

    1. inside each TP group, TP rank 0 broadcasts every **replicated** parameter (LayerNorms, position
       embedding, row-parallel biases) — sharded ones differ by design and are left alone;
    2. inside each DP group, DP rank 0 broadcasts **every** parameter (the twins of one shard); an expert's
       (``tpsim.ep``) inside its expert-DP group, the ranks holding the same experts.

After step 1 every replica's replicated copies equal its TP rank 0's; after step 2 every rank equals the rank at
(dp 0, same tp_rank), whose replicated copies came from (dp 0, tp 0): the whole grid agrees with DP replica 0.

Data. Megatron reads the batch on TP rank 0 and broadcasts it inside the TP group (``broadcast_data``), so
every rank of a TP group works on the same rows; DP replicas get disjoint rows of the global batch:
``dp_slice`` gives DP rank d the contiguous block ``[d·B/dp, (d+1)·B/dp)``.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.ep.params import expert_param_names
from tpsim.errors import ConfigError
from tpsim.nn.module import Module
from tpsim.phases import DATA, INIT


def broadcast_params(module: Module, grid: ProcessGrid) -> None:
    """Make every replica equal DP replica 0 (see the module docstring). In place; phase "init", scope = name.

    A group of size 1 issues nothing. Each parameter must be a writeable C-contiguous array (``add_param``
    guarantees it); a tied weight is listed once and so broadcast once.
    """
    tracer = grid.tracer
    entries, experts = list(module.named_entries()), expert_param_names(module)
    if grid.tp > 1:
        for e in entries:
            if e.partition is None and e.name not in experts:  # replicated across TP: TP rank 0's copy wins
                with tracer.region(scope=e.name, phase=INIT):
                    grid.tp_group.broadcast(e.param, root=0)
    for e in entries:  # every shard equals its twin in DP replica 0 (an expert's: in expert-DP replica 0)
        group = grid.group("edp") if e.name in experts else grid.dp_group
        if group.size > 1:
            with tracer.region(scope=e.name, phase=INIT):
                group.broadcast(e.param, root=0)


def broadcast_batch(grid: ProcessGrid, ids: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TP rank 0's ``(ids, labels)`` on every rank of its TP group: one broadcast, phase "data", scope "batch".

    Contract: on TP rank 0, ``ids`` and ``labels`` are this DP replica's rows, ``int [b, s]`` each. On the other
    TP ranks only their *shape* is read — pass e.g. ``np.empty((b, s), np.int64)`` twice, with ``b, s`` known
    from the configuration (batch size / dp, sequence length): every rank must pass the same shape, as in
    Megatron where the sizes are part of the config. Both are packed into one ``int64 [2, b, s]`` message.
    Returns fresh ``int64 [b, s]`` arrays (ids, labels); with tp == 1 nothing is sent.
    """
    ids, labels = np.asarray(ids), np.asarray(labels)
    if ids.shape != labels.shape or ids.ndim != 2:
        raise ValueError(f"ids and labels must both be [batch, seq]; got {ids.shape} and {labels.shape}")
    if grid.tp == 1:
        return ids.astype(np.int64), labels.astype(np.int64)
    packed = np.empty((2, *ids.shape), dtype=np.int64)
    if grid.tp_rank == 0:
        packed[0], packed[1] = ids, labels
    with grid.tracer.region(scope="batch", phase=DATA):
        grid.tp_group.broadcast(packed, root=0)
    return packed[0].copy(), packed[1].copy()


def dp_slice(global_batch: int, dp: int, dp_rank: int) -> slice:
    """The rows of the global batch that DP rank ``dp_rank`` owns: ``slice(d·B/dp, (d+1)·B/dp)``.

    Raises ``ConfigError`` (the same on every rank) when ``global_batch`` is not divisible by ``dp``.
    """
    if dp < 1 or not 0 <= dp_rank < dp:
        raise ConfigError(f"dp rank {dp_rank} is outside a DP group of size {dp}")
    if global_batch < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {global_batch}")
    if global_batch % dp:
        raise ConfigError(f"--batch-size {global_batch} is not divisible by dp {dp}")
    rows = global_batch // dp
    return slice(dp_rank * rows, (dp_rank + 1) * rows)
