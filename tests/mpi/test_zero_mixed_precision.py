"""ZeRO-1 with 16-bit mixed precision (Megatron's distributed optimizer with bf16/fp16) equals plain mixed-precision
DP × TP training; its collectives match the formulas; its live model state is 6 + 12/d bytes per parameter.

Story: the same sharded 16-bit GPT trains a few clipped AdamW steps twice — ``GradSync`` + the
``MixedPrecisionOptimizer`` (float32 main parameters of every parameter on every DP rank), and
``DistributedOptimizer`` (float32 buckets reduce-scattered, float32 main slices of the owned slices only, the
16-bit parameters all-gathered). Both do the same float32 arithmetic on the same elements; what may differ is
the order of the DP sum (MPI's reduce-scatter vs its all-reduce) and of the clip norm's partial sums (owned
slices vs whole shards), i.e. float32 roundings of single values. Measured (MPICH, 1 to 8 ranks): at dp 1 and
2 everything is bit-for-bit equal (a sum of two commutes); at dp 4 and 8 the DP sums differ in the last float32
bit, the norms by ≤ 3.2e-7 relative, and AdamW (which divides by √v, so it magnifies the relative difference of
near-zero gradients) turns that into main parameters differing by ≤ 1.1e-5 of each tensor's largest element
after 3 steps; the 16-bit parameters by ≤ 3.7e-5 (float16; bfloat16: 0). The test allows TOL = 1e-6 on the
loss and norm, TOL_MAIN = 1e-4 on the main parameters and one 16-bit rounding (2^-7 bfloat16, 2^-10 float16,
of the tensor's largest element) on the model's parameters: a sum order cannot fail it, while a wrong slice,
scale or cast (errors of 1e-2 and more here) cannot pass.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tpsim.models.build import build_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.nn.precision import dtype_of
from tpsim.config import RunConfig
from tpsim.predict.formulas import predict_step
from tpsim.trace.formula_check import compare, format_comparison
from tpsim.predict.model_state import MEGATRON_LAYOUTS, TPSIM_16BIT, measure_model_state
from tpsim.train import (AdamW, DynamicLossScaler, GradSync, apply_update, broadcast_batch, check_replicas,
                         compute_grads, dp_slice, mixed_precision)
from tpsim.train.zero import DistributedOptimizer

TOL, TOL_MAIN = 1e-6, 1e-4
ULP = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}
BATCH, SEQ, STEPS, CAP, CLIP = 8, 5, 3, 1000, 0.05
DTYPES = ["bfloat16", "float16"]


def config(tp: int) -> GPTConfig:
    """Odd sizes (as tests/mpi/test_zero1.py): buckets need padding and parameters straddle two owners."""
    heads = 3 if tp == 1 else tp
    return GPTConfig(vocab_size=16 * tp + 3, n_positions=SEQ, n_embd=3 * heads, n_layer=2, n_head=heads)


def _adamw(model):
    return AdamW(model, lr=1e-2, weight_decay=0.1, no_decay=lambda n: n.endswith("bias"))


def _scaler(name):
    return DynamicLossScaler(scale=2.0 ** 12, growth_interval=2) if name == "float16" else None


def train(grid, name: str, zero: bool):
    """STEPS clipped AdamW steps of a 16-bit GPT: ``(model, optimizer, [(loss, norm)])``."""
    cfg = config(grid.tp)
    model = build_gpt(cfg, grid.tp_group, seed=3, dtype=dtype_of(name))
    if zero:
        opt = sync = DistributedOptimizer(_adamw(model), grid, bucket_cap_bytes=CAP, loss_scaler=_scaler(name))
    else:
        sync = GradSync(model, grid.dp_group, bucket_cap_bytes=CAP)
        opt = mixed_precision(model, _adamw, grid.world, loss_scaler=_scaler(name))
    rng = np.random.default_rng(1)
    ids, labels = rng.integers(0, cfg.vocab_size, (2, BATCH, SEQ))
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    out = []
    for _ in range(STEPS):
        loss, _ = compute_grads(model, grid, sync, ids[rows], labels[rows], loss_scale=opt.loss_scale)
        out.append((loss, apply_update(model, opt, grid, CLIP)))
    return model, opt, out


def _main_slices(opt: DistributedOptimizer):
    return [(p.name, p.start, p.param) for parts in opt.slices for p in parts]


@pytest.mark.parametrize("name", DTYPES)
def test_zero1_mixed_precision_equals_plain_mixed_precision_dp_tp(grid, name):
    plain, ref_opt, ref = train(grid, name, zero=False)
    zero, opt, got = train(grid, name, zero=True)
    replicas = check_replicas(zero, grid)  # collective: before any assertion that one rank alone may fail
    assert all(norm > CLIP for _, norm in ref[:2]), "clipping should scale the first steps"
    for (a, na), (b, nb) in zip(got, ref):
        assert abs(a - b) <= TOL * abs(b) and abs(na - nb) <= TOL * nb, f"loss/norm {a}, {na} vs {b}, {nb}"
    for (n, p), (_, q) in zip(zero.named_parameters(), plain.named_parameters()):
        assert p.dtype == dtype_of(name)
        worst = np.max(np.abs(p.astype(np.float64) - q)) / max(np.max(np.abs(q.astype(np.float64))), 1e-30)
        assert worst <= ULP[name], f"{n}: 16-bit parameters differ by {worst:.2e}"
    main = ref_opt.main_params
    for n, start, part in _main_slices(opt):  # the owned float32 main slices vs plain's whole main params
        expected = main[n].reshape(-1)[start:start + part.size]
        worst = np.max(np.abs(part - expected), initial=0.0) / np.max(np.abs(main[n]))
        assert part.dtype == np.float32 and worst <= TOL_MAIN, f"{n}: main parameters differ by {worst:.2e}"
    if name == "float16":
        assert opt.loss_scaler.state_dict() == ref_opt.loss_scaler.state_dict()
    assert replicas.ok


@pytest.mark.parametrize("name", DTYPES)
def test_zero1_16_bit_step_matches_the_formulas(grid, name):
    """Reduce-scatter float32 (4 bytes/element), all-gather the 16-bit parameters (2 bytes/element)."""
    cfg, dtype = config(grid.tp), dtype_of(name)
    model = build_gpt(cfg, grid.tp_group, seed=3, dtype=dtype)
    opt = DistributedOptimizer(_adamw(model), grid, bucket_cap_bytes=CAP, loss_scaler=_scaler(name))
    rng = np.random.default_rng(1)
    ids, labels = rng.integers(0, cfg.vocab_size, (2, BATCH, SEQ))
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    grid.tracer.reset()
    ids, labels = broadcast_batch(grid, ids[rows], labels[rows])
    compute_grads(model, grid, opt, ids, labels, loss_scale=opt.loss_scale)
    assert apply_update(model, opt, grid, 1.0) is not None
    records = [e.as_dict() for e in grid.tracer.events]
    run = RunConfig.of(cfg, tp=grid.tp, dp=grid.dp, zero=1, batch_size=BATCH, seq_len=SEQ, dtype=dtype)
    predicted = predict_step(run, clip=True, grad_bytes_local=opt.total_bytes, ddp_buckets=len(opt.buckets))
    table = compare(records, predicted)
    assert all(r.match for r in table), format_comparison(table)
    rs = [r for r in records if r["op"] == "reduce_scatter" and r["group"] == "dp"]
    ag = [r for r in records if r["op"] == "all_gather" and r["group"] == "dp"]
    assert len(rs) == len(ag) == (len(opt.buckets) if grid.dp > 1 else 0)
    assert all(r["dtype"] == "float32" and r["bytes"] == 4 * np.prod(r["shape"]) for r in rs)
    assert all(r["dtype"] == name and r["bytes"] == 2 * np.prod(r["shape"]) for r in ag)
    assert 2 * sum(r["bytes"] for r in ag) == sum(r["bytes"] for r in rs) == (opt.total_bytes if rs else 0)


@pytest.mark.parametrize("name", DTYPES)
def test_live_model_state_is_6_plus_12_over_d(grid, name):
    """TP 1 (the whole model on each rank), no padding: 2 + 4 + 12/d bytes per parameter, Megatron's bf16 row."""
    if grid.tp != 1:
        pytest.skip("the table's per-parameter figure is for a model that is whole on each DP rank (tp 1)")
    cfg = GPTConfig(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=4)  # 3,952 parameters
    model = build_gpt(cfg, grid.tp_group, seed=3, dtype=dtype_of(name))
    n = sum(p.size for _, p in model.named_parameters())
    assert n % grid.dp == 0, "no padding, so the live figure is exact"
    per = measure_model_state(model, DistributedOptimizer(_adamw(model), grid, 10**9)).per_parameter()
    assert (per["params"], per["grads"], per["optimizer"]) == (2, 4, Fraction(12, grid.dp))
    assert per["total"] == MEGATRON_LAYOUTS[1].bytes_per_parameter(grid.dp, True) == 6 + Fraction(12, grid.dp)
    assert per["total"] == TPSIM_16BIT.bytes_per_parameter(grid.dp, True)


def test_float16_overflow_on_one_rank_skips_the_zero1_step_everywhere(grid):
    cfg = config(grid.tp)
    model = build_gpt(cfg, grid.tp_group, seed=3, dtype=np.float16)
    opt = DistributedOptimizer(_adamw(model), grid, bucket_cap_bytes=CAP,
                               loss_scaler=DynamicLossScaler(scale=2.0 ** 10))
    ids, labels = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, BATCH, SEQ))
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    before = {n: p.copy() for n, p in model.named_parameters()}
    compute_grads(model, grid, opt, ids[rows], labels[rows], loss_scale=opt.loss_scale)
    if grid.rank == grid.world_size - 1:  # one rank alone overflows, in a slice it owns
        next(p for parts in opt.slices for p in parts).grad[0] = np.inf
    grid.tracer.reset()
    assert apply_update(model, opt, grid, 1.0) is None, "skipped: no clipping, no update, no all-gather"
    assert opt.skipped and opt.loss_scaler.scale == 2.0 ** 9 and opt.step_count == 0
    assert [e.scope for e in grid.tracer.events] == ["loss_scaler"]
    for n, p in model.named_parameters():
        np.testing.assert_array_equal(p, before[n], err_msg=n)


def test_float16_state_dict_round_trip_resumes_bit_for_bit(grid):
    """The shard's state carries the float32 main slices and the loss scale: a resumed run continues exactly."""
    _, opt, _ = train(grid, "float16", zero=True)
    model = opt.optimizer.module
    saved = {n: p.copy() for n, p in model.named_parameters()}
    sd = opt.state_dict()
    assert [a.dtype for a in sd["main"]] == [np.float32] * len(opt.buckets) and "loss_scaler" in sd
    cfg = config(grid.tp)
    ids, labels = np.random.default_rng(2).integers(0, cfg.vocab_size, (2, BATCH, SEQ))
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    other = build_gpt(cfg, grid.tp_group, seed=4, dtype=np.float16)  # other weights: all come from the state
    for name, p in other.named_parameters():
        p[...] = saved[name]
    resumed = DistributedOptimizer(_adamw(other), grid, bucket_cap_bytes=CAP, loss_scaler=_scaler("float16"))
    resumed.load_state_dict(sd)
    for m, o in ((model, opt), (other, resumed)):
        compute_grads(m, grid, o, ids[rows], labels[rows], loss_scale=o.loss_scale)
        apply_update(m, o, grid, CLIP)
    differ = [n for (n, a), (_, b) in zip(model.named_parameters(), other.named_parameters())
              if not np.array_equal(a.view(np.uint16), b.view(np.uint16))]
    assert not differ and resumed.loss_scaler.state_dict() == opt.loss_scaler.state_dict(), differ
