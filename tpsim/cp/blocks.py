"""Attention over a sequence cut into shards, one key/value block at a time: the arithmetic of ring attention.

Context parallelism gives each of C ranks a shard of the sequence; attention is the one layer whose queries need
keys of the other shards. Ring attention (Liu et al. 2023, arXiv:2310.01889) visits the K/V blocks one after
another and never holds a whole [s, s] score matrix. For queries Q of a shard and one block (K_j, V_j) at
absolute positions, causal (key position ≤ query position), scale 1/√d:

    S_j = Q·K_jᵀ·scale (masked: −∞)     m_j = max_k S_j     l_j = Σ_k exp(S_j − m_j)
    O_j = exp(S_j − m_j)·V_j / l_j       lse_j = m_j + log l_j                      (``block_forward``)

and two partial results merge exactly, the online softmax (Milakov & Gimelshein 2018; the same idea as the
SenseParrots article's parallel softmax, eqs. (3)(4): a global max and a global sum of exponentials, each
shard's part rescaled to them):

    lse = log(exp(lse_a) + exp(lse_b))     O = exp(lse_a − lse)·O_a + exp(lse_b − lse)·O_b     (``merge``)

A query row that sees no key of a block has lse_j = −∞ and O_j = 0, and the merge leaves the other side as it
is. The backward needs only the final O and lse (Dao et al. 2022, FlashAttention, §B.2): with P_j = exp(S_j −
lse) the block's share of the final probabilities and D = rowsum(dO ⊙ O),

    dV_j = P_jᵀ·dO      dS_j = P_j ⊙ (dO·V_jᵀ − D)      dQ += dS_j·K_j·scale      dK_j = dS_jᵀ·Q·scale
                                                                                 (``block_backward``)

so each block's contribution to dQ, dK and dV is computed where the block is, and the sums are the serial
gradients. Attention dropout (GPT-2) multiplies the normalised probabilities by a keep mask M/(1 − p): O_j uses
(exp(S_j − m_j)/l_j ⊙ M_j/(1 − p))·V_j, which merges the same way (the rescaling is linear), and the backward
reads dV_j = (P_j ⊙ M_j)ᵀ·dO/(1 − p), dP_j = dO·V_jᵀ ⊙ M_j/(1 − p); D = rowsum(dO ⊙ O) still holds.
Grouped-query attention: a KV head serves n_rep query heads; ``block_*`` repeat K and V to the query
heads and fold dK, dV back (only the KV heads travel). Shapes ``[b, heads, s_shard, d]``. Pure NumPy, no MPI.
"""

from __future__ import annotations

import numpy as np


def _repeat(x: np.ndarray, heads: int) -> np.ndarray:
    return x if x.shape[1] == heads else np.repeat(x, heads // x.shape[1], axis=1)


def _fold(dx: np.ndarray, kv_heads: int) -> np.ndarray:
    b, h, s, d = dx.shape
    return dx if h == kv_heads else dx.reshape(b, kv_heads, h // kv_heads, s, d).sum(axis=2)


def _scores(q: np.ndarray, k: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
    """Q·Kᵀ/√d with keys after the query (by absolute position) at −∞."""
    s = q @ _repeat(k, q.shape[1]).swapaxes(-1, -2) * (1.0 / float(np.sqrt(q.shape[-1])))
    np.copyto(s, -np.inf, where=k_pos[None, :] > q_pos[:, None])
    return s


def _dropped(x: np.ndarray, keep: np.ndarray | None, p: float) -> np.ndarray:
    return x if keep is None else x * keep * (1.0 / (1.0 - p))


def block_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray,
                  keep: np.ndarray | None = None, p: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``(O_j [b, h, sq, d], lse_j [b, h, sq])`` of queries at ``q_pos`` against one K/V block at ``k_pos``;
    ``keep``: attention dropout's mask ``bool [b, h, sq, sk]`` of drop probability ``p`` (None: no dropout)."""
    s = _scores(q, k, q_pos, k_pos)
    m = s.max(axis=-1, keepdims=True)
    seen = np.isfinite(m)
    e = np.exp(s - np.where(seen, m, 0.0))  # a row that sees nothing: exp(−∞) = 0 everywhere
    total = e.sum(axis=-1, keepdims=True)
    out = (_dropped(e / np.where(seen, total, 1.0), keep, p)) @ _repeat(v, q.shape[1])
    lse = np.where(seen, m + np.log(np.where(seen, total, 1.0)), -np.inf)[..., 0]
    return out, lse


def merge(out_a: np.ndarray, lse_a: np.ndarray, out_b: np.ndarray,
          lse_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two partial attentions of the same queries over disjoint keys as one (the module docstring)."""
    top = np.maximum(lse_a, lse_b)
    safe = np.where(np.isfinite(top), top, 0.0)
    wa, wb = np.exp(lse_a - safe), np.exp(lse_b - safe)  # 0 for a side that saw nothing
    lse = np.where(np.isfinite(top), safe + np.log(wa + wb), -np.inf)
    norm = np.where(np.isfinite(top), wa + wb, 1.0)
    return (wa / norm)[..., None] * out_a + (wb / norm)[..., None] * out_b, lse


def block_backward(dout: np.ndarray, out: np.ndarray, lse: np.ndarray, q: np.ndarray, k: np.ndarray,
                   v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray, keep: np.ndarray | None = None,
                   p: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One block's ``(dQ share, dK_j, dV_j)`` from the final ``out``, ``lse`` and ``dout`` of the queries (``keep``,
    ``p``: the forward's dropout)."""
    heads, scale = q.shape[1], 1.0 / float(np.sqrt(q.shape[-1]))
    s = _scores(q, k, q_pos, k_pos)
    probs = np.exp(s - np.where(np.isfinite(lse), lse, 0.0)[..., None])  # masked keys: exp(−∞) = 0
    d = (dout * out).sum(axis=-1, keepdims=True)
    kr, vr = _repeat(k, heads), _repeat(v, heads)
    dv = _dropped(probs, keep, p).swapaxes(-1, -2) @ dout
    ds = probs * (_dropped(dout @ vr.swapaxes(-1, -2), keep, p) - d)
    return ds @ kr * scale, _fold(ds.swapaxes(-1, -2) @ q * scale, k.shape[1]), _fold(dv, v.shape[1])
