"""Dropout masks under tensor parallelism: who draws which bits (Megatron's ``CudaRNGStatesTracker``, two ways).

Dropout on a *replicated* activation (embeddings, the residual stream) must drop the same elements on every
TP rank, or the ranks' copies drift apart. Dropout on a *partitioned* one (attention probabilities, split by
heads) must drop different, independent elements per shard. Every mask request therefore says where the
local tensor sits in the serial model's activation:

    keep_mask(p, key, step, global_shape, index, region) -> bool [local shape]
        key     "transformer.h.0.attn.attn_dropout"   which dropout site (module path + what)
        index   per dimension, the global positions held here (a slice or an int array)
        region  "replicated" | "partitioned"

Two schemes answer it:

- ``ExactDropoutRNG`` (default): the keep bit of an element is a pure function of
  (seed, key, step, global flat index) — a counter-based generator, no state. ``region`` then does not even
  matter: ranks holding the same positions get the same bits, ranks holding different positions get
  different bits, and the serial model (tp 1, full index) gets the union. TP training with dropout equals
  serial training under any sharding (heads, DP batch rows, sequence).
- ``MegatronDropoutRNG``: what Megatron-LM does. A default generator seeded with ``seed`` on every TP rank
  (replicated regions) and a model-parallel one seeded with ``seed + 2718 + tp_rank`` (partitioned regions),
  each drawing ``random(local_shape) >= p`` in call order. Correct for training, but a mask depends on the
  shard's shape and the call history, so it never equals the serial model's mask.

The counter hash is splitmix64's output function (Steele, Lea & Flood 2014) applied twice:

    z = mix(mix((i + 1)·γ) ⊕ stream),   stream = mix(mix(mix(seed) ⊕ H(key)) ⊕ step),   u = (z >> 11)·2⁻⁵³

with ``mix(z)``: ``z ^= z>>30; z *= 0xBF58476D1CE4E5B9; z ^= z>>27; z *= 0x94D049BB133111EB; z ^= z>>31``
(mod 2⁶⁴), ``γ = 0x9E3779B97F4A7C15`` and ``H`` an 8-byte BLAKE2b of the key (stable across processes,
unlike Python's ``hash``). ``u`` is uniform in [0, 1) from the top 53 bits; keep = ``u >= p``.
"""

from __future__ import annotations

import hashlib

import numpy as np

REGIONS = ("replicated", "partitioned")
SCHEMES = ("exact", "megatron")
MEGATRON_TP_SEED_OFFSET = 2718  # Megatron's model_parallel_cuda_manual_seed: tp seed = seed + 2718 + tp_rank

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix_int(z: int) -> int:
    """splitmix64's output function on one Python int (mod 2⁶⁴): for deriving a stream from (seed, key, step)."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def _mix_array(z: np.ndarray) -> np.ndarray:
    """The same function on a uint64 array; NumPy array arithmetic wraps mod 2⁶⁴ without a warning."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def global_positions(global_shape: tuple[int, ...], index) -> list[np.ndarray]:
    """Per dimension, the 1-D int64 array of global positions that ``index`` selects (checked in range).

    ``index``: a tuple with one slice or 1-D int array per dimension of ``global_shape``.
    """
    global_shape = tuple(int(n) for n in global_shape)
    if len(index) != len(global_shape):
        raise ValueError(f"index has {len(index)} entries for a global shape of {len(global_shape)} dims")
    out = []
    for dim, (n, ix) in enumerate(zip(global_shape, index)):
        pos = np.arange(n)[ix] if isinstance(ix, slice) else np.asarray(ix, dtype=np.int64)
        if pos.ndim != 1:
            raise ValueError(f"index[{dim}] must be a slice or a 1-D int array, got shape {pos.shape}")
        if pos.size and (pos.min() < 0 or pos.max() >= n):
            raise ValueError(f"index[{dim}] holds positions outside [0, {n})")
        out.append(pos.astype(np.int64))
    return out


class DropoutRNG:
    """The interface both schemes share; ``keep_mask`` validates the request, subclasses draw the bits."""

    scheme = ""

    def keep_mask(self, p: float, key: str, step: int, global_shape: tuple[int, ...], index,
                  region: str) -> np.ndarray:
        """Boolean keep mask of the local shape (``len`` of each index entry); True = keep the element."""
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        if region not in REGIONS:
            raise ValueError(f"region must be one of {REGIONS}, got {region!r}")
        return self._draw(float(p), str(key), int(step), global_positions(global_shape, index), region,
                          tuple(int(n) for n in global_shape))

    def _draw(self, p, key, step, positions, region, global_shape):  # pragma: no cover - interface
        raise NotImplementedError


class ExactDropoutRNG(DropoutRNG):
    """Stateless: keep bit = hash(seed, key, step, global flat index) >= p. Equal to serial at any sharding."""

    scheme = "exact"

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def stream(self, key: str, step: int) -> int:
        """The 64-bit stream id of one dropout site at one step; distinct sites and steps get unrelated bits."""
        key_hash = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
        return _mix_int(_mix_int(_mix_int(self.seed) ^ key_hash) ^ (step & _MASK64))

    def _draw(self, p, key, step, positions, region, global_shape):
        # Row-major flat index of every local element, built by broadcasting one axis per dimension.
        # (The outermost extent never enters a row-major stride, so a caller that only knows its own batch
        # rows may pass any extent that covers them.)
        flat = np.zeros((1,) * len(positions), dtype=np.uint64)
        stride = 1
        for dim in reversed(range(len(positions))):
            shape = [1] * len(positions)
            shape[dim] = -1
            flat = flat + positions[dim].astype(np.uint64).reshape(shape) * np.uint64(stride)
            stride *= global_shape[dim]
        flat = np.broadcast_to(flat, tuple(len(pos) for pos in positions))
        z = _mix_array(_mix_array((flat + np.uint64(1)) * np.uint64(_GAMMA)) ^ np.uint64(self.stream(key, step)))
        u = (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53  # top 53 bits: every float in [0, 1) reachable
        return u >= p

    def __repr__(self) -> str:
        return f"ExactDropoutRNG(seed={self.seed})"


class MegatronDropoutRNG(DropoutRNG):
    """Megatron's two generators: one shared by the TP group, one per TP rank. Ignores key, step, positions."""

    scheme = "megatron"

    def __init__(self, seed: int, tp_rank: int) -> None:
        self.seed, self.tp_rank = int(seed), int(tp_rank)
        # Own generators per instance: a tracker is an object, never module-level state.
        self.default_generator = np.random.default_rng(self.seed)
        self.model_parallel_generator = np.random.default_rng(self.seed + MEGATRON_TP_SEED_OFFSET + self.tp_rank)

    def _draw(self, p, key, step, positions, region, global_shape):
        rng = self.default_generator if region == "replicated" else self.model_parallel_generator
        return rng.random(tuple(len(pos) for pos in positions)) >= p

    def __repr__(self) -> str:
        return f"MegatronDropoutRNG(seed={self.seed}, tp_rank={self.tp_rank})"


def make_dropout_rng(scheme: str = "exact", seed: int = 0, tp_rank: int = 0) -> DropoutRNG:
    """The tracker for ``scheme`` ("exact" or "megatron"); ``tp_rank`` only matters to Megatron's."""
    if scheme == "exact":
        return ExactDropoutRNG(seed)
    if scheme == "megatron":
        return MegatronDropoutRNG(seed, tp_rank)
    raise ValueError(f"unknown dropout RNG scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
