"""ZeRO-1 (Megatron's distributed optimizer) under TP × DP equals plain DP × TP training.

Story: train the same sharded GPT twice on every dp × tp layout of the world — once with ``GradSync`` and a
full AdamW on every DP rank, once with ``DistributedOptimizer`` (reduce-scatter, AdamW on this rank's 1/d slice,
all-gather) — with clipping that really scales, and compare the losses, the clip norms and every parameter
(float64, ≤ 1e-12 relative). Awkward sizes: the buckets' lengths are not multiples of dp (padding), a small
bucket cap gives several buckets, parameters straddle two ranks' slices. Then the trace (the bytes equal the
all-reduce's) and the optimizer state (1/d of AdamW's, exactly the formula).
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.cost import wire_bytes
from tpsim.models.build import build_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.config import RunConfig
from tpsim.predict.formulas import predict_step
from tpsim.trace.formula_check import compare, format_comparison
from tpsim.predict.memory import predict_memory
from tpsim.trace.measure import format_memory, measure_memory
from tpsim.predict.model_state import MEGATRON_LAYOUTS, measure_model_state, zero_optimizer_bytes
from tpsim.partition import padded_length
from tpsim.train import (AdamW, GradSync, apply_update, broadcast_batch, check_replicas, compute_grads, dp_slice,
                         train_step)
from tpsim.train.zero import DistributedOptimizer

TOL = 1e-12
BATCH, SEQ, STEPS = 8, 5, 3
SMALL_CAP = 1000  # bytes: several buckets of the tiny model
CLIP = 0.05  # below every configuration's first gradient norms, so clipping really scales


def config(tp: int) -> GPTConfig:
    """Hidden 3·heads: c_attn's bias shard (9 elements at tp 1, 2, 4) and more are odd, so buckets need padding."""
    heads = 3 if tp == 1 else tp
    return GPTConfig(vocab_size=16 * tp + 3, n_positions=SEQ, n_embd=3 * heads, n_layer=2, n_head=heads)


def data(cfg: GPTConfig, seed: int = 1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, (BATCH, SEQ)), rng.integers(0, cfg.vocab_size, (BATCH, SEQ))


def adamw(model):
    return AdamW(model, lr=1e-2, weight_decay=0.1, no_decay=lambda n: n.endswith("bias"))


def train(grid, cfg, zero: bool, cap, clip: float | None, dtype=np.float64):
    """This rank's part of STEPS AdamW steps; ``(model, optimizer, results)``."""
    model = build_gpt(cfg, grid.tp_group, seed=3, dtype=dtype)
    if zero:
        opt = sync = DistributedOptimizer(adamw(model), grid, bucket_cap_bytes=cap)
    else:
        opt, sync = adamw(model), GradSync(model, grid.dp_group, bucket_cap_bytes=cap)
    ids, labels = data(cfg)
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    results = [train_step(model, opt, grid, sync, ids[rows], labels[rows], clip=clip) for _ in range(STEPS)]
    return model, opt, results


@pytest.mark.parametrize("cap", [SMALL_CAP, 10**9], ids=["small-buckets", "one-bucket"])
def test_zero1_equals_plain_dp_tp_with_clipping(grid, cap):
    cfg = config(grid.tp)
    plain, _, ref = train(grid, cfg, zero=False, cap=cap, clip=CLIP)
    zero, opt, got = train(grid, cfg, zero=True, cap=cap, clip=CLIP)
    assert all(r.grad_norm > CLIP for r in ref[:2]), "clipping should scale the first steps"
    for a, b in zip(got, ref):
        assert abs(a.loss - b.loss) <= TOL * abs(b.loss), f"loss {a.loss} vs {b.loss}"
        assert abs(a.grad_norm - b.grad_norm) <= TOL * b.grad_norm, f"norm {a.grad_norm} vs {b.grad_norm}"
    worst = max(float(np.max(np.abs(p - q)) / max(1.0, float(np.max(np.abs(q)))))
                for (_, p), (_, q) in zip(zero.named_parameters(), plain.named_parameters()))
    assert worst <= TOL, f"parameters differ from plain DP x TP by {worst:.2e}"
    assert check_replicas(zero, grid).ok
    if grid.dp > 1:  # the awkward sizes really were awkward
        sizes = dict((n, p.size) for n, p in zero.named_parameters())
        padded = [len(buf) - sum(sizes[n] for n in b.names) for b, buf in zip(opt.buckets, opt.buffers)]
        assert all(0 <= x < grid.dp for x in padded) and (any(padded) or cap == 10**9), padded
        assert len(opt.buckets) > 2 or cap == 10**9, len(opt.buckets)


def zero_setup(grid, cap):
    """A fresh sharded GPT under ZeRO-1, this DP rank's rows, a clean tracer: ``(cfg, model, opt, ids, labels)``."""
    cfg = config(grid.tp)
    model = build_gpt(cfg, grid.tp_group, seed=3)
    opt = DistributedOptimizer(adamw(model), grid, bucket_cap_bytes=cap)
    ids, labels = data(cfg)
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    grid.tracer.reset()
    grid.tracer.step = 0
    return cfg, model, opt, ids[rows], labels[rows]


def test_zero1_trace_moves_the_all_reduce_bytes(grid):
    _, model, opt, ids, labels = zero_setup(grid, SMALL_CAP)
    train_step(model, opt, grid, opt, ids, labels, clip=1.0)
    rs = grid.tracer.select(op="reduce_scatter", group="dp")
    ag = grid.tracer.select(op="all_gather", group="dp")
    if grid.dp == 1:
        assert not rs and not ag
        return
    assert {e.phase for e in rs} == {"dp_sync"} and {e.phase for e in ag} == {"optimizer"}
    assert len(rs) == len(ag) == len(opt.buckets)
    total = opt.total_bytes
    assert sum(e.bytes for e in rs) == sum(e.bytes for e in ag) == total
    all_reduce_wire = sum(wire_bytes("all_reduce", b.nbytes, grid.dp) for b in opt.buckets)
    assert sum(e.wire_bytes for e in rs + ag) == all_reduce_wire
    norm = grid.tracer.select(scope="clip_grad_norm")
    assert len(norm) == 1 and norm[0].group == "world"


def test_optimizer_state_is_one_dth_and_matches_the_formula(grid):
    cfg = config(grid.tp)
    model = build_gpt(cfg, grid.tp_group, seed=3)
    full = adamw(model).state_bytes()
    opt = DistributedOptimizer(adamw(model), grid, bucket_cap_bytes=SMALL_CAP)
    elements = [sum(p.size for n, p in model.named_parameters() if n in b.names) for b in opt.buckets]
    assert opt.state_bytes() == zero_optimizer_bytes(elements, grid.dp, itemsize=8)
    assert opt.state_bytes() * grid.dp == 2 * 8 * sum(padded_length(n, grid.dp) for n in elements)
    assert opt.state_bytes() * grid.dp - full < 2 * 8 * grid.dp * len(elements)  # only the padding on top


def test_fp32_row_of_megatrons_table_from_live_arrays(grid):
    """TP 1 (the whole model on each rank), float32: params + grads + AdamW's slice = 8 + 8/d bytes/parameter."""
    if grid.tp != 1:
        pytest.skip("the table's per-parameter figure is for a model that is whole on each DP rank (tp 1)")
    cfg = GPTConfig(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=4)  # 3,952 parameters
    model = build_gpt(cfg, grid.tp_group, seed=3, dtype=np.float32)
    n = sum(p.size for _, p in model.named_parameters())
    assert n % grid.dp == 0, "no padding, so the live figure is exact"
    plain = measure_model_state(model, adamw(model)).per_parameter()["total"]
    zero = measure_model_state(model, DistributedOptimizer(adamw(model), grid, 10**9)).per_parameter()["total"]
    fp32 = MEGATRON_LAYOUTS[2]
    assert plain == fp32.bytes_per_parameter() == 16
    assert zero == fp32.bytes_per_parameter(grid.dp, distributed=True) == 8 + 8 / grid.dp


@pytest.mark.parametrize("cap", [10**9, SMALL_CAP], ids=["one-bucket", "small-buckets"])
def test_trace_and_memory_match_the_formulas(grid, cap):
    """One step as the demo runs it, against ``predict_step(zero=1)`` row by row and ``predict_memory(zero_dp=d)``."""
    cfg, model, opt, ids, labels = zero_setup(grid, cap)
    ids, labels = broadcast_batch(grid, ids, labels)
    with grid.tracer.paused():  # a forward to measure the cache, outside the step's trace
        _, cache = model.forward(ids, labels)
    compute_grads(model, grid, opt, ids, labels)
    apply_update(model, opt, grid, clip=1.0)
    given = {} if cap == 10**9 else {"grad_bytes_local": opt.total_bytes}  # one bucket: padding predicted too
    run = RunConfig.of(cfg, tp=grid.tp, dp=grid.dp, zero=1, batch_size=BATCH, seq_len=SEQ)
    predicted = predict_step(run, clip=True, ddp_buckets=len(opt.buckets), **given)
    table = compare([e.as_dict() for e in grid.tracer.events], predicted)
    assert all(r.match for r in table), format_comparison(table)
    assert {r.layer for r in table} >= ({"zero"} if grid.dp > 1 else set())
    if cap == 10**9:
        measured = measure_memory(model, opt, cache, exclude=(ids, labels))
        formula = predict_memory(cfg, grid.tp, BATCH // grid.dp, SEQ, np.float64, grid.tp_rank, zero_dp=grid.dp)
        for key in ("params", "grads", "optimizer"):
            assert getattr(measured, key) == formula[key], format_memory(measured, formula)


def test_state_dict_round_trip_resumes_bit_for_bit(grid):
    """Save this rank's shard after 2 steps; a fresh optimizer that loads it continues exactly as the original."""
    cfg, model, opt, ids, labels = zero_setup(grid, SMALL_CAP)
    for _ in range(2):
        train_step(model, opt, grid, opt, ids, labels, clip=1.0)
    saved_params = {n: p.copy() for n, p in model.named_parameters()}
    sd = opt.state_dict()
    train_step(model, opt, grid, opt, ids, labels, clip=1.0)
    other = build_gpt(cfg, grid.tp_group, seed=3)
    for name, p in other.named_parameters():
        p[...] = saved_params[name]
    resumed = DistributedOptimizer(adamw(other), grid, bucket_cap_bytes=SMALL_CAP)
    resumed.load_state_dict(sd)
    train_step(other, resumed, grid, resumed, ids, labels, clip=1.0)
    differ = [n for (n, a), (_, b) in zip(model.named_parameters(), other.named_parameters())
              if not np.array_equal(a, b)]
    assert not differ and resumed.step_count == 3, differ
    with pytest.raises(ValueError):
        DistributedOptimizer(adamw(other), grid, bucket_cap_bytes=10**9).load_state_dict(sd)
