"""The check of exercise 14: ZeRO-1's owned slices of a padded gradient bucket, against ``tpsim.trace.
model_state`` on awkward sizes and against the pieces a real ``DistributedOptimizer`` owns (TP 2 × DP d)."""

from __future__ import annotations

import numpy as np

from tpsim.models.build import build_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.teach.checks.registry import exercise
from tpsim.teach.verdict import Report
from tpsim.partition import owned_range, owned_segments
from tpsim.train.optim import AdamW
from tpsim.train.zero import DistributedOptimizer

NO_PADDING = "no padding: the slices were n // dp long, so the last elements belong to nobody"
BUCKET_POSITIONS = "start and stop are positions in the bucket: count them inside parameter i (subtract its offset)"
REMAINDER = "the last rank took the remainder: slices must be equal for a reduce-scatter, so pad to a multiple of dp"


def range_symptoms(n: int, dp: int, rank: int) -> dict:
    floor = n // dp
    last = (rank * floor, n if rank == dp - 1 else (rank + 1) * floor)
    return {NO_PADDING: np.array([rank * floor, (rank + 1) * floor], float), REMAINDER: np.array(last, float)}


def pieces(sizes: list[int], dp: int, rank: int) -> np.ndarray:
    """The expected answer, ``[k, 3]`` rows of (parameter, start, stop), as floats (compared exactly, tol 0)."""
    return np.array([(s.index, s.start, s.stop) for s in owned_segments(sizes, dp, rank)], float).reshape(-1, 3)


def piece_symptoms(sizes: list[int], dp: int, rank: int) -> dict:
    """Exercise 14's typical slip in owned_pieces: bucket positions where parameter positions belong."""
    offsets = np.cumsum([0, *sizes[:-1]])
    segs = owned_segments(sizes, dp, rank)
    in_bucket = [(s.index, s.start + offsets[s.index], s.stop + offsets[s.index]) for s in segs]
    return {BUCKET_POSITIONS: np.array(in_bucket, float).reshape(-1, 3)}


def lengths(rows: np.ndarray) -> np.ndarray:
    """(parameter, stop − start) rows, to set beside a real optimizer's pieces."""
    return np.c_[rows[:, :1], rows[:, 2:] - rows[:, 1:2]] if rows.ndim == 2 and rows.shape[1] == 3 else rows


def as_rows(got) -> np.ndarray:
    try:
        return np.array(list(got), float).reshape(-1, 3)
    except (TypeError, ValueError):
        return np.asarray(got)


@exercise("14", "owned_range", "owned_pieces",
          owned_range=("a reduce-scatter needs dp equal slices: how long must the bucket be?",
                       "pad n up to the next multiple of dp, ⌈n/dp⌉·dp; each slice is ⌈n/dp⌉ long",
                       "shard = -(-n // dp); rank r owns (r·shard, (r+1)·shard)"),
          owned_pieces=("parameter i occupies [offset, offset + size_i) of the bucket, offset = Σ sizes before i",
                        "intersect that span with owned_range(Σ sizes, dp, rank); keep non-empty overlaps",
                        "(i, max(lo, off) − off, min(hi, off + size) − off) for every overlap, in order"))
def check_14(r: Report) -> None:
    for n, dp in [(13, 4), (16, 4), (7, 8), (1, 3), (100, 1), (1001, 8), (0, 2)]:
        for rank in range(dp):
            got = r.call("owned_range", n, dp, rank)
            want = owned_range(n, dp, rank)
            r.compare(f"owned_range(n={n}, dp={dp}, rank={rank})", np.asarray(got),
                      np.array([want.start, want.stop], float), tol=0, symptoms=range_symptoms(n, dp, rank),
                      layout="values")
    for sizes, dp in [([5, 3], 2), ([7, 1, 11, 4, 2], 3), ([4, 4, 4, 4], 4), ([9], 8), ([2, 30, 1], 8)]:
        for rank in range(dp):
            got = r.call("owned_pieces", sizes, dp, rank)
            r.compare(f"owned_pieces(sizes={sizes}, dp={dp}, rank={rank})", as_rows(got), pieces(sizes, dp, rank),
                      tol=0, symptoms=piece_symptoms(sizes, dp, rank), layout="rows")
    grid = r.grid(2)
    cfg = GPTConfig(vocab_size=19, n_positions=8, n_embd=12, n_layer=1, n_head=4)
    model = build_gpt(cfg, grid.tp_group, seed=14)
    zero = DistributedOptimizer(AdamW(model), grid, bucket_cap_bytes=1500)
    sizes = {name: p.size for name, p in model.named_parameters()}
    for b, bucket in enumerate(zero.buckets):
        names = list(bucket.names)
        got = lengths(as_rows(r.call("owned_pieces", [sizes[n] for n in names], grid.dp, grid.dp_rank)))
        real = np.array([(names.index(p.name), p.param.size) for p in zero.pieces[b]], float).reshape(-1, 2)
        r.compare(f"owned_pieces of bucket {b} ({len(names)} parameters) on DP rank {grid.dp_rank}, as (parameter, "
                  "length): the pieces a real DistributedOptimizer updates", got, real, tol=0, layout="rows")
