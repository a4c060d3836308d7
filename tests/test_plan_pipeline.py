"""The planner's pipeline terms (``tpsim.plan.pipeline``): the schedule's own lists on the virtual clock at real size.

The fast clock (``tpsim.pipeline.stage_clock``) is the clock of ``tpsim.pipeline.clock.simulate`` on ``build``'s
lists, under random per-stage costs; at unit costs the planner's bubble and in flight are the formulas of
``tpsim.predict.pipeline``; with FLOP-derived costs the measured bubble exceeds the formula by what a heavier
last stage (the LM head) or uneven ``--pp-layers`` explain, written out as 1F1B's makespan; the p2p bytes are
2·m·(v·p − 1)·b·s·h·e (÷ t under SP); memory holds the schedule's peak in flight; bad layouts are one line and
exit 2.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace

import numpy as np
import pytest

from tpsim.errors import ConfigError
from tpsim.pipeline.actions import SENDS, Schedule, with_messages
from tpsim.pipeline.clock import Costs, simulate as clock_simulate
from tpsim.pipeline.schedules import SCHEDULES, build, compute_orders
from tpsim.pipeline.stage_clock import compile_orders, compiled, in_flight_peak, timed
from tpsim.plan.cli import main
from tpsim.plan.layout import Layout
from tpsim.plan.memory import activation_bytes_per_layer, busiest_stage, logits_bytes, stage_memory
from tpsim.plan.models import PRESETS
from tpsim.plan.pipeline import simulate
from tpsim.gpus import gpu as gpu_preset
from tpsim.plan.timing import flops_per_step
from tpsim.partition import padded_vocab_size
from tpsim.plan.planner import plan
from tpsim.plan.published import compare, load, row_layout, row_model
from tpsim.plan.search import search
from tpsim.plan.timing import head_flops, layer_flops
from tpsim.predict import pipeline as formula

LLAMA70, LLAMA405, GPT3 = PRESETS["llama3-70b"], PRESETS["llama3-405b"], PRESETS["gpt3-175b"]
LAYOUT = Layout(tp=8, pp=4, dp=2, sp=True, recompute="selective", seq_len=8192, global_batch=256)  # lesson 16's
META_405B = (7,) + (8,) * 14 + (7,)  # Llama-3 405B's 126 layers on 16 stages: one fewer on the first and last


def sizes(name: str, p: int):
    for v in ((1, 2, 3) if name == "interleaved" and p > 1 else (1,)):
        for m in range(1, 13):
            if name != "interleaved" or v == 1 or m % p == 0:
                yield m, v


@pytest.mark.parametrize("p", range(1, 7))
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_the_fast_clock_is_the_clock(name, p):
    """Random costs per (rank, chunk, op) and per message (sender stage, direction): the same step, busy time and
    end of every rank, the same peak in flight and sends."""
    rng = random.Random(f"{name}{p}")
    for m, v in sizes(name, p):
        compute = [[[rng.uniform(0.1, 2) for _ in range(3)] for _ in range(v)] for _ in range(p)]
        message = [[rng.uniform(0, 0.5) for _ in range(2)] for _ in range(p * v)]
        costs = Costs({op: (lambda i: lambda r, c, j: compute[r][c][i])(i) for i, op in enumerate("FBW")}, beta=1,
                      message_bytes=lambda d, j, s: message[s][d == "B"])
        want, got = clock_simulate(build(name, p, m, v), costs), timed(compiled(name, p, m, v), compute, message)
        assert got.step == pytest.approx(want.step, abs=1e-12), (name, p, m, v)
        assert np.allclose(got.busy, want.busy, rtol=0, atol=1e-12) and got.finish == pytest.approx(want.finish)
        assert got.bubble_fraction == pytest.approx(want.bubble_fraction, abs=1e-12)
        assert in_flight_peak(compiled(name, p, m, v), np.ones((p, v))) == want.peak_in_flight
        assert compiled(name, p, m, v).sends == tuple(sum(a.op in SENDS for a in r) for r in want.schedule.ranks)


def unit_costs(lay: Layout) -> np.ndarray:
    """The textbook's: a stage's F 1, B 2 (split: B 1, W 1), each of v chunks 1/v of that."""
    split = lay.schedule == "zb-h1"
    return np.tile([1, 1, 1] if split else [1, 2, 0], (lay.pp, lay.vp, 1)) / lay.vp


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 3), (8, 16), (8, 64), (16, 256)])
def test_at_unit_costs_the_planners_bubble_and_in_flight_are_the_formulas(name, p, m):
    for v in ((1, 2, 4) if name == "interleaved" else (1,)):
        if v > 1 and m % p:
            continue
        lay = Layout(pp=p, dp=1, micro_batch=1, global_batch=m, schedule=name, vp=v)
        out = simulate(lay, unit_costs(lay), np.zeros((p * v, 2)))
        assert abs(out["bubble_fraction"]["measured"] - formula.bubble_fraction(name, p, m, v)) <= 1e-9
        assert out["bubble_fraction"]["formula"] == formula.bubble_fraction(name, p, m, v)
        assert [r["peak_in_flight"] for r in out["ranks"]] == formula.peak_in_flight(name, p, m, v)
        assert out["makespan_s"] == out["makespan_without_p2p_s"]


def test_compute_is_the_mean_busy_time_so_the_stage_flops_add_up_to_the_step():
    """Under the flat ``--mfu``, Σ of every stage's F + B + W FLOPs = Narayanan's count: the clock's mean busy
    time is ``compute``; the step's parts add up to it under either time model."""
    for model, lay in ((LLAMA70, LAYOUT), (LLAMA70, replace(LAYOUT, schedule="interleaved", vp=2)),
                       (LLAMA70, replace(LAYOUT, schedule="zb-h1", recompute="full")),
                       (LLAMA405, Layout(tp=8, pp=16, dp=8, sp=True, seq_len=8192, global_batch=1024,
                                         stage_layers=META_405B)),
                       (GPT3, Layout(tp=8, pp=8, dp=4, recompute="none", seq_len=2048, global_batch=512))):
        flat = plan(model, replace(lay, mfu=0.5))
        busy = [r["busy_s"] - r["collectives_s"] for r in flat.pipeline["ranks"]]  # the FLOPs' share
        peak = gpu_preset(lay.gpu).peak(lay.dtype)
        assert sum(busy) / len(busy) == pytest.approx(flat.time_s["compute"], rel=1e-12)
        padded = replace(model, vocab=padded_vocab_size(model.vocab, lay.tp))  # the head computes Vp/t columns
        assert flat.time_s["compute"] * lay.gpus * peak * 0.5 == pytest.approx(flops_per_step(padded, lay),
                                                                                   rel=1e-12)
        for p in (flat, plan(model, lay)):
            t = p.time_s
            assert t["compute"] + t["tp"] + t["bubble"] + t["pp"] == pytest.approx(t["pipeline"], rel=1e-12)
            parts = ("compute", "tp", "bubble", "pp", "loss", "embedding", "dp", "optimizer", "dp_gather")
            assert t["step"] == pytest.approx(sum(t[k] for k in parts), rel=1e-12)
            assert t["step"] == pytest.approx(p.pipeline["step_s"] + t["optimizer"] + t["dp_gather"], rel=1e-12)
            assert (t["embedding"] > 0) == model.tied  # GPT-3's tied embedding: first + last stage


def test_the_lm_head_makes_the_last_stage_heavier_and_the_bubble_larger():
    """1F1B with p − 1 equal stages and a heavier last one: the makespan is (p − 1)(t_f + t_b) to fill and
    drain plus m (t_f' + t_b') of the last stage, whose pace the others wait for. Priced flat (time ∝ FLOPs),
    the head's 2·h·V a token weighs what it does in FLOPs."""
    p = plan(LLAMA70, replace(LAYOUT, mfu=0.5))
    pipe, stages, m = p.pipeline, p.pipeline["stages"], LAYOUT.microbatches
    assert stages[3]["F_s"] > stages[0]["F_s"] == stages[1]["F_s"] == stages[2]["F_s"]
    fill = 3 * (stages[0]["F_s"] + stages[0]["B_s"])
    assert pipe["makespan_compute_only_s"] == pytest.approx(fill + m * (stages[3]["F_s"] + stages[3]["B_s"]),
                                                            rel=1e-12)
    f, b = ([s[f"{op}_s"] + s[f"{op}_collectives_s"] for s in stages] for op in "FB")  # what the clock charges
    assert f[3] > f[0] > f[1] == f[2]  # stage 0's F also runs the embedding's all-reduce
    fill = sum(f[:3]) + sum(b[:3])  # the last stage still sets the pace: fill, m of its own, drain
    assert pipe["makespan_without_p2p_s"] == pytest.approx(fill + m * (f[3] + b[3]), rel=1e-12)
    assert pipe["bubble_fraction"]["formula"] == pytest.approx(3 / 131, rel=1e-15)
    assert pipe["bubble_fraction"]["measured"] > 2 * pipe["bubble_fraction"]["formula"]


def test_uneven_stages_idle_more_than_the_formula_and_the_busiest_sets_the_pace():
    lay = Layout(tp=8, pp=16, dp=8, sp=True, seq_len=8192, global_batch=1024, stage_layers=META_405B)
    p = plan(LLAMA405, lay)
    pipe = p.pipeline
    assert [r["layers"] for r in pipe["ranks"]] == list(META_405B)
    busy = [r["busy_s"] for r in pipe["ranks"]]
    assert max(busy) == busy[1] > busy[0] and busy[0] < busy[15] < busy[1]  # 8 layers > 7 + the head > 7
    assert pipe["bubble_fraction"]["measured"] > pipe["bubble_fraction"]["formula"]
    assert p.per_gpu["stage"] == 1  # 8 layers x 15 in flight: more than stage 0's 7 x 16
    even = plan(LLAMA70, replace(LAYOUT, stage_layers=(20, 20, 20, 20)))
    assert even.pipeline == plan(LLAMA70, LAYOUT).pipeline
    heavy_first = plan(LLAMA70, replace(LAYOUT, stage_layers=(23, 19, 19, 19)))
    assert heavy_first.pipeline["bubble_fraction"]["measured"] > even.pipeline["bubble_fraction"]["measured"]


@pytest.mark.parametrize("schedule, vp", [("afab", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2),
                                          ("interleaved", 5)])
@pytest.mark.parametrize("sp", [False, True])
def test_p2p_bytes_are_2m_vp_minus_1_boundary_tensors(schedule, vp, sp):
    lay = replace(LAYOUT, sp=sp, schedule=schedule, vp=vp)
    p = plan(LLAMA70, lay)
    b, s, h, e, t, m = 1, 8192, LLAMA70.hidden, 2, 8, lay.microbatches
    tensor = b * s * h * e // (t if sp else 1)
    assert p.pipeline["p2p_bytes"]["measured"] == p.pipeline["p2p_bytes"]["formula"]
    assert p.pipeline["p2p_bytes"]["measured"] == 2 * m * (vp * 4 - 1) * tensor
    sends = [m * (2 * vp - 1), 2 * m * vp, 2 * m * vp, m * (2 * vp - 1)]  # the ends of the model send one way
    assert [r["sends"] for r in p.pipeline["ranks"]] == sends
    assert p.per_gpu["wire_bytes_per_step"]["pp"] == sends[p.per_gpu["stage"]] * tensor


def test_memory_holds_the_schedules_peak_in_flight():
    """Activations on the first stage: 1F1B L/p x p, AFAB L/p x m, ZB-H1 L/p x p, interleaved
    L/(pv) x (2(p − 1) + (v − 1)p + 1) = L(1 + (p − 1)/(pv)) layers (Korthikanti et al. 2022's factor)."""
    layer, L, p, m = activation_bytes_per_layer(LLAMA70, LAYOUT)["paper"], 80, 4, LAYOUT.microbatches
    first = {("1f1b", 1): L / p * p, ("afab", 1): L / p * m, ("zb-h1", 1): L / p * p,
             ("interleaved", 2): L / 8 * (2 * 3 + 4 + 1), ("interleaved", 4): L / 16 * (2 * 3 + 12 + 1)}
    for (schedule, vp), layers in first.items():
        lay = replace(LAYOUT, schedule=schedule, vp=vp)
        assert stage_memory(LLAMA70, lay, 0)["activations"] == pytest.approx(layers * layer, rel=1e-12)
        if schedule == "interleaved":
            assert layers == pytest.approx(L * (1 + (p - 1) / (p * vp)))
    zb = replace(LAYOUT, schedule="zb-h1")  # every stage holds p: the last, with its logits and head, the most
    mem = busiest_stage(LLAMA70, zb)
    assert mem["stage"] == 3 and mem["activations"] == pytest.approx(20 * 4 * layer + logits_bytes(LLAMA70, zb),
                                                                      rel=1e-12)
    mem = busiest_stage(LLAMA70, replace(zb, stage_layers=(18, 24, 20, 18)))  # the most layers, the most memory
    assert mem["stage"] == 1 and mem["activations"] == pytest.approx(24 * 4 * layer, rel=1e-12)
    last = busiest_stage(LLAMA70, replace(LAYOUT, pp=1, dp=8))
    assert last["activations"] == pytest.approx(80 * layer + logits_bytes(LLAMA70, replace(LAYOUT, pp=1)), rel=1e-12)


@pytest.mark.parametrize("argv, says", [
    (["--global-batch", "200", "--dp", "4", "--schedule", "interleaved", "--vp", "2"],
     "50 micro-batches (global batch / (dp x micro-batch)) must be a multiple of --pp 4"),
    (["--schedule", "1f1b", "--vp", "2"], "--schedule 1f1b runs one model chunk per rank"),
    (["--schedule", "interleaved", "--vp", "3"], "layers 80 not divisible by pp 4 x vp 3 (give --pp-layers)"),
    (["--pp-layers", "20,20,20"], "--pp-layers 20,20,20: 4 stages (pp x vp) of at least one layer each, 80"),
    (["--pp-layers", "20,20,a,20"], "--pp-layers 20,20,a,20: whole numbers separated by commas"),
    (["--pp", "1", "--dp", "8", "--schedule", "interleaved", "--vp", "2"], "--vp 2: model chunks interleave"),
])
def test_a_bad_pipeline_is_one_line_and_exit_2(capsys, argv, says):
    base = ["--model", "llama3-70b", "--tp", "8", "--pp", "4", "--dp", "2", "--seq-len", "8192", "--global-batch",
            "256"]
    assert main(base + argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert captured.out == ""


def test_json_carries_the_schedule_the_bubble_and_the_p2p_bytes(capsys):
    assert main(["--model", "llama3-70b", "--tp", "8", "--pp", "4", "--dp", "2", "--sp", "--seq-len", "8192",
                 "--global-batch", "256", "--schedule", "interleaved", "--vp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (out["layout"]["schedule"], out["layout"]["vp"], out["layout"]["stage_layers"]) == ("interleaved", 2, None)
    pipe = out["pipeline"]
    assert {"schedule", "pp", "vp", "microbatches", "bubble_fraction", "p2p_bytes", "messages", "makespan_s",
            "makespan_without_p2p_s", "ranks", "stages"} <= set(pipe)
    assert set(pipe["bubble_fraction"]) == set(pipe["p2p_bytes"]) == {"measured", "formula"}
    assert {"rank", "layers", "busy_s", "idle_s", "peak_in_flight", "sends"} <= set(pipe["ranks"][0])
    assert [s["virtual_stage"] for s in pipe["stages"]] == list(range(8)) and out["layout"]["in_flight"] == 11


def test_search_runs_the_schedule_it_is_given():
    base = Layout(sp=True, recompute="selective", seq_len=8192, global_batch=256, schedule="interleaved", vp=2)
    plans = search(LLAMA70, base, 64, keep_all=True)
    assert plans and {(q.layout["schedule"], q.layout["vp"] if q.layout["pp"] > 1 else 2)
                      for q in plans} == {("interleaved", 2)}
    assert all(80 % (q.layout["pp"] * q.layout["vp"]) == 0 for q in plans)


def test_published_runs_use_their_scripts_interleaving_and_it_raises_the_planners_numbers():
    """Megatron-LM's sc21/run_table_1.sh: 5 layers a virtual stage at PP 8 (v 2), 1 at PP 35 (v 3)."""
    rows = {r["name"]: r for r in load()}
    for name, vp, per in (("N21-145.6B", 2, 5), ("N21-529.6B", 3, 1)):
        lay, model = row_layout(rows[name]), row_model(rows[name])
        assert (lay.schedule, lay.vp, model.layers // (lay.pp * lay.vp)) == ("interleaved", vp, per)
        interleaved, plain = compare([rows[name]])["rows"][0]["plan"], plan(model, replace(lay, schedule="1f1b",
                                                                                            vp=1))
        assert interleaved.tflops_per_gpu > plain.tflops_per_gpu
        assert interleaved.time_s["bubble"] < plain.time_s["bubble"]


def test_thousands_of_micro_batches_plan_in_a_fraction_of_a_second():
    """PP 16 x 2048 micro-batches: 65,536 F and B timed twice; compiling is cached per (schedule, p, m, v)."""
    compiled.cache_clear()
    t0 = time.process_time()
    p = plan(LLAMA70, Layout(tp=4, pp=16, dp=1, sp=True, recompute="selective", seq_len=8192, global_batch=2048))
    assert time.process_time() - t0 < 1.0 and p.pipeline["microbatches"] == 2048


@pytest.mark.parametrize("recompute, redo", [("none", 0), ("selective", 1), ("full", None)])
def test_backward_splits_into_dx_and_dw_as_a_matmul_does(recompute, redo):
    """Per token and layer: W (dW) = 2·w = the weight matmuls' forward; B (dX) = 2·w + 8·s·h (attention has no
    weights); recomputation joins B. F + B + W = 3 forwards + the recomputed part."""
    lay = replace(LAYOUT, recompute=recompute)
    s, h = lay.seq_len, LLAMA70.hidden
    f = layer_flops(LLAMA70, lay)
    weights = (f["F"] - 4 * s * h) / 2
    assert f["W"] == 2 * weights and f["B"] - f["W"] == 8 * s * h + (f["F"] if redo is None else redo * 4 * s * h)
    assert head_flops(LLAMA70) == dict.fromkeys("FBW", 2 * h * LLAMA70.vocab)
    split = plan(LLAMA70, replace(lay, schedule="zb-h1")).pipeline["stages"]
    joined = plan(LLAMA70, lay).pipeline["stages"]
    assert all(z["B_s"] + z["W_s"] == pytest.approx(j["B_s"], rel=1e-15) and j["W_s"] == 0
               for z, j in zip(split, joined))


def test_compute_orders_the_fast_clock_cannot_time_get_the_checkers_line(monkeypatch):
    """A backward before its forward on the last stage, or a forward missing: the checker's one line, raised
    (``build`` stands in for lists a generator got wrong)."""
    import tpsim.pipeline.stage_clock as stage_clock

    good = compute_orders("1f1b", 2, 2)
    swapped = [good[0], [good[1][1], good[1][0], *good[1][2:]]]  # last stage: B0 before F0
    missing = [good[0], good[1][1:]]  # last stage: no F0, so no receive of stage 0's activation
    for orders, says in ((swapped, "comes before F of micro-batch 0"), (missing, "rank 1 has no matching RECV_F0")):
        monkeypatch.setattr(stage_clock, "build", lambda *a, o=orders: Schedule("1f1b", 2, 2, 1, tuple(
            with_messages(2, 1, r, o[r]) for r in range(2))))
        with pytest.raises(ConfigError, match=says):
            compile_orders("1f1b", 2, 2, 1, orders)
