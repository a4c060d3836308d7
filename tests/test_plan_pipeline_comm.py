"""The collectives on the planner's pipeline clock (``tpsim.plan.pipeline_comm``), against independent counts.

- nothing is dropped or counted twice: the F, B and W of a virtual stage carry every TP row of ``predict_step``
  that stage issues (its wire bytes and calls add up to the rows'), and W carries only what a weight gradient
  issues (the SP norms' syncs, the replicated KV heads' sum, one re-gather a column-parallel layer);
- each rank's collectives on the clock (its busy time less its FLOP time) are exactly the TP time
  ``tpsim.plan.comm.step_comm`` prices for that stage, less the batch broadcast and the clip norm (outside the
  step's clock), on every schedule, SP, full recompute, uneven stages and a Llama whose KV heads are replicated;
  at tp 1 there are none and the makespan is the FLOPs' and the messages';
- the step after the makespan: the loss broadcast, the tied embedding's all-reduce, the DP sync (and the loss
  normalizer that starts the last stage late), written out with ``tpsim.cost.ring_time``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpsim.arch import LlamaConfig
from tpsim.cost import ring_time
from tpsim.phases import FORWARD, SP_GRAD_SYNC
from tpsim.pipeline.stage_clock import ROUNDING, compiled
from tpsim.plan.comm import in_first_layer, rows_seconds, end_rows, links, step_comm, tp_rows
from tpsim.plan.dp_overlap import stage_buckets
from tpsim.gpus import gpu
from tpsim.plan.layout import Layout
from tpsim.plan.memory import stage_param_elements
from tpsim.plan.models import PRESETS
from tpsim.plan.of_run import model_spec
from tpsim.plan.pipeline import pipeline_terms
from tpsim.plan.pipeline_comm import by_action

LLAMA70, GPT3, GPT2 = PRESETS["llama3-70b"], PRESETS["gpt3-175b"], PRESETS["gpt2"]
TOY_LLAMA = model_spec(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=8,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64))
H100 = gpu("h100-80gb")
LAYOUTS = [(LLAMA70, Layout(tp=8, pp=4, dp=2, sp=True, recompute="selective", seq_len=8192, global_batch=256)),
           (LLAMA70, Layout(tp=8, pp=4, dp=2, sp=True, seq_len=8192, global_batch=256, schedule="zb-h1")),
           (GPT3, Layout(tp=8, pp=8, dp=4, seq_len=2048, global_batch=512, schedule="interleaved", vp=2)),
           (GPT3, Layout(tp=4, pp=4, dp=1, seq_len=2048, global_batch=64, recompute="full", schedule="afab")),
           (GPT2, Layout(tp=2, pp=3, seq_len=1024, global_batch=24, stage_layers=(3, 5, 4), schedule="zb-h1", sp=True)),
           (TOY_LLAMA, Layout(tp=4, pp=2, dp=2, seq_len=64, global_batch=16, schedule="zb-h1"))]
IDS = ["llama70-1f1b-sp", "llama70-zb-h1-sp", "gpt3-interleaved", "gpt3-afab-full", "gpt2-uneven-zb-h1-sp",
       "llama-kv-replicated-zb-h1"]


def totals(rows) -> tuple[int, int]:
    return sum(r.wire_bytes for r in rows), sum(r.calls or 1 for r in rows)


@pytest.mark.parametrize("model, lay", LAYOUTS, ids=IDS)
def test_every_row_a_stage_issues_goes_to_exactly_one_action(model, lay):
    split = compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp).splits_backward
    rows = tp_rows(model, lay)
    for group in ([r for r in rows if in_first_layer(model, r)], end_rows(model, lay, True, False, rows, batch=False),
                  end_rows(model, lay, False, True, rows, batch=False)):
        acts = by_action(model, group, split)
        assert totals(acts["F"] + acts["B"] + acts["W"]) == totals(group)
        assert all(r.phase == FORWARD for r in acts["F"]) and not any(r.phase == FORWARD for r in acts["B"])
        if not split:
            assert acts["W"] == []
            continue
        assert {r.phase for r in acts["W"] if r.group == "tp" and r.op == "all_reduce"} <= {SP_GRAD_SYNC}
        backward_gathers = [r for r in group if r.op == "all_gather" and r.phase != FORWARD
                            and r.layer != model.architecture.config.layer_names.embed]
        assert sum(r.calls for r in acts["W"] if r.op == "all_gather") == len(backward_gathers)
        assert [r for r in acts["W"] if r.group == "kv"] == [r for r in group if r.group == "kv"]
    if lay.tp > model.kv_heads and split:
        assert any(r.group == "kv" for r in by_action(model, rows, split)["W"])


@pytest.mark.parametrize("model, lay", LAYOUTS, ids=IDS)
def test_each_ranks_collectives_on_the_clock_are_its_stages_tp_time(model, lay):
    """Two paths of the planner, one per micro-batch per action, one per step per stage: the same seconds."""
    terms = pipeline_terms(model, lay, H100)
    link, m = links(lay, H100)["tp"], lay.microbatches
    outside = [r for r in tp_rows(model, lay) if r.layer in ("batch", "clip_grad_norm")]
    for r, rank in enumerate(terms["ranks"]):
        n = stage_param_elements(model, lay.tp, lay.pp, r)
        tp = step_comm(model, lay, H100, r, n)["time_s"]["tp"]
        batch = [x for x in outside if x.layer == "batch"]
        half = [replace(x, wire_bytes=x.wire_bytes // 2) for x in batch] * ((r == 0) + (r == lay.pp - 1))
        clip = [x for x in outside if x.layer == "clip_grad_norm"]
        want = tp - m * rows_seconds(half, link) - rows_seconds(clip, link)
        assert rank["collectives_s"] == pytest.approx(want, rel=1e-9), r
        assert rank["collectives_s"] > 0


def test_at_tp_1_nothing_is_charged_and_the_makespan_is_the_flops_and_the_messages():
    lay = Layout(tp=1, pp=4, dp=1, seq_len=2048, global_batch=64, mfu=0.5)  # flat: time ∝ FLOPs
    model = replace(GPT3, vocab=50304)  # a vocabulary tp 2 splits without padding: the head's FLOPs halve too
    terms = pipeline_terms(model, lay, H100)
    assert all(r["collectives_s"] == 0 for r in terms["ranks"])
    assert terms["makespan_s"] == terms["makespan_without_collectives_s"]
    assert terms["makespan_without_p2p_s"] == terms["makespan_compute_only_s"] < terms["makespan_s"]
    two = pipeline_terms(model, replace(lay, tp=2), H100)  # the FLOPs halve, the collectives come in
    assert two["makespan_without_p2p_s"] > two["makespan_compute_only_s"] == pytest.approx(
        terms["makespan_compute_only_s"] / 2, rel=1e-12)


@pytest.mark.parametrize("dp", [1, 4])
def test_the_step_ends_after_the_loss_the_embedding_and_the_dp_sync(dp):
    """GPT-3 (tied) on pp 4: the loss broadcast ends every stage at the latest clock + its cost; then the first
    and the last stage sum the embedding's gradient; then every stage its DP all-reduce, one per bucket the
    planner cuts (``tpsim.plan.dp_overlap.stage_buckets``: α paid per bucket, the bytes the stage's gradients)."""
    lay = Layout(tp=8, pp=4, dp=dp, seq_len=2048, global_batch=64 * dp)
    terms = pipeline_terms(GPT3, lay, H100)
    link = links(lay, H100)
    def on_dp(op, nbytes):  # a DP group across nodes is priced by NCCL's model (tpsim.nccl), inside one by α-β
        if hasattr(link["dp"], "collective"):
            return link["dp"].collective(op, nbytes, dp)
        return ring_time(op, nbytes, dp, link["dp"].alpha, link["dp"].beta)

    loss = on_dp("all_reduce", 8) if dp > 1 else 0.0
    bcast = ring_time("broadcast", 16, 4, link["pp"].alpha, link["pp"].beta)
    shard = -(-GPT3.vocab // 8) * 8 // 8 * GPT3.hidden  # the [V/t, h] shard, V padded to a multiple of t
    emb = ring_time("all_reduce", shard * 4, 2, link["pp"].alpha, link["pp"].beta)  # fp32 gradients (bf16 run)
    after = terms["after_schedule"]
    assert after["embedding_s"] == pytest.approx([emb, 0, 0, emb], rel=1e-15)
    finish = [r["finish_s"] for r in terms["ranks"]]
    assert max(finish) == terms["makespan_s"]
    latest = max(finish[:3] + [finish[3] + loss])  # the last stage first sums the loss over DP
    buckets = stage_buckets(GPT3, lay)
    for r in range(4):
        assert sum(b.nbytes for b in buckets[r]) == stage_param_elements(GPT3, 8, 4, r) * 4
        dp_s = sum(on_dp("all_reduce", b.nbytes) for b in buckets[r]) if dp > 1 else 0.0
        assert after["dp_s"][r] == pytest.approx(dp_s, rel=1e-12, abs=0)
        assert after["ends"][r] == pytest.approx(latest + bcast + after["embedding_s"][r] + dp_s, rel=ROUNDING)
    assert terms["step_s"] == max(after["ends"]) > terms["makespan_s"]
