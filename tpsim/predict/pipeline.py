"""A pipeline schedule's bubble, micro-batches in flight and point-to-point bytes, as closed formulas.

The virtual clock (``tpsim.pipeline.clock``) measures these from the action lists; the tests hold the two equal
to 1e-9 for p = 1..8, m = 1..32 and v = 1..4 wherever the schedule takes m. p pipeline ranks, m micro-batches,
v model chunks per rank; the bubble is the idle share of the pipeline's rank-time, Σ idle / (p · step), at the
textbook's unit costs (a stage's F = 1, B = 2; split, B = W = 1; a chunk 1/v of that; messages free):

    afab, 1f1b    (p − 1)/(m + p − 1)          Huang et al. 2019; Narayanan et al. 2021 §2.2.1 (their (p − 1)/m
                                               is the same idle time over the ideal time instead of the step)
    interleaved   (p − 1)/(v·m + p − 1)        Narayanan et al. 2021 §2.2.2: the fill and drain shrink v times
    zb-h1         (p − 1)/(3m + p − 1), m ≥ p  Qi et al. 2023 §2.1: p − 1 idle units a stage, a third of 1F1B's
                  (2p − 1 − m)/(2m + 2p − 1), m < p   (the step is 2m + 2p − 1: too few W's to fill the drain)

Micro-batches in flight on pipeline rank i (activations held: F run, backward — W when split — not yet):

    afab          m                            every forward before any backward
    1f1b          min(p − i, m)                p − i − 1 warm-up forwards, then one in, one out
    interleaved   min(2(p − i − 1) + (v − 1)·p + 1, v·m)  (micro-batch, chunk) pairs, each 1/v of the rank's
                  layers: rank 0 holds p + (p − 1)/v micro-batches' worth (Korthikanti et al. 2022's 1 + (p − 1)/(pv))
    zb-h1         min(p, m)                    every stage: its W's are delayed by i, as its warm-up is shorter

Point-to-point bytes of one step, for one DP replica and one TP rank (every message once, at its sender): each
of the v·p − 1 boundaries between virtual stages carries m activations forward and m gradients back, each a
micro-batch's [s, b, h] tensor of e bytes per element — [s/t, b, h] under sequence parallelism:

    2·m·(p − 1)·b·s·h·e      afab, 1f1b, zb-h1
    2·m·(v·p − 1)·b·s·h·e    interleaved

Pure arithmetic, MPI-free.
"""

from __future__ import annotations

from tpsim.errors import ConfigError
from tpsim.pipeline.interleaved import check_microbatches

NAMES = ("afab", "1f1b", "interleaved", "zb-h1")


def known(schedule: str, pp: int, m: int, vp: int) -> None:
    if schedule not in NAMES:
        raise ConfigError(f"--schedule {schedule}: no formula (one of {', '.join(NAMES)})")
    if vp != 1 and schedule != "interleaved":
        raise ConfigError(f"--schedule {schedule} runs one model chunk per rank: --vp {vp} needs interleaved")
    if schedule == "interleaved":
        check_microbatches(pp, m, vp)


def bubble_fraction(schedule: str, pp: int, m: int, vp: int = 1) -> float:
    """Σ idle / (p · step) at unit costs (the module's table)."""
    known(schedule, pp, m, vp)
    if schedule == "zb-h1":
        return (pp - 1) / (3 * m + pp - 1) if m >= pp else (2 * pp - 1 - m) / (2 * m + 2 * pp - 1)
    return (pp - 1) / (vp * m + pp - 1)


def peak_in_flight(schedule: str, pp: int, m: int, vp: int = 1) -> list[int]:
    """Micro-batches (interleaved: (micro-batch, chunk) pairs) each pipeline rank holds at most."""
    known(schedule, pp, m, vp)
    if schedule == "afab":
        return [m] * pp
    if schedule == "zb-h1":
        return [min(pp, m)] * pp
    if schedule == "interleaved" and vp > 1:
        return [min(2 * (pp - i - 1) + (vp - 1) * pp + 1, vp * m) for i in range(pp)]
    return [min(pp - i, m) for i in range(pp)]


def p2p_bytes(schedule: str, pp: int, m: int, vp: int, *, micro_batch: int, seq_len: int, hidden: int,
              bytes_per_element: int, tp: int = 1, sequence_parallel: bool = False) -> float:
    """Bytes sent between pipeline ranks in one step (one DP replica, one TP rank): 2·m·(v·p − 1) boundary
    tensors of b·s·h·e bytes, ÷ t under sequence parallelism."""
    known(schedule, pp, m, vp)
    tensor = micro_batch * seq_len * hidden * bytes_per_element / (tp if sequence_parallel else 1)
    return 2 * m * (vp * pp - 1) * tensor
