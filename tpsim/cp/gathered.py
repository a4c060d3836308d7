"""All-gather context parallelism (Llama 3's choice, Dubey et al. 2024 §3.3.2): K and V of the whole sequence
gathered before attention, their gradients reduce-scattered after.

    forward    [K, V]_all = all_gather([K_r, V_r])           [2, b, kv, s, d], blocks in CP-rank order
               O_r, lse_r = block_forward(Q_r, K_all, V_all)  causal by absolute position (any layout)
    backward   dQ_r, dK_all, dV_all = block_backward(dO_r, O_r, lse_r, ...)
               [dK_r, dV_r] = reduce_scatter([dK_all, dV_all])   every rank's queries' share, summed

Simpler than the ring and the same forward bytes ((C − 1)·2·b·kv·(s/C)·d a rank), but every rank holds the whole
K and V of the sequence for the layer — the memory the ring avoids — and nothing overlaps the gather. Only the KV
heads travel (GQA). Traced on the CP group under the caller's scope.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.cp.blocks import block_backward, block_forward


class GatheredCache(NamedTuple):
    q: np.ndarray
    kv: np.ndarray  # [2, b, kv, s, d] the whole sequence's K and V, in the arithmetic's dtype
    out: np.ndarray
    lse: np.ndarray
    k_pos: np.ndarray  # the absolute positions of kv's rows


def gathered_forward(ctx, q: np.ndarray, k: np.ndarray, v: np.ndarray, keep=None, p: float = 0.0):
    """``(O [b, h, L, d], GatheredCache)`` (module docstring)."""
    group, local = ctx.group, q.shape[2]
    mine = np.ascontiguousarray(np.stack([k, v]).astype(ctx.dtype, copy=False))
    kv = group.all_gather(mine, axis=3).astype(q.dtype, copy=False)
    q_pos = ctx.rank_positions(group.rank, local)
    k_pos = np.concatenate([ctx.rank_positions(j, local) for j in range(group.size)])
    ctx.count(q_pos, k_pos, q.shape[1])
    mask = keep(q_pos, k_pos, None) if keep is not None else None
    out, lse = block_forward(q, kv[0], kv[1], q_pos, k_pos, mask, p)
    return out, GatheredCache(q, kv, out, lse, k_pos)


def gathered_backward(ctx, dout: np.ndarray, cache: GatheredCache, keep=None, p: float = 0.0):
    """``(dQ, dK, dV)`` of this rank's shard (module docstring)."""
    group, q = ctx.group, cache.q
    q_pos = ctx.rank_positions(group.rank, q.shape[2])
    mask = keep(q_pos, cache.k_pos, None) if keep is not None else None
    dq, dk, dv = block_backward(dout, cache.out, cache.lse, q, cache.kv[0], cache.kv[1], q_pos, cache.k_pos, mask, p)
    mine = group.reduce_scatter(np.stack([dk, dv]).astype(ctx.dtype, copy=False), axis=3)
    return dq, mine[0].astype(q.dtype), mine[1].astype(q.dtype)
