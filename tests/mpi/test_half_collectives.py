"""16-bit collectives: 2 bytes per element on the wire, sums accumulated in float32 and rounded at every step.

Tolerance: each rank's value is a 16-bit number (exact in float64); an all-reduce over p ranks rounds at most
p − 1 times (ring) or log2(p) times (recursive doubling), each time with relative error ≤ u (bfloat16: u = 2^-8,
8 significand bits; float16: u = 2^-11). With the partial sums bounded by Σ|x_r|, the error is at most
(p − 1)·u·Σ_r|x_r| per element; the test asserts exactly that bound against a float64 reference sum.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.nn.precision import bfloat16

UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


def _rank_values(dtype, size: int, shape=(4, 24)) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(size)]


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_all_reduce_is_16_bit_and_within_the_rounding_bound(grid, name):
    dtype = bfloat16 if name == "bfloat16" else np.dtype(np.float16)
    g = grid.tp_group
    xs = _rank_values(dtype, g.size)
    exact = sum(x.astype(np.float64) for x in xs)
    bound = max(g.size - 1, 1) * UNIT_ROUNDOFF[name] * sum(np.abs(x.astype(np.float64)) for x in xs)
    got = g.all_reduce(xs[g.rank])
    assert got.dtype == dtype
    assert np.all(np.abs(got.astype(np.float64) - exact) <= bound + 1e-300), "beyond (p-1)·u·Σ|x|"
    if g.size > 1:  # every rank holds the same bits: replicas stay identical
        same = g.all_gather(got.view(np.uint16)[None], axis=0)
        assert np.all(same == same[0])
    inplace = xs[g.rank].copy()
    assert g.all_reduce(inplace, inplace=True) is inplace
    np.testing.assert_array_equal(inplace.view(np.uint16), got.view(np.uint16))
    rec = [r for r in grid.tracer.events if r.op == "all_reduce"][0]
    assert rec.dtype == name and rec.bytes == 2 * got.size


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_gather_scatter_broadcast_and_max_in_16_bits(grid, name):
    dtype = bfloat16 if name == "bfloat16" else np.dtype(np.float16)
    g = grid.tp_group
    xs = _rank_values(dtype, g.size, shape=(3, 2 * g.size))
    gathered = g.all_gather(xs[g.rank], axis=-1)
    np.testing.assert_array_equal(gathered.view(np.uint16), np.concatenate(xs, axis=-1).view(np.uint16))
    chunk = g.reduce_scatter(xs[g.rank], axis=-1)
    exact = np.split(sum(x.astype(np.float64) for x in xs), g.size, axis=-1)[g.rank]
    scale = np.split(sum(np.abs(x.astype(np.float64)) for x in xs), g.size, axis=-1)[g.rank]
    assert chunk.dtype == dtype
    assert np.all(np.abs(chunk.astype(np.float64) - exact) <= max(g.size - 1, 1) * UNIT_ROUNDOFF[name] * scale)
    top = g.all_reduce(xs[g.rank], op="max")
    np.testing.assert_array_equal(top.astype(np.float64), np.max([x.astype(np.float64) for x in xs], axis=0))
    b = xs[g.rank].copy()
    g.broadcast(b, root=0)
    np.testing.assert_array_equal(b.view(np.uint16), xs[0].view(np.uint16))
    assert {r.dtype for r in grid.tracer.events} == {name}
