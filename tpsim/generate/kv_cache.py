"""The KV cache of one rank, and attention of new queries against it.

Decoding token t needs the keys and values of every earlier position; recomputing them is O(t) matmuls per
layer, keeping them is memory. Each rank keeps only the heads it computes: under TP that is heads / tp query
heads and (Llama) kv_heads / tp KV heads — or 1 replicated KV head when tp > kv_heads — so the cache shrinks
with TP exactly as the attention weights do, and needs no communication ever:

    per layer per rank   K, V: [b, kv_heads_local, T, head_dim]  bytes = 2 · b · kv_heads_local · T · hd · itemsize

The prefill writes positions [0, s); each decode step appends one. Query i of a chunk starting at ``start`` sits
at position start + i and may see keys 0 .. start + i (the causal mask, shifted).
"""

from __future__ import annotations

import numpy as np

from tpsim.nn.softmax import softmax_forward


class LayerKV:
    """Preallocated ``k, v: [b, kv_heads, capacity, head_dim]``; ``length`` positions filled."""

    def __init__(self, batch: int, kv_heads: int, capacity: int, head_dim: int, dtype) -> None:
        self.k = np.zeros((batch, kv_heads, capacity, head_dim), dtype=dtype)
        self.v = np.zeros_like(self.k)
        self.length = 0

    def append(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store ``k, v: [b, kv_heads, t, hd]`` at the next positions; return every key and value so far."""
        t = k.shape[2]
        if self.length + t > self.k.shape[2]:
            raise ValueError(f"KV cache full: {self.length} + {t} positions > capacity {self.k.shape[2]}")
        self.k[:, :, self.length:self.length + t] = k
        self.v[:, :, self.length:self.length + t] = v
        self.length += t
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    @property
    def nbytes(self) -> int:
        """Bytes held (allocated for the whole capacity) on this rank for this layer."""
        return self.k.nbytes + self.v.nbytes


def cached_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
    """``q: [b, nh, t, hd]`` at positions start.., ``k, v: [b, nkv, T, hd]`` (T = start + t) -> ``[b, nh, t, hd]``.

    ``nh`` a multiple of ``nkv``: query head j reads KV head j // (nh / nkv) (grouped-query attention; nkv = nh
    for GPT-2).
    """
    nh, nkv = q.shape[1], k.shape[1]
    if nh != nkv:
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
    t, T = q.shape[2], k.shape[2]
    scores = (q @ k.swapaxes(-1, -2)) * (1.0 / float(np.sqrt(q.shape[-1])))
    future = np.arange(T)[None, :] > (start + np.arange(t))[:, None]  # key j after query i's position
    scores[..., future] = -np.inf
    probs, _ = softmax_forward(scores, axis=-1)
    return probs @ v
