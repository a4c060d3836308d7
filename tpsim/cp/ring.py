"""Ring attention over a CP group (Liu et al. 2023, arXiv:2310.01889), forward and a hand-written backward ring.

Rank r of C holds its queries Q_r and its block (K_r, V_r) at the positions of its layout (``tpsim.cp.layout``).
Forward: C steps; at step t rank r holds block (r − t) mod C, computes its partial attention and merges it into
the running (O, lse) by the online-softmax rule (``tpsim.cp.blocks.merge``), and passes the block on to r + 1:

    step t:  O, lse <- merge(O, lse, block_forward(Q_r, K_j, V_j))      j = (r − t) mod C
             send [K_j, V_j] to r + 1, receive [K_(j−1), V_(j−1)] from r − 1          (t < C − 1)

so C − 1 messages of 2·b·kv·(s/C)·d elements leave each rank (``tpsim.predict.cp_comm``). Backward, the second
ring: the block travels the same way again and carries its gradient accumulator [dK_j, dV_j] with it; each rank
adds its queries' share (``block_backward``) and keeps dQ_r. After C − 1 steps the block has met every rank's
queries; one last message takes [dK_j, dV_j] home to rank j:

    step t:  dQ_r += dQ share;  [dK_j, dV_j] += (dK, dV) share                     j = (r − t) mod C
             send [K_j, V_j] and [dK_j, dV_j] to r + 1, receive j − 1's from r − 1      (t < C − 1)
    then     send [dK_j, dV_j] to r + 1: rank r receives its own [dK_r, dV_r] from r − 1

A block with no (query, key) pair under the causal mask is skipped (its keys all come after the queries); the
message still goes, because the ring carries it on. Sends are posted (``Isend``) before the receive, so the ring
never deadlocks. Only the KV heads travel (GQA). Messages are traced on the CP group under the caller's scope.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.cp.blocks import block_backward, block_forward, merge

FORWARD_TAG, KV_TAG, DKV_TAG = 11, 12, 13


class RingCache(NamedTuple):
    q: np.ndarray
    kv: np.ndarray  # [2, b, kv, L, d] this rank's own K and V, in the dtype that travels
    out: np.ndarray
    lse: np.ndarray
    dtype: np.dtype  # the activations' dtype (the arithmetic may run wider: ``ContextParallel``)


def _pass(group, buf: np.ndarray, tag: int) -> np.ndarray:
    """Send ``buf`` one step along the ring (to r + 1) and receive the one coming from r − 1."""
    nxt, prv = (group.rank + 1) % group.size, (group.rank - 1) % group.size
    group.send(buf, nxt, tag)
    return group.recv(buf.shape, buf.dtype, prv, tag)


def ring_forward(ctx, q: np.ndarray, k: np.ndarray, v: np.ndarray, keep=None, p: float = 0.0):
    """``(O [b, h, L, d], RingCache)``: this rank's queries over every block of the ring (module docstring)."""
    group, cp, work = ctx.group, ctx.group.size, q.dtype
    kv = np.ascontiguousarray(np.stack([k, v]).astype(ctx.dtype, copy=False))
    held, out, lse = kv, None, None
    q_pos = ctx.rank_positions(group.rank, q.shape[2])
    for t in range(cp):
        j = (group.rank - t) % cp
        k_pos = ctx.rank_positions(j, q.shape[2])
        if ctx.count(q_pos, k_pos, q.shape[1]):
            mask = keep(q_pos, k_pos, None) if keep is not None else None
            k_j, v_j = (x.astype(work, copy=False) for x in held)
            o_j, lse_j = block_forward(q, k_j, v_j, q_pos, k_pos, mask, p)
            out, lse = (o_j, lse_j) if out is None else merge(out, lse, o_j, lse_j)
        if t < cp - 1:
            held = _pass(group, held, FORWARD_TAG)
    group.wait_sends()
    return out, RingCache(q, kv, out, lse, ctx.dtype)


def ring_backward(ctx, dout: np.ndarray, cache: RingCache, keep=None, p: float = 0.0):
    """``(dQ, dK, dV)`` of this rank's shard: the second ring (module docstring)."""
    group, cp = ctx.group, ctx.group.size
    q, work = cache.q, cache.q.dtype
    q_pos = ctx.rank_positions(group.rank, q.shape[2])
    dq = np.zeros_like(q)
    held, acc = cache.kv, np.zeros(cache.kv.shape, dtype=cache.dtype)
    for t in range(cp):
        j = (group.rank - t) % cp
        k_pos = ctx.rank_positions(j, q.shape[2])
        if ctx.count(q_pos, k_pos, q.shape[1], backward=True):
            mask = keep(q_pos, k_pos, None) if keep is not None else None
            k_j, v_j = (x.astype(work, copy=False) for x in held)
            dq_j, dk_j, dv_j = block_backward(dout, cache.out, cache.lse, q, k_j, v_j, q_pos, k_pos, mask, p)
            dq += dq_j
            acc = (acc.astype(work, copy=False) + np.stack([dk_j, dv_j])).astype(cache.dtype, copy=False)  # new
        if t < cp - 1:
            held = _pass(group, held, KV_TAG)
        if cp > 1:
            acc = _pass(group, acc, DKV_TAG)  # to r + 1; the last step takes each accumulator home
    group.wait_sends()
    return dq, acc[0].astype(work, copy=False), acc[1].astype(work, copy=False)
