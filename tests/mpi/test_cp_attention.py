"""Context-parallel attention equals serial attention, output and dQ, dK, dV, on live CP groups.

Story: every rank draws the same whole-sequence Q, K, V (GQA: fewer KV heads) and dO; each CP rank keeps the rows
of its positions (zigzag or contiguous), runs ``ContextParallel`` over its CP group (ring, allgather, ulysses), and
compares its output and gradients with the rows of serial causal attention (``tpsim.nn.attention``'s core, the
layer every model uses) at 1e-12 in float64 — at every CP size the world has (1, 2, 4, 8), KV heads 8, 2 and 1,
with and without attention dropout. The traced CP messages equal ``tpsim.predict.cp_comm`` call for call and byte
for byte; the zigzag layout gives every rank the same attention work, the contiguous one rank r's causal share.
bfloat16: within 2e-2 (absolute and relative) of the float64 serial result: the inputs, the K/V and dK/dV
messages and the results are each rounded to bfloat16 (relative 2^-8 each, a few of them compounded), the
exponentials and sums run in float32.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.comm import ProcessGrid
from tpsim.cp.choice import CP_COMMS
from tpsim.cp.context import ContextParallel
from tpsim.cp.layout import causal_pairs
from tpsim.phases import BACKWARD, FORWARD
from tpsim.nn.attention import attention_core_backward, attention_core_forward
from tpsim.predict.cp_comm import cp_messages
from conftest import WORLD

N = WORLD.Get_size()
B, H, S, D, P = 2, 8, 16, 4, 0.25
_GRIDS: dict[int, ProcessGrid] = {}


def cp_grid(cp: int) -> ProcessGrid:
    if cp not in _GRIDS:
        _GRIDS[cp] = ProcessGrid(tp=1, cp=cp)
    grid = _GRIDS[cp]
    grid.tracer.reset()
    grid.tracer.enabled = True
    return grid


def serial(kv_heads: int, keep=None, dtype=np.float64):
    rng = np.random.default_rng(7)
    q, dout = rng.standard_normal((B, H, S, D)), rng.standard_normal((B, H, S, D))
    k, v = rng.standard_normal((B, kv_heads, S, D)), rng.standard_normal((B, kv_heads, S, D))
    rep = H // kv_heads
    out, cache = attention_core_forward(q, np.repeat(k, rep, 1), np.repeat(v, rep, 1), keep, P)
    dq, dk, dv = attention_core_backward(dout, cache)
    fold = (B, kv_heads, rep, S, D)
    return (q, k, v, dout), (out, dq, dk.reshape(fold).sum(2), dv.reshape(fold).sum(2))


def cases():
    for cp in (c for c in (1, 2, 4, 8) if N % c == 0):
        for comm in CP_COMMS:
            for layout in ("zigzag", "contiguous"):
                for kv in (8, 2, 1):
                    if comm != "ulysses" or kv % cp == 0:
                        yield pytest.param(cp, comm, layout, kv, id=f"cp{cp}-{comm}-{layout}-kv{kv}")


def run_cp(cp, comm, layout, kv, *, dropout=False, dtype=np.float64):
    grid = cp_grid(cp)
    keep_full = np.random.default_rng(3).random((B, H, S, S)) >= P if dropout else None
    inputs, want = serial(kv, keep_full)
    ctx = ContextParallel(grid.cp_group, comm, layout)
    pos = ctx.positions(S // cp)

    def keep(q_pos, k_pos, heads):
        return keep_full[:, heads if heads is not None else slice(None)][:, :, q_pos][:, :, :, k_pos]
    q, k, v, dout = (x[:, :, pos].astype(dtype) for x in inputs)
    with grid.tracer.region(scope="attn", phase=FORWARD):
        out, cache = ctx.forward(q, k, v, keep if dropout else None, P if dropout else 0.0)
    with grid.tracer.region(scope="attn", phase=BACKWARD):
        grads = ctx.backward(dout, cache)
    return grid, ctx, pos, (out, *grads), want


@pytest.mark.parametrize("cp, comm, layout, kv", list(cases()))
def test_cp_attention_equals_serial(cp, comm, layout, kv):
    grid, ctx, pos, got, want = run_cp(cp, comm, layout, kv)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert g.dtype == np.float64
        np.testing.assert_allclose(g, w[:, :, pos], rtol=0, atol=1e-12, err_msg=name)
    records = [e for e in grid.tracer.events if e.group == "cp"]
    measured = {}
    for r in records:
        key = (r.phase, r.op)
        calls, nbytes = measured.get(key, (0, 0))
        measured[key] = (calls + 1, nbytes + r.bytes)
    predicted = {}
    for phase, op, calls, nbytes in cp_messages(comm, cp, b=B, s=S, heads=H, kv_heads=kv, head_dim=D, e=8):
        c, n = predicted.get((phase, op), (0, 0))
        predicted[(phase, op)] = (c + calls, n + calls * nbytes)
    assert measured == predicted


@pytest.mark.parametrize("comm", CP_COMMS)
@pytest.mark.parametrize("cp", [c for c in (2, 4, 8) if N % c == 0])
def test_cp_attention_dropout_equals_serial(cp, comm):
    _, _, pos, got, want = run_cp(cp, comm, "zigzag", 2 if comm != "ulysses" or cp <= 2 else 8, dropout=True)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w[:, :, pos], rtol=0, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("cp", [c for c in (2, 4, 8) if N % c == 0])
def test_ring_work_is_balanced_only_by_zigzag(cp, layout):
    grid, ctx, _, _, _ = run_cp(cp, "ring", layout, 2)
    work = grid.cp_group.comm.allgather(ctx.head_pairs)  # set-up talk, untraced: the test's own bookkeeping
    n = S // cp
    assert work == [H * causal_pairs(layout, r, cp, S) for r in range(cp)]  # pairs x heads, every row alike
    if layout == "zigzag":
        assert len(set(work)) == 1
    else:  # rank r: n²·r + n(n + 1)/2 pairs a head, the last rank about 2cp − 1 times the first
        assert work == [H * (n * n * r + n * (n + 1) // 2) for r in range(cp)]


@pytest.mark.parametrize("comm", CP_COMMS)
@pytest.mark.parametrize("cp", [c for c in (2, 4) if N % c == 0])
def test_cp_attention_bfloat16(cp, comm):
    from ml_dtypes import bfloat16
    _, _, pos, got, want = run_cp(cp, comm, "zigzag", 2 if comm != "ulysses" else 4, dtype=bfloat16)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert g.dtype == bfloat16
        np.testing.assert_allclose(g.astype(np.float64), w[:, :, pos], rtol=2e-2, atol=2e-2, err_msg=name)
