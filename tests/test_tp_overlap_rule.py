"""The --tp-comm-overlap cost rule (``tpsim.plan.tp_overlap``) by hand, against an event-by-event simulation of the
two decompositions, and the planner's stage_comm charging exactly the exposed time of each pipelined collective.

Story: max(g, a + g/c) on numbers worked out on paper; the closed form equals a step-by-step timeline of t − 1
transfers on one link beside t GEMM chunks, for an all-gather before the GEMM and a reduce-scatter after it, at
random sizes; the Playbook's condition is exactly "exposed is 0"; the planner's per-layer F and B collective
seconds drop by a − exposed for each pipelined collective, with the GEMM shapes written out here from the layers'
weights, and nothing else changes; a layout without SP is refused with the reason.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tpsim.plan.comm import links, ring_seconds
from tpsim.gpus import gpu
from tpsim.plan.layout import Layout, problems
from tpsim.plan.models import PRESETS
from tpsim.plan.pipeline_comm import stage_comm
from tpsim.plan.timing import gemm_seconds
from tpsim.plan.tp_overlap import (exposed_seconds, gemms_seconds, hides, layer_overlaps, layer_summary,
                                   pipelined_seconds)


def test_the_rule_on_numbers_worked_out_by_hand():
    # a = 3, g = 8, t = 4: chunks of 2 s of GEMM, steps of 1 s of transfer -> hidden: max(8, 3 + 2) = 8
    assert pipelined_seconds(3.0, 8.0, 4) == 8.0 and exposed_seconds(3.0, 8.0, 4) == 0.0 and hides(3.0, 8.0, 4)
    # a = 9: steps of 3 s > chunks of 2 s -> 9 + 2 = 11, 3 s exposed (a − (t − 1)·g/t = 9 − 6)
    assert pipelined_seconds(9.0, 8.0, 4) == 11.0 and exposed_seconds(9.0, 8.0, 4) == 3.0 and not hides(9.0, 8.0, 4)
    # the boundary: a = 6, steps of 2 s = chunks of 2 s -> exactly hidden
    assert exposed_seconds(6.0, 8.0, 4) == 0.0 and hides(6.0, 8.0, 4)
    # t = 2: one transfer beside the second chunk: a = 5, g = 4 -> 5 + 2 = 7
    assert pipelined_seconds(5.0, 4.0, 2) == 7.0 and exposed_seconds(5.0, 4.0, 2) == 3.0
    with pytest.raises(ValueError, match="at least 2"):
        pipelined_seconds(1.0, 1.0, 1)


def gather_then_gemm(a: float, g: float, t: int) -> float:
    """Step by step: transfer k ends at k·a/(t−1); GEMM chunk k waits for it and for chunk k−1."""
    step, chunk, end = a / (t - 1), g / t, g / t  # the own chunk first, from 0
    for k in range(1, t):
        end = max(end, k * step) + chunk
    return end


def gemm_then_scatter(a: float, g: float, t: int) -> float:
    """Step by step: chunk k (for rank r + k) ends at k·g/t and is sent when the link is free; own chunk last."""
    step, chunk, link = a / (t - 1), g / t, 0.0
    for k in range(1, t):
        link = max(link, k * chunk) + step
    return max(link, t * chunk)


@pytest.mark.parametrize("t", [2, 3, 4, 8])
def test_the_closed_form_is_the_timeline_of_both_decompositions(t):
    rng = np.random.default_rng(t)
    for a, g in rng.uniform(0.01, 10.0, (200, 2)):
        want = pipelined_seconds(a, g, t)
        assert abs(gather_then_gemm(a, g, t) - want) <= 1e-12 * want
        assert abs(gemm_then_scatter(a, g, t) - want) <= 1e-12 * want
        assert hides(a, g, t) == (exposed_seconds(a, g, t) <= 1e-12 * g)


def gpt_layer_overlaps(lay, model):
    """(op, GEMMs) of every collective a GPT layer pipelines, from its weights: c_attn [h, 3h/t], attention's
    c_proj [h/t, h], c_fc [h, 4h/t], the MLP's c_proj [4h/t, h]; m = micro-batch × sequence."""
    t, h, m = lay.tp, model.hidden, lay.micro_batch * lay.seq_len
    f = model.ffn
    forward = [((m, 3 * h // t, h),), ((m, h, h // t),), ((m, f // t, h),), ((m, h, f // t),)]
    backward = [((m, h, 3 * h // t),), ((m, h // t, h),), ((m, h, f // t),), ((m, f // t, h),)]
    return forward, backward


@pytest.mark.parametrize("tp", [2, 8])
def test_stage_comm_charges_each_pipelined_collective_its_exposed_time(tp):
    model, g = PRESETS["gpt2-medium"], gpu("h100-80gb")
    base = Layout(tp=tp, pp=2, sp=True, seq_len=1024, micro_batch=2, global_batch=16, stage_layers=(12, 12))
    lay = replace(base, tp_comm_overlap=True)
    link = links(lay, g)["tp"]
    nbytes = lay.micro_batch * lay.seq_len * model.hidden * 2  # [b, s, h] in bfloat16
    a = ring_seconds("all_gather", nbytes, tp, link)
    assert a == ring_seconds("reduce_scatter", nbytes, tp, link)
    forward, backward = gpt_layer_overlaps(lay, model)
    saved = [sum(a - exposed_seconds(a, sum(gemm_seconds(*s, lay, g) for s in gemms), tp) for gemms in side)
             for side in (forward, backward)]
    before, after = stage_comm(model, base, g, split=False), stage_comm(model, lay, g, split=False)
    # rank 0 holds 12 layers and the embedding (nothing pipelined there): 12 × the layer's saving
    for i, want in enumerate(saved):
        assert abs((before[0, 0, i] - after[0, 0, i]) - 12 * want) <= 1e-12 * before[0, 0, i]
    assert after[0, 0, 2] == before[0, 0, 2] == 0.0  # no split backward: no W
    assert np.all(after <= before) and np.all(after[..., :2] > 0)


def test_a_layout_without_sp_or_at_tp_one_is_refused_with_the_reason():
    model = PRESETS["gpt2"]
    assert any("plain TP's all-reduce cannot hide" in p
               for p in problems(model, Layout(tp=2, sp=False, tp_comm_overlap=True)))
    assert any("needs --tp > 1" in p for p in problems(model, Layout(tp=1, sp=True, tp_comm_overlap=True)))
    assert not problems(model, Layout(tp=4, sp=True, tp_comm_overlap=True))


def test_llama_gemm_shapes_keep_a_rank_s_columns_and_replicated_kv_heads():
    """Llama-3 8B (h 4096, 32 query heads of 128, 8 KV heads, ffn 14336) at tp 8 and 16 (KV heads replicated)."""
    from tpsim.plan.tp_overlap import layer_overlaps
    model, m = PRESETS["llama3-8b"], 2 * 1024
    for tp, kv_cols in ((8, 128), (16, 128)):
        lay = Layout(tp=tp, sp=True, seq_len=1024, micro_batch=2, gpus_per_node=16)
        got = {(o.layer.rsplit(".", 1)[1], o.phase, o.op): o.gemms for o in layer_overlaps(model, lay)["F"]
               + layer_overlaps(model, lay)["B"]}
        q, f = 4096 // tp, 14336 // tp
        assert got["self_attn", "forward", "all_gather"] == ((m, q, 4096), (m, kv_cols, 4096), (m, kv_cols, 4096))
        assert got["self_attn", "forward", "reduce_scatter"] == ((m, 4096, q),)
        assert got["self_attn", "backward", "reduce_scatter"] == ((m, 4096, q), (m, 4096, kv_cols),
                                                                  (m, 4096, kv_cols))
        assert got["self_attn", "backward", "all_gather"] == ((m, q, 4096),)
        assert got["mlp", "forward", "all_gather"] == ((m, f, 4096), (m, f, 4096))
        assert got["mlp", "backward", "all_gather"] == ((m, f, 4096),)
        assert layer_overlaps(model, lay)["W"] == []  # the re-gathers stay whole


def test_the_validate_case_tells_overlap_from_none_beyond_its_tolerance():
    """On plan --validate's toy layout the GEMMs are tiny beside α, yet pricing the flag moves each rank's TP time
    far more than the 1e-12 the case allows: a live clock that ignored the flag would fail there."""
    from tpsim.pipeline.stage_clock import ROUNDING
    from tpsim.plan.of_run import model_spec, run_layout
    from tpsim.plan.validate_pipeline import PIPELINE_CASES
    case = next(c for c in PIPELINE_CASES if c.tp_comm_overlap)
    run = case.run()
    model, lay = model_spec(run.model), run_layout(run)
    on = stage_comm(model, lay, gpu(lay.gpu), split=False).sum(axis=(1, 2))
    off = stage_comm(model, replace(lay, tp_comm_overlap=False), gpu(lay.gpu), split=False).sum(axis=(1, 2))
    assert np.all(off - on > 1e3 * ROUNDING * off)


@pytest.mark.parametrize("name", ["gpt3-175b", "llama3-70b"])
def test_the_layer_summary_is_its_collectives_by_the_rule(name):
    """One layer a micro-batch: four SP collectives a sublayer pair forward and backward (f̄ and ḡ of attention
    and of the MLP, each direction) = 8, their unsplit α-β time, the rule's exposed time, the condition's count."""
    model, lay = PRESETS[name], Layout(tp=8, sp=True, tp_comm_overlap=True, seq_len=4096)
    g = gpu("h100-80gb")
    link = links(lay, g)["tp"]
    s = layer_summary(model, lay, g, link)
    items = [o for v in layer_overlaps(model, lay).values() for o in v]
    assert s["count"] == len(items) == 8
    a = [ring_seconds(o.op, o.nbytes, 8, link) for o in items]
    e = [exposed_seconds(x, gemms_seconds(o.gemms, lay, g), 8) for x, o in zip(a, items)]
    assert s["comm_s"] == pytest.approx(sum(a), rel=1e-12) and s["exposed_s"] == pytest.approx(sum(e), rel=1e-12)
    assert s["hiding"] == sum(x == 0 for x in e) and 0 <= s["exposed_s"] < s["comm_s"]
