"""The interleaved schedule on live ranks: v = 2 model chunks per rank, equal to the serial model and its formulas.

Chunk c of pipeline rank r is virtual stage c·p + r, so one micro-batch crosses the pipeline v times. Every layout
the world allows with pp 2 or 4 (× TP 2, × DP filling the rest), GPT-2 (tied embedding, dropout with the exact
RNG) and Llama (untied head, grouped-query attention), m = 2p micro-batches (the schedule's constraint: a multiple
of p), uneven stages at pp 2, float64:

    loss and every gradient at step 0        = the serial model's, ≤ 1e-12
    three clipped AdamW steps                = the serial model trained the same way
    (micro-batch, chunk) pairs held at once  = tpsim.predict.pipeline.peak_in_flight
    the live unit clock                      = tpsim.pipeline.clock.simulate of the same schedule, exactly; its
                                               bubble = (p − 1)/(v·m + p − 1) to 1e-9
    p2p bytes of one pipeline                = 2·m·(v·p − 1)·b·s·h·e (÷ t under sequence parallelism)
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.arch import architecture_of
from tpsim.compare import relative_difference
from tpsim.errors import ConfigError
from tpsim.nn.dropout import DropoutPlan
from tpsim.pipeline.actions import Schedule
from tpsim.pipeline.clock import simulate
from tpsim.pipeline.schedules import build
from tpsim.live_pipeline.build import pipeline_from_serial
from tpsim.live_pipeline.clock import bubble_measured
from tpsim.live_pipeline.executor import Executor
from tpsim.live_pipeline.split import split_layers
from tpsim.live_pipeline.step import pipeline_grads
from tpsim.predict.pipeline import bubble_fraction, p2p_bytes, peak_in_flight
from tpsim.tp.random import ExactDropoutRNG
from tpsim.train.ddp import GradSync
from tpsim.train.optim import AdamW
from conftest import WORLD
from test_pipeline_parallel import (SEED, SEQ, TOL, assert_everywhere, assert_grads_equal_serial,
                                    get_grid, global_batch, model_config, train_against_serial)

N = WORLD.Get_size()
VP, B_MICRO = 2, 2
LAYOUTS = [(pp, tp, N // (pp * tp)) for pp in (2, 4) for tp in (1, 2) if N % (pp * tp) == 0]
UNEVEN = {2: (1, 1, 2, 1)}  # five layers over pp 2 × vp 2 virtual stages


def layout_id(t):
    return f"pp{t[0]}-tp{t[1]}-dp{t[2]}-vp{VP}"


def interleaved_pipeline(arch, grid, sp=False, uneven=False):
    """``(cfg, serial, shard, sync, executor)``: this rank's two chunks, its DP sync, the interleaved executor."""
    layers = 5 if uneven else VP * grid.pp
    cfg = model_config(arch, grid.tp, layers=layers)
    serial = architecture_of(cfg).serial(cfg, seed=SEED)
    stages = split_layers(layers, grid.pp * VP, UNEVEN[grid.pp] if uneven else None, vp=VP)
    shard = pipeline_from_serial(serial, grid, stages, sequence_parallel=sp)
    sync = GradSync(shard, grid.dp_group) if grid.dp > 1 else None
    boundary = (B_MICRO, SEQ // grid.tp if sp else SEQ, cfg.hidden)
    ex = Executor(build("interleaved", grid.pp, 2 * grid.pp, VP), shard.chunks, grid.pp_group, boundary, np.float64)
    return cfg, serial, shard, sync, ex


def run_step(cfg, grid, shard, sync, ex, step=0):
    m = ex.schedule.microbatches
    ids, labels = global_batch(cfg, B_MICRO * m * grid.dp, seed=step)
    rows = np.arange(grid.dp_rank * B_MICRO * m, (grid.dp_rank + 1) * B_MICRO * m)
    loss, _, result = pipeline_grads(shard, ex, grid, sync, ids[rows], labels[rows], rows=rows,
                                     rng=ExactDropoutRNG(SEED), step=step)
    return loss, result, (ids, labels)


def serial_step(serial, batch, step):
    return serial.loss_and_grads(*batch, DropoutPlan(ExactDropoutRNG(SEED), step))


def check_equal_serial(grid, serial, shard, loss, batch):
    loss_s = serial_step(serial, batch, 0)
    assert_everywhere(relative_difference(loss, loss_s, floor=0.0) <= TOL, f"loss {loss} vs serial {loss_s}")
    assert_grads_equal_serial(shard, serial)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_step0_loss_every_gradient_peak_and_clock(layout, arch):
    grid = get_grid(*layout)
    cfg, serial, shard, sync, ex = interleaved_pipeline(arch, grid, uneven=grid.pp in UNEVEN)
    assert [c.stage for c in shard.chunks] == [grid.pp_rank, grid.pp + grid.pp_rank]
    loss, result, batch = run_step(cfg, grid, shard, sync, ex)
    check_equal_serial(grid, serial, shard, loss, batch)
    sch, rank = ex.schedule, grid.pp_rank
    want = peak_in_flight("interleaved", grid.pp, sch.microbatches, VP)[rank]
    assert_everywhere(result.peak_in_flight == want, f"peak in flight {result.peak_in_flight}, formula {want}")
    compute = [f"{a.op}{a.microbatch}.{a.chunk}" for a in sch.ranks[rank] if a.op in ("F", "B")]
    assert_everywhere(result.ran == compute, f"ran {result.ran[:6]}..., the schedule says {compute[:6]}...")
    timed = simulate(sch)  # the MPI-free clock on the same list, the same unit costs
    same = (result.clock.time, result.clock.busy) == (timed.finish[rank], timed.busy[rank])
    assert_everywhere(same, f"live clock {(result.clock.time, result.clock.busy)}, simulated "
                            f"{(timed.finish[rank], timed.busy[rank])}")
    clocks = WORLD.allgather((grid.rank, result.clock.time, result.clock.busy))
    end, idle = bubble_measured([(t, busy) for r, t, busy in clocks if r in grid.pp_group.ranks])
    formula = bubble_fraction("interleaved", grid.pp, sch.microbatches, VP)
    assert abs(idle - formula) <= 1e-9 and end == timed.step, (end, idle, formula)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_training_with_clipping_equals_serial_training(layout, arch):
    """Three AdamW steps whose norm crosses the threshold every step: the norm sums over both chunks of every
    rank and counts the tied embedding once."""
    grid = get_grid(*layout)
    cfg, serial, shard, sync, ex = interleaved_pipeline(arch, grid)
    opt = AdamW(shard, lr=1e-2, weight_decay=0.01)
    train_against_serial(grid, shard, opt, serial,
                         lambda step: run_step(cfg, grid, shard, sync, ex, step=step)[::2])


def pipeline_messages(grid):
    """Every send and recv of this rank's pipeline group (one DP replica, one TP rank), from every rank's trace."""
    mine = [(e.op, e.rank, e.peer, e.microbatch, e.chunk, e.phase, e.bytes) for e in grid.tracer.events
            if e.op in ("send", "recv")]
    chain = set(grid.pp_group.ranks)
    return [r for rows in WORLD.allgather(mine) for r in rows if r[1] in chain]


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_p2p_bytes_equal_the_interleaved_formula(layout, sp):
    """2·m·(v·p − 1) messages a pipeline, each recorded once by its sender and once by its receiver; under SP a
    boundary tensor is this TP rank's [b, s/t, h] and the gradients still equal serial."""
    grid = get_grid(*layout)
    if sp and grid.tp == 1:
        pytest.skip("sequence parallelism splits over TP: needs tp > 1")
    cfg, serial, shard, sync, ex = interleaved_pipeline("gpt2", grid, sp=sp)
    loss, _, batch = run_step(cfg, grid, shard, sync, ex)
    check_equal_serial(grid, serial, shard, loss, batch)
    everyone = pipeline_messages(grid)
    sends = [r for r in everyone if r[0] == "send"]
    recvs = [r for r in everyone if r[0] == "recv"]
    m = ex.schedule.microbatches
    want = p2p_bytes("interleaved", grid.pp, m, VP, micro_batch=B_MICRO, seq_len=SEQ, hidden=cfg.hidden,
                     bytes_per_element=8, tp=grid.tp, sequence_parallel=sp)
    assert len(sends) == 2 * m * (VP * grid.pp - 1) and sum(r[6] for r in sends) == want, (len(sends), want)
    crossed = sorted((d, s, j, ph) for _, s, d, j, _, ph, _ in recvs)
    assert sorted((s, d, j, ph) for _, s, d, j, _, ph, _ in sends) == crossed


def test_the_executor_refuses_a_schedule_that_would_hang():
    """Rank 0 of a two-stage 1F1B holding its activations back until it has the gradients: both ranks would
    wait for each other; ``check`` names the cycle on every rank before any message moves (else: a hang)."""
    if N % 2:
        pytest.skip("needs an even world")
    grid = get_grid(2, 1, N // 2)
    cfg = model_config("gpt2", 1, layers=2)
    shard = pipeline_from_serial(architecture_of(cfg).serial(cfg, seed=SEED), grid, split_layers(2, 2))
    good = build("1f1b", 2, 2)
    held = tuple(a for a in good.ranks[0] if a.op != "SEND_F") + tuple(a for a in good.ranks[0] if a.op == "SEND_F")
    bad = Schedule("stuck", 2, 2, 1, (held, good.ranks[1]))
    with pytest.raises(ConfigError, match="deadlock"):
        Executor(bad, shard.chunks, grid.pp_group, (B_MICRO, SEQ, cfg.hidden), np.float64)
