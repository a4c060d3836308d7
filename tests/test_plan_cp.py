"""Context parallelism in the planner (``tpsim plan --cp C --cp-comm ring|allgather|ulysses``): every term by hand.

A CP rank holds s/C tokens of every layer: its activations are Korthikanti's with s → s/C but for attention's
terms, which the variant decides; its CP bytes are ``tpsim.predict.cp_comm``'s; its gradients are averaged over
dp·C ranks. At cp 1 nothing changes (the other tests/test_plan*.py hold every number); here the variants' own
numbers, their ordering, where the group sits, the refusals, and Llama 3 405B's long-context layout.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tpsim.config import RunConfig
from tpsim.cost import wire_bytes
from tpsim.plan import cp_terms
from tpsim.plan.cli import main
from tpsim.plan.comm import dp_wire_bytes, links, tp_wire_bytes_per_layer
from tpsim.plan.cp_shape import busiest_share
from tpsim.gpus import gpu
from tpsim.plan.kernel_time import kernel_seconds, layer_seconds
from tpsim.plan.kernels import attention
from tpsim.plan.layout import Layout, problems
from tpsim.plan.memory import activation_bytes_per_layer, logits_bytes, ring_buffer_bytes, stage_memory
from tpsim.plan.models import PRESETS
from tpsim.plan.of_run import run_layout
from tpsim.plan.planner import plan
from tpsim.plan.search import search

GPT2, L8B, L405B = PRESETS["gpt2"], PRESETS["llama3-8b"], PRESETS["llama3-405b"]
H100 = gpu("h100-80gb")
PARTS = ("compute", "tp", "cp", "bubble", "pp", "loss", "embedding", "dp", "optimizer", "dp_gather")
META_405B = ["--model", "llama3-405b", "--tp", "8", "--cp", "16", "--pp", "16", "--dp", "8", "--sp", "--zero", "1",
             "--attention", "fused", "--seq-len", "131072", "--global-batch", "128",
             "--pp-layers", ",".join(["7", *["8"] * 14, "7"])]


def gpt2_layout(**kw) -> Layout:
    return Layout(**{"tp": 2, "seq_len": 1024, "micro_batch": 2, "global_batch": 8, **kw})


def test_variants_do_not_matter_at_cp_1():
    base = plan(GPT2, gpt2_layout())
    for comm, layout in (("ulysses", "contiguous"), ("allgather", "zigzag")):
        other = plan(GPT2, gpt2_layout(cp_comm=comm, cp_layout=layout))
        assert other.time_s == base.time_s and other.per_gpu == base.per_gpu
    assert base.time_s["cp"] == 0.0 and base.cp["placement"] == "no CP"


@pytest.mark.parametrize("comm", ["ring", "allgather", "ulysses"])
def test_gpt_layer_activations_by_hand(comm):
    """Korthikanti's TP line s'bh(10 + 24/t) at s' = s/cp, and the attention term: every variant runs
    flash-style (tpsim.cp recomputes the scores in the backward), so it keeps the lse (4·a·s'·b/t bytes) and no
    scores — allgather also the other ranks' K and V (2·b·(s − s')·(a/t)·d elements, 2 bytes each)."""
    b, s, t, cp, h, a, d = 2, 1024, 2, 2, GPT2.hidden, GPT2.heads, GPT2.head_dim  # ulysses: 6 heads a TP rank
    mine = s // cp
    want = mine * b * h * (10 + 24 / t)
    want += 4 * a * mine * b / t
    if comm == "allgather":
        want += 2 * 2 * b * (s - mine) * (a // t) * d
    got = activation_bytes_per_layer(GPT2, gpt2_layout(cp=cp, cp_comm=comm))["paper"]
    assert got == pytest.approx(want, rel=1e-12)


def test_fused_and_selective_drop_the_scores_of_every_variant():
    """Fused attention keeps each row's lse and no scores; so does selective recompute under CP (every variant
    flash-style whatever --attention says)."""
    b, s, t, cp, h, a = 2, 1024, 2, 2, GPT2.hidden, GPT2.heads
    mine = s // cp
    for comm in ("ring", "ulysses"):
        fused = activation_bytes_per_layer(GPT2, gpt2_layout(cp=cp, cp_comm=comm, attention="fused"))["paper"]
        assert fused == pytest.approx(mine * b * h * (10 + 24 / t) + 4 * a * mine * b / t, rel=1e-12)
        selective = activation_bytes_per_layer(GPT2, gpt2_layout(cp=cp, cp_comm=comm, recompute="selective"))
        lse = 4 * a * mine * b / t  # flash-style blocks: the lse kept, as a fused kernel's
        assert selective["paper"] == pytest.approx(mine * b * h * (10 + 24 / t) + lse, rel=1e-12)


def test_sp_full_recompute_logits_and_the_ring_buffers():
    """Llama-3 8B, TP 8 + SP, CP 2: full recompute keeps [s'/t, b, h]; the last stage's logits are of s' tokens;
    the ring's two receive buffers are 2 × 2·b·g_t·s'·d·e, once a GPU."""
    lay = Layout(tp=8, sp=True, cp=2, seq_len=8192, micro_batch=1, global_batch=8)
    mine = 4096
    assert activation_bytes_per_layer(L8B, replace(lay, recompute="full"))["paper"] == 2 * mine * L8B.hidden / 8
    assert logits_bytes(L8B, lay) == mine * 128256 // 8 * 4
    assert ring_buffer_bytes(L8B, lay) == 2 * 2 * 1 * 1 * mine * 128 * 2
    assert ring_buffer_bytes(L8B, replace(lay, cp_comm="allgather")) == 0 == ring_buffer_bytes(L8B, replace(lay, cp=1))
    with_buffers = stage_memory(L8B, lay, 0)["activations"]
    assert with_buffers - stage_memory(L8B, replace(lay, cp_comm="allgather", attention="fused"), 0)["activations"] \
        == pytest.approx(ring_buffer_bytes(L8B, lay) - lay.in_flight * 32 * 2 * mine * 128 * 2, rel=1e-12)


def test_zero1_shards_the_optimizer_over_dp_times_cp():
    lay = Layout(tp=8, dp=2, cp=4, zero=1, sp=True, seq_len=8192, global_batch=8)
    p = plan(L8B, lay)
    assert p.per_gpu["model_state_bytes_per_param"] == {"params": 2, "grads": 4, "optimizer": 12 / 8,
                                                           "total": 6 + 12 / 8}
    assert p.layout["gpus"] == 8 * 2 * 4 and p.layout["microbatches"] == 4  # m = B/(dp·b): CP shares a batch
    assert dp_wire_bytes(lay, 1000) == wire_bytes("reduce_scatter", 4000, 8) + wire_bytes("all_gather", 2000, 8)


@pytest.mark.parametrize("comm", ["ring", "allgather", "ulysses"])
def test_cp_bytes_by_hand(comm):
    """Llama-3 8B at TP 1, CP 8: a K (or V) shard kv = b·g·(s/cp)·d·e, a Q shard q = b·a·(s/cp)·d·e."""
    cp, s = 8, 8192
    lay = Layout(cp=cp, cp_comm=comm, seq_len=s, micro_batch=1, global_batch=8, recompute="selective")
    kv, q = 8 * (s // cp) * 128 * 2, 32 * (s // cp) * 128 * 2
    want = {"ring": ((cp - 1) * 2 * kv, (cp - 1) * 2 * kv + cp * 2 * kv),
            "allgather": ((cp - 1) * 2 * kv, (cp - 1) * 2 * kv),
            "ulysses": ((cp - 1) * (2 * q + 2 * kv) // cp, (cp - 1) * (2 * q + 2 * kv) // cp)}[comm]
    assert cp_terms.layer_bytes(L8B, lay) == dict(zip(("forward", "backward"), want))
    p = plan(L8B, lay)
    assert p.cp["wire_bytes_per_step"] == 32 * lay.microbatches * sum(want)
    full = cp_terms.layer_bytes(L8B, replace(lay, recompute="full"))
    assert full["backward"] == want[1] + want[0]  # the recomputed forward fetches the other shards again


def test_byte_ordering_of_the_variants():
    """The ring sends allgather's bytes plus its dK, dV home (cp·2·kv more); Ulysses' share (cp − 1)/cp of its
    shards stays flat as cp grows, so past a few ranks it sends the least."""
    def total(comm, cp, model=L8B):
        out = cp_terms.layer_bytes(model, Layout(cp=cp, cp_comm=comm, seq_len=8192, global_batch=8))
        return out["forward"] + out["backward"]
    for cp in (2, 4, 8):
        kv = 8 * (8192 // cp) * 128 * 2
        assert total("ring", cp) - total("allgather", cp) == cp * 2 * kv
    assert total("ulysses", 8) < total("allgather", 8) < total("ring", 8)
    for cp in (2, 4):  # MHA (q = kv): Ulysses 2·(cp − 1)/cp·4·kv, allgather 2·(cp − 1)·2·kv
        assert total("ulysses", cp, GPT2) / total("allgather", cp, GPT2) == pytest.approx(2 / cp)


def test_placement_and_link():
    inside = Layout(tp=2, cp=4, seq_len=4096, global_batch=8)
    across = replace(inside, tp=4)
    assert cp_terms.placement(inside) == "CP inside a node" and links(inside, H100)["cp"] is H100.intra
    spanning = links(across, H100)["cp"]  # NCCL's model for its collectives, one NIC for its sends
    assert cp_terms.placement(across) == "CP across nodes" and spanning.point is H100.inter
    assert (spanning.fabric, spanning.per_node) == (H100.fabric, 2)  # tp 4: two CP ranks of the group a node
    assert links(replace(inside, pp=2), H100)["pp"] is H100.inter  # tp·cp·pp = 16 > 8
    assert cp_terms.placement(replace(inside, cp=1)) == "no CP"


def test_tokens_per_rank_are_s_over_cp():
    """Everything but attention is that of s/cp tokens: TP's wire bytes, and under zigzag (balanced) the layer's
    whole time at the flat --mfu model is 1/cp of cp 1's (allgather: the same unfused kernels; the ring's are
    flash-style, whose backward recomputes the scores)."""
    lay = Layout(tp=2, seq_len=4096, global_batch=8, mfu=0.5, cp_comm="allgather")
    four = replace(lay, cp=4)
    assert tp_wire_bytes_per_layer(GPT2, four) == tp_wire_bytes_per_layer(GPT2, replace(lay, seq_len=1024))
    one, split = layer_seconds(GPT2, lay, H100), layer_seconds(GPT2, four, H100)
    assert all(split[op] == pytest.approx(one[op] / 4, rel=1e-12) for op in "FBW")


def test_contiguous_critical_path_is_the_busiest_rank():
    """Under the contiguous layout the last rank's queries see the most keys: (2cp − 1)/cp² of the causal work
    for s ≫ cp, (2cp − 1)/cp times the mean; its attention is what the layer waits for."""
    for cp in (2, 4, 8):
        lay = Layout(cp=cp, cp_layout="contiguous", seq_len=8192, global_batch=8, mfu=0.5)
        assert busiest_share(lay) * cp == pytest.approx((2 * cp - 1) / cp, rel=1e-3)
        assert busiest_share(replace(lay, cp_layout="zigzag")) == 1 / cp == busiest_share(replace(lay,
                                                                                                 cp_comm="ulysses"))
        zig = sum(k.flops for k in attention(L8B, replace(lay, cp_layout="zigzag"), "F"))
        assert sum(k.flops for k in attention(L8B, lay, "F")) == pytest.approx(zig * busiest_share(lay) * cp)


def test_ring_overlaps_its_steps_with_the_blocks():
    """exposed F = (cp − 1)·max(0, t_kv − t_F/cp), B = (cp − 1)·max(0, 2·t_kv − t_B/cp) + t_kv; allgather and
    ulysses exposed whole. A slow link (one GPU a node: CP over InfiniBand) and a short sequence expose some."""
    lay = Layout(cp=4, seq_len=2048, global_batch=8, gpus_per_node=1)
    link = H100.inter
    t_kv = link.alpha + link.beta * 2 * 8 * 512 * 128 * 2
    t_f, t_b = (sum(kernel_seconds(k, lay, H100) for k in attention(L8B, lay, op)) / 4 for op in "FB")
    got = cp_terms.layer_seconds(L8B, lay, H100)
    assert got["exposed"]["F"] == pytest.approx(3 * max(0.0, t_kv - t_f), rel=1e-12)
    assert got["exposed"]["B"] == pytest.approx(3 * max(0.0, 2 * t_kv - t_b) + t_kv, rel=1e-12)
    assert got["transfer"]["F"] == pytest.approx(3 * t_kv) and got["transfer"]["B"] == pytest.approx(7 * t_kv)
    assert 0 < got["exposed"]["F"] < got["transfer"]["F"]
    for comm in ("allgather", "ulysses"):
        other = cp_terms.layer_seconds(L8B, replace(lay, cp_comm=comm), H100)
        assert other["exposed"] == other["transfer"] and other["transfer"]["F"] > 0


@pytest.mark.parametrize("comm, gather", [("ring", False), ("allgather", False), ("ulysses", False),
                                          ("ring", True), ("allgather", True)])
def test_the_step_still_adds_up(comm, gather):
    """The parts sum to the step with CP's own part, the DP buckets on their stream (their pieces carry a layer's
    CP messages) and ZeRO-1's gathers under the forward; cp_s is every action's exposed CP once a micro-batch."""
    lay = Layout(tp=2, cp=4, pp=2, dp=2, cp_comm=comm, seq_len=8192, global_batch=16, zero=1, sp=True,
                 overlap_grad_reduce=True, overlap_param_gather=gather, gpus_per_node=4)
    p = plan(L8B, lay)
    t = p.time_s
    assert t["step"] == pytest.approx(sum(t[k] for k in PARTS), rel=1e-12)
    assert t["cp"] > 0 and t["cp"] == p.cp["exposed_s_per_step"]
    per_rank = [r["cp_s"] for r in p.pipeline["ranks"]]
    assert t["cp"] == pytest.approx(sum(per_rank) / 2, rel=1e-12)
    m, layers = 16 // 2, 32 // 2
    assert per_rank[0] == pytest.approx(m * layers * sum(p.cp["exposed_s_per_layer"].values()), rel=1e-12)


def test_refusals_are_one_line_and_exit_2(capsys):
    cases = [(["--seq-len", "1000", "--cp", "3"], "not divisible by 6 (zigzag over cp 3: 2 x cp = 6 chunks)"),
             (["--seq-len", "1000", "--cp", "3", "--cp-layout", "contiguous"], "not divisible by 3"),
             (["--cp", "0"], "argument --cp: '0' is not a whole number >= 1"),
             (["--tp", "8", "--cp", "16", "--cp-comm", "ulysses", "--seq-len", "8192"], "must both divide by cp 16")]
    for args, why in cases:
        try:
            status = main(["--model", "llama3-70b", *args])
        except SystemExit as stop:  # refused by the parser (tpsim.options)
            status = stop.code
        assert status == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err
    assert problems(L8B, Layout(cp=2, seq_len=4096, cp_comm="ulysses", global_batch=8)) == []


def test_the_report_and_json_carry_the_cp_line(capsys):
    assert main(["--model", "llama3-8b", "--tp", "4", "--cp", "4", "--seq-len", "32768", "--global-batch", "8",
                 "--cp-comm", "allgather", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    text, p = "\n".join(out[:-1]), json.loads(out[-1])
    assert "TP 4 x CP 4 x PP 1 x DP 1" in text and "allgather, zigzag, CP across nodes" in text
    assert "time: CP exposed" in text and p["layout"]["gpus"] == 16
    assert {"placement", "bytes_per_layer_per_microbatch", "exposed_s_per_layer", "wire_bytes_per_step"} <= set(p["cp"])


def test_search_keeps_cp_as_given():
    base = Layout(cp=4, sp=True, seq_len=32768, global_batch=8, attention="fused")
    plans = search(L8B, base, 32)
    assert plans and all(p.layout["cp"] == 4 and p.layout["gpus"] == 32 for p in plans)
    with pytest.raises(Exception, match="not divisible by --cp 4"):
        search(L8B, base, 30)


def test_llama3_405b_long_context_layout():
    """Meta's long-context stage (Dubey et al. 2024, Table 4): TP 8 × CP 16 × PP 16 × DP 8 on 16,384 H100s,
    sequences of 131,072 tokens, 16 M tokens a step. All-gather CP keeps every layer's gathered K and V
    (2·b·(s − s/16)·1·128 elements of 2 bytes a layer) and does not fit beside ZeRO-1's fp32 gradients; the ring
    keeps none and fits; CP across nodes (tp·cp = 128 GPUs)."""
    ring_args = [*META_405B, "--cp-comm", "ring", "--json"]
    p = {}
    for comm in ("allgather", "ring"):
        lay = Layout(tp=8, cp=16, pp=16, dp=8, sp=True, zero=1, attention="fused", seq_len=131072,
                     global_batch=128, cp_comm=comm, stage_layers=(7, *[8] * 14, 7))
        p[comm] = plan(L405B, lay)
    assert p["ring"].layout["gpus"] == 16384 and p["ring"].layout["microbatches"] == 16
    assert p["ring"].cp["placement"] == "CP across nodes"
    kept = 2 * (131072 - 8192) * 128 * 2
    act = {c: p[c].per_gpu["activation_bytes_per_layer"]["paper"] for c in p}
    assert act["allgather"] - act["ring"] == pytest.approx(kept, rel=1e-12)
    assert p["ring"].fits and not p["allgather"].fits
    assert p["ring"].cp["bytes_per_layer_per_microbatch"] == {"forward": 15 * 2 * 8192 * 128 * 2,
                                                                 "backward": 31 * 2 * 8192 * 128 * 2}
    assert main(ring_args) == 0


def test_a_layout_and_a_run_say_cp_the_same_way():
    lay = Layout(tp=2, cp=4, cp_comm="ulysses", cp_layout="contiguous", seq_len=4096, global_batch=8)
    par = lay.parallel
    assert (par.cp, par.cp_comm, par.cp_layout, par.world, par.grad_replicas) == (4, "ulysses", "contiguous", 8, 4)
    run = RunConfig.of(L8B.config(layers=2, max_positions=64), tp=2, cp=2, cp_comm="allgather", seq_len=64,
                       batch_size=2)
    live = run_layout(run)
    assert (live.cp, live.cp_comm, live.cp_layout, live.local_seq) == (2, "allgather", "zigzag", 32)
