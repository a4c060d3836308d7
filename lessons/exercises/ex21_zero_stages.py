"""Exercise 21 — ZeRO's four stages by hand: the bytes each keeps, the slice each owns, what ZeRO-3 sends
(lesson 21_zero_stages.py).

Plain arithmetic on every rank: no collective, no group. The check asks the bytes per parameter of every stage
at several d, the owned slices of awkward buckets (lengths that d does not divide, shorter than d, empty), and
the wire bytes of a ZeRO-3 step at several sizes; then, when every answer is right, it holds them to a live
ZeRO-1 over the 4 ranks (its owned slices and its traced bytes) and to a ZeRO-2's gradients at rest.
Check it:   tpsim check 21           (4 ranks)
The reference answer: tpsim lesson solution 21 (prints where it is) — try first.
"""

from __future__ import annotations


def bytes_per_param(stage: int, d: int) -> float:
    """Bytes of model state per parameter that one of ``d`` data-parallel ranks holds at ZeRO ``stage`` (0 = plain
    data parallelism, 1 = P_os, 2 = P_os+g, 3 = P_os+g+p), in the ZeRO paper's accounting: mixed-precision Adam
    with a 2-byte fp16 parameter, a 2-byte fp16 gradient and K = 12 bytes of optimizer state (the fp32 master
    parameter and Adam's two fp32 moments)."""
    # TODO: which of the three pieces does each stage cut into d slices?
    raise NotImplementedError


def owned_slice(n: int, d: int, rank: int) -> tuple[int, int, int]:
    """``(start, stop, padding)``: the positions ``[start, stop)`` (stop excluded) of a flat bucket of ``n``
    elements that DP rank ``rank`` of ``d`` owns, and how many of those positions are padding.

    The bucket is padded with zeros to a multiple of ``d`` (a reduce-scatter needs ``d`` equal slices), then cut
    into ``d`` equal, contiguous slices in rank order; a padded position belongs to no parameter."""
    # TODO: pad, slice, then count the padded positions that fall into this rank's slice.
    raise NotImplementedError


def zero3_step_bytes(params: int, d: int, e: int) -> int:
    """The bytes one rank sends over its DP group of ``d`` in one ZeRO-3 training step (one micro-batch): a model
    of ``params`` elements in one flat bucket padded to a multiple of ``d``, ``e`` bytes an element for the
    parameters and the gradients alike, every collective a ring."""
    # TODO: which collectives does a ZeRO-3 step issue, and how much does a ring collective send per rank?
    raise NotImplementedError
