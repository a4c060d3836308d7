"""The check of exercise 14: ZeRO-1's owned slices of a padded gradient bucket, against ``tpsim.partition`` on
awkward sizes (buckets whose length is not a multiple of dp, buckets shorter than dp, an empty one) and against
the pieces a real ``DistributedOptimizer`` owns (TP 2 × DP d).

Each typical slip is written out below as the wrong rule it is, so the check names it by what the learner's
result looks like (``tpsim.teach.diagnose``) instead of by a difference of numbers."""

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
REMAINDER = "the last rank took the remainder: slices must be equal for a reduce-scatter, so pad to a multiple of dp"
ARRAY_SPLIT = ("your slices differ in length, the first n % dp one element longer (np.array_split's cut): a "
               "reduce-scatter needs dp equal slices of the bucket padded to a multiple of dp")
CLIPPED = ("your last rank's range was cut off at n: the padding is owned too, so every slice, the last "
           "included, is as long as the others")
CLIPPED_ALL = ("your ranges were cut off at n (a rank past the end got an empty or reversed range): the padding "
               "is owned too, so every slice is as long as the others, even one that holds only padding")
INCLUSIVE = ("your stop is the last position the rank owns: ranges are [start, stop) with the stop excluded, as "
             "in a Python slice")
SHARD_PLUS_ONE = ("your slices are one element too long when dp divides n: n // dp + 1 adds a padded element "
                  "to every slice even when there is nothing to pad")
BUCKET_POSITIONS = "start and stop are positions in the bucket: count them inside parameter i (subtract its offset)"
PIECES_INCLUSIVE = ("your pieces' stops are the last element of each piece: (i, start, stop) means elements "
                    "[start, stop) of parameter i, the stop excluded")
EMPTY_PIECES = "you kept empty pieces (start == stop): leave out the parameters that do not overlap the rank's range"


def wrong_ranges(n: int, dp: int, rank: int) -> dict[str, tuple[int, int]]:
    """``{sentence: (start, stop)}``: what each slip in ``owned_range`` returns."""
    floor, shard = n // dp, -(-n // dp)
    split = [len(a) for a in np.array_split(np.arange(n), dp)]
    split_start = sum(split[:rank])
    return {NO_PADDING: (rank * floor, (rank + 1) * floor),
            REMAINDER: (rank * floor, n if rank == dp - 1 else (rank + 1) * floor),
            ARRAY_SPLIT: (split_start, split_start + split[rank]),
            CLIPPED: (rank * shard, min((rank + 1) * shard, n)),
            CLIPPED_ALL: (min(rank * shard, n), min((rank + 1) * shard, n)),
            INCLUSIVE: (rank * shard, (rank + 1) * shard - 1),
            SHARD_PLUS_ONE: (rank * (floor + 1), (rank + 1) * (floor + 1))}


def range_symptoms(n: int, dp: int, rank: int) -> dict:
    return {sentence: np.array(got, float) for sentence, got in wrong_ranges(n, dp, rank).items()}


def pieces(sizes: list[int], dp: int, rank: int) -> np.ndarray:
    """The expected answer, ``[k, 3]`` rows of (parameter, start, stop), as floats (compared exactly, tol 0)."""
    return np.array([(s.index, s.start, s.stop) for s in owned_segments(sizes, dp, rank)], float).reshape(-1, 3)


def piece_symptoms(sizes: list[int], dp: int, rank: int) -> dict:
    """owned_pieces' typical slips: bucket positions where parameter positions belong, inclusive stops, and the
    parameters that miss the range kept as empty pieces."""
    offsets = np.cumsum([0, *sizes[:-1]])
    segs = owned_segments(sizes, dp, rank)
    lo, hi = owned_range(sum(sizes), dp, rank).start, owned_range(sum(sizes), dp, rank).stop
    in_bucket = [(s.index, s.start + offsets[s.index], s.stop + offsets[s.index]) for s in segs]
    inclusive = [(s.index, s.start, s.stop - 1) for s in segs]
    # every parameter's intersection, the non-overlapping ones too (start >= stop: empty or reversed)
    with_empty = [(i, max(lo, off) - off, min(hi, off + size) - off)
                  for i, (size, off) in enumerate(zip(sizes, offsets))]
    return {BUCKET_POSITIONS: np.array(in_bucket, float).reshape(-1, 3),
            PIECES_INCLUSIVE: np.array(inclusive, float).reshape(-1, 3),
            EMPTY_PIECES: np.array(with_empty, float).reshape(-1, 3)}


def lengths(rows: np.ndarray) -> np.ndarray:
    """(parameter, stop − start) rows, to set beside a real optimizer's pieces."""
    return np.c_[rows[:, :1], rows[:, 2:] - rows[:, 1:2]] if rows.ndim == 2 and rows.shape[1] == 3 else rows


def as_rows(got) -> np.ndarray:
    try:
        return np.array(list(got), float).reshape(-1, 3)
    except Exception:  # noqa: BLE001 — not rows of numbers: the diagnosis says what it is
        return got


# (n, dp): a multiple of dp first (16: inclusive stops and a slice one too long show there, padding slips cannot),
# then not a multiple (13, 10, 11, 1001), shorter than dp (7 over 8, 1 over 3), dp 1, empty
RANGE_CASES = [(16, 4), (13, 4), (10, 4), (7, 8), (1, 3), (100, 1), (12, 3), (11, 3), (1001, 8), (0, 2)]
PIECE_CASES = [([5, 3], 2), ([7, 1, 11, 4, 2], 3), ([4, 4, 4, 4], 4), ([9], 8), ([2, 30, 1], 8), ([6, 5], 4)]


@exercise("14", "owned_range", "owned_pieces",
          owned_range=("a reduce-scatter needs dp equal slices: how long must the bucket be?",
                       "pad n up to the next multiple of dp, ⌈n/dp⌉·dp; each slice is ⌈n/dp⌉ long",
                       "shard = -(-n // dp); rank r owns (r·shard, (r+1)·shard)"),
          owned_pieces=("parameter i occupies [offset, offset + size_i) of the bucket, offset = Σ sizes before i",
                        "intersect that span with owned_range(Σ sizes, dp, rank); keep non-empty overlaps",
                        "(i, max(lo, off) − off, min(hi, off + size) − off) for every overlap, in order"))
def check_14(r: Report) -> None:
    for n, dp in RANGE_CASES:
        for rank in range(dp):
            got = r.call("owned_range", n, dp, rank)
            want = owned_range(n, dp, rank)
            r.compare(f"owned_range(n={n}, dp={dp}, rank={rank})", got,
                      np.array([want.start, want.stop], float), tol=0, symptoms=range_symptoms(n, dp, rank),
                      layout="values")
    for sizes, dp in PIECE_CASES:
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
        real = np.array([(names.index(p.name), p.param.size) for p in zero.slices[b]], float).reshape(-1, 2)
        r.compare(f"owned_pieces of bucket {b} ({len(names)} parameters) on DP rank {grid.dp_rank}, as (parameter, "
                  "length): the pieces a real DistributedOptimizer updates", got, real, tol=0, layout="rows")
