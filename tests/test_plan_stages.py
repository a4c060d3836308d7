"""``tpsim plan``'s communication per pipeline stage: each stage's own collectives, from hand arithmetic.

The figures are written out from the collectives a Megatron-style stage issues (Korthikanti et al. 2022 §4.2.2
for SP's all-gathers and reduce-scatters, Narayanan et al. 2021 §2.2 for the point-to-point sends), with the
ring's (t − 1)/t factor, not read back from the planner: the first stage has the embedding, the last the final
norm, the LM head and the loss, no GPU both, and a stage sends activations forward only if a stage follows it
and gradients backward only if one precedes it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import tpsim.plan.comm as comm
from tpsim.gpus import gpu
from tpsim.plan.layout import Layout
from tpsim.plan.memory import stage_param_elements
from tpsim.plan.models import PRESETS
from tpsim.plan.planner import plan

LLAMA = PRESETS["llama3-70b"]
LAYOUT = Layout(tp=8, pp=4, dp=2, sp=True, recompute="selective", seq_len=8192, global_batch=256)  # lesson 16's


def ring(t: int) -> float:
    """Bytes a rank sends per logical byte in an all-gather or a reduce-scatter of t ranks."""
    return (t - 1) / t


def llama_sp_stage_tp_bytes(stage: int) -> float:
    """TP bytes one GPU of ``stage`` sends per step at LAYOUT (bf16: 2-byte activations, SP, b = 1)."""
    b, s, h, t, L, p, m = 1, 8192, LLAMA.hidden, 8, LLAMA.layers, 4, 128
    act = b * s * h * 2
    norm_sync = 2 * ring(t) * h * 2  # an RMSNorm's [h] gradient, all-reduced under SP
    # a layer: forward all-gather + reduce-scatter around attention and around the MLP (4); backward their
    # conjugates plus tpsim's re-gather of each column-parallel input (6); two norms' gradient syncs
    layer = 10 * act * ring(t) + 2 * norm_sync
    per_microbatch = L // p * layer
    if stage == 0:  # the embedding: an all-reduce forward, an all-gather backward (the sequence split); the ids
        per_microbatch += 3 * act * ring(t) + b * s * 8
    if stage == p - 1:  # the LM head: all-gather forward, all-gather + reduce-scatter backward; the loss's three
        # [b, s] reductions in float32 (Megatron's logits.float()); the final norm's sync; the labels
        per_microbatch += 3 * act * ring(t) + 3 * 2 * ring(t) * b * s * 4 + norm_sync + b * s * 8
    return m * per_microbatch + 2 * ring(t) * 8  # + the clip norm's float64 all-reduce, once a step


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_each_stage_sends_its_own_tp_bytes(stage):
    n = stage_param_elements(LLAMA, 8, 4, stage)
    got = comm.step_comm(LLAMA, LAYOUT, gpu("h100-80gb"), stage, n)["wire_bytes"]
    assert got["tp"] == pytest.approx(llama_sp_stage_tp_bytes(stage), rel=1e-15, abs=1)


@pytest.mark.parametrize("stage, sends", [(0, 128), (1, 256), (3, 128)])
def test_pipeline_sends_forward_from_all_but_the_last_backward_from_all_but_the_first(stage, sends):
    n = stage_param_elements(LLAMA, 8, 4, stage)
    got = comm.step_comm(LLAMA, LAYOUT, gpu("h100-80gb"), stage, n)["wire_bytes"]
    assert got["pp"] == sends * (1 * 8192 * LLAMA.hidden * 2 // 8)  # [s/t, b, h] in bf16 under SP
    assert got["dp"] == 2 * ring(2) * n * 4  # fp32 gradients all-reduced over dp 2


def test_the_plan_reports_its_busiest_stage_alone():
    """Stage 0 holds the most memory: the plan's per-GPU communication is stage 0's, not stage 0's plus the
    last stage's head and loss (about 45 GB of TP bytes more) nor both directions of pipeline sends."""
    p = plan(LLAMA, LAYOUT)
    assert p.per_gpu["stage"] == 0
    wire = p.per_gpu["wire_bytes_per_step"]
    assert wire["tp"] == pytest.approx(llama_sp_stage_tp_bytes(0), rel=1e-15, abs=1)
    assert wire["pp"] == 128 * 8192 * LLAMA.hidden * 2 // 8
    last_stage_ends = llama_sp_stage_tp_bytes(3) - llama_sp_stage_tp_bytes(1)  # head, loss, final norm, labels
    assert 45.0e9 < last_stage_ends < 45.2e9  # what stage 0's line used to carry besides its own


def test_one_stage_issues_everything():
    """p = 1: the only stage has the embedding, the head, the loss and the whole batch (plain TP, GPT-2)."""
    model, t, b, s, m = PRESETS["gpt2"], 2, 2, 1024, 4
    lay = Layout(tp=t, seq_len=s, micro_batch=b, global_batch=b * m)
    act = b * s * model.hidden * 2
    # per micro-batch: 4 all-reduces a layer, the embedding's g, the tied head's f, the loss's three [b, s]
    # float32 reductions (under 16 bits, as Megatron's logits.float()), the [2, b, s] int64 batch
    per_microbatch = (4 * model.layers + 2) * 2 * ring(t) * act + 3 * 2 * ring(t) * b * s * 4 + 2 * b * s * 8
    got = comm.step_comm(model, lay, gpu("h100-80gb"), 0, stage_param_elements(model, t, 1, 0))["wire_bytes"]
    assert got["tp"] == pytest.approx(m * per_microbatch + 2 * ring(t) * 8, rel=1e-15)
    assert got["pp"] == 0


def test_a_row_no_stage_claims_fails_loud(monkeypatch):
    rows = comm.tp_rows(LLAMA, LAYOUT)
    monkeypatch.setattr(comm, "tp_rows", lambda *a, **k: rows + [replace(rows[1], layer="mystery")])
    with pytest.raises(ValueError, match="no pipeline stage claims predict_step's row mystery"):
        comm.step_comm(LLAMA, LAYOUT, gpu("h100-80gb"), 0, 1)


def test_a_stage_outside_the_pipeline_is_refused():
    with pytest.raises(ValueError, match="stage 4 of a 4-stage pipeline"):
        comm.step_comm(LLAMA, LAYOUT, gpu("h100-80gb"), 4, 1)


@pytest.mark.parametrize("stage", range(4))
def test_a_tied_embedding_is_all_reduced_between_the_first_and_the_last_stage(stage):
    """GPT-3 at TP 8 x PP 4, bf16: the first and the last stage all-reduce the [V/t, h] word-embedding shard's
    fp32 main gradients in a group of two (2·(2 − 1)/2 = once its bytes on the wire, 2 ring steps of alpha on
    the PP link); the middle stages, an untied Llama and one stage issue none."""
    gpt3, lay = PRESETS["gpt3-175b"], Layout(tp=8, pp=4, dp=2, seq_len=2048, global_batch=64)
    g = gpu("h100-80gb")
    n = stage_param_elements(gpt3, 8, 4, stage)
    got = comm.step_comm(gpt3, lay, g, stage, n)
    shard = -(-50257 // 8) * 12288  # V padded to a multiple of t, ÷ t, × h
    want = shard * 4 if stage in (0, 3) else 0
    assert got["wire_bytes"]["embedding"] == want
    link = comm.links(lay, g)["pp"]
    assert got["time_s"]["embedding"] == (2 * link.alpha + want * link.beta if want else 0)
    assert comm.step_comm(LLAMA, LAYOUT, g, stage, 1)["wire_bytes"]["embedding"] == 0
    one = replace(lay, pp=1)
    assert comm.step_comm(gpt3, one, g, 0, stage_param_elements(gpt3, 8, 1, 0))["wire_bytes"]["embedding"] == 0


def test_the_report_prints_the_embedding_all_reduce_only_where_there_is_one():
    from tpsim.plan.report import format_plan

    gpt3 = plan(PRESETS["gpt3-175b"], Layout(tp=8, pp=4, dp=2, seq_len=2048, global_batch=64))
    t = gpt3.time_s
    parts = ("compute", "tp", "bubble", "pp", "loss", "embedding", "dp", "optimizer", "dp_gather")
    assert t["step"] == pytest.approx(sum(t[k] for k in parts), rel=1e-12) and t["embedding"]
    assert "after the schedule; embedding 0." in format_plan(gpt3)
    assert "; embedding" not in format_plan(plan(LLAMA, LAYOUT))  # untied: no such all-reduce
