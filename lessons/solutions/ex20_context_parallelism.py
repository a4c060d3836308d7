"""Reference answer to exercise 20 — the online-softmax merge, the zigzag chunks, the ring's forward bytes
(lesson 20_context_parallelism.py)."""

from __future__ import annotations

import numpy as np


def merge_partials(out_a, lse_a, out_b, lse_b):
    top = np.maximum(lse_a, lse_b)  # the global max: never −∞, one side always sees a key
    wa, wb = np.exp(lse_a - top), np.exp(lse_b - top)  # each side's sum of exponentials, rescaled to it
    lse = top + np.log(wa + wb)
    return (wa / (wa + wb))[..., None] * out_a + (wb / (wa + wb))[..., None] * out_b, lse


def zigzag_chunks(rank, cp):
    return rank, 2 * cp - 1 - rank  # chunk r and its mirror image from the end


def ring_bytes(cp, b, s, heads, kv_heads, head_dim, e):
    block = b * kv_heads * (s // cp) * head_dim * e  # one K (or V) shard: only the KV heads travel
    return (cp - 1) * 2 * block  # K and V, passed on cp − 1 times
