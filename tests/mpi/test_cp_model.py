"""Whole models under context parallelism equal the serial model: loss and every gradient, then training.

Story: the same master weights (one seed) on every rank; a global batch of sequences, with padding (ignored
labels); each DP replica takes its rows, each CP rank of it the tokens of its layout (zigzag or contiguous), each
TP rank its heads. GPT-2 (learned positions, dropout 0.1 with the exact RNG, tied embedding) and Llama (RoPE,
GQA) take their positions at their absolute places. Step 0's loss and every gradient shard equal the serial
model's at 1e-12 in float64, for every CP variant and every CP × TP × DP layout of the world (CP 2, 4, 8; with SP
inside TP); three clipped AdamW steps later, with plain DP or ZeRO-1 over DP × CP, every parameter still does.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from tpsim.arch import GPTConfig, LlamaConfig
from tpsim.comm import ProcessGrid
from tpsim.compare import shard_differences
from tpsim.config import RunConfig
from tpsim.nn.dropout import DropoutPlan
from tpsim.tp.random import ExactDropoutRNG
from tpsim.train import AdamW, GradSync, apply_update, compute_grads, dp_slice
from tpsim.train.zero import DistributedOptimizer
from conftest import WORLD

N = WORLD.Get_size()
B, S, SEED, CLIP = 4, 16, 3, 0.05
_GRIDS: dict[tuple, ProcessGrid] = {}


def grid_of(tp: int, cp: int) -> ProcessGrid:
    if (tp, cp) not in _GRIDS:
        _GRIDS[(tp, cp)] = ProcessGrid(tp=tp, cp=cp)
    grid = _GRIDS[(tp, cp)]
    grid.tracer.reset()
    return grid


def config(arch: str, layers: int = 2):
    if arch == "gpt2":
        return GPTConfig(vocab_size=19, n_positions=S, n_embd=16, n_layer=layers, n_head=4, dropout=0.1)
    return LlamaConfig(vocab_size=19, hidden_size=16, intermediate_size=24, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=S)


def batch(cfg, step: int):
    rng = np.random.default_rng(50 + step)
    ids, labels = rng.integers(0, cfg.vocab, (B, S)), rng.integers(0, cfg.vocab, (B, S))
    labels[rng.random((B, S)) < 0.2] = -100
    return ids, labels


def layouts():
    for cp in (c for c in (2, 4, 8) if N % c == 0):
        for tp in (t for t in (1, 2, 4) if N % (t * cp) == 0 and 4 % t == 0):
            yield cp, tp


def cases():
    for cp, tp in layouts():
        for comm in ("ring", "allgather", "ulysses"):
            for arch in ("gpt2", "llama"):
                heads, kv = 4 // tp, max(2 // tp, 1)
                if comm == "ulysses" and (heads % cp or kv % cp):
                    continue
                yield pytest.param(cp, tp, comm, arch, id=f"cp{cp}-tp{tp}-{comm}-{arch}")


def local_batch(grid, model, cfg, step):
    ids, labels = batch(cfg, step)
    rows = np.arange(B)[dp_slice(B, grid.dp, grid.dp_rank)]
    pos = model.body().core.positions(S // grid.cp)
    return ids[rows][:, pos], labels[rows][:, pos], rows


def serial_grads(run, cfg, step=0):
    serial = run.serial_model()
    ids, labels = batch(cfg, step)
    loss = serial.loss_and_grads(ids, labels, DropoutPlan(ExactDropoutRNG(SEED), step))
    return loss, dict(serial.named_grads()), serial


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("cp, tp, comm, arch", list(cases()))
def test_step0_equals_serial(cp, tp, comm, arch, sp):
    if sp and tp == 1:
        pytest.skip("sequence parallelism needs tp > 1")
    grid, cfg = grid_of(tp, cp), config(arch)
    run = RunConfig.of(cfg, tp=tp, dp=grid.dp, cp=cp, cp_comm=comm, sp=sp, batch_size=B, seq_len=S, seed=SEED)
    model = run.build_model(grid.tp_group, grid.cp_group)
    ids, labels, rows = local_batch(grid, model, cfg, 0)
    loss, _ = compute_grads(model, grid, GradSync(model, grid.dp_group), ids, labels,
                            plan=DropoutPlan(ExactDropoutRNG(SEED), 0, rows))
    want, grads, _ = serial_grads(run, cfg)
    assert abs(loss - want) <= 1e-12
    worst = shard_differences(model, grads)
    assert max(worst.values()) <= 1e-12, max(worst, key=worst.get)


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("cp, tp", list(layouts()))
def test_training_with_cp_equals_serial(cp, tp, arch, zero):
    grid, cfg = grid_of(tp, cp), config(arch)
    run = RunConfig.of(cfg, tp=tp, dp=grid.dp, cp=cp, batch_size=B, seq_len=S, seed=SEED)
    model = run.build_model(grid.tp_group, grid.cp_group)
    adamw = AdamW(model, lr=1e-2, weight_decay=0.01)
    opt = DistributedOptimizer(adamw, grid, bucket_cap_bytes=600) if zero else adamw
    sync = opt if zero else GradSync(model, grid.dp_group, bucket_cap_bytes=600)
    serial, alone = run.serial_model(), ProcessGrid(tp=1, comm=MPI.COMM_SELF)  # the serial twin, on each rank
    serial_opt = AdamW(serial, lr=1e-2, weight_decay=0.01)
    for step in range(3):
        ids, labels, rows = local_batch(grid, model, cfg, step)
        compute_grads(model, grid, sync, ids, labels, plan=DropoutPlan(ExactDropoutRNG(SEED), step, rows))
        apply_update(model, opt, grid, CLIP)
        full_ids, full_labels = batch(cfg, step)
        compute_grads(serial, alone, None, full_ids, full_labels, plan=DropoutPlan(ExactDropoutRNG(SEED), step))
        apply_update(serial, serial_opt, alone, CLIP)
    worst = shard_differences(model, dict(serial.named_parameters()), grads=False)
    assert max(worst.values()) <= 1e-12, max(worst, key=worst.get)


def pipe_layouts():
    for cp in (2, 4):
        for pp in (2, 4):
            for tp in (1, 2):
                if N == cp * pp * tp or (N % (cp * pp * tp) == 0 and N // (cp * pp * tp) <= 2):
                    yield pytest.param(cp, pp, tp, id=f"cp{cp}-pp{pp}-tp{tp}")


@pytest.mark.parametrize("comm", ["ring", "ulysses"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("cp, pp, tp", list(pipe_layouts()))
def test_cp_pipeline_equals_serial(cp, pp, tp, arch, comm):
    """CP × PP (× TP × DP): 1F1B over m = 2 micro-batches, every stage's gradients equal serial's."""
    from tpsim.pipeline.schedules import build
    from tpsim.live_pipeline.build import build_pipeline
    from tpsim.live_pipeline.data import stage_batch
    from tpsim.live_pipeline.executor import Executor
    from tpsim.live_pipeline.step import pipeline_grads
    from tpsim.config import Pipeline
    if comm == "ulysses" and (4 // tp) % cp + max(2 // tp, 1) % cp:
        pytest.skip("ulysses needs the heads of a TP rank, and its KV heads, divisible by cp")
    key = ("pipe", tp, cp, pp)
    if key not in _GRIDS:
        _GRIDS[key] = ProcessGrid(tp=tp, cp=cp, pp=pp)
    grid, cfg = _GRIDS[key], config(arch, layers=pp)
    grid.tracer.reset()
    run = RunConfig.of(cfg, tp=tp, dp=grid.dp, cp=cp, cp_comm=comm, pp=pp, batch_size=B, seq_len=S, seed=SEED,
                       pipeline=Pipeline(microbatches=2))
    shard = build_pipeline(run, grid)
    ex = Executor(build("1f1b", pp, 2), shard.chunks, grid.pp_group, (run.micro_batch, S // cp, cfg.hidden),
                  np.float64)
    mine = shard.chunks[0].core.positions(S // cp)
    ids, labels, rows = stage_batch(grid, lambda: batch(cfg, 0), B, S, mine)
    sync = GradSync(shard, grid.dp_group)
    loss, _, _ = pipeline_grads(shard, ex, grid, sync, ids, labels, rows=rows, rng=ExactDropoutRNG(SEED))
    want, grads, _ = serial_grads(run, cfg)
    assert abs(loss - want) <= 1e-12
    worst = shard_differences(shard, grads)
    assert max(worst.values()) <= 1e-12, max(worst, key=worst.get)
