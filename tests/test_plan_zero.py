"""ZeRO-2 and ZeRO-3 in the planner (``tpsim plan --zero 2|3``): model state, bytes, time, by hand.

Stage by stage the sharded columns (Rajbhandari et al. 2019 §5: the optimizer, then the gradients, then the
parameters ÷ d) in every recipe; the paper's Figure 1 as it prints it; ZeRO-2's bytes equal ZeRO-1's and its
time ZeRO-1's with ``--overlap-grad-reduce`` at one micro-batch, every micro-batch's reduce-scatters on the
stream at m;
ZeRO-3's 1.5× DDP at one micro-batch in one dtype, m times that under a pipeline; its two gathered pieces; the
step's parts still adding up; Llama 3 405B fitting on Meta's layout with ZeRO-2. Stages 0 and 1 keep every
number they had (the other tests/test_plan*.py hold them).
"""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction

import pytest

from tpsim.cost import wire_bytes
from tpsim.plan.cli import main
from tpsim.plan.comm import dp_collectives, dp_wire_bytes, links, ring_seconds
from tpsim.gpus import gpu
from tpsim.plan.layout import Layout, problems
from tpsim.plan.memory import STATE_BYTES, ZERO_PAPER_STATE_BYTES, stage_memory, state_bytes_per_param
from tpsim.plan.models import PRESETS
from tpsim.plan.planner import plan
from tpsim.plan.published import ZERO_PAPER_GB, format_zero_example, zero_stages_example
from tpsim.partition import padded_vocab_size
from tpsim.plan.zero3 import held_bucket, piece_elements
from tpsim.plan.zero3_time import exposed
from time_invariants import stream_problems

GPT2, L8B, L405B = PRESETS["gpt2"], PRESETS["llama3-8b"], PRESETS["llama3-405b"]
H100 = gpu("h100-80gb")
PARTS = ("compute", "tp", "cp", "bubble", "pp", "loss", "embedding", "dp", "optimizer", "dp_gather", "zero3_gather")
META_SPLIT = (7,) + (8,) * 14 + (7,)  # Llama 3 405B's 126 layers, one fewer on the first and the last stage
META_8K = ["--model", "llama3-405b", "--tp", "8", "--pp", "16", "--dp", "64", "--sp", "--attention", "fused",
           "--seq-len", "8192", "--global-batch", "2048", "--pp-layers", ",".join(map(str, META_SPLIT))]
RECIPES = {  # (params, grads, optimizer) bytes a parameter
    "float16": (2, 4, 12), "bfloat16": (2, 4, 12), "float32": (4, 4, 8), "float64": (8, 8, 16),
    "paper": ZERO_PAPER_STATE_BYTES}


def small(**kw) -> Layout:
    return Layout(**{"tp": 2, "dp": 4, "seq_len": 1024, "micro_batch": 2, "global_batch": 8, **kw})


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_each_stage_shards_one_more_column(recipe, d):
    """p + g + o, p + g + o/d, p + (g + o)/d, (p + g + o)/d: exactly (each a Fraction of the table's)."""
    p, g, o = RECIPES[recipe]
    want = [p + g + o, p + g + Fraction(o, d), p + Fraction(g + o, d), Fraction(p + g + o, d)]
    table = None if recipe != "paper" else ZERO_PAPER_STATE_BYTES
    dtype = "float16" if recipe == "paper" else recipe
    assert RECIPES[recipe] == (ZERO_PAPER_STATE_BYTES if table else STATE_BYTES[dtype])
    for zero, total in enumerate(want):
        got = state_bytes_per_param(dtype, zero, d, table=table)
        assert Fraction(got["total"]).limit_denominator(10 ** 6) == total, (recipe, zero, d, got)
        assert got["total"] == got["params"] + got["grads"] + got["optimizer"]


def test_the_named_recipes_per_stage():
    """The paper's 16 → 4 + 12/d → 2 + 14/d → 16/d; Megatron's bf16 18 → 6 + 12/d → 2 + 16/d → 18/d;
    tpsim's float64 32 → 16 + 16/d → 8 + 24/d → 32/d (d = 8)."""
    d = 8
    for dtype, table, want in (("float16", ZERO_PAPER_STATE_BYTES, (16, 4 + 12 / d, 2 + 14 / d, 16 / d)),
                               ("bfloat16", None, (18, 6 + 12 / d, 2 + 16 / d, 18 / d)),
                               ("float64", None, (32, 16 + 16 / d, 8 + 24 / d, 32 / d))):
        got = [state_bytes_per_param(dtype, z, d, table=table)["total"] for z in range(4)]
        assert got == pytest.approx(want, rel=1e-15), dtype


def test_the_zero_papers_figure_1_as_printed():
    """7.5 B parameters, Nd = 64: 120 → 31.4 → 16.6 → 1.9 GB (GB = 1e9; 1.875 rounds up, as the paper does)."""
    rows = zero_stages_example()
    assert tuple(r["paper_gb"] for r in rows) == ZERO_PAPER_GB == (120.0, 31.4, 16.6, 1.9)
    assert [r["gb"] for r in rows] == pytest.approx([120.0, 31.40625, 16.640625, 1.875], rel=1e-15)
    assert rows[2]["planner_gb"] == pytest.approx(7.5 * (2 + 16 / 64))  # bf16 with fp32 gradient pieces
    text = format_zero_example()
    assert "P_os+g+p" in text and "1.875" in text and "1.9" in text


def test_zero_example_on_the_command_line(capsys):
    assert main(["--zero-example", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "float32 B/param" in out and "31.4" in out and "16.6" in out


def test_zero_2_moves_zero_1s_bytes_and_takes_its_time():
    """At one micro-batch a step: the same reduce-scatter, the same all-gather (§7); ZeRO-2 issues each bucket's
    as the backward finishes it, so its step is ZeRO-1's with ``--overlap-grad-reduce`` to the last bit (the flag
    itself changes nothing for ZeRO-2); only the gradients shrink."""
    for lay in (small(zero=1), small(zero=1, cp=2, seq_len=2048)):
        assert lay.microbatches == 1
        one, two = plan(GPT2, replace(lay, overlap_grad_reduce=True)), plan(GPT2, replace(lay, zero=2))
        assert dp_collectives(replace(lay, zero=2), 1000) == dp_collectives(lay, 1000)
        assert two.per_gpu["wire_bytes_per_step"] == one.per_gpu["wire_bytes_per_step"]
        assert two.time_s == one.time_s == plan(GPT2, replace(lay, zero=2, overlap_grad_reduce=True)).time_s
        assert two.time_s["dp"] < plan(GPT2, lay).time_s["dp"]  # ZeRO-1 without the flag: all after
        m1, m2 = one.per_gpu["memory_bytes"], two.per_gpu["memory_bytes"]
        assert m2["grads"] == round(m1["grads"] / lay.grad_replicas) and m2["params"] == m1["params"]


def test_zero_2_with_micro_batches_reduce_scatters_each_one():
    """m > 1: the owned slices accumulate, so every micro-batch's gradients are reduce-scattered — m times ZeRO-1's
    reduce-scatter, the one all-gather after the step; the memory still g/d, the DP time longer."""
    lay = small(zero=1, pp=2, dp=2, global_batch=8)
    m = lay.microbatches
    assert m > 1
    (rs1, n1), (ag1, a1) = dp_collectives(lay, 1000)
    (rs2, n2), (ag2, a2) = dp_collectives(replace(lay, zero=2), 1000)
    assert (rs1, ag1) == (rs2, ag2) == ("reduce_scatter", "all_gather") and n2 == m * n1 and a2 == a1
    one, two = plan(GPT2, replace(lay, overlap_grad_reduce=True)), plan(GPT2, replace(lay, zero=2))
    for z1, z2 in zip(*(p.pipeline["after_schedule"]["dp_streams"] for p in (one, two))):
        # every (bucket, micro-batch) once — the tied embedding's, held for its sum, once a step — none early
        held = [b["bucket"] for b in z2["buckets"] if b["microbatch"] == -1]
        want = {(b, j) for b in range(len(z1["buckets"])) for j in range(m) if b not in held}
        assert sorted((b["bucket"], b["microbatch"]) for b in z2["buckets"]) == sorted(want | {(b, -1) for b in held})
        assert len(held) == 1 and not stream_problems(z2)
        seconds = {b["bucket"]: b["end"] - b["start"] for b in z1["buckets"]}
        assert z2["comm_s"] == pytest.approx(sum(t * (1 if b in held else m) for b, t in seconds.items()), rel=1e-9)
        assert z2["comm_s"] > z1["comm_s"] and z2["exposed_s"] >= z1["exposed_s"] and z2["hidden_s"] > 0
    assert two.time_s["step"] >= one.time_s["step"]
    m1, m2 = one.per_gpu["memory_bytes"], two.per_gpu["memory_bytes"]
    assert m2["grads"] == round(m1["grads"] / lay.grad_replicas)


@pytest.mark.parametrize("d", [2, 4, 64])
def test_zero_3_is_one_and_a_half_ddp_in_one_dtype(d):
    """One micro-batch, float32 (params and grads 4 bytes): reduce-scatter + 2 all-gathers = 3(d−1)/d·N,
    DDP's all-reduce 2(d−1)/d·N; m micro-batches: m times ZeRO-3's, DDP's unchanged."""
    n, lay = 10_000_000, Layout(dp=d, dtype="float32", micro_batch=1, global_batch=d)
    ddp, z3 = dp_wire_bytes(lay, n), dp_wire_bytes(replace(lay, zero=3), n)
    assert Fraction(z3, ddp) == Fraction(3, 2)
    assert z3 == 3 * wire_bytes("all_gather", 4 * n, d)
    four = replace(lay, zero=3, global_batch=4 * d)
    assert four.microbatches == 4 and dp_wire_bytes(four, n) == 4 * z3
    assert dp_wire_bytes(replace(four, zero=0), n) == ddp


def test_zero_3s_gathered_pieces_are_two_of_the_largest():
    """2·w·(p + g) on top of the activations, w the stage's largest piece on one TP rank; nothing at d = 1."""
    lay = small(zero=3, pp=2, dp=2)
    for stage in (0, 1):
        pieces = piece_elements(GPT2, lay, stage)
        mem, two = stage_memory(GPT2, lay, stage), stage_memory(GPT2, replace(lay, zero=2), stage)
        assert sum(pieces) == mem["param_count"]  # the pieces are the stage's parameters
        p, g, _ = STATE_BYTES["bfloat16"]
        assert mem["zero3_gathered"] == 2 * max(pieces) * (p + g)
        assert mem["activations"] - two["activations"] == mem["zero3_gathered"]
        assert mem["params"] == pytest.approx(two["params"] / 2)
    assert stage_memory(GPT2, small(zero=3, dp=1), 0)["zero3_gathered"] == 0


def test_the_prefetching_stream_by_hand():
    """Gathers of 3 s under 2 s pieces: the first waits 3 s, each later one 1 s; reduce-scatters' tail counts."""
    assert exposed([3, 3, 3], [2, 2, 2], [0, 0, 0]) == 3 + 1 + 1
    assert exposed([1, 1, 1], [2, 2, 2], [0, 0, 0]) == 1  # all but the first hidden
    assert exposed([0, 0], [2, 2], [3, 3]) == 4  # the second piece's scatter waits for the first's
    assert exposed([], [], []) == 0


@pytest.mark.parametrize("kw", [dict(), dict(pp=2, dp=2), dict(pp=2, dp=2, schedule="zb-h1"),
                                dict(pp=2, dp=2, schedule="interleaved", vp=2, global_batch=16),
                                dict(cp=2, seq_len=2048, sp=True), dict(dp=1)])
def test_zero_3s_step_adds_up(kw):
    """The parts sum to the step with ZeRO-3's own part; no gather after the step, and after the schedule no DP
    sync but the tied embedding's held bucket under a pipeline (one reduce-scatter, after its sum over the
    embedding group); zero3_gather is the ranks' mean of every action's exposed stream once a micro-batch."""
    lay = small(zero=3, **kw)
    p = plan(GPT2, lay)
    t = p.time_s
    assert t["step"] == pytest.approx(sum(t[k] for k in PARTS), rel=1e-12)
    held = held_bucket(GPT2, lay, lay.pp * lay.vp - 1) * STATE_BYTES["bfloat16"][1]
    d = lay.grad_replicas
    assert held == (0 if lay.pp == 1 else padded_vocab_size(GPT2.vocab, lay.tp) // lay.tp * GPT2.hidden * 4)
    assert t["dp"] == (ring_seconds("reduce_scatter", held, d, links(lay, H100)["dp"]) if held and d > 1 else 0)
    assert t["dp_gather"] == 0 and "param_gather" not in p.pipeline["after_schedule"]
    ranks = p.pipeline["ranks"]
    assert t["zero3_gather"] == pytest.approx(sum(r["zero3_s"] for r in ranks) / len(ranks), rel=1e-12)
    assert (t["zero3_gather"] > 0) == (lay.grad_replicas > 1)
    for zero in (0, 1, 2):
        assert plan(GPT2, replace(lay, zero=zero)).time_s["zero3_gather"] == 0


def test_one_pieces_gather_as_the_dp_link_prices_it():
    lay = small(zero=3)
    link = links(lay, H100)["dp"]
    layer = piece_elements(GPT2, lay, 0)[1]
    want = ring_seconds("all_gather", layer * 2, lay.grad_replicas, link)
    from tpsim.plan.zero3_time import piece_seconds
    gathers, scatters = piece_seconds(GPT2, lay, H100, 0)
    assert gathers[1] == want and scatters[1] == ring_seconds("reduce_scatter", layer * 4, 4, link)


def test_layout_rules_for_the_new_stages():
    assert not problems(GPT2, small(zero=2)) and not problems(GPT2, small(zero=3))
    assert any("--zero 4" in x for x in problems(GPT2, small(zero=4)))
    assert not problems(GPT2, small(zero=2, overlap_param_gather=True))
    assert any("needs --zero 1 or 2" in x for x in problems(GPT2, small(zero=3, overlap_param_gather=True)))


def test_llama3_405b_fits_on_metas_layout_with_zero_2(capsys):
    """TP 8 × PP 16 × DP 64 on 8,192 H100s, 8K tokens, 16 M tokens a step: ZeRO-1 fits by under a GB (its
    12.75 GB of float32 gradients whole), ZeRO-2 leaves 13.29 GB a GPU; its 32 micro-batches' reduce-scatters, one
    a bucket each, run under the next micro-batches' compute: 8.39 s of them hidden, 123.2 ms exposed — the last
    micro-batch's tail, as ZeRO-1 with ``--overlap-grad-reduce`` exposes — so 13.80 s a step against ZeRO-1's
    13.91 s without the flag (the DP group one rank a node: NCCL's ring on one NIC, ``tpsim.nccl``; buckets of
    Megatron's max(40 M, 1 M x 64) parameters); the first stage holding 8 layers beside the embedding with
    selective recompute, ZeRO-1 needs 89.53 GB (no fit), ZeRO-2 fits."""
    assert main([*META_8K, "--zero", "2", "--json"]) == 0
    out = capsys.readouterr().out
    p = json.loads(out.splitlines()[-1])
    assert p["fits"] and p["layout"]["gpus"] == 8192
    mem, usable = p["per_gpu"]["memory_bytes"], p["layout"]["gpu_usable_bytes"]
    assert round(mem["total"] / 1e9, 2) == 71.16 and round((usable - mem["total"]) / 1e9, 2) == 13.29
    assert "fits, 13.29 GB left" in out
    lay = Layout(tp=8, pp=16, dp=64, sp=True, attention="fused", seq_len=8192, global_batch=2048,
                 stage_layers=META_SPLIT, zero=1)
    one = plan(L405B, lay)
    assert one.fits and round(one.per_gpu["memory_bytes"]["grads"] / 1e9, 2) == 12.75
    overlapped = plan(L405B, replace(lay, overlap_grad_reduce=True)).time_s
    t = p["time_s"]
    assert p["layout"]["microbatches"] == 32 and round(t["step"], 2) == 13.80 < round(one.time_s["step"], 2)
    assert round(t["hidden"]["dp"], 2) == 8.39 and round(t["dp"], 4) == 0.1232
    assert t["dp"] == pytest.approx(overlapped["dp"], rel=1e-12)  # 32 reduce-scatters, the last one's tail shown
    assert "time: ZeRO-2 scatter exposed" in out and "8.39 s more hidden under the backward, 32 a bucket" in out
    other = replace(lay, attention="unfused", recompute="selective", stage_layers=(8,) * 15 + (6,))
    assert not plan(L405B, other).fits
    assert round(plan(L405B, other).per_gpu["memory_bytes"]["total"] / 1e9, 2) == 89.53
    assert plan(L405B, replace(other, zero=2)).fits


@pytest.mark.parametrize("zero", range(4))
def test_the_planners_columns_are_the_live_layouts(zero):
    """``tpsim.predict.model_state``'s layouts (what a live run's table checks) give the planner's totals at every
    stage: Megatron's three rows, tpsim's float64 and 16-bit ones; ZeRO-2's "2 + 16/d" written as Megatron would."""
    from tpsim.predict.model_state import MEGATRON_LAYOUTS, TPSIM_16BIT, TPSIM_FLOAT64, format_formula
    d = 8
    # float16 is priced as the bf16 row (fp32 gradients, as Megatron runs it), not dist_optimizer.md's fp16 row
    for layout, dtype in zip((*MEGATRON_LAYOUTS[1:], TPSIM_FLOAT64, TPSIM_16BIT, TPSIM_16BIT),
                             ("bfloat16", "float32", "float64", "bfloat16", "float16")):
        want = state_bytes_per_param(dtype, zero, d)["total"]
        assert float(layout.bytes_per_zero_stage(zero, d)) == pytest.approx(want, rel=1e-15), (layout.name, zero)
    assert [format_formula(MEGATRON_LAYOUTS[1], z) for z in range(4)] == ["18", "6 + 12/d", "2 + 16/d", "18/d"]
