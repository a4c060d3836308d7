"""``--clock unit|GPU`` on live pipelines: the live virtual clock charges the planner's own costs, its spans are
the MPI-free clock's, and ``timeline.json`` draws them.

MPI-free: the clock's GPU names and their one-line refusals; under a GPU the costs are ``stage_costs`` and
``message_costs`` of the run's layout, so ``simulate`` of the schedule gives the planner's makespan (to 1e-12
relative) for every live schedule; ``LiveClock`` driven as the executor drives it leaves exactly ``simulate``'s
spans; the "virtual clock" process of the Chrome trace. Slow (mpiexec): the demo under ``--clock h100`` and
``--clock unit``, whose timeline.json holds every F, B and wait at ``simulate``'s times exactly.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from launch_program import run_mpi, without_launcher_notices
from tpsim.arch import GPTConfig, LlamaConfig
from tpsim.config import Pipeline, RunConfig
from tpsim.errors import ConfigError
from tpsim.pipeline.actions import COMPUTE, RECVS, SENDS
from tpsim.pipeline.check import walk
from tpsim.cost import ring_steps
from tpsim.pipeline.clock import Costs, simulate, unit
from tpsim.pipeline.schedules import build
from tpsim.plan.comm import boundary_bytes, links
from tpsim.gpus import GPUS, gpu
from tpsim.plan.of_run import clock_costs, model_spec, run_layout
from tpsim.plan.pipeline import message_costs, pipeline_terms, stage_costs
from tpsim.plan.pipeline_comm import stage_comm
from tpsim.live_pipeline.clock import LiveClock
from tpsim.trace.timeline import UNIT_DRAWN_AS, chrome_trace

GPT = GPTConfig(vocab_size=37, n_positions=16, n_embd=24, n_layer=4, n_head=4, dropout=0.1)
LLAMA = LlamaConfig(vocab_size=37, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)

# (model, tp, dp, pp, sp, dtype, pipeline): every live schedule, uneven stages, SP, 16 bits, the untied Llama
LAYOUTS = [(GPT, 2, 1, 2, False, "float64", Pipeline("1f1b", 4, clock="h100")),
           (GPT, 1, 2, 2, False, "float64", Pipeline("interleaved", 4, 2, clock="a100-80gb", mfu=0.3)),
           (GPT, 1, 1, 4, False, "float64", Pipeline("afab", 3, clock="v100-32gb")),
           (GPT, 2, 1, 2, True, "float64", Pipeline("1f1b", 2, stage_layers=(1, 3), clock="h200")),
           (GPT, 2, 1, 2, False, "bfloat16", Pipeline("1f1b", 4, clock="h100")),
           (LLAMA, 2, 1, 4, False, "float64", Pipeline("1f1b", 8, clock="h100"))]


def live_run(model, tp, dp, pp, sp, dtype, pipeline) -> RunConfig:
    return RunConfig.of(model, tp=tp, dp=dp, pp=pp, sp=sp, dtype=dtype, pipeline=pipeline,
                        batch_size=2 * dp * pipeline.microbatches)


def boundary_of(run: RunConfig) -> tuple[tuple[int, ...], np.dtype]:
    """The live executor's message: [b, s, h] ([b, s/t, h] under SP) in the run's dtype (tpsim.demo.tour.build)."""
    s = run.schedule.seq_len // run.parallel.tp if run.parallel.sp else run.schedule.seq_len
    return (run.micro_batch, s, run.model.hidden), run.precision.numpy


def schedule_of(run: RunConfig):
    return build(run.pipeline.schedule, run.parallel.pp, run.pipeline.microbatches, run.pipeline.vp)


def test_clock_names_a_gpu_of_the_planner_or_says_the_choices_in_one_line():
    assert Pipeline(clock="h100").clock == "h100-80gb" and Pipeline(clock="v100-32gb").clock == "v100-32gb"
    assert Pipeline(clock="h100").mfu is None and Pipeline(clock="h100", mfu=0.5).mfu == 0.5
    assert Pipeline().mfu is None and Pipeline().clock == "unit"
    for name, why in (("a100", "names more than one GPU"), ("tpu", "is neither unit nor a GPU")):
        with pytest.raises(ConfigError) as err:
            Pipeline(clock=name)
        assert why in str(err.value) and all(g in str(err.value) for g in GPUS) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="--mfu 0.4 prices a GPU clock: give --clock GPU too"):
        Pipeline(mfu=0.4)
    with pytest.raises(ConfigError, match=r"--mfu 1.5: must be in \(0, 1\]"):
        Pipeline(clock="h100", mfu=1.5)
    assert RunConfig.of(GPT, pipeline=Pipeline(clock="h100")).pipeline.clock == "h100-80gb"  # pp 1: one stage


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"{x[6].schedule}-pp{x[3]}-tp{x[1]}-{x[5]}"
                         + ("-sp" if x[4] else "") + ("-uneven" if x[6].stage_layers else ""))
def test_a_gpu_clock_charges_the_planners_costs_so_simulate_is_the_planners_makespan(layout):
    run = live_run(*layout)
    model, lay = model_spec(run.model), run_layout(run)
    g = gpu(run.pipeline.clock)
    assert (lay.gpu, lay.mfu, lay.microbatches, lay.micro_batch) == (run.pipeline.clock, run.pipeline.mfu,
                                                                     run.pipeline.microbatches, run.micro_batch)
    boundary, dtype = boundary_of(run)
    assert int(np.prod(boundary)) * dtype.itemsize == boundary_bytes(model, lay)  # the live message = the planner's
    sch = schedule_of(run)
    costs = clock_costs(run, sch, boundary, dtype)
    table = stage_costs(model, lay, g)
    for r in range(sch.pp):
        for c in range(sch.vp):
            assert [costs.compute[op](r, c, 0) for op in "FBW"] == table[r, c].tolist()
    hop = costs.alpha + costs.beta * costs.message_bytes("F", 0, 0)
    assert np.all(message_costs(model, lay, g) == hop)
    terms = pipeline_terms(model, lay, g)
    timeline = simulate(sch, costs)  # the FLOPs and the messages: the collectives come from the trace, live
    assert timeline.step == pytest.approx(terms["makespan_without_collectives_s"], rel=1e-12, abs=0)
    assert timeline.busy == pytest.approx([r["busy_s"] - r["collectives_s"] for r in terms["ranks"]], rel=1e-12)
    assert timeline.p2p_bytes == terms["p2p_bytes"]["measured"]
    # the collectives each action runs, priced by costs.collective from predict_step's rows, as the planner does
    comm = stage_comm(model, lay, g, sch.splits_backward)
    full = simulate(sch, with_collectives(run, sch, costs))
    if lay.dp == 1:  # no loss normalizer: every rank starts at 0, as simulate's do
        assert full.step == pytest.approx(terms["makespan_s"], rel=1e-12, abs=0)
        assert full.bubble_fraction == pytest.approx(terms["bubble_fraction"]["measured"], rel=1e-12, abs=0)
    assert full.busy == pytest.approx([r["busy_s"] for r in terms["ranks"]], rel=1e-12, abs=0)
    assert (comm > 0).any() == (lay.tp > 1) and terms["step_s"] > terms["makespan_s"]
    assert full.bubble_fraction > terms["bubble_fraction"]["formula"]  # heavier head, uneven, messages


def test_a_gpu_clock_prices_each_collective_on_its_groups_link():
    run = live_run(*LAYOUTS[1])  # dp 2: the DP link too
    lay, g = run_layout(run), gpu(run.pipeline.clock)
    price, on = clock_costs(run, schedule_of(run), *boundary_of(run)).collective, links(lay, g)
    for group, link in (("tp", "tp"), ("kv", "tp"), ("embedding", "pp"), ("pp", "pp"), ("dp", "dp")):
        want = ring_steps("all_reduce", 4) * on[link].alpha + 1000 * on[link].beta
        assert price("all_reduce", group, 4, 1000) == want
    with pytest.raises(ValueError, match="a collective over group 'world'"):
        price("all_reduce", "world", 8, 8)
    assert unit(schedule_of(run)).collective is None  # the textbook's clock: collectives free


def with_collectives(run: RunConfig, schedule, costs):
    """``costs`` with the planner's collectives of each action added (``stage_comm``): what the live GPU clock
    charges an action once the trace's collectives are priced."""
    model, lay = model_spec(run.model), run_layout(run)
    comm = stage_comm(model, lay, gpu(lay.gpu), schedule.splits_backward)
    return Costs({op: (lambda i, f: lambda r, c, j: f(r, c, j) + comm[r, c, i])(i, costs.compute[op])
                  for i, op in enumerate("FBW")}, costs.alpha, costs.beta, costs.message_bytes)


def test_a_live_message_the_planner_does_not_price_is_refused():
    run = live_run(*LAYOUTS[0])
    (b, s, h), dtype = boundary_of(run)
    with pytest.raises(ValueError, match="a live message holds .* the planner's boundary_bytes"):
        clock_costs(run, schedule_of(run), (b, s // 2, h), dtype)
    with pytest.raises(ValueError, match="is not the schedule's"):
        clock_costs(run, build("afab", 2, 4), (b, s, h), dtype)


def test_the_unit_clock_is_the_textbooks():
    run = live_run(GPT, 2, 1, 2, False, "float64", Pipeline("interleaved", 4, 2))
    sch = schedule_of(run)
    assert simulate(sch, clock_costs(run, sch, *boundary_of(run))).spans == simulate(sch, unit(sch)).spans


def live_spans(schedule, costs) -> list[list[tuple]]:
    """Every rank's ``LiveClock`` driven as ``tpsim.live_pipeline.executor`` drives it, in an order the lists can run
    in: a SEND stamps the sender's time, a RECV arrives with that stamp, a compute action charges its cost."""
    clocks = [LiveClock(costs, r) for r in range(schedule.pp)]
    stamps = {}
    for rank, _, a in walk(schedule):
        if a.op in COMPUTE:
            clocks[rank].compute(a.op, a.chunk, a.microbatch)
        elif a.op in SENDS:
            stamps[schedule.message(rank, a)] = clocks[rank].time
        else:
            message = schedule.message(rank, a)
            clocks[rank].arrive(stamps[message], message, chunk=a.chunk)
    return [c.spans for c in clocks]


def simulated_spans(schedule, costs) -> list[list[tuple]]:
    """``simulate``'s (op, micro-batch, chunk, start, end) of every compute action and receive, rank by rank."""
    t = simulate(schedule, costs)
    return [[(a.op, a.microbatch, a.chunk, *span) for a, span in zip(actions, spans) if a.op not in SENDS]
            for actions, spans in zip(schedule.ranks, t.spans)]


@pytest.mark.parametrize("layout", [LAYOUTS[0], LAYOUTS[1], LAYOUTS[2], LAYOUTS[3]],
                         ids=["1f1b", "interleaved", "afab", "uneven-sp"])
@pytest.mark.parametrize("clock", ["unit", "gpu"])
def test_the_live_clocks_spans_are_simulates_exactly(layout, clock):
    run = live_run(*layout)
    if clock == "unit":
        run = run.replace(pipeline=Pipeline(run.pipeline.schedule, run.pipeline.microbatches, run.pipeline.vp,
                                            run.pipeline.stage_layers))
    sch = schedule_of(run)
    costs = clock_costs(run, sch, *boundary_of(run))
    live = [[tuple(span) for span in rank] for rank in live_spans(sch, costs)]
    assert live == simulated_spans(sch, costs)  # every float equal, not approximately
    assert any(op in RECVS and end > start for rank in live for op, _, _, start, end in rank)  # waits happen


def virtual_tracks(run: RunConfig, steps=(3, 4)) -> dict:
    sch = schedule_of(run)
    spans = simulated_spans(sch, clock_costs(run, sch, *boundary_of(run)))
    return {"clock": "test clock", "seconds": run.pipeline.clock != "unit", "ranks": [10 + r for r in range(sch.pp)],
            "tracks": [{step: rank for step in steps} for rank in spans]}


def test_the_timeline_draws_one_virtual_track_per_pipeline_rank():
    run = live_run(*LAYOUTS[0])
    tracks = virtual_tracks(run)
    trace = chrome_trace([{"rank": 0, "step": 3, "scope": "", "phase": "forward", "start": 1.0, "duration": 0.5}],
                         [], steps={3, 4}, virtual=tracks)
    ev = trace["traceEvents"]
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")}
    assert "virtual clock: test clock (modelled seconds)" in names
    assert {"pipeline rank 0 (world rank 10)", "pipeline rank 1 (world rank 11)"} <= names
    virtual = [e for e in ev if e["ph"] == "X" and e["pid"] == 1]  # the process after the last rank's
    sch = schedule_of(run)
    step = simulate(sch, clock_costs(run, sch, *boundary_of(run))).step
    for tid, rank in enumerate(tracks["tracks"]):
        mine = sorted((e for e in virtual if e["tid"] == tid), key=lambda e: e["ts"])
        want = [(op, j, c, s, e) for op, j, c, s, e in rank[3] if op in COMPUTE or e > s]  # a wait only if it waited
        assert [(e["args"]["virtual_start"], e["args"]["virtual_end"]) for e in mine] == \
            [(s, e) for *_, s, e in want] * 2  # steps 3 and 4
        assert [e["name"] for e in mine[:len(want)]] == [f"{op}{j}" if op in COMPUTE else "wait"
                                                         for op, j, *_ in want]
        ns = lambda us: round(us * 1000)  # noqa: E731 - the trace's µs with 3 decimals, as whole ns
        assert all(ns(a["ts"] + a["dur"]) <= ns(b["ts"]) for a, b in zip(mine, mine[1:]))  # one track, no overlap
        second = mine[len(want)]  # step 4 starts where step 3 ended on its slowest rank
        assert second["ts"] == pytest.approx((step + second["args"]["virtual_start"]) * 1e6, abs=1e-3)


def test_the_unit_clock_is_drawn_as_milliseconds():
    run = live_run(GPT, 1, 1, 4, False, "float64", Pipeline("afab", 3))
    trace = chrome_trace([], [], steps={3}, virtual=virtual_tracks(run, steps=(3,)))
    [name] = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert name == "virtual clock: test clock (1 unit drawn as 1 ms)"
    last = max((e for e in trace["traceEvents"] if e["ph"] == "X"), key=lambda e: e["ts"] + e["dur"])
    assert last["ts"] + last["dur"] == pytest.approx(simulate(schedule_of(run)).step * UNIT_DRAWN_AS * 1e6)


DEMO = ["--pp", "2", "--tp", "2", "--microbatches", "4", "--steps", "2", "--timeline-steps", "2"]


def demo_run(monkeypatch, args: list[str], out) -> RunConfig:
    """The ``RunConfig`` the demo builds from ``args`` on 4 ranks (its own parser)."""
    import tpsim.demo.cli as cli

    monkeypatch.setattr(cli, "world_size", lambda: 4)
    return cli.parse([*args, "--out", str(out)]).run


@pytest.mark.slow
@pytest.mark.parametrize("clock", ["h100", "unit"])
def test_the_demos_virtual_tracks_are_simulates_spans(tmp_path, monkeypatch, clock):
    """The demo at PP 2 x TP 2: every F, B and wait of timeline.json's virtual tracks at simulate's times (the unit
    clock exactly; a GPU's with each action's collectives, to 1e-12 relative), both kept steps, and under a GPU the
    collectives after the schedule drawn; pipeline.json's clock, makespan and step; the BUBBLE CHECK line."""
    args = [*DEMO, "--clock", clock]
    r = run_mpi(4, ["-m", "tpsim.demo", *args, "--out", str(tmp_path)], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    run = demo_run(monkeypatch, args, tmp_path)
    sch = schedule_of(run)
    costs = clock_costs(run, sch, *boundary_of(run))
    costs = costs if clock == "unit" else with_collectives(run, sch, costs)
    want = simulated_spans(sch, costs)
    trace = json.loads((tmp_path / "timeline.json").read_text())
    virtual = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 4]
    tol = 0 if clock == "unit" else 1e-12
    for tid, rank in enumerate(want):
        got = sorted((e for e in virtual if e["tid"] == tid and e["cat"] != "collective"), key=lambda e: e["ts"])
        drawn = [(op if op in COMPUTE else "wait", j, s, e) for op, j, _, s, e in rank if op in COMPUTE or e > s]
        assert [(e["name"][0] if e["name"] != "wait" else "wait", e["args"]["microbatch"]) for e in got] == \
            [(op, j) for op, j, _, _ in drawn] * 2
        times = [t for e in got for t in (e["args"]["virtual_start"], e["args"]["virtual_end"])]
        assert times == pytest.approx([t for *_, s, e in drawn for t in (s, e)] * 2, rel=tol, abs=0)
        assert {e["args"]["step"] for e in got} == {0, 1}
        after = {e["name"] for e in virtual if e["tid"] == tid and e["cat"] == "collective"}
        assert after == (set() if clock == "unit" else {"loss broadcast", "embedding all-reduce"})
    pipe = json.loads((tmp_path / "pipeline.json").read_text())
    timeline = simulate(sch, costs)
    assert pipe["makespan"] == pytest.approx(timeline.step, rel=tol, abs=0)
    assert pipe["bubble_fraction"]["measured"] == pytest.approx(timeline.bubble_fraction, rel=1e-12, abs=0)
    line = next(x for x in r.stdout.splitlines() if x.startswith("BUBBLE CHECK"))
    if clock == "unit":
        assert pipe["time_unit"] == "unit" and pipe["clock_gpu"] is None and "planner" not in pipe
        assert pipe["step_time"] == pipe["makespan"]  # nothing charged after the schedule
        assert line.startswith("BUBBLE CHECK: MATCH — on the unit clock (F 1, B 2)")
    else:
        terms = pipeline_terms(model_spec(run.model), run_layout(run), gpu("h100-80gb"))
        assert pipe["clock_gpu"] == "h100-80gb" and pipe["mfu"] is None and pipe["time_unit"] == "s"
        assert pipe["makespan"] == pytest.approx(terms["makespan_s"], rel=1e-12, abs=0)
        assert pipe["step_time"] == pytest.approx(terms["step_s"], rel=1e-12, abs=0)
        assert pipe["step_time"] > pipe["makespan"]  # the loss broadcast and the embedding's all-reduce
        assert pipe["planner"]["makespan_s"] == terms["makespan_s"] and pipe["planner"]["step_s"] == terms["step_s"]
        assert line.startswith("BUBBLE CHECK: MATCH — on the h100-80gb clock") and "(equal to 1e-12 relative)" in line
        assert "assumes equal stages and free messages: rank 1 (it holds the LM head) is busy" in line
        assert "the collectives inside F, B and W add" in line
        assert "the messages add" in line and "MISMATCH" not in r.stdout


@pytest.mark.slow
def test_the_step_prices_each_dp_bucket_the_run_cut(tmp_path, monkeypatch):
    """PP 2 x DP 2 with one DP bucket per tensor (--bucket-mb 0): the live step pays α on every bucket's
    all-reduce, and the planner given the run's buckets says the same step; one bucket a stage would be less."""
    args = ["--pp", "2", "--dp", "2", "--microbatches", "2", "--steps", "1", "--bucket-mb", "0", "--clock", "h100"]
    r = run_mpi(4, ["-m", "tpsim.demo", *args, "--out", str(tmp_path)], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BUBBLE CHECK: MATCH — on the h100-80gb clock" in r.stdout and "MISMATCH" not in r.stdout
    pipe = json.loads((tmp_path / "pipeline.json").read_text())
    assert pipe["step_time"] == pytest.approx(pipe["planner"]["step_s"], rel=1e-12, abs=0)
    run = demo_run(monkeypatch, args, tmp_path)
    coarse = pipeline_terms(model_spec(run.model), run_layout(run), gpu("h100-80gb"))["step_s"]
    assert coarse < pipe["step_time"]  # one all-reduce a stage pays α once, not once a tensor


# one launch per case, by design: each is its own error path, and a program stops at its first error
@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--pp", "2", "--clock", "tpu"], "--clock 'tpu' is neither unit nor a GPU: choose unit or one of h100-80gb"),
    (["--pp", "2", "--clock", "a100"], "--clock 'a100' names more than one GPU"),
    (["--overlap-param-gather"], "--overlap-param-gather (ZeRO's all-gather under the next forward) needs --zero 1 or 2"),
    (["--pp", "2", "--mfu", "0.3"], "--mfu 0.3 prices a GPU clock: give --clock GPU too"),
])
def test_a_clock_the_demo_cannot_take_is_one_line_before_any_work(args, message):
    r = run_mpi(2, ["-m", "tpsim.demo", *args], timeout=60)
    assert r.returncode == 2
    errors = [line for line in without_launcher_notices(r.stderr).splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("tpsim.demo: error: ") and message in errors[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
