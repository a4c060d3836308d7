"""ZeRO-3 (parameters sharded too) under TP × DP equals plain DP × TP training; its gathers, bytes and memory are
the formulas'.

Story: tests/mpi/test_zero2.py's GPT of awkward sizes trains clipped AdamW steps with DDP and with ZeRO-3, whose
buckets are cut at the units (each block, each layer outside the blocks): losses, norms and parameters agree to
1e-12 in float64, and within mixed precision's stated tolerance of ZeRO-1 in 16 bits (other buckets sum the DP
gradients in other groups: tests/mpi/test_zero_mixed_precision.py measures what that costs). Every unit's bucket
is all-gathered once before its forward and once before its backward, every gradient bucket reduce-scattered
once, a tied LM head gathering the embedding's bucket for its own two calls: ``predict_step(zero=3)`` row by row,
and 1.5× DDP's wire bytes in one dtype plus the head's two gathers. At rest a rank holds 32/d bytes a parameter
in float64 (16/d float32, 18/d in 16 bits); one unit's parameters are gathered at a time.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tpsim.arch.gpt2 import GPTConfig
from tpsim.config import RunConfig
from tpsim.cost import wire_bytes
from tpsim.models.build import build_gpt
from tpsim.nn.hooks import FORWARD
from tpsim.nn.precision import dtype_of
from tpsim.predict.formulas import predict_step
from tpsim.predict.model_state import MEGATRON_LAYOUTS, TPSIM_16BIT, TPSIM_FLOAT64, measure_model_state
from tpsim.trace.formula_check import compare, format_comparison
from tpsim.train import GradSync, broadcast_batch, compute_grads, dp_slice, train_step
from tpsim.train.zero import DistributedOptimizer

from test_zero2 import BATCH, CLIP, SEQ, SMALL_CAP, TOL, adamw, config, train
from test_zero_mixed_precision import TOL as TOL_16, ULP


def whole(model, opt):
    """The parameters, gathered whole (ZeRO-3) and copied."""
    opt.finish_param_gather()
    return {n: p.copy() for n, p in model.named_parameters()}


def batch(cfg, grid):
    rng = np.random.default_rng(1)
    ids, labels = rng.integers(0, cfg.vocab_size, (2, BATCH, SEQ))
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    return ids[rows], labels[rows]


def test_zero3_equals_plain_dp_tp_with_clipping(grid):
    plain, _, ref = train(grid, 0, SMALL_CAP)
    three, opt, got = train(grid, 3, SMALL_CAP)
    assert opt.zero_stage == 3 and all(r[1] > CLIP for r in ref[:2]), "clipping must scale"
    for (loss, norm), (loss_r, norm_r) in zip(got, ref):
        assert abs(loss - loss_r) <= TOL * abs(loss_r) and abs(norm - norm_r) <= TOL * norm_r
    ref_params, got_params = {n: p.copy() for n, p in plain.named_parameters()}, whole(three, opt)
    worst = max(float(np.max(np.abs(got_params[n] - q))) / max(1.0, float(np.max(np.abs(q))))
                for n, q in ref_params.items())
    assert worst <= TOL, f"parameters differ from plain DP x TP by {worst:.2e}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_zero3_16_bit_equals_zero1_within_mixed_precisions_tolerance(grid, dtype):
    one, opt1, got1 = train(grid, 1, SMALL_CAP, dtype)
    three, opt3, got3 = train(grid, 3, SMALL_CAP, dtype)
    for (a, na), (b, nb) in zip(got3, got1):
        assert abs(a - b) <= TOL_16 * abs(b) and abs(na - nb) <= TOL_16 * nb, ((a, na), (b, nb))
    p1, p3 = whole(one, opt1), whole(three, opt3)
    for name, q in p1.items():
        bound = ULP[dtype] * float(np.max(np.abs(q.astype(np.float64))))
        assert float(np.max(np.abs(p3[name].astype(np.float64) - q.astype(np.float64)))) <= bound, name


def test_each_unit_gathers_twice_and_the_trace_is_the_formula(grid):
    cfg = config(grid.tp)
    model = build_gpt(cfg, grid.tp_group, seed=3)
    opt = DistributedOptimizer(adamw(model), grid, stage=3)
    grid.tracer.reset()
    grid.tracer.step = 0
    ids, labels = broadcast_batch(grid, *batch(cfg, grid))
    train_step(model, opt, grid, opt, ids, labels, clip=1.0)
    units = len(opt.buckets)
    assert units == cfg.n_layer + 3, "a bucket per block, the two embeddings and the final norm (the head is tied)"
    if grid.dp > 1:
        gathers = opt.sharded_params.gathers
        assert gathers == [2] * (units - 1) + [4], gathers  # the tied wte, packed last
        ag = grid.tracer.select(op="all_gather", group="dp")
        rs = grid.tracer.select(op="reduce_scatter", group="dp")
        assert {e.phase for e in ag} == {"forward", "backward"} and len(ag) == 2 * (units + 1) and len(rs) == units
        wte = opt.buckets[-1].nbytes
        ddp = wire_bytes("all_reduce", opt.total_bytes, grid.dp)
        assert sum(e.wire_bytes for e in ag + rs) == 3 * ddp // 2 + 2 * wire_bytes("all_gather", wte, grid.dp)
    run = RunConfig.of(cfg, tp=grid.tp, dp=grid.dp, zero=3, batch_size=BATCH, seq_len=SEQ)
    predicted = predict_step(run, clip=True, ddp_buckets=units, grad_bytes_local=opt.total_bytes)
    table = compare([e.as_dict() for e in grid.tracer.events], predicted)
    assert all(r.match for r in table), format_comparison(table)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_live_model_state_is_the_formula_and_one_unit_is_gathered_at_a_time(grid, dtype):
    if grid.tp != 1:
        pytest.skip("the per-parameter figure is for a model whole on each DP rank (tp 1)")
    cfg = GPTConfig(vocab_size=32, n_positions=8, n_embd=16, n_layer=2, n_head=4)
    model = build_gpt(cfg, grid.tp_group, seed=3, dtype=dtype_of(dtype))
    opt = DistributedOptimizer(adamw(model), grid, stage=3)
    sizes = opt.bucket_sizes
    ids = np.random.default_rng(2).integers(0, 32, (2 * grid.dp, 8))
    rows = dp_slice(2 * grid.dp, grid.dp, grid.dp_rank)
    train_step(model, opt, grid, opt, ids[rows], np.roll(ids, -1, 1)[rows], clip=1.0)
    if any(n != sum(p.size for name, p in model.named_parameters() if name in b.names)
           for n, b in zip(sizes, opt.buckets)):
        pytest.skip(f"dp {grid.dp} pads a unit's bucket: the exact per-parameter figure needs none")
    layout = {"float64": TPSIM_FLOAT64, "float32": MEGATRON_LAYOUTS[2], "bfloat16": TPSIM_16BIT}[dtype]
    per = measure_model_state(model, opt).per_parameter()
    assert per["total"] == layout.bytes_per_zero_stage(3, grid.dp) == Fraction(layout.replicated + layout.sharded,
                                                                                grid.dp)
    assert per["params"] == Fraction(layout.param, grid.dp) and per["grads"] == Fraction(layout.grad, grid.dp)
    itemsize = np.dtype(dtype_of(dtype)).itemsize
    assert opt.sharded_params.peak_bytes == max(sizes) * itemsize, "one unit's bucket gathered at a time"
    assert all(not p.flags.writeable for _, p in model.named_parameters()), "sharded at rest"
    gathered = opt.sharded_params.units
    gathering = [sum(FORWARD in h.events for h in u.hooks) for u in gathered]
    assert gathering == [1] * len(gathered), f"one gathering hook a unit, however often hooked: {gathering}"
    opt.finish_param_gather()
    assert all(p.flags.writeable for _, p in model.named_parameters()), "whole for a reader"
    assert not any(FORWARD in h.events for u in gathered for h in u.hooks), "a reader's model gathers nothing"


def test_gathered_gradients_and_a_state_dict_round_trip(grid):
    cfg = config(grid.tp)
    ids, labels = batch(cfg, grid)
    grads = []
    for stage in (0, 3):
        model = build_gpt(cfg, grid.tp_group, seed=3)
        sync = DistributedOptimizer(adamw(model), grid, stage=3) if stage else GradSync(model, grid.dp_group)
        compute_grads(model, grid, sync, ids, labels)
        sync.gather_grads()
        grads.append({n: g.copy() for n, g in model.named_grads()})
    assert max(float(np.max(np.abs(grads[1][n] - g))) for n, g in grads[0].items()) <= TOL
    model = build_gpt(cfg, grid.tp_group, seed=3)
    opt = DistributedOptimizer(adamw(model), grid, stage=3)
    for _ in range(2):
        train_step(model, opt, grid, opt, ids, labels, clip=1.0)
    saved, sd = whole(model, opt), opt.state_dict()
    train_step(model, opt, grid, opt, ids, labels, clip=1.0)
    other = build_gpt(cfg, grid.tp_group, seed=3)
    for name, p in other.named_parameters():
        p[...] = saved[name]
    resumed = DistributedOptimizer(adamw(other), grid, stage=3)
    resumed.load_state_dict(sd)
    train_step(other, resumed, grid, resumed, ids, labels, clip=1.0)
    a, b = whole(model, opt), whole(other, resumed)
    assert all(np.array_equal(a[n], b[n]) for n in a)
