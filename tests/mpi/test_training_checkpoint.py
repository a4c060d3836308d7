"""A training checkpoint's optimizer state (``tpsim.train.checkpoint``): gathered from any TP × DP layout, with or
without ZeRO-1, it is the serial model's AdamW state; cut into another layout and gathered again, it is the same
bits. 16-bit runs carry their float32 main parameters; pipeline stages each contribute theirs.

Story: train a sharded GPT three clipped AdamW steps on every layout of the world, the serial model the same
three steps by the reference AdamW (``tpsim.train.reference``), gather the parallel state on rank 0 and compare
(float64, ≤ 1e-12 relative to the largest value of its kind). Then load that full state into the other layouts
and gather it back. Awkward sizes: a vocabulary no tp > 1 divides (padding rows), buckets not multiples of dp.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import WORLD, get_grid, tp_sizes

from tpsim.arch.gpt2 import GPTConfig
from tpsim.comm import ProcessGrid
from tpsim.hf.checkpoint import CheckpointError
from tpsim.models.build import build_gpt, serial_gpt
from tpsim.live_pipeline.build import pipeline_from_serial
from tpsim.live_pipeline.split import split_layers
from tpsim.train import AdamW, GradSync, dp_slice, mixed_precision, train_step
from tpsim.train.checkpoint import check_state, gather_state, load_state, state_key, state_slots
from tpsim.train.reference import reference_adamw, reference_clip
from tpsim.train.zero import DistributedOptimizer

TOL = 1e-12
BATCH, SEQ, STEPS, SEED = 8, 5, 3, 3
CLIP = 0.05  # below the first gradient norms: clipping really scales
LR, WD = 1e-2, 0.1
SMALL_CAP = 1000  # bytes: several ZeRO-1 buckets, slices straddling two DP ranks


def config(tp: int) -> GPTConfig:
    heads = 3 if tp == 1 else tp
    return GPTConfig(vocab_size=16 * tp + 3, n_positions=SEQ, n_embd=3 * heads, n_layer=2, n_head=heads)


def no_decay(name: str) -> bool:
    return name.endswith("bias")


def data(cfg, seed: int = 1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, (BATCH, SEQ)), rng.integers(0, cfg.vocab_size, (BATCH, SEQ))


def optimizer_for(model, grid, zero: bool):
    """``(optimizer, sync)``: ZeRO-1's DistributedOptimizer (both), or (16 bits: mixed-precision) AdamW + GradSync."""
    def adamw(m):
        return AdamW(m, lr=LR, weight_decay=WD, no_decay=no_decay)
    if zero:
        opt = DistributedOptimizer(adamw(model), grid, bucket_cap_bytes=SMALL_CAP)
        return opt, opt
    return mixed_precision(model, adamw, grid.world), GradSync(model, grid.dp_group, bucket_cap_bytes=SMALL_CAP)


def serial_state(cfg) -> dict[str, np.ndarray]:
    """The serial model's AdamW state after STEPS clipped steps on the whole batch, by ``state_key``."""
    serial = serial_gpt(cfg, seed=SEED)
    names = [n for n, _ in serial.named_parameters()]
    params, grads = [p for _, p in serial.named_parameters()], [g for _, g in serial.named_grads()]
    m, v = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
    ids, labels = data(cfg)
    for t in range(1, STEPS + 1):
        serial.loss_and_grads(ids, labels)
        reference_clip(grads, CLIP)
        for i, name in enumerate(names):
            reference_adamw(params[i], grads[i], m[i], v[i], t, LR, (0.9, 0.999), 1e-8, 0.0 if no_decay(name) else WD)
    return {**{state_key("exp_avg", n): a for n, a in zip(names, m)},
            **{state_key("exp_avg_sq", n): a for n, a in zip(names, v)}}


def trained(grid, cfg, zero: bool):
    model = build_gpt(cfg, grid.tp_group, seed=SEED)
    opt, sync = optimizer_for(model, grid, zero)
    ids, labels = data(cfg)
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    for _ in range(STEPS):
        train_step(model, opt, grid, sync, ids[rows], labels[rows], clip=CLIP)
    return model, opt


def agree(ok: bool, what: str) -> None:
    reports = WORLD.allgather(None if ok else what)
    bad = [f"rank {r}: {m}" for r, m in enumerate(reports) if m]
    assert not bad, "; ".join(bad)


@pytest.mark.parametrize("zero", [False, True], ids=["plain-dp", "zero1"])
def test_gathered_state_is_the_serial_models_adamw_state(grid, zero):
    cfg = config(grid.tp)
    model, opt = trained(grid, cfg, zero)
    events = len(grid.tracer.events)
    full = gather_state(model, opt, grid)
    assert len(grid.tracer.events) == events, "gathering for a checkpoint is not training traffic: untraced"
    if grid.rank == 0:
        want = serial_state(cfg)
        assert list(full) == list(want), f"keys {list(full)[:3]}... vs {list(want)[:3]}..."
        for slot in ("exp_avg", "exp_avg_sq"):
            scale = max(float(np.max(np.abs(a))) for k, a in want.items() if k.startswith(slot + "."))
            worst = max((float(np.max(np.abs(full[k] - a))) / scale, k) for k, a in want.items()
                        if k.startswith(slot + "."))
            assert worst[0] <= TOL, f"{slot}: {worst[1]} differs from serial by {worst[0]:.2e}"
            assert all(full[k].shape == a.shape and full[k].dtype == a.dtype for k, a in want.items())
    else:
        assert full is None


def test_state_cut_into_every_layout_gathers_back_to_the_same_bits():
    """The state of a TP 1, DP = world ZeRO-1 run (every slice awkward), loaded into every other TP × DP layout
    with and without ZeRO-1, and gathered again: bit for bit the same tensors, and the same step count."""
    source = get_grid(1)
    cfg = config(1)
    _, opt = trained(source, cfg, zero=True)
    full = WORLD.bcast(gather_state(opt.optimizer.module, opt, source))
    for tp in tp_sizes():
        grid = get_grid(tp)
        if cfg.n_head % tp:
            continue
        for zero in (False, True):
            model = build_gpt(cfg, grid.tp_group, seed=SEED + 1)  # other weights: only the state is loaded
            target, _ = optimizer_for(model, grid, zero)
            load_state(model, target, full, step_count=STEPS, loss_scaler=None)
            assert target.step_count == STEPS
            again = gather_state(model, target, grid)
            if grid.rank == 0:
                bad = [k for k in full if not np.array_equal(full[k], again[k]) or full[k].dtype != again[k].dtype]
                assert list(again) == list(full) and not bad, f"tp {tp} zero {zero}: {bad[:3]}"


@pytest.mark.parametrize("zero", [False, True], ids=["mixed-precision", "zero1"])
def test_bfloat16_state_carries_the_float32_main_parameters(grid, zero):
    """Before any step the main parameters are the 16-bit weights, exactly; a random state (main parameters
    that no bfloat16 value equals) goes in and comes back bit for bit, float32."""
    import tpsim.nn.precision as precision

    bf16 = precision.dtype_of("bfloat16")
    cfg = config(grid.tp)
    model = build_gpt(cfg, grid.tp_group, seed=SEED, dtype=bf16)
    opt, _ = optimizer_for(model, grid, zero)
    assert state_slots(opt, model) == ["exp_avg", "exp_avg_sq", "main_param"]
    full = gather_state(model, opt, grid)
    serial = serial_gpt(cfg, seed=SEED, dtype=bf16)
    if grid.rank == 0:
        for name, p in serial.named_parameters():
            main = full[state_key("main_param", name)]
            assert main.dtype == np.float32 and np.array_equal(main, p.astype(np.float32)), name
    rng = np.random.default_rng(5)
    state = WORLD.bcast({k: rng.standard_normal(a.shape).astype(np.float32) for k, a in full.items()}
                        if grid.rank == 0 else None)
    load_state(model, opt, state, step_count=7, loss_scaler=None)
    again = gather_state(model, opt, grid)
    if grid.rank == 0:
        assert all(np.array_equal(state[k], again[k]) and again[k].dtype == np.float32 for k in state)


@pytest.mark.skipif(WORLD.Get_size() % 2, reason="pipeline stages need an even world")
def test_pipeline_stages_each_contribute_their_state():
    """pp 2 (TP 1, DP the rest): a full state loaded into the two stages (the tied embedding in both) gathers
    back whole on rank 0, with each stage's slices where the serial tensors have them."""
    grid = ProcessGrid(tp=1, pp=2)
    cfg = config(1)
    shard = pipeline_from_serial(serial_gpt(cfg, seed=SEED), grid, split_layers(cfg.n_layer, 2))
    opt = AdamW(shard, lr=LR, weight_decay=WD)
    rng = np.random.default_rng(9)
    shapes = cfg.param_shapes()
    full = WORLD.bcast({state_key(s, n): rng.standard_normal(shape) for s in ("exp_avg", "exp_avg_sq")
                        for n, shape in shapes.items()} if WORLD.Get_rank() == 0 else None)
    load_state(shard, opt, full, step_count=4, loss_scaler=None)
    mine = {n for n, _ in shard.named_parameters()}
    agree(mine < set(shapes), f"stage {grid.pp_rank} holds {sorted(mine)}")
    again = gather_state(shard, opt, grid)
    if grid.rank == 0:
        assert list(again) == list(full) and all(np.array_equal(full[k], again[k]) for k in full)


def test_check_state_names_what_does_not_fit():
    cfg = config(1)
    shapes = cfg.param_shapes()
    good = {state_key(s, n): np.zeros(shape) for s in ("exp_avg", "exp_avg_sq") for n, shape in shapes.items()}
    check_state(good, ["exp_avg", "exp_avg_sq"], shapes, np.float64, "ok")
    name = next(iter(shapes))
    cases = {"missing exp_avg_sq." + name: {k: a for k, a in good.items() if k != state_key("exp_avg_sq", name)},
             "has shape (1,)": {**good, state_key("exp_avg", name): np.zeros(1)},
             "this run's optimizer state is float64": {**good, state_key("exp_avg", name): np.zeros(
                 shapes[name], np.float32)},
             "unexpected main_param.x": {**good, "main_param.x": np.zeros(1)}}
    for words, state in cases.items():
        with pytest.raises(CheckpointError, match=words.replace("(", r"\(").replace(")", r"\)")):
            check_state(state, ["exp_avg", "exp_avg_sq"], shapes, np.float64, "f")


def test_float16_loss_scaler_state_is_restored_and_a_missing_one_refused(grid):
    import tpsim.nn.precision as precision

    cfg = config(grid.tp)
    model = build_gpt(cfg, grid.tp_group, seed=SEED, dtype=precision.dtype_of("float16"))
    opt, _ = optimizer_for(model, grid, zero=False)
    assert opt.loss_scaler is not None, "float16 scales the loss"
    full = WORLD.bcast(gather_state(model, opt, grid))
    saved = {"scale": 1024.0, "good_steps": 7, "skipped_steps": 2}
    load_state(model, opt, full, step_count=9, loss_scaler=saved)
    assert opt.loss_scaler.state_dict() == saved and opt.loss_scale == 1024.0 and opt.step_count == 9
    with pytest.raises(CheckpointError, match="loss scaler does not fit"):
        load_state(model, opt, full, step_count=9, loss_scaler=None)
