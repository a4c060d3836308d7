"""Property-based tests (hypothesis) of the pure arithmetic every parallel layer relies on."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsim.comm import grid_layout
from tpsim.errors import ConfigError
from tpsim.cost import wire_bytes
from tpsim.nn import softmax_cross_entropy_forward
from tpsim.nn.module import Partition
from tpsim.partition import take_shard, uneven_ranges
from tpsim.partition import padded_vocab_size, vocab_range
from tpsim.train.ddp import assign_buckets

sizes = st.integers(min_value=1, max_value=64)


@given(tp=sizes, dp=sizes)
def test_grid_rows_are_tp_groups_and_columns_dp_groups(tp, dp):
    layout = grid_layout(tp * dp, tp)
    assert sorted(layout.ravel().tolist()) == list(range(tp * dp))
    for rank in range(tp * dp):  # Megatron order: TP ranks consecutive
        assert layout[rank // tp, rank % tp] == rank


@given(world=sizes, tp=sizes)
def test_grid_rejects_exactly_the_indivisible_sizes(world, tp):
    try:
        grid_layout(world, tp)
        assert world % tp == 0
    except ConfigError as err:
        assert world % tp and "not divisible" in str(err)


@given(n=st.integers(0, 1000), p=sizes)
def test_uneven_ranges_cover_everything_once(n, p):
    ranges = uneven_ranges(n, p)
    assert [i for r in ranges for i in r] == list(range(n))
    lengths = [len(r) for r in ranges]
    assert max(lengths) - min(lengths) <= 1


@given(vocab=st.integers(1, 5000), tp=sizes)
def test_padded_vocab_ranges_partition_the_padded_vocabulary(vocab, tp):
    vp = padded_vocab_size(vocab, tp)
    assert vp % tp == 0 and vocab <= vp < vocab + tp
    bounds = [vocab_range(vp, tp, r) for r in range(tp)]
    assert bounds[0][0] == 0 and bounds[-1][1] == vp
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


@given(nbytes=st.integers(0, 10**9), p=sizes)
def test_ring_wire_bytes_bounds(nbytes, p):
    ar, ag = wire_bytes("all_reduce", nbytes, p), wire_bytes("all_gather", nbytes, p)
    assert 0 <= ag <= nbytes and 0 <= ar <= 2 * nbytes
    assert abs(ar - 2 * ag) <= 1, "an all-reduce is a reduce-scatter plus an all-gather"
    assert wire_bytes("reduce_scatter", nbytes, p) == ag
    assert (p == 1) == (ar == 0) or nbytes == 0


@given(st.lists(st.integers(1, 500), min_size=1, max_size=40), st.integers(0, 2000))
def test_ddp_buckets_keep_order_and_respect_the_cap(sizes_, cap):
    entries = [(f"p{i}", n, "float64") for i, n in enumerate(sizes_)]
    buckets = assign_buckets(entries, cap)
    assert [i for b in buckets for i in b] == list(range(len(entries)))
    for b in buckets:
        total = sum(sizes_[i] for i in b)
        assert len(b) == 1 or (cap and total <= cap)


@settings(max_examples=50)
@given(rows=st.integers(1, 6), cols=st.integers(2, 9), shift=st.floats(-1e3, 1e3), seed=st.integers(0, 99))
def test_cross_entropy_is_invariant_to_a_per_row_shift(rows, cols, shift, seed):
    rng = np.random.default_rng(seed)
    logits, targets = rng.standard_normal((rows, cols)), rng.integers(0, cols, rows)
    a, _ = softmax_cross_entropy_forward(logits, targets)
    b, _ = softmax_cross_entropy_forward(logits + shift, targets)
    assert abs(a - b) <= 1e-9 * max(1.0, abs(a))


@given(n=st.integers(1, 30), full_extra=st.integers(0, 5), data=st.data())
def test_take_shard_reads_a_short_master_as_zero_padded(n, full_extra, data):
    full = n + full_extra
    index = np.array(sorted(data.draw(st.sets(st.integers(0, full - 1), min_size=1))))
    master = np.arange(n * 3, dtype=float).reshape(n, 3) + 1
    shard = take_shard(master, Partition(0, index, full))
    for row, i in zip(shard, index):
        assert np.array_equal(row, master[i] if i < n else np.zeros(3))
