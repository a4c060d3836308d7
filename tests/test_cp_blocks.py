"""Ring attention's arithmetic, serially (``tpsim.cp.blocks``, ``tpsim.cp.layout``): a shard's queries against
every K/V block in ring order, merged by the online softmax, equal serial causal attention to 1e-12 in float64,
and the blocks' backward shares add up to serial attention's dQ, dK, dV — at CP 2, 4 and 8, zigzag and
contiguous, with GQA; the zigzag layout gives every rank the same causal work, the contiguous one does not."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.cp.blocks import block_backward, block_forward, merge
from tpsim.cp.layout import causal_pairs, positions
from tpsim.errors import ConfigError
from tpsim.nn.attention import attention_core_backward, attention_core_forward
from tpsim.nn.gradcheck import numerical_grad, relative_error

CASES = [(cp, layout, kv) for cp in (2, 4, 8) for layout in ("zigzag", "contiguous") for kv in (4, 2, 1)]


def serial(q, k, v, dout, keep=None, p=0.0):
    """Serial causal attention with K/V repeated to the query heads, and its gradients folded back."""
    rep = q.shape[1] // k.shape[1]
    out, cache = attention_core_forward(q, np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1), keep, p)
    dq, dk, dv = attention_core_backward(dout, cache)
    fold = lambda x: x.reshape(x.shape[0], k.shape[1], rep, *x.shape[2:]).sum(axis=2)  # noqa: E731
    return out, dq, fold(dk), fold(dv)


def ring(q, k, v, dout, cp, layout, keep=None, p=0.0):
    """Each rank's shard of queries against every rank's K/V block, the source one step further round the ring
    each time (rank r sees block r − t at step t), merged; then every block's backward share, summed where the
    block lives — what a ring of CP ranks computes, here in one process."""
    s = q.shape[2]
    pos = [positions(layout, r, cp, s) for r in range(cp)]
    shard = lambda x, r: x[:, :, pos[r]]  # noqa: E731
    out, lse = np.zeros_like(q), np.zeros(q.shape[:3])
    for r in range(cp):
        o, m = None, None
        for t in range(cp):
            j = (r - t) % cp
            mask = None if keep is None else keep[:, :, pos[r]][:, :, :, pos[j]]
            oj, mj = block_forward(shard(q, r), shard(k, j), shard(v, j), pos[r], pos[j], mask, p)
            o, m = (oj, mj) if o is None else merge(o, m, oj, mj)
        out[:, :, pos[r]], lse[:, :, pos[r]] = o, m
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for r in range(cp):
        for t in range(cp):
            j = (r - t) % cp
            mask = None if keep is None else keep[:, :, pos[r]][:, :, :, pos[j]]
            a, b, c = block_backward(shard(dout, r), shard(out, r), lse[:, :, pos[r]], shard(q, r), shard(k, j),
                                     shard(v, j), pos[r], pos[j], mask, p)
            dq[:, :, pos[r]] += a
            dk[:, :, pos[j]] += b
            dv[:, :, pos[j]] += c
    return out, dq, dk, dv


@pytest.mark.parametrize("cp, layout, kv", CASES, ids=lambda x: str(x))
def test_the_ring_equals_serial_causal_attention_and_its_gradients(cp, layout, kv):
    rng = np.random.default_rng(cp * 10 + kv)
    b, h, s, d = 2, 4, 4 * cp, 8
    q, dout = rng.standard_normal((b, h, s, d)), rng.standard_normal((b, h, s, d))
    k, v = rng.standard_normal((b, kv, s, d)), rng.standard_normal((b, kv, s, d))
    for got, want in zip(ring(q, k, v, dout, cp, layout), serial(q, k, v, dout)):
        assert np.max(np.abs(got - want)) <= 1e-12 * max(1.0, np.max(np.abs(want)))


@pytest.mark.parametrize("cp", [2, 4])
def test_the_ring_with_attention_dropout_equals_serial(cp):
    """GPT-2's attention dropout: each block's mask at its absolute (query, key) positions, p = 0.3."""
    rng = np.random.default_rng(cp)
    b, h, s, d, p = 2, 4, 4 * cp, 8, 0.3
    q, dout = rng.standard_normal((b, h, s, d)), rng.standard_normal((b, h, s, d))
    k, v = rng.standard_normal((b, 2, s, d)), rng.standard_normal((b, 2, s, d))
    keep = rng.random((b, h, s, s)) >= p
    for got, want in zip(ring(q, k, v, dout, cp, "zigzag", keep, p), serial(q, k, v, dout, keep, p)):
        assert np.max(np.abs(got - want)) <= 1e-12 * max(1.0, np.max(np.abs(want)))


def test_a_row_that_sees_no_key_of_a_block_leaves_the_merge_unchanged():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 4, 8)) for _ in range(3))
    early, late = np.arange(4), np.arange(4, 8)
    o, m = block_forward(q, k, v, early, late)  # every key after every query: nothing seen
    assert np.all(o == 0) and np.all(m == -np.inf)
    oa, ma = block_forward(q, k, v, late, early)
    ob, mb = merge(oa, ma, o, m)
    assert np.array_equal(ob, oa) and np.array_equal(mb, ma)
    assert not np.isnan(block_backward(q, oa, ma, q, k, v, early, late)[0]).any()


def test_the_merged_forward_has_finite_difference_gradients():
    """Central differences (float64) of Σ dout ⊙ O through two blocks and the merge, against block_backward."""
    rng = np.random.default_rng(5)
    q, k, v, dout = (rng.standard_normal((1, 2, 6, 4)) for _ in range(4))
    k, v = k[:, :1], v[:, :1]  # GQA: one KV head for two query heads
    qp, a, b = np.arange(6), np.array([0, 1, 5]), np.array([2, 3, 4])

    def loss() -> float:
        o1, l1 = block_forward(q, k[:, :, :3], v[:, :, :3], qp, a)
        o2, l2 = block_forward(q, k[:, :, 3:], v[:, :, 3:], qp, b)
        return float((dout * merge(o1, l1, o2, l2)[0]).sum())
    o1, l1 = block_forward(q, k[:, :, :3], v[:, :, :3], qp, a)
    o2, l2 = block_forward(q, k[:, :, 3:], v[:, :, 3:], qp, b)
    out, lse = merge(o1, l1, o2, l2)
    g1 = block_backward(dout, out, lse, q, k[:, :, :3], v[:, :, :3], qp, a)
    g2 = block_backward(dout, out, lse, q, k[:, :, 3:], v[:, :, 3:], qp, b)
    assert relative_error(g1[0] + g2[0], numerical_grad(loss, q)) < 1e-7
    assert relative_error(np.concatenate([g1[1], g2[1]], axis=2), numerical_grad(loss, k)) < 1e-7
    assert relative_error(np.concatenate([g1[2], g2[2]], axis=2), numerical_grad(loss, v)) < 1e-7


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_zigzag_balances_the_causal_work_and_contiguous_does_not(cp):
    s = 16 * cp
    zig = [causal_pairs("zigzag", r, cp, s) for r in range(cp)]
    flat = [causal_pairs("contiguous", r, cp, s) for r in range(cp)]
    assert len(set(zig)) == 1 and sum(zig) == sum(flat) == s * (s + 1) // 2  # every pair once, split evenly
    n = s // cp
    assert flat == [n * n * r + n * (n + 1) // 2 for r in range(cp)]  # rank r: (2r + 1)·n²/2 + n/2
    assert flat[-1] / flat[0] == pytest.approx(1 + 2 * n * (cp - 1) / (n + 1), rel=1e-15)  # → 2C − 1 as n grows
    assert sorted(np.concatenate([positions("zigzag", r, cp, s) for r in range(cp)]).tolist()) == list(range(s))


def test_a_sequence_the_layout_cannot_cut_is_one_line():
    with pytest.raises(ConfigError, match="not divisible by 8 .zigzag over cp 4: 2 x cp chunks"):
        positions("zigzag", 0, 4, 12)
    with pytest.raises(ConfigError, match="one of zigzag, contiguous"):
        positions("striped", 0, 2, 8)
