"""Who holds which slice: the arithmetic of splitting a dimension over the tensor-parallel group.

Pure arithmetic, no MPI, so the formulas, the memory model and a planner can use it on a laptop.

Even splits (Megatron's ``divide``) are required wherever the math needs equal shards; ``uneven_ranges``
serves the classifier of the InsightFace way (An et al. 2021, "Partial FC"), whose class count need not
divide by the world size. A ``Partition`` records where a shard sits in its master tensor.

Vocabulary padding (Megatron's ``VocabUtility``): a vocabulary of V tokens is split by rows (embedding) or
columns (LM head, logits) into p equal, contiguous ranges. V rarely divides by p (GPT-2's 50257 is prime),
so the table is padded with zero rows up to

    Vp = ⌈V / p⌉ · p          rank r owns ids [r · Vp/p, (r + 1) · Vp/p)

The padded ids (≥ V) are never looked up and never enter the softmax — the cross-entropy masks them — so
padding changes the shapes, never the math.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from tpsim.errors import ConfigError


@dataclass(frozen=True)
class Partition:
    """How a tensor-parallel shard sits in its master tensor: along ``dim``, at master positions ``index``.

    ``full`` is the master's length along ``dim`` (after any padding). A parameter without a Partition is
    *replicated*: every TP rank holds the whole of it. Clipping, export and checks read this, not layer types.
    ``replica`` numbers identical copies of one shard held by several TP ranks (a grouped-query KV head
    replicated over tp / kv_heads ranks, ``tpsim.tp.gqa_attention``): only copy 0 counts in a norm.
    """

    dim: int
    index: np.ndarray
    full: int
    replica: int = 0


def within(inner: Partition, outer: Partition | None) -> Partition:
    """``inner``'s positions read through ``outer``'s: a shard of a shard (SP's part of a CP rank's tokens) as
    positions of the whole tensor; ``inner`` itself when ``outer`` is None."""
    if outer is None:
        return inner
    return replace(inner, index=outer.index[inner.index], full=outer.full)


def divide(n: int, p: int, what: str = "dimension") -> int:
    """n / p, or a ``ConfigError`` naming the constraint."""
    if n % p:
        raise ConfigError(f"{what} = {n} is not divisible by the tensor-parallel size {p}")
    return n // p


def shard_range(n: int, p: int, rank: int, what: str = "dimension") -> range:
    """The contiguous index range [rank·n/p, (rank+1)·n/p) that ``rank`` owns."""
    k = divide(n, p, what)
    return range(rank * k, (rank + 1) * k)


def uneven_ranges(n: int, p: int) -> list[range]:
    """Split n into p contiguous ranges whose sizes differ by at most one (the first n % p get one more)."""
    base, extra = divmod(n, p)
    out, start = [], 0
    for r in range(p):
        size = base + (1 if r < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def take_shard(master: np.ndarray, partition: Partition | None) -> np.ndarray:
    """The part of a master (serial) tensor that a rank holds: itself if replicated, else its index along dim.

    A master shorter than ``partition.full`` along ``dim`` (a vocabulary padded to a multiple of tp) is
    read as zero-padded: padded positions come out as zeros.
    """
    if partition is None:
        return master
    n = master.shape[partition.dim]
    if partition.full > n:
        pad = [(0, 0)] * master.ndim
        pad[partition.dim] = (0, partition.full - n)
        master = np.pad(master, pad)
    return np.take(master, partition.index, axis=partition.dim)


# --- the vocabulary ----------------------------------------------------------------------------------------------
def padded_vocab_size(vocab_size: int, tp: int, *, divisible_by: int = 1) -> int:
    """The smallest multiple of ``divisible_by · tp`` that is ≥ ``vocab_size``.

    ``divisible_by`` is Megatron's ``--make-vocab-size-divisible-by`` (128 there, for fast matmul shapes);
    1 gives the least padding.
    """
    if vocab_size < 1 or tp < 1 or divisible_by < 1:
        raise ConfigError(f"need vocab_size, tp, divisible_by ≥ 1, got {vocab_size}, {tp}, {divisible_by}")
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def vocab_range(padded_vocab: int, tp: int, rank: int) -> tuple[int, int]:
    """``(start, end)``: the contiguous ids that ``rank`` owns, ``end − start = padded_vocab / tp``.

    ``padded_vocab`` must divide by ``tp`` (use ``padded_vocab_size``); ids ≥ the real vocabulary are padding.
    """
    if padded_vocab % tp:
        raise ConfigError(f"padded vocabulary {padded_vocab} is not divisible by the tensor-parallel size {tp}"
                          f" (pad it with padded_vocab_size first)")
    if not 0 <= rank < tp:
        raise ConfigError(f"rank {rank} is not in [0, {tp})")
    per_rank = padded_vocab // tp
    return rank * per_rank, (rank + 1) * per_rank


# --- ZeRO's owned slices of a DP-sharded buffer (Megatron's distributed optimizer) ----------------------------


def padded_length(n: int, dp: int) -> int:
    """``n`` rounded up to a multiple of ``dp``: the length of a bucket that a reduce-scatter splits evenly."""
    if n < 0 or dp < 1:
        raise ValueError(f"need n >= 0 and dp >= 1, got n={n}, dp={dp}")
    return -(-n // dp) * dp


def owned_range(n: int, dp: int, rank: int) -> range:
    """Positions of a bucket of ``n`` elements (padded to a multiple of ``dp``) that DP rank ``rank`` owns."""
    if not 0 <= rank < dp:
        raise ValueError(f"rank {rank} is not in a DP group of {dp}")
    shard = padded_length(n, dp) // dp
    return range(rank * shard, (rank + 1) * shard)


class Segment(NamedTuple):
    """The piece of parameter ``index`` that a rank owns: elements [start, stop) of the flattened parameter,
    found at ``buffer_start`` in the bucket's buffer."""

    index: int
    start: int
    stop: int
    buffer_start: int


def owned_segments(sizes: list[int], dp: int, rank: int) -> list[Segment]:
    """Pieces of the parameters packed (in this order, ``sizes`` elements each) that ``rank`` owns.

    E.g. sizes [5, 3], dp 2: the buffer is 8 long, rank 0 owns [0, 4) = parameter 0's elements 0..3, rank 1
    owns [4, 8) = parameter 0's element 4 and all of parameter 1.
    """
    mine = owned_range(sum(sizes), dp, rank)
    out, offset = [], 0
    for i, size in enumerate(sizes):
        lo, hi = max(offset, mine.start), min(offset + size, mine.stop)
        if lo < hi:
            out.append(Segment(i, lo - offset, hi - offset, lo))
        offset += size
    return out


def assign_buckets(sizes: list[tuple[str, int, str]], cap: int | None) -> list[list[int]]:
    """Group entries ``(name, nbytes, dtype)`` — already in packing order — into buckets (lists of positions).

    A bucket is closed before an entry that would push it over ``cap`` or that has another dtype (a flat
    buffer has one dtype); an entry larger than ``cap`` thus sits alone. ``cap`` 0 or None: one per entry.
    Pure arithmetic, no MPI.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    used, dtype = 0, None
    for i, (_, nbytes, dt) in enumerate(sizes):
        if current and (not cap or used + nbytes > cap or dt != dtype):
            buckets.append(current)
            current, used = [], 0
        current.append(i)
        used, dtype = used + nbytes, dt
    if current:
        buckets.append(current)
    return buckets
