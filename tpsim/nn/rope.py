"""Rotary position embedding (Su et al. 2021, RoFormer, arXiv:2104.09864) in the Hugging Face convention.

Each head's ``d = head_dim`` features are read as two halves ``x = [x1 | x2]`` (Hugging Face's ``rotate_half``,
not the interleaved pairs of the paper); feature i of x1 and feature i of x2 are rotated together by the angle
``position · inv_freq[i]``:

    inv_freq[i] = 1 / θ^(2i/d),  i < d/2        θ = rope_theta (10000 in Llama 2, 500000 in Llama 3)
    cos, sin = cos(pos ⊗ [inv_freq | inv_freq]), sin(...)                                   [s, d]
    rotate_half(x) = [−x2 | x1]
    y = x · cos + rotate_half(x) · sin

The rotation is linear in x and orthogonal, so the backward is the inverse rotation: with R = rotate_half,
Rᵀ = −R and

    dx = dy · cos − rotate_half(dy · sin)

Partial rotary (Hugging Face's ``partial_rotary_factor``; GPT-NeoX's ``rotary_pct``; Nemotron-4 rotates half of
each head): only the first r = factor · d features turn, by ``rope_cos_sin(positions, r)``'s angles and the
halves of those r; the other d − r pass through unchanged, forward and backward (``partial_rope_forward``).

RoPE touches q and k *per head and per position*: a rank holding whole heads (and, under sequence parallelism,
the whole sequence again after f̄) rotates its own heads with no communication. cos and sin are computed in
float64 and cast to the activations' dtype; Hugging Face computes them in float32, so it differs from tpsim by
~1e-7 relative even in float64 runs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.kinds import ELEMENTWISE, marked


def rope_cos_sin(positions: np.ndarray, head_dim: int, theta: float = 10000.0,
                 dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin: [len(positions), head_dim]`` for the given integer positions, computed in float64."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # [d/2]
    freqs = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)  # [s, d/2]
    angles = np.concatenate([freqs, freqs], axis=-1)  # [s, d]: both halves of a pair share one angle
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """``[x1 | x2] -> [−x2 | x1]`` along the last dimension (Hugging Face's ``rotate_half``)."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class RopeCache(NamedTuple):
    cos: np.ndarray  # [s, d]
    sin: np.ndarray  # [s, d]


@marked(ELEMENTWISE)
def rope_forward(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, RopeCache]:
    """``x: [..., s, d]``, ``cos, sin: [s, d]`` -> ``(x · cos + rotate_half(x) · sin, RopeCache)``."""
    return x * cos + rotate_half(x) * sin, RopeCache(cos, sin)


@marked(ELEMENTWISE)
def rope_backward(dy: np.ndarray, cache: RopeCache) -> np.ndarray:
    """``dy: [..., s, d]`` -> ``dx = dy · cos − rotate_half(dy · sin)`` (the inverse rotation)."""
    return dy * cache.cos - rotate_half(dy * cache.sin)


@marked(ELEMENTWISE)
def partial_rope_forward(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, RopeCache]:
    """``x: [..., s, d]``, ``cos, sin: [s, r]`` with r ≤ d -> the first r features of each head rotated, the rest
    as they are (the module docstring); r = d is ``rope_forward``."""
    r = cos.shape[-1]
    head = x[..., :r]
    y = x.copy()
    y[..., :r] = head * cos + rotate_half(head) * sin
    return y, RopeCache(cos, sin)


@marked(ELEMENTWISE)
def partial_rope_backward(dy: np.ndarray, cache: RopeCache) -> np.ndarray:
    """``dy: [..., s, d]`` -> the inverse rotation on the first r features, the identity on the rest."""
    r = cache.cos.shape[-1]
    dx = dy.copy()
    dx[..., :r] = dy[..., :r] * cache.cos - rotate_half(dy[..., :r] * cache.sin)
    return dx
