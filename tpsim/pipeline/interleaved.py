"""Interleaved 1F1B: each rank holds ``vp`` model chunks and runs 1F1B over (micro-batch, chunk) pairs.

Narayanan et al. 2021 (arXiv:2104.04473), §2.2.2, as Megatron-LM's ``forward_backward_pipelining_with_interleaving``
runs it. Rank r of p holds chunks c = 0 .. v − 1, chunk c being virtual stage c·p + r, so one micro-batch visits
every rank v times and each visit costs 1/v of a plain stage. A rank's v·m forwards are taken in this order
(the *virtual micro-batches* k = 0 .. v·m − 1): micro-batches in groups of p, and within a group every chunk in
turn — for p = 2, v = 2, m = 4:

    k            0  1  2  3  4  5  6  7
    micro-batch  0  1  0  1  2  3  2  3
    chunk        0  0  1  1  0  0  1  1

Its backwards take the same table with the chunks reversed (chunk v − 1 − c: the gradient enters at the last
chunk). Rank r runs ``(p − r − 1)·2 + (v − 1)·p`` warm-up forwards (Megatron-LM's count, at most v·m), then one
forward and one backward at a time, then the backwards left. The bubble shrinks from (p − 1)(t_f + t_b) to
(p − 1)(t_f + t_b)/v: with unit costs (p − 1)/(v·m + p − 1) of the step instead of (p − 1)/(m + p − 1); the price
is v times as many point-to-point messages and (p − 1)/v more micro-batch-stages held on rank 0.

The constraint: the groups of p must tile the m micro-batches, so m is a multiple of p when v > 1 (Megatron-LM
raises for a last group smaller than p: it would stall the pipeline). With v = 1 this is plain 1F1B (warm-up
p − r − 1, as Megatron-LM runs it without interleaving). MPI-free.
"""

from __future__ import annotations

from tpsim.errors import ConfigError


def warmup(pp: int, rank: int, m: int, vp: int) -> int:
    """Rank ``rank``'s warm-up forwards (Megatron-LM's count, capped at the v·m forwards it has)."""
    count = pp - rank - 1 if vp == 1 else (pp - rank - 1) * 2 + (vp - 1) * pp
    return min(count, m * vp)


def table(pp: int, m: int, vp: int) -> list[tuple[int, int]]:
    """Virtual micro-batch k → (micro-batch, chunk) of the k-th forward: groups of p micro-batches, each through
    every chunk in turn."""
    return [(j, c) for start in range(0, m, pp) for c in range(vp) for j in range(start, min(start + pp, m))]


def check_microbatches(pp: int, m: int, vp: int) -> None:
    """``ConfigError`` (one line) unless the interleaved schedule can take ``m`` micro-batches."""
    if vp > 1 and m % pp:
        raise ConfigError(f"--schedule interleaved --vp {vp}: --microbatches {m} must be a multiple of --pp {pp} "
                          f"(micro-batches go through the chunks in groups of pp; try {m + pp - m % pp})")


def interleaved(pp: int, m: int, vp: int = 1) -> list[list[tuple[str, int, int]]]:
    """Every rank's compute order ``[(op, micro-batch, chunk), ...]``: warm-up forwards, 1F1B, the backwards left."""
    check_microbatches(pp, m, vp)
    order = table(pp, m, vp)
    forward = [("F", j, c) for j, c in order]
    backward = [("B", j, vp - 1 - c) for j, c in order]
    ranks = []
    for r in range(pp):
        warm = warmup(pp, r, m, vp)
        steady = [op for k in range(len(order) - warm) for op in (forward[warm + k], backward[k])]
        ranks.append(forward[:warm] + steady + backward[len(order) - warm:])
    return ranks
