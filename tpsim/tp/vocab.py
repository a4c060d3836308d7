"""Vocabulary padding and ranges: who owns which token ids (Megatron's ``VocabUtility``).

A vocabulary of V tokens is split by rows (embedding) or columns (LM head, logits) into p equal, contiguous
ranges. V rarely divides by p (GPT-2's 50257 is prime), so the table is padded with zero rows up to

    Vp = ⌈V / p⌉ · p          rank r owns ids [r · Vp/p, (r + 1) · Vp/p)

The padded ids (≥ V) are never looked up and never enter the softmax — the cross-entropy masks them — so
padding changes the shapes, never the math.
"""

from __future__ import annotations

from tpsim.comm import ConfigError


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
