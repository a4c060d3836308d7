"""ZeRO-2 under a pipeline: every micro-batch reduce-scatters the buckets its backward wrote, and training still
equals the serial model.

Every layout of the world with pp 2 or 4 (× TP 1 or 2, DP filling the rest, dp > 1), GPT-2 (tied embedding:
its bucket is held for the sum over the embedding group and reduce-scattered once a step) and Llama (untied),
1F1B and ZB-H1 (where the weight gradients run in W actions, apart from B), five layers cut unevenly, float64,
buckets of ~1 KB so that a stage has several: the step-0 gradients (gathered from the owned slices) equal
serial's, three clipped AdamW steps equal serial training, and each rank's reduce-scatters are
``zero2_reduce_scatter``'s m·(buckets − held) + held calls and m·(bytes − held) + held bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.arch import architecture_of
from tpsim.nn.dropout import DropoutPlan
from tpsim.pipeline.schedules import build
from tpsim.live_pipeline.build import pipeline_from_serial
from tpsim.live_pipeline.executor import Executor
from tpsim.live_pipeline.split import split_layers
from tpsim.predict.zero_rows import zero2_reduce_scatter
from tpsim.tp.random import ExactDropoutRNG
from tpsim.train.optim import AdamW
from tpsim.train.zero import DistributedOptimizer

from conftest import WORLD
from test_pipeline_parallel import (B_MICRO, M, SEED, SEQ, SIZES, assert_everywhere, assert_grads_equal_serial,
                                    get_grid, global_batch, model_config, run_step, train_against_serial)

N = WORLD.Get_size()
LAYOUTS = [(pp, tp, N // (pp * tp)) for pp in (2, 4) for tp in (1, 2) if N % (pp * tp) == 0 and N // (pp * tp) > 1]
CAP = 1000  # bytes: several buckets a stage


def zero2_pipeline(arch, grid, schedule, stage=2):
    cfg = model_config(arch, grid.tp)
    serial = architecture_of(cfg).serial(cfg, seed=SEED)
    shard = pipeline_from_serial(serial, grid, split_layers(cfg.layers, grid.pp, SIZES[grid.pp]))
    shared = getattr(shard, "shared_embedding", None)
    opt = DistributedOptimizer(AdamW(shard, lr=1e-2, weight_decay=0.01), grid, bucket_cap_bytes=CAP, stage=stage,
                               held=(shared.grads["weight"],) if shared is not None else ())
    ex = Executor(build(schedule, grid.pp, M), shard.chunks, grid.pp_group, (B_MICRO, SEQ, cfg.hidden), np.float64)
    return cfg, serial, shard, opt, ex


pytestmark = pytest.mark.skipif(not LAYOUTS, reason="ZeRO-2 under a pipeline needs pp >= 2 and dp >= 2: 4+ ranks")


@pytest.mark.parametrize("stage", [2, 3], ids=["zero2", "zero3"])
@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("layout", LAYOUTS or [(2, 1, 1)], ids=lambda t: f"pp{t[0]}-tp{t[1]}-dp{t[2]}")
def test_step0_gradients_equal_serial_and_each_micro_batch_reduce_scatters(layout, arch, schedule, stage):
    grid = get_grid(*layout)
    cfg, serial, shard, opt, ex = zero2_pipeline(arch, grid, schedule, stage)
    grid.tracer.step = 0
    run_step(cfg, grid, shard, opt, ex)
    rs = grid.tracer.select(op="reduce_scatter", group="dp")
    held = opt.sharded.held
    want = zero2_reduce_scatter(M, opt.total_bytes, len(opt.buckets),
                                (sum(opt.buckets[i].nbytes for i in held), len(held)))
    assert_everywhere((sum(e.bytes for e in rs), len(rs)) == want, f"reduce-scatters {len(rs)}, formula {want}, "
                      f"per bucket {opt.sharded.reductions}, held {held}")
    assert_everywhere(len(opt.buckets) > len(held), "only held buckets: the test would not see the per-micro-batch "
                      "reduce-scatters")
    assert_everywhere(arch == "llama" or grid.pp_rank not in (0, grid.pp - 1) or bool(held), "the tied bucket held")
    opt.gather_grads()
    ids, labels = global_batch(cfg, B_MICRO * M * grid.dp, seed=0)
    serial.loss_and_grads(ids, labels, DropoutPlan(ExactDropoutRNG(SEED), 0))
    assert_grads_equal_serial(shard, serial)


@pytest.mark.parametrize("stage", [2, 3], ids=["zero2", "zero3"])
@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("layout", LAYOUTS or [(2, 1, 1)], ids=lambda t: f"pp{t[0]}-tp{t[1]}-dp{t[2]}")
def test_training_with_clipping_equals_serial_training(layout, arch, schedule, stage):
    grid = get_grid(*layout)
    cfg, serial, shard, opt, ex = zero2_pipeline(arch, grid, schedule, stage)
    train_against_serial(grid, shard, opt, serial, lambda step: (
        run_step(cfg, grid, shard, opt, ex, step=step)[0], global_batch(cfg, B_MICRO * M * grid.dp, seed=step)),
        whole=opt.finish_param_gather)


@pytest.mark.parametrize("placed, message", [(1, "not the ones ZeRO-2 places"), (None, "not the ones ZeRO-2 places")])
def test_lists_whose_collectives_are_not_the_stages_are_refused_before_anything_runs(placed, message):
    """The executor runs the collectives the lists carry (a REDUCE_GRAD arms the sync): lists placed for another
    stage would reduce-scatter ZeRO-2's gradients once instead of every micro-batch, so they are one line."""
    from tpsim.errors import ConfigError
    from tpsim.pipeline.collectives import with_collectives
    from tpsim.zero_stage import zero_stage

    grid = get_grid(*(LAYOUTS or [(2, 1, 1)])[0])
    cfg, _, shard, opt, ex = zero2_pipeline("gpt2", grid, "1f1b", 2)
    other = with_collectives(ex.schedule, zero_stage(1))
    if placed is None:  # ZeRO-2's, with one REDUCE_GRAD taken out by hand: the checker passes it, the stage not
        right = with_collectives(ex.schedule, zero_stage(2))
        drop = next(i for i, a in enumerate(right.ranks[0]) if a.op == "REDUCE_GRAD")
        ranks = (right.ranks[0][:drop] + right.ranks[0][drop + 1:],) + right.ranks[1:]
        other = type(right)(right.name, right.pp, right.microbatches, right.vp, ranks)
    ex._place(other)
    grid.tracer.step = 0
    with pytest.raises(ConfigError, match=message):
        run_step(cfg, grid, shard, opt, ex)
