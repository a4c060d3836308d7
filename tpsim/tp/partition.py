"""Who holds which slice: the arithmetic of splitting a dimension over the TP group.

Even splits (Megatron's ``divide``) are required wherever the math needs equal shards; ``uneven_ranges``
serves the classifier of the InsightFace way, whose class count need not divide by the world size.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import ConfigError
from tpsim.nn.module import Partition


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
