"""Pipeline parallelism on live ranks equals the serial model: loss, every gradient, and training with clipping.

Every layout the world allows with pp 2 or 4 (× TP 2, × DP 2 where the ranks allow), schedules afab and 1f1b,
GPT-2 (tied embedding: its gradient summed over the embedding group; dropout with the exact RNG) and Llama
(untied head, grouped-query attention), uneven stages, padding in the labels (the loss is the global-batch
mean over valid tokens), m = 3 micro-batches, float64, tolerance 1e-12.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.arch import GPTConfig, LlamaConfig, architecture_of
from tpsim.comm import ProcessGrid
from tpsim.compare import relative_difference
from tpsim.nn.dropout import DropoutPlan
from tpsim.partition import take_shard
from tpsim.pipeline.actions import Schedule, with_messages
from tpsim.pipeline.schedules import build
from tpsim.live_pipeline.build import pipeline_from_serial
from tpsim.live_pipeline.clock import bubble_measured
from tpsim.live_pipeline.executor import Executor
from tpsim.live_pipeline.split import split_layers
from tpsim.live_pipeline.step import pipeline_grads
from tpsim.predict.pipeline import bubble_fraction
from tpsim.tp.random import ExactDropoutRNG
from tpsim.train.ddp import GradSync
from tpsim.train.optim import AdamW
from tpsim.train.reference import reference_adamw, reference_clip
from tpsim.train.step import apply_update
from conftest import WORLD

N = WORLD.Get_size()
TOL = 1e-12
M, B_MICRO, SEQ, SEED = 3, 2, 6, 11
LAYOUTS = [(pp, tp, N // (pp * tp)) for pp in (2, 4) for tp in (1, 2) if N % (pp * tp) == 0]
SIZES = {2: (2, 3), 4: (1, 1, 2, 1)}  # uneven stages of a 5-layer model
_GRIDS: dict[tuple, ProcessGrid] = {}


def get_grid(pp, tp, dp):
    if (pp, tp) not in _GRIDS:
        _GRIDS[pp, tp] = ProcessGrid(tp=tp, pp=pp)
    grid = _GRIDS[pp, tp]
    grid.tracer.reset()
    return grid


def model_config(arch, tp, layers=5):
    if arch == "gpt2":
        return GPTConfig(vocab_size=13, n_positions=SEQ, n_embd=12, n_layer=layers, n_head=2 * tp, dropout=0.1)
    return LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=24, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)


def global_batch(cfg, rows, seed=3):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab, (rows, SEQ))
    labels = rng.integers(0, cfg.vocab, (rows, SEQ))
    labels[rng.random((rows, SEQ)) < 0.3] = -100  # padding: micro-batches hold different token counts
    return ids, labels


def pipeline(cfg, grid, schedule, sp=False):
    """This rank's stages of ``cfg`` (uneven at 5 layers, even otherwise), its DP sync and its executor."""
    serial = architecture_of(cfg).serial(cfg, seed=SEED)
    layers = split_layers(cfg.layers, grid.pp, SIZES[grid.pp] if cfg.layers == 5 else None)
    shard = pipeline_from_serial(serial, grid, layers, sequence_parallel=sp)
    sync = GradSync(shard, grid.dp_group) if grid.dp > 1 else None
    sch = build(schedule, grid.pp, M)
    boundary = (B_MICRO, SEQ // grid.tp if sp else SEQ, cfg.hidden)
    return shard, sync, Executor(sch, shard.chunks, grid.pp_group, boundary, np.float64)


def run_step(cfg, grid, shard, sync, ex, step=0):
    """One step's gradients on this replica's rows of global batch ``step``: ``(loss, tokens, ExecutorResult)``."""
    ids, labels = global_batch(cfg, B_MICRO * M * grid.dp, seed=step)
    rows = np.arange(grid.dp_rank * B_MICRO * M, (grid.dp_rank + 1) * B_MICRO * M)
    return pipeline_grads(shard, ex, grid, sync, ids[rows], labels[rows], rows=rows, rng=ExactDropoutRNG(SEED),
                          step=step)


def assert_everywhere(ok: bool, what: str) -> None:
    reports = WORLD.allgather(None if ok else what)
    bad = [f"rank {r}: {m}" for r, m in enumerate(reports) if m]
    assert not bad, "; ".join(bad)


def assert_grads_equal_serial(shard, serial) -> None:
    """Every gradient of every stage = the serial model's (``TOL``), and every serial parameter held by a stage."""
    ref = dict(serial.named_grads())
    worst = {e.name: relative_difference(e.grad, take_shard(ref[e.name], e.partition), floor=1e-300)
             for e in shard.named_entries()}
    bad = {k: f"{v:.1e}" for k, v in worst.items() if v > TOL}
    assert_everywhere(not bad, f"gradients differ from serial: {bad}")
    held = set().union(*WORLD.allgather(set(worst)))
    assert held == set(ref), f"parameters no stage holds: {sorted(set(ref) - held)}"


def train_against_serial(grid, shard, opt, serial, live_step, whole=None) -> None:
    """Three AdamW steps (lr 1e-2, weight decay 0.01) clipped at 0.05, a threshold every step crosses, live and on
    the serial reference (``tpsim.train.reference``): each step's loss and clip norm equal (``TOL``) — the norm
    must sum over every stage and count a tied embedding once —, the parameters after them too.
    ``live_step(step) -> (loss, the global batch (ids, labels) it trained on)``; ``whole()``, when given, makes
    the stage's parameters whole before they are compared (ZeRO-3's ``finish_param_gather``)."""
    params, grads = [p for _, p in serial.named_parameters()], [g for _, g in serial.named_grads()]
    m, v = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
    clip, norms = 0.05, []
    for step in range(3):
        loss, batch = live_step(step)
        norm = apply_update(shard, opt, grid, clip)
        loss_s = serial.loss_and_grads(*batch, DropoutPlan(ExactDropoutRNG(SEED), step))
        norm_s = reference_clip(grads, clip)
        for i in range(len(params)):
            reference_adamw(params[i], grads[i], m[i], v[i], step + 1, 1e-2, (0.9, 0.999), 1e-8, 0.01)
        norms.append((norm, norm_s))
        assert_everywhere(relative_difference(loss, loss_s, floor=0.0) <= TOL, f"step {step} loss")
    assert_everywhere(all(relative_difference(a, b, floor=0.0) <= TOL for a, b in norms), f"norms {norms}")
    assert all(b > clip for _, b in norms), "the threshold must clip every step for this test to mean something"
    if whole is not None:
        whole()
    assert_params_equal_serial(shard, serial, params)


def assert_params_equal_serial(shard, serial, params, steps: int = 3) -> None:
    """Every stage's parameters = ``params``, the serial reference's after ``steps`` steps (in ``serial``'s order)."""
    ref = dict(zip([n for n, _ in serial.named_parameters()], params))
    worst = max(relative_difference(e.param, take_shard(ref[e.name], e.partition), floor=1.0)
                for e in shard.named_entries())
    assert_everywhere(worst <= 1e-10, f"parameters after {steps} steps differ by {worst:.1e}")


def check_step0(grid, cfg, schedule, sp=False):
    shard, sync, ex = pipeline(cfg, grid, schedule, sp=sp)
    loss, tokens, result = run_step(cfg, grid, shard, sync, ex)
    serial = architecture_of(cfg).serial(cfg, seed=SEED)
    ids, labels = global_batch(cfg, B_MICRO * M * grid.dp, seed=0)
    loss_s = serial.loss_and_grads(ids, labels, DropoutPlan(ExactDropoutRNG(SEED), 0))
    assert_everywhere(relative_difference(loss, loss_s, floor=0.0) <= TOL, f"loss {loss} vs serial {loss_s}")
    assert_everywhere(tokens == int(np.count_nonzero(labels != -100)), f"tokens {tokens}")
    assert_grads_equal_serial(shard, serial)
    expect = M if schedule == "afab" else min(grid.pp - grid.pp_rank, M)
    assert_everywhere(result.peak_in_flight == expect, f"peak in flight {result.peak_in_flight}, expected {expect}")
    clocks = WORLD.allgather((grid.rank, result.clock.time, result.clock.busy))
    end, idle = bubble_measured([(t, busy) for r, t, busy in clocks if r in grid.pp_group.ranks])
    assert abs(idle - bubble_fraction(schedule, grid.pp, M)) <= 1e-9 and end == 3 * (M + grid.pp - 1), (end, idle)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("schedule", ["afab", "1f1b"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: f"pp{t[0]}-tp{t[1]}-dp{t[2]}")
def test_step0_loss_and_every_gradient_equal_serial(layout, schedule, arch):
    grid = get_grid(*layout)
    check_step0(grid, model_config(arch, grid.tp), schedule)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("layout", [t for t in LAYOUTS if t[1] == 2], ids=lambda t: f"pp{t[0]}-tp{t[1]}-dp{t[2]}")
def test_sequence_parallel_stages_send_their_sequence_shard(layout, arch):
    """Under SP the boundary tensor is this TP rank's [b, s/t, h]: half the bytes, the same gradients."""
    grid = get_grid(*layout)
    check_step0(grid, model_config(arch, grid.tp, layers=4), "1f1b", sp=True)
    sends = [e for e in grid.tracer.events if e.op == "send"]
    assert_everywhere(all(e.shape == (B_MICRO, SEQ // 2, 12 if arch == "gpt2" else 16) for e in sends),
                      f"boundary shapes {sorted({e.shape for e in sends})}")


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: f"pp{t[0]}-tp{t[1]}-dp{t[2]}")
def test_training_with_clipping_equals_serial_training(layout, arch):
    """Three AdamW steps with a clipping threshold every step crosses: the norm must sum over every stage and
    count the tied embedding once, or the clipped update differs."""
    grid = get_grid(*layout)
    cfg = model_config(arch, grid.tp)
    shard, sync, ex = pipeline(cfg, grid, "1f1b")
    opt = AdamW(shard, lr=1e-2, weight_decay=0.01)
    serial = architecture_of(cfg).serial(cfg, seed=SEED)
    train_against_serial(grid, shard, opt, serial, lambda step: (
        run_step(cfg, grid, shard, sync, ex, step=step)[0], global_batch(cfg, B_MICRO * M * grid.dp, seed=step)))


@pytest.mark.parametrize("schedule", ["afab", "1f1b"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: f"pp{t[0]}-tp{t[1]}-dp{t[2]}")
def test_every_message_is_recorded_by_its_sender_and_its_receiver(layout, schedule):
    """Per pipeline (one DP replica, one TP rank): 2·m·(p − 1) messages of b·s·h·e bytes, each once as a send
    and once as a recv with the same micro-batch, the peers crossed; activations forward, gradients backward."""
    grid = get_grid(*layout)
    cfg = model_config("gpt2", grid.tp)
    shard, sync, ex = pipeline(cfg, grid, schedule)
    run_step(cfg, grid, shard, sync, ex)
    mine = [(e.op, e.rank, e.peer, e.microbatch, e.phase, e.bytes) for e in grid.tracer.events
            if e.op in ("send", "recv")]
    everyone = [r for rows in WORLD.allgather(mine) for r in rows]
    chain = set(grid.pp_group.ranks)
    sends = [r for r in everyone if r[0] == "send" and r[1] in chain]
    recvs = [r for r in everyone if r[0] == "recv" and r[1] in chain]
    message = B_MICRO * SEQ * cfg.hidden * 8
    assert len(sends) == 2 * M * (grid.pp - 1) and sum(r[5] for r in sends) == 2 * M * (grid.pp - 1) * message
    assert sorted((s, d, j, ph) for _, s, d, j, ph, _ in sends) == sorted((s, d, j, ph) for _, d, s, j, ph, _ in recvs)
    pos = {r: i for i, r in enumerate(grid.pp_group.ranks)}
    assert all((pos[d] > pos[s]) == (ph == "forward") for _, s, d, _, ph, _ in sends)


def chunked_afab(pp: int, m: int, vp: int) -> Schedule:
    """A two-chunk schedule written here (the executor runs any list it is given): every forward chunk by chunk,
    then every backward in reverse — each rank holds virtual stages r and pp + r."""
    compute = [[("F", j, c) for c in range(vp) for j in range(m)]
               + [("B", j, c) for c in reversed(range(vp)) for j in range(m)] for _ in range(pp)]
    return Schedule("chunked-afab", pp, m, vp, tuple(with_messages(pp, vp, r, compute[r]) for r in range(pp)))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: f"pp{t[0]}-tp{t[1]}-dp{t[2]}")
def test_two_model_chunks_per_rank_equal_serial(layout, arch):
    """vp = 2: chunk c of rank r is virtual stage c·pp + r; the embedding on rank 0's chunk 0, the head on the
    last rank's chunk 1 (the tied embedding's two copies on the pipeline's ends, as with one chunk)."""
    grid = get_grid(*layout)
    cfg = model_config(arch, grid.tp, layers=2 * grid.pp)
    serial = architecture_of(cfg).serial(cfg, seed=SEED)
    shard = pipeline_from_serial(serial, grid, split_layers(cfg.layers, 2 * grid.pp))
    assert [c.stage for c in shard.chunks] == [grid.pp_rank, grid.pp + grid.pp_rank]
    sync = GradSync(shard, grid.dp_group) if grid.dp > 1 else None
    ex = Executor(chunked_afab(grid.pp, M, 2), shard.chunks, grid.pp_group, (B_MICRO, SEQ, cfg.hidden), np.float64)
    loss, _, result = run_step(cfg, grid, shard, sync, ex)
    ids, labels = global_batch(cfg, B_MICRO * M * grid.dp, seed=0)
    loss_s = serial.loss_and_grads(ids, labels, DropoutPlan(ExactDropoutRNG(SEED), 0))
    assert_everywhere(relative_difference(loss, loss_s, floor=0.0) <= TOL, f"loss {loss} vs {loss_s}")
    ref = dict(serial.named_grads())
    worst = max(relative_difference(e.grad, take_shard(ref[e.name], e.partition), floor=1e-300)
                for e in shard.named_entries())
    assert_everywhere(worst <= TOL, f"gradients differ by {worst:.1e}")
    assert_everywhere(result.peak_in_flight == 2 * M, f"peak {result.peak_in_flight}")
