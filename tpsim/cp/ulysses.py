"""Ulysses context parallelism (Jacobs et al. 2023, DeepSpeed-Ulysses, arXiv:2309.14509): trade the sequence
split for a head split around attention, with all-to-alls.

Rank r holds Q, K, V of its s/C tokens for all h heads of its TP rank. An all-to-all gives it instead h/C whole
heads over the whole sequence (chunk j of the heads to rank j, the sequence shards gathered in CP-rank order);
attention then runs on whole sequences, per head, with nothing more to exchange; a second all-to-all takes the
output back to sequence shards:

    forward    Q', K', V' = all_to_all(Q, K, V)      [b, h/C, s, d], [b, kv/C, s, d]   (3 all-to-alls)
               O' = attention(Q', K', V')             causal by absolute position
               O = all_to_all(O')                     [b, h, s/C, d]                    (the 4th)
    backward   dO' = all_to_all(dO);  dQ', dK', dV' = attention's backward;  dQ, dK, dV = all_to_all(each)

Each all-to-all keeps 1/C of its tensor and sends the rest: (C − 1)/C of the local Q, K, V and O (four a
direction, ``tpsim.predict.cp_comm``). Query heads j·h/C ... read KV heads j·kv/C ..., so GQA needs h and kv both
divisible by C (``tpsim.cp.choice``) and, again, only the KV heads travel. Traced on the CP group.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.cp.blocks import block_backward, block_forward


class UlyssesCache(NamedTuple):
    q: np.ndarray  # [b, h/C, s, d]: this rank's heads over the whole sequence
    k: np.ndarray
    v: np.ndarray
    out: np.ndarray
    lse: np.ndarray
    pos: np.ndarray  # absolute positions of the gathered sequence's rows


def _to_heads(ctx, x: np.ndarray, work) -> np.ndarray:
    """[b, n, s/C, d] sequence shard -> [b, n/C, s, d] head shard (sequence shards in CP-rank order)."""
    return ctx.group.all_to_all(np.ascontiguousarray(x.astype(ctx.dtype, copy=False)), 1, 2).astype(work, copy=False)


def _to_sequence(ctx, x: np.ndarray, work) -> np.ndarray:
    """[b, n/C, s, d] head shard -> [b, n, s/C, d] sequence shard."""
    return ctx.group.all_to_all(np.ascontiguousarray(x.astype(ctx.dtype, copy=False)), 2, 1).astype(work, copy=False)


def _head_slice(ctx, heads: int) -> slice:
    n = heads // ctx.group.size
    return slice(ctx.group.rank * n, (ctx.group.rank + 1) * n)


def ulysses_forward(ctx, q: np.ndarray, k: np.ndarray, v: np.ndarray, keep=None, p: float = 0.0):
    """``(O [b, h, L, d], UlyssesCache)`` (module docstring)."""
    work, local = q.dtype, q.shape[2]
    qh, kh, vh = (_to_heads(ctx, x, work) for x in (q, k, v))
    pos = np.concatenate([ctx.rank_positions(j, local) for j in range(ctx.group.size)])
    ctx.count(pos, pos, q.shape[1], heads_here=qh.shape[1])
    mask = keep(pos, pos, _head_slice(ctx, q.shape[1])) if keep is not None else None
    out, lse = block_forward(qh, kh, vh, pos, pos, mask, p)
    return _to_sequence(ctx, out, work), UlyssesCache(qh, kh, vh, out, lse, pos)


def ulysses_backward(ctx, dout: np.ndarray, cache: UlyssesCache, keep=None, p: float = 0.0):
    """``(dQ, dK, dV)`` of this rank's sequence shard (module docstring)."""
    work = cache.q.dtype
    mask = keep(cache.pos, cache.pos, _head_slice(ctx, dout.shape[1])) if keep is not None else None
    douth = _to_heads(ctx, dout, work)
    dq, dk, dv = block_backward(douth, cache.out, cache.lse, cache.q, cache.k, cache.v, cache.pos, cache.pos,
                                mask, p)
    return tuple(_to_sequence(ctx, g, work) for g in (dq, dk, dv))
