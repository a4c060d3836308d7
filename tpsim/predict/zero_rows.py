"""The DP rows of ZeRO-2 and ZeRO-3 in a step's formulas (``tpsim.predict.formulas``, ``pipeline_comm``): pure
arithmetic, as the live optimizer moves them (``tpsim.train.zero2``, ``tpsim.train.zero3``).

    ZeRO-1   reduce-scatter every padded bucket once after the last micro-batch; all-gather the parameters after
             the step (phase optimizer)
    ZeRO-2   every micro-batch reduce-scatters each bucket its backward wrote, m times a bucket, but a bucket held
             for the tied embedding's sum over the embedding group (pp > 1): once; the all-gather as ZeRO-1's
    ZeRO-3   the reduce-scatters as ZeRO-2's, over one bucket a unit; each micro-batch all-gathers every unit's
             bucket before its forward (phase forward) and again before its backward (phase backward), and a tied
             LM head on the embedding's stage gathers the embedding's bucket for its own two calls; nothing after
             the step

so at one micro-batch in one dtype ZeRO-2 moves ZeRO-1's (= DDP's) bytes and ZeRO-3 1.5× them (Rajbhandari et
al. 2019, §7), plus the tied head's gathers.
"""

from __future__ import annotations

from tpsim.partition import padded_length, padded_vocab_size
from tpsim.phases import BACKWARD, FORWARD, OPTIMIZER
from tpsim.zero_stage import zero_stage


def zero2_reduce_scatter(m: int, total: int, buckets: int | None, held: tuple[int, int]) -> tuple[int, int | None]:
    """ZeRO-2's reduce-scatter bytes and calls of a stage in a step of ``m`` micro-batches: every bucket it wrote
    reduce-scattered after each micro-batch's backward (``tpsim.train.zero2``), but those ``held`` for the tied
    embedding's sum over the embedding group (``(bytes, buckets)``), once after the last:
    m·(total − held) + held bytes, m·(buckets − held) + held calls (None: the count not predicted)."""
    held_bytes, held_buckets = held
    calls = None if buckets is None else m * (buckets - held_buckets) + held_buckets
    return m * (total - held_bytes) + held_bytes, calls


def zero_gathers(config, zero: int, params: int, buckets: int | None, *, tp: int, dp: int, e: int,
                 microbatches: int = 1, tied_head: bool = True) -> list[tuple[str, int, int | None]]:
    """``(phase, bytes, calls)`` of ZeRO's parameter all-gathers over ``dp`` ranks in a step: ZeRO-1/2 once after
    it, every padded bucket in the parameters' dtype (``params`` bytes: the reduce-scatter's elements); ZeRO-3
    every unit's bucket before its forward and again before its backward, each micro-batch, and a tied LM head
    (``tied_head``: it shares the embedding's weight on this rank) the embedding's bucket for its own two calls.
    ``buckets`` None: the count is not predicted."""
    if not zero_stage(zero).gathers_around_units:
        return [(OPTIMIZER, params, buckets)]
    tied = padded_length(padded_vocab_size(config.vocab, tp) // tp * config.hidden, dp) * e
    tied = tied if config.tied and tied_head else 0
    calls = None if buckets is None else microbatches * (buckets + bool(tied))
    return [(phase, microbatches * (params + tied), calls) for phase in (FORWARD, BACKWARD)]
