"""Reference answer to exercise 14 — the owned slices of a padded bucket (lesson 14_zero1_with_tp.py)."""

from __future__ import annotations


def owned_range(n: int, dp: int, rank: int) -> tuple[int, int]:
    shard = -(-n // dp)  # ⌈n/dp⌉: the padded bucket ⌈n/dp⌉·dp splits into dp slices of this length
    return rank * shard, (rank + 1) * shard


def owned_pieces(sizes: list[int], dp: int, rank: int) -> list[tuple[int, int, int]]:
    lo, hi = owned_range(sum(sizes), dp, rank)
    pieces, offset = [], 0
    for i, size in enumerate(sizes):  # parameter i sits at [offset, offset + size) of the bucket
        start, stop = max(lo, offset), min(hi, offset + size)
        if start < stop:
            pieces.append((i, start - offset, stop - offset))
        offset += size
    return pieces
