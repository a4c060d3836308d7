"""ZeRO-2 (gradients sharded too) under TP × DP and PP equals plain DP × TP training; its bytes and memory are the
formulas'.

Story: the same sharded GPT of awkward sizes (tests/mpi/test_zero1.py's: padded buckets, parameters straddling two
owners) trains clipped AdamW steps with ``GradSync`` + AdamW, with ZeRO-1 and with ZeRO-2. With one micro-batch
ZeRO-2 reduce-scatters every bucket once, with the same non-blocking call as ZeRO-1 into a zeroed owned slice, so
its parameters must equal ZeRO-1's *bit for bit* (float64, bfloat16 and float16 alike) — and plain DP × TP's to
1e-12. At rest a rank holds the owned slices only (8 + 24/d bytes a parameter in float64, 2 + 16/d in 16 bits, the
live arrays counted); the buckets exist only while a backward writes them. Under a pipeline every micro-batch
reduce-scatters what it wrote (the tied embedding's held bucket once a step): 1F1B and ZB-H1, GPT-2 and Llama,
against the serial model trained the same way, the calls and bytes against ``zero2_reduce_scatter``.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tpsim.arch.gpt2 import GPTConfig
from tpsim.config import RunConfig
from tpsim.models.build import build_gpt
from tpsim.nn.precision import dtype_of
from tpsim.predict.formulas import predict_step
from tpsim.predict.model_state import MEGATRON_LAYOUTS, TPSIM_16BIT, TPSIM_FLOAT64, measure_model_state
from tpsim.trace.formula_check import compare, format_comparison
from tpsim.train import (AdamW, DynamicLossScaler, GradSync, apply_update, broadcast_batch, compute_grads, dp_slice,
                         train_step)
from tpsim.train.zero import DistributedOptimizer


TOL = 1e-12
BATCH, SEQ, STEPS, SMALL_CAP, CLIP = 8, 5, 3, 1000, 0.05


def config(tp: int) -> GPTConfig:
    heads = 3 if tp == 1 else tp
    return GPTConfig(vocab_size=16 * tp + 3, n_positions=SEQ, n_embd=3 * heads, n_layer=2, n_head=heads)


def adamw(model):
    return AdamW(model, lr=1e-2, weight_decay=0.1, no_decay=lambda n: n.endswith("bias"))


def train(grid, stage: int, cap, dtype="float64"):
    """STEPS clipped steps at ZeRO ``stage`` (0: DDP + AdamW); ``(model, optimizer, [(loss, norm)])``."""
    cfg = config(grid.tp)
    model = build_gpt(cfg, grid.tp_group, seed=3, dtype=dtype_of(dtype))
    scaler = DynamicLossScaler(scale=2.0 ** 12, growth_interval=2) if dtype == "float16" else None
    if stage:
        opt = sync = DistributedOptimizer(adamw(model), grid, bucket_cap_bytes=cap, stage=stage, loss_scaler=scaler)
    else:
        from tpsim.train import mixed_precision

        sync = GradSync(model, grid.dp_group, bucket_cap_bytes=cap)
        opt = adamw(model) if dtype == "float64" else mixed_precision(model, adamw, grid.world, loss_scaler=scaler)
    rng = np.random.default_rng(1)
    ids, labels = rng.integers(0, cfg.vocab_size, (2, BATCH, SEQ))
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    out = []
    for _ in range(STEPS):
        loss, _ = compute_grads(model, grid, sync, ids[rows], labels[rows], loss_scale=opt.loss_scale)
        out.append((loss, apply_update(model, opt, grid, CLIP)))
    return model, opt, out


def params(model, opt=None):
    """The parameters, copied (ZeRO-3's gathered whole first: ``opt.finish_param_gather``)."""
    if opt is not None:
        opt.finish_param_gather()
    return {n: p.copy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("cap", [SMALL_CAP, 10**9], ids=["small-buckets", "one-bucket"])
def test_zero2_equals_zero1_bit_for_bit_and_plain_dp_tp(grid, cap):
    plain, _, ref = train(grid, 0, cap)
    one, _, got1 = train(grid, 1, cap)
    two, opt, got2 = train(grid, 2, cap)
    assert got2 == got1, (got2, got1)
    assert all(np.array_equal(a, b) for a, b in zip(params(two).values(), params(one).values()))
    for (loss, norm), (loss_r, norm_r) in zip(got2, ref):
        assert abs(loss - loss_r) <= TOL * abs(loss_r) and abs(norm - norm_r) <= TOL * norm_r
    assert all(norm > CLIP for _, norm in ref[:2]), "clipping must scale"
    worst = max(float(np.max(np.abs(p - q))) / max(1.0, float(np.max(np.abs(q))))
                for p, q in zip(params(two).values(), params(plain).values()))
    assert worst <= TOL, f"parameters differ from plain DP x TP by {worst:.2e}"
    assert opt.zero_stage == 2 and all(b is None for b in opt.buffers), "every bucket freed after the step"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_zero2_16_bit_equals_zero1_bit_for_bit(grid, dtype):
    """The same float32 reduce-scatters into zeroed owned slices, the same main slices: ZeRO-1's bits exactly
    (ZeRO-1 against plain mixed precision: tests/mpi/test_zero_mixed_precision.py and its stated tolerance)."""
    one, _, got1 = train(grid, 1, SMALL_CAP, dtype)
    two, _, got2 = train(grid, 2, SMALL_CAP, dtype)
    assert got2 == got1
    assert all(np.array_equal(a, b) for a, b in zip(params(two).values(), params(one).values()))


def test_gathered_gradients_equal_plain_dp(grid):
    """``gather_grads`` (the demo's verify) rebuilds the DP-mean gradients of every parameter from the owned slices."""
    cfg = config(grid.tp)
    rng = np.random.default_rng(1)
    ids, labels = rng.integers(0, cfg.vocab_size, (2, BATCH, SEQ))
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    grads = []
    for stage in (0, 2):
        model = build_gpt(cfg, grid.tp_group, seed=3)
        sync = (DistributedOptimizer(adamw(model), grid, SMALL_CAP, stage=2) if stage
                else GradSync(model, grid.dp_group, SMALL_CAP))
        compute_grads(model, grid, sync, ids[rows], labels[rows])
        sync.gather_grads()
        grads.append({n: g.copy() for n, g in model.named_grads()})
    worst = max(float(np.max(np.abs(grads[1][n] - g))) for n, g in grads[0].items())
    assert worst <= TOL, worst


def test_trace_moves_zero1s_bytes_and_matches_the_formula(grid):
    """One micro-batch: a reduce-scatter and an all-gather per bucket, ZeRO-1's bytes, ``predict_step(zero=2)``."""
    cfg = config(grid.tp)
    model = build_gpt(cfg, grid.tp_group, seed=3)
    opt = DistributedOptimizer(adamw(model), grid, bucket_cap_bytes=SMALL_CAP, stage=2)
    rng = np.random.default_rng(1)
    ids, labels = rng.integers(0, cfg.vocab_size, (2, BATCH, SEQ))
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    grid.tracer.reset()
    grid.tracer.step = 0
    ids, labels = broadcast_batch(grid, ids[rows], labels[rows])  # as the demo reads it (the formula's batch row)
    train_step(model, opt, grid, opt, ids, labels, clip=1.0)
    rs = grid.tracer.select(op="reduce_scatter", group="dp")
    if grid.dp > 1:
        assert len(rs) == len(opt.buckets) and sum(e.bytes for e in rs) == opt.total_bytes
        # issued during the backward, as each bucket's layers finish: TP's backward collectives come after some
        order = [e.op for e in grid.tracer.events if e.phase in ("backward", "dp_sync") and e.group in ("tp", "dp")]
        assert grid.tp == 1 or order.index("reduce_scatter") < len(order) - 1 - order[::-1].index("all_reduce")
    run = RunConfig.of(cfg, tp=grid.tp, dp=grid.dp, zero=2, batch_size=BATCH, seq_len=SEQ)
    predicted = predict_step(run, clip=True, ddp_buckets=len(opt.buckets), grad_bytes_local=opt.total_bytes)
    table = compare([e.as_dict() for e in grid.tracer.events], predicted)
    assert all(r.match for r in table), format_comparison(table)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_live_model_state_is_the_formula(grid, dtype):
    """TP 1, no padding: params + owned gradient slices + AdamW's slices = whole + sharded/d exactly; the buckets
    materialised at once stay below the whole gradient when there are several."""
    if grid.tp != 1:
        pytest.skip("the per-parameter figure is for a model whole on each DP rank (tp 1)")
    cfg = GPTConfig(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=4)  # 3,952 parameters
    model = build_gpt(cfg, grid.tp_group, seed=3, dtype=dtype_of(dtype))
    opt = DistributedOptimizer(adamw(model), grid, bucket_cap_bytes=2000, stage=2)
    assert sum(p.size for _, p in model.named_parameters()) % grid.dp == 0 and not any(
        n % grid.dp for n in opt.bucket_sizes), "no padding, so the figure is exact"
    ids = np.random.default_rng(2).integers(0, 32, (2 * grid.dp, 8))
    rows = dp_slice(2 * grid.dp, grid.dp, grid.dp_rank)
    train_step(model, opt, grid, opt, ids[rows], np.roll(ids, -1, 1)[rows], clip=1.0)
    layout = {"float64": TPSIM_FLOAT64, "float32": MEGATRON_LAYOUTS[2], "bfloat16": TPSIM_16BIT}[dtype]
    per = measure_model_state(model, opt).per_parameter()
    assert per["total"] == layout.bytes_per_zero_stage(2, grid.dp)
    assert per["grads"] == Fraction(layout.grad, grid.dp)
    assert {"float64": 8 + Fraction(24, grid.dp), "float32": 4 + Fraction(12, grid.dp),
            "bfloat16": 2 + Fraction(16, grid.dp)}[dtype] == per["total"]
    peak, whole = opt.sharded.peak_bytes, opt.total_bytes
    assert max(b.nbytes for b in opt.buckets) <= peak < whole, (peak, whole)


def test_state_dict_round_trip_resumes_bit_for_bit(grid):
    cfg = config(grid.tp)
    rng = np.random.default_rng(1)
    ids, labels = rng.integers(0, cfg.vocab_size, (2, BATCH, SEQ))
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    model = build_gpt(cfg, grid.tp_group, seed=3)
    opt = DistributedOptimizer(adamw(model), grid, bucket_cap_bytes=SMALL_CAP, stage=2)
    for _ in range(2):
        train_step(model, opt, grid, opt, ids[rows], labels[rows], clip=1.0)
    saved, sd = params(model), opt.state_dict()
    train_step(model, opt, grid, opt, ids[rows], labels[rows], clip=1.0)
    other = build_gpt(cfg, grid.tp_group, seed=3)
    for name, p in other.named_parameters():
        p[...] = saved[name]
    resumed = DistributedOptimizer(adamw(other), grid, bucket_cap_bytes=SMALL_CAP, stage=2)
    resumed.load_state_dict(sd)
    train_step(other, resumed, grid, resumed, ids[rows], labels[rows], clip=1.0)
    assert all(np.array_equal(a, b) for a, b in zip(params(model).values(), params(other).values()))


def test_a_write_outside_a_weight_gradient_fails_loudly(grid):
    """Between a bucket's uses its gradients are read-only placeholders holding no memory."""
    model = build_gpt(config(grid.tp), grid.tp_group, seed=3)
    DistributedOptimizer(adamw(model), grid, bucket_cap_bytes=SMALL_CAP, stage=2)
    name, g = next(iter(model.named_grads()))
    assert not g.flags.writeable and not any(g.strides)
    with pytest.raises(ValueError):
        g += 1.0
    model.zero_grad()  # leaves them be


def test_the_refusals_name_the_constraint(grid):
    model = build_gpt(config(grid.tp), grid.tp_group, seed=3)
    with pytest.raises(ValueError, match="stage 4"):
        DistributedOptimizer(adamw(model), grid, stage=4)
    for stage in (2, 3):
        with pytest.raises(ValueError, match=f"ZeRO-{stage} reduce-scatters each bucket during the backward"):
            DistributedOptimizer(adamw(model), grid, stage=stage, overlap_grad_reduce=True)
    with pytest.raises(ValueError, match="ZeRO-3 gathers each layer's parameters before its forward"):
        DistributedOptimizer(adamw(model), grid, stage=3, overlap_param_gather=True)
