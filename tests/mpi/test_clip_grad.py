"""TP-aware gradient clipping and AdamW on shards vs a serial twin of two MLPs in sequence.

Story: build a serial model (MLP → MLP), shard it with ``ParallelMLP.from_serial``, run forward/backward on the
same input and upstream gradient, then check that the norm computed from the shards with one all-reduce is the
serial norm, that clipping scales each shard exactly like the serial gradient, and that counting the replicated
c_proj biases on every rank (the bug the design avoids) inflates the norm at tp > 1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tpsim.nn import MLP, Module
from tpsim.partition import take_shard
from tpsim.tp import ParallelMLP
from tpsim.train import AdamW, clip_grad_norm, grad_norm
from _util import assert_close, randn

NORMS = [2.0, math.inf, 1.0, 3.5]


class TwoMLPs(Module):
    """first → second; the same container holds the serial MLPs or their parallel twins."""

    def __init__(self, first: Module, second: Module) -> None:
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x):
        y, c1 = self.first.forward(x)
        z, c2 = self.second.forward(y)
        return z, (c1, c2)

    def backward(self, dz, cache):
        c1, c2 = cache
        return self.first.backward(self.second.backward(dz, c2), c1)


def make_twins(grid, hidden: int = 13, ffn_per_rank: int = 5):
    rng = np.random.default_rng(7)
    serial = TwoMLPs(MLP(hidden, ffn_per_rank * grid.tp, rng=rng, std=0.3),
                     MLP(hidden, ffn_per_rank * grid.tp, rng=rng, std=0.3))
    parallel = TwoMLPs(ParallelMLP.from_serial(serial.first, grid.tp_group),
                       ParallelMLP.from_serial(serial.second, grid.tp_group))
    return serial, parallel


def fwd_bwd(serial: Module, parallel: Module, step: int = 0, hidden: int = 13) -> None:
    x, dz = randn(10 + step, 2, 5, hidden), randn(20 + step, 2, 5, hidden)
    for model in (serial, parallel):
        model.zero_grad()
        z, cache = model.forward(x)
        model.backward(dz, cache)


def matching(serial: Module, parallel: Module, which: str = "grads"):
    """(name, parallel local tensor, the serial tensor's matching slice) for every parameter."""
    get = (lambda m: m.named_grads()) if which == "grads" else (lambda m: m.named_parameters())
    for (name, s), (pname, param, grad, part) in zip(get(serial), parallel.named_entries()):
        assert name == pname, f"{name} != {pname}"
        yield name, grad if which == "grads" else param, take_shard(s, part)


def serial_norm(model: Module, p: float) -> float:
    flat = np.concatenate([g.ravel() for _, g in model.named_grads()])
    return float(np.linalg.norm(flat, ord=p))


def serial_clip(model: Module, max_norm: float, p: float) -> float:
    """The single-process reference: PyTorch's rule, coef = max_norm / (norm + 1e-6) applied if < 1."""
    total = serial_norm(model, p)
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for _, g in model.named_grads():
            g *= coef
    return total


def assert_rel(actual: float, expected: float, what: str, tol: float = 1e-12) -> None:
    assert abs(actual - expected) <= tol * abs(expected), f"{what}: {actual!r} vs {expected!r}"


@pytest.mark.parametrize("norm_type", NORMS, ids=str)
def test_grad_norm_equals_serial_on_every_rank(grid, norm_type):
    serial, parallel = make_twins(grid)
    fwd_bwd(serial, parallel)
    total = grad_norm(parallel, grid.tp_group, norm_type)
    assert isinstance(total, float)
    assert_rel(total, serial_norm(serial, norm_type), f"norm {norm_type}")
    others = grid.tp_group.comm.allgather(total)  # test-side check, outside the traced API
    assert all(t == total for t in others), f"norm differs across TP ranks: {others}"


@pytest.mark.parametrize("norm_type", [2.0, math.inf], ids=str)
def test_clip_below_the_norm_scales_every_shard_like_serial(grid, norm_type):
    serial, parallel = make_twins(grid)
    fwd_bwd(serial, parallel)
    max_norm = 0.3 * serial_norm(serial, norm_type)
    expected = serial_clip(serial, max_norm, norm_type)
    returned = clip_grad_norm(parallel, grid.tp_group, max_norm, norm_type)
    assert_rel(returned, expected, "returned pre-clip norm")
    for name, local, ref in matching(serial, parallel):
        assert_close(local, ref, 1e-12, f"clipped {name}")
    # the clip coefficient is max_norm / (norm + 1e-6), as in PyTorch; ``expected`` is the pre-clip norm
    assert_rel(grad_norm(parallel, grid.tp_group, norm_type), max_norm * expected / (expected + 1e-6),
               "norm after clipping")


def test_clip_above_the_norm_leaves_grads_unchanged(grid):
    serial, parallel = make_twins(grid)
    fwd_bwd(serial, parallel)
    before = {name: g.copy() for name, g in parallel.named_grads()}
    total = clip_grad_norm(parallel, grid.tp_group, 2.0 * serial_norm(serial, 2.0))
    assert_rel(total, serial_norm(serial, 2.0), "norm")
    for name, g in parallel.named_grads():
        np.testing.assert_array_equal(g, before[name], err_msg=name)


@pytest.mark.parametrize("norm_type,reduce_op", [(2.0, "sum"), (math.inf, "max")], ids=["l2", "inf"])
def test_clip_issues_one_all_reduce_in_the_tp_group(grid, norm_type, reduce_op):
    serial, parallel = make_twins(grid)
    fwd_bwd(serial, parallel)
    grid.tracer.reset()
    clip_grad_norm(parallel, grid.tp_group, 1e-3, norm_type)
    ev = grid.tracer.events
    assert [(e.op, e.group, e.scope, e.phase, e.reduce_op) for e in ev] == [
        ("all_reduce", "tp", "clip_grad_norm", "optimizer", reduce_op)], ev
    assert ev[0].shape == (1,) and ev[0].bytes == 8 and ev[0].group_size == grid.tp


def test_naive_norm_counting_replicated_grads_on_every_rank_is_wrong(grid):
    """Sum every local grad on every rank: the replicated c_proj biases are counted tp times."""
    serial, parallel = make_twins(grid)
    fwd_bwd(serial, parallel)
    local = sum(float(np.sum(g * g)) for _, g in parallel.named_grads())
    naive = math.sqrt(grid.tp_group.all_reduce(np.array([local]))[0])
    replicated = sum(float(np.sum(e.grad * e.grad)) for e in parallel.named_entries() if e.partition is None)
    true = serial_norm(serial, 2.0)
    assert replicated > 0
    assert_rel(naive**2, true**2 + (grid.tp - 1) * replicated, "naive² = serial² + (tp-1)·Σ replicated²")
    if grid.tp > 1:
        assert naive > true * (1 + 1e-6), f"naive {naive} should exceed serial {true} at tp={grid.tp}"


def test_adamw_on_shards_equals_serial_adamw_after_clipped_steps(grid):
    serial, parallel = make_twins(grid)
    no_decay = lambda name: name.endswith("bias")  # noqa: E731 - a one-line policy reads best inline
    s_opt = AdamW(serial, lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1, no_decay=no_decay)
    p_opt = AdamW(parallel, lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1, no_decay=no_decay)
    for step in range(2):
        fwd_bwd(serial, parallel, step)
        max_norm = 0.5 * serial_norm(serial, 2.0)  # clipping active, so the norm has to be the serial one
        serial_clip(serial, max_norm, 2.0)
        clip_grad_norm(parallel, grid.tp_group, max_norm)
        s_opt.step()
        p_opt.step()
    for name, local, ref in matching(serial, parallel, "params"):
        assert_close(local, ref, 1e-12, f"param {name} after 2 steps")
    # Optimizer memory: sharded state is 1/tp of the serial state, replicated state is whole.
    expected = sum(2 * (s.nbytes if e.partition is None else s.nbytes // grid.tp) for (_, s), e in
                   zip(serial.named_parameters(), parallel.named_entries()))
    assert p_opt.state_bytes() == expected


@pytest.mark.parametrize("kwargs,match", [({"norm_type": 0.0}, "norm_type"), ({"norm_type": -2.0}, "norm_type"),
                                          ({"norm_type": math.nan}, "norm_type"), ({"max_norm": -1.0}, "max_norm")])
def test_bad_arguments_fail_on_every_rank_before_any_collective(grid, kwargs, match):
    _, parallel = make_twins(grid)
    with pytest.raises(ValueError, match=match):
        clip_grad_norm(parallel, grid.tp_group, **{"max_norm": 1.0, **kwargs})
    assert grid.tracer.events == []
