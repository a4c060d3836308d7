"""The dropout RNG tracker on a real TP group: which ranks share bits, and which scheme reproduces serial.

Exact scheme: a keep bit depends only on (seed, key, step, global position), so replicated masks agree on
every rank, partitioned masks are the rank's slice of the serial mask, and the serial model (tp 1, full
index) is reproduced under any sharding. Megatron's scheme agrees where it must (replicated) and differs
where it must (partitioned) — but no partitioned mask equals the serial one.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.tp.random import ExactDropoutRNG, MegatronDropoutRNG, make_dropout_rng

SEED, P = 1234, 0.3
KEY = "transformer.h.0.attn.attn_dropout"
FULL4 = (slice(None),) * 4


def heads_layout(tp: int, tp_rank: int, heads_per_rank: int = 3):
    """Attention probabilities [b, heads, s, s] split by heads, as ParallelSelfAttention splits them."""
    heads = heads_per_rank * tp
    mine = np.arange(tp_rank * heads_per_rank, (tp_rank + 1) * heads_per_rank)
    return (2, heads, 7, 7), (slice(None), mine, slice(None), slice(None))


def gathered(group, mask: np.ndarray) -> np.ndarray:
    """Every TP rank's mask stacked on a new leading axis (group-rank order)."""
    return group.all_gather(mask[None].astype(np.uint8), axis=0).astype(bool)


def test_exact_replicated_masks_agree_across_tp_and_equal_serial(grid):
    rng = ExactDropoutRNG(SEED)
    shape, full = (2, 7, 12), (slice(None),) * 3
    mask = rng.keep_mask(P, "transformer.drop", 5, shape, full, "replicated")
    every = gathered(grid.tp_group, mask)
    assert all(np.array_equal(m, every[0]) for m in every), "replicated masks differ between TP ranks"
    serial = ExactDropoutRNG(SEED).keep_mask(P, "transformer.drop", 5, shape, full, "replicated")
    assert np.array_equal(mask, serial)


def test_exact_partitioned_masks_are_slices_of_serial_and_differ_per_rank(grid):
    shape, index = heads_layout(grid.tp, grid.tp_rank)
    mask = ExactDropoutRNG(SEED).keep_mask(P, KEY, 3, shape, index, "partitioned")
    serial = ExactDropoutRNG(SEED).keep_mask(P, KEY, 3, shape, FULL4, "partitioned")
    assert mask.shape == (2, 3, 7, 7)
    assert np.array_equal(mask, serial[index]), "partitioned mask is not the matching slice of the serial mask"
    every = gathered(grid.tp_group, mask)
    assert np.array_equal(np.concatenate(list(every), axis=1), serial), "the shards do not tile the serial mask"
    for a in range(grid.tp):
        for b in range(a + 1, grid.tp):
            assert not np.array_equal(every[a], every[b]), f"TP ranks {a} and {b} drew the same partitioned mask"


def test_exact_mask_follows_data_parallel_rows_and_sequence_shards(grid):
    """Any sharding works, not only heads: strided batch rows (as DP would hold them) and a sequence chunk."""
    rng = ExactDropoutRNG(SEED)
    shape = (4 * grid.dp, 3, 11, 11)
    serial = rng.keep_mask(P, KEY, 1, shape, FULL4, "partitioned")
    rows = np.arange(grid.dp_rank, shape[0], grid.dp)
    seq = slice(grid.tp_rank, 11, grid.tp)
    index = (rows, slice(None), seq, slice(None))
    assert np.array_equal(rng.keep_mask(P, KEY, 1, shape, index, "partitioned"), serial[rows][:, :, seq])


def test_exact_mask_is_pure_in_key_and_step():
    rng = ExactDropoutRNG(SEED)
    shape = (2, 6, 9, 9)

    def mask(key=KEY, step=0, seed=SEED):
        return ExactDropoutRNG(seed).keep_mask(P, key, step, shape, FULL4, "partitioned")

    first = rng.keep_mask(P, KEY, 0, shape, FULL4, "partitioned")
    rng.keep_mask(P, "other", 9, shape, FULL4, "replicated")  # draws in between change nothing: no state
    assert np.array_equal(rng.keep_mask(P, KEY, 0, shape, FULL4, "partitioned"), first)
    assert np.array_equal(mask(), first)
    for other in (mask(step=1), mask(key="transformer.h.1.attn.attn_dropout"), mask(seed=SEED + 1)):
        assert not np.array_equal(other, first)
        # unrelated bits: the two masks agree about as often as two independent ones would, p² + (1 − p)²
        assert abs((other == first).mean() - (P ** 2 + (1 - P) ** 2)) < 0.05


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_exact_keep_rate_within_binomial_bound(p):
    n = 200_000
    keep = ExactDropoutRNG(7).keep_mask(p, KEY, 0, (n,), (slice(None),), "replicated")
    sigma = np.sqrt(p * (1 - p) / n)  # binomial standard deviation of the keep rate
    assert abs(keep.mean() - (1 - p)) < 5 * sigma, f"keep rate {keep.mean():.5f}, expected {1 - p} ± {5 * sigma:.5f}"
    half = keep[: n // 2].mean() - keep[n // 2:].mean()  # no drift along the counter; its sigma is 2·sigma
    assert abs(half) < 5 * 2 * sigma, f"keep rate drifts along the index by {half:.5f}"


def test_megatron_replicated_agree_partitioned_differ_and_neither_is_serial(grid):
    rng = MegatronDropoutRNG(SEED, grid.tp_rank)
    rep = rng.keep_mask(P, "transformer.drop", 0, (2, 7, 12), (slice(None),) * 3, "replicated")
    every = gathered(grid.tp_group, rep)
    assert all(np.array_equal(m, every[0]) for m in every), "Megatron's default generator must be shared"

    shape, index = heads_layout(grid.tp, grid.tp_rank)
    part = rng.keep_mask(P, KEY, 0, shape, index, "partitioned")
    assert part.shape == (2, 3, 7, 7)
    every = gathered(grid.tp_group, part)
    for a in range(grid.tp):
        for b in range(a + 1, grid.tp):
            assert not np.array_equal(every[a], every[b]), f"TP ranks {a} and {b} drew the same partitioned mask"
    if grid.tp > 1:  # the serial model draws one [b, heads, s, s] mask; a shard's stream cannot reproduce it
        exact_serial = ExactDropoutRNG(SEED).keep_mask(P, KEY, 0, shape, FULL4, "partitioned")
        megatron_serial = MegatronDropoutRNG(SEED, 0).keep_mask(P, KEY, 0, shape, FULL4, "partitioned")
        assert not np.array_equal(part, exact_serial[index])
        assert not np.array_equal(part, megatron_serial[index])


def test_megatron_masks_depend_on_call_order():
    """Stateful streams: the same (key, step) asked twice gives a fresh mask — why it cannot match serial."""
    rng = MegatronDropoutRNG(SEED, 0)
    a = rng.keep_mask(P, KEY, 0, (4, 9), (slice(None),) * 2, "replicated")
    b = rng.keep_mask(P, KEY, 0, (4, 9), (slice(None),) * 2, "replicated")
    assert not np.array_equal(a, b)
    assert np.array_equal(MegatronDropoutRNG(SEED, 5).keep_mask(P, KEY, 0, (4, 9), (slice(None),) * 2,
                                                                 "replicated"), a)


def test_factory_and_invalid_requests():
    assert isinstance(make_dropout_rng("exact", 1, 3), ExactDropoutRNG)
    meg = make_dropout_rng("megatron", 1, 3)
    assert isinstance(meg, MegatronDropoutRNG) and meg.tp_rank == 3
    with pytest.raises(ValueError, match="exact, megatron"):
        make_dropout_rng("philox", 1, 0)
    rng = ExactDropoutRNG(0)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        rng.keep_mask(1.0, KEY, 0, (3,), (slice(None),), "replicated")
    with pytest.raises(ValueError, match="region"):
        rng.keep_mask(0.5, KEY, 0, (3,), (slice(None),), "sharded")
    with pytest.raises(ValueError, match="outside"):
        rng.keep_mask(0.5, KEY, 0, (3,), (np.array([0, 3]),), "replicated")
    with pytest.raises(ValueError, match="entries"):
        rng.keep_mask(0.5, KEY, 0, (3, 4), (slice(None),), "replicated")
