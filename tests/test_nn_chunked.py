"""Elementwise and row-wise formulas run block by block (tpsim.nn.chunked) give the whole-array bits.

The arrays here span many blocks (several MiB against 256 KiB blocks), and each reference is the whole-array
formula written the straightforward way, in the same order of operations — so equality is exact, not close.
"""

import math

import numpy as np
import pytest

from tpsim.nn import gelu_backward, gelu_forward
from tpsim.nn.chunked import CHUNK_BYTES, chunk_slices, row_blocks
from tpsim.nn.layernorm import layernorm_backward, layernorm_forward
from tpsim.nn.softmax import softmax_backward, softmax_forward

DTYPES = [np.float32, np.float64]
C = math.sqrt(2.0 / math.pi)  # a Python float: a NumPy float64 would promote the float32 reference


@pytest.mark.parametrize("n, itemsize", [(0, 4), (1, 8), (65536, 4), (65537, 4), (1_000_003, 8)])
def test_chunk_slices_cover_the_range_once_in_blocks_that_fit(n, itemsize):
    parts = list(chunk_slices(n, itemsize))
    assert [i for p in parts for i in range(p.start, p.stop)] == list(range(n))
    assert all(0 < (p.stop - p.start) * itemsize <= CHUNK_BYTES for p in parts)


@pytest.mark.parametrize("rows, row_bytes", [(0, 4096), (5, 4096), (1000, 4096), (3, 10 * CHUNK_BYTES)])
def test_row_blocks_hold_whole_rows_at_least_one(rows, row_bytes):
    parts = list(row_blocks(rows, row_bytes))
    assert [i for p in parts for i in range(p.start, p.stop)] == list(range(rows))
    assert all(p.stop - p.start == 1 or (p.stop - p.start) * row_bytes <= CHUNK_BYTES for p in parts)


def _tanh_gelu_reference(x, dy):
    t = np.tanh(C * (x * x * x * 0.044715 + x))  # the order _tanh_u computes it in
    y = (t + 1.0) * x * 0.5
    du = (x * x * (3.0 * 0.044715) + 1.0) * C
    slope = (1.0 - t * t) * x * du * 0.5
    return y, ((t + 1.0) * 0.5 + slope) * dy


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_in_blocks_equals_the_whole_array_formula(dtype):
    rng = np.random.default_rng(0)
    x = (3 * rng.standard_normal((700, 1001))).astype(dtype)  # 2.8 / 5.6 MB, not a whole number of blocks
    dy = rng.standard_normal(x.shape).astype(dtype)
    y, cache = gelu_forward(x)
    want_y, want_dx = _tanh_gelu_reference(x, dy)
    dx = gelu_backward(dy, cache)
    assert y.dtype == dx.dtype == dtype and np.array_equal(y, want_y) and np.array_equal(dx, want_dx)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_in_row_blocks_equals_the_whole_array_formula(dtype):
    rng = np.random.default_rng(1)
    x = (4 * rng.standard_normal((3, 401, 512))).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    want = e / e.sum(axis=-1, keepdims=True)
    y, cache = softmax_forward(x)
    dx = softmax_backward(dy, cache)
    assert np.array_equal(y, want)
    assert np.array_equal(dx, (dy - (dy * want).sum(axis=-1, keepdims=True)) * want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_in_row_blocks_equals_the_whole_array_formula(dtype):
    rng = np.random.default_rng(2)
    x = (2 * rng.standard_normal((2, 777, 640)) + 1).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    w, b = (rng.standard_normal(640).astype(dtype) for _ in range(2))
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(np.square(xc).mean(axis=-1, keepdims=True) + 1e-5)
    xhat = xc * rstd
    y, cache = layernorm_forward(x, w, b)
    assert np.array_equal(y, xhat * w + b) and np.array_equal(cache.rstd, rstd) and np.array_equal(cache.xhat, xhat)
    dxhat = dy * w
    want_dx = (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)) * rstd
    dx, dw, db = layernorm_backward(dy, cache)
    assert np.array_equal(dx, want_dx)
    assert np.array_equal(dw, (dy * xhat).reshape(-1, 640).sum(axis=0)) and np.array_equal(db, dy.reshape(-1, 640).sum(axis=0))
