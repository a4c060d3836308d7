"""Exercise 14 — the owned-slice arithmetic of ZeRO-1 (lesson 14_zero1_with_tp.py).

Both functions are arithmetic: no collective, no group. The check compares them with awkward sizes and with
the slices a real ``DistributedOptimizer`` owns on 8 ranks (TP 2 × DP 4).
Check it:   tpsim check 14           (8 ranks)
The reference answer: tpsim lesson solution 14 (prints where it is) — try first.
"""

from __future__ import annotations


def owned_range(n: int, dp: int, rank: int) -> tuple[int, int]:
    """``(start, stop)``: the positions ``[start, stop)`` (stop excluded, as in a slice) of a flat gradient bucket
    of ``n`` elements that DP rank ``rank`` owns.

    The bucket is first padded with zeros to a multiple of ``dp`` (so a reduce-scatter splits it evenly), then
    cut into ``dp`` equal, contiguous slices in rank order.
    """
    # TODO: pad, then slice.
    raise NotImplementedError


def owned_pieces(sizes: list[int], dp: int, rank: int) -> list[tuple[int, int, int]]:
    """The pieces of the parameters packed into one bucket that DP rank ``rank`` owns.

    ``sizes``: the parameters' element counts, in packing order (parameter i starts where i − 1 ends). Return
    ``(i, start, stop)`` for each parameter that overlaps the rank's range, in order: its elements
    ``[start, stop)`` (counted inside parameter i) are this rank's to update. Leave out empty pieces.
    """
    # TODO: intersect each parameter's span in the bucket with owned_range(sum(sizes), dp, rank).
    raise NotImplementedError
