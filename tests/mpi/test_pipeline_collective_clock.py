"""Collectives on the live virtual clock under a GPU (``tpsim.live_pipeline.clock``, ``tpsim.live_pipeline.step``): each
compute action costs the planner's FLOP time plus the α-β time of exactly the collectives the planner puts in it, and
the step ends where the planner's clock ends it.

On every layout the world allows with pp 2 × tp 2 (× DP filling the rest), GPT-2 (tied embedding, dropout) and
Llama (untied, grouped-query attention), with and without sequence parallelism, 1F1B and ZB-H1 (whose W carries
the weight gradients' collectives), float64, one step of the toy models of ``tpsim.plan.live_pipeline``:

    every F, B and W span on the clock      = stage_costs + stage_comm of its (rank, chunk, op)  (1e-12 relative)
    the TP collectives priced inside them    > 0 (the layouts all have tp 2), = the rank's busy − FLOP time
    each rank's clock when its schedule ends = the planner's timeline of the same costs (its finish), and the
                                               pipeline's latest = pipeline_terms' makespan_s      (1e-12 relative)
    the clock after the DP sync              = after_schedule's end of that rank; the latest = step_s
    the spans after the schedule             the loss broadcast on every stage, the embedding's all-reduce on the
                                               first and the last (GPT-2), the DP sync with dp > 1
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tpsim.comm import ProcessGrid
from tpsim.gpus import gpu
from tpsim.plan.live_pipeline import one_step, pipeline_run
from tpsim.plan.of_run import model_spec, run_layout
from tpsim.plan.pipeline import pipeline_terms, stage_costs
from tpsim.plan.pipeline_comm import stage_comm
from tpsim.pipeline.stage_clock import ROUNDING, compiled
from conftest import WORLD
from test_pipeline_parallel import assert_everywhere

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the rules every clock's spans keep
from time_invariants import clock_problems  # noqa: E402

N = WORLD.Get_size()
DP = N // 4
CASES = [(arch, schedule, sp) for arch in ("gpt2", "llama") for schedule in ("1f1b", "zb-h1") for sp in (False, True)]
_GRIDS: dict = {}


def close(a: float, b: float) -> bool:
    return abs(a - b) <= ROUNDING * max(abs(a), abs(b))


@pytest.mark.skipif(N % 4 != 0, reason="pp 2 x tp 2 needs a multiple of 4 ranks")
@pytest.mark.parametrize("arch, schedule, sp", CASES, ids=lambda x: str(x))
def test_every_action_and_the_step_end_where_the_planners_clock_ends_them(arch, schedule, sp):
    run = pipeline_run(2, DP, 2, schedule, 1, 4, 4, "h100-80gb", sp, arch)
    if "grid" not in _GRIDS:
        _GRIDS["grid"] = ProcessGrid(tp=2, dp=DP, pp=2)
    grid = _GRIDS["grid"]
    result = one_step(run, grid)[0]
    model, lay = model_spec(run.model), run_layout(run)
    g = gpu(lay.gpu)
    split = compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp).splits_backward
    flops, comm = stage_costs(model, lay, g), stage_comm(model, lay, g, split)
    clock, r = result.clock, grid.pp_rank
    problems = clock_problems(clock)
    assert_everywhere(not problems, f"the clock's spans break a rule: {problems[:2]}")
    ops = {"F": 0, "B": 1, "W": 2}
    spans = [s for s in clock.spans if s.op in ops]
    charged = [(s, flops[r, s.chunk, ops[s.op]] + comm[r, s.chunk, ops[s.op]]) for s in spans]
    wrong = [s for s, want in charged if abs(s.end - s.start - want) > ROUNDING * s.end]  # the times' own rounding
    assert_everywhere(not wrong, f"spans off the planner's F/B/W + collectives: {wrong[:3]}")
    flop_busy = sum(flops[r, s.chunk, ops[s.op]] for s in spans)
    assert_everywhere(clock.comm > 0 and close(clock.busy - flop_busy, clock.comm),
                      f"collectives {clock.comm} vs busy {clock.busy} - FLOP time {flop_busy}")
    terms = pipeline_terms(model, lay, g)
    chain = grid.pp_group.gather_objects((clock.schedule_end, clock.time), root=0)  # None off pipeline rank 0
    ok = chain is None or (close(max(e[0] for e in chain), terms["makespan_s"])
                           and close(max(e[1] for e in chain), terms["step_s"]))
    assert_everywhere(ok, f"pipeline ends {chain} vs makespan {terms['makespan_s']}, step {terms['step_s']}")
    want_end = terms["after_schedule"]["ends"][r]
    assert_everywhere(close(clock.time, want_end), f"step end {clock.time} vs the planner's {want_end}")
    after = {s.op for s in clock.spans if s.microbatch < 0}
    want = {"loss broadcast"} | ({"embedding all-reduce"} if model.tied and r in (0, 1) else set())
    want |= {"DP sync"} if DP > 1 else set()
    want |= {"loss all-reduce", "loss normalizer"} if DP > 1 and grid.last_stage else set()
    assert_everywhere(after == want, f"collectives after the schedule {sorted(after)}, want {sorted(want)}")
