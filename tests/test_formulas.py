"""The formulas by hand: ring-cost arithmetic, Korthikanti's Table 2, our activation count, the presets, and a
comparison that notices a wrong byte. (The multi-rank twin, tests/mpi/test_traced_formulas.py, checks real traces.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tpsim.cost import ring_steps, ring_time
from tpsim.arch.gpt2 import GPTConfig
from tpsim.phases import SP_GRAD_SYNC
from tpsim.config import RunConfig
from tpsim.predict.formulas import Prediction, predict_step
from tpsim.trace.formula_check import compare, format_comparison, formula_verdict
from tpsim.links import IB_NDR, NVLINK4_H100, PCIE4_X16, PRESETS
from tpsim.predict.hardware import estimate_breakdown, estimate_step_time
from tpsim.predict.gpt_memory import (block_activation_elements, block_activation_regions, korthikanti_layer_bytes,
                                    korthikanti_layer_elements)
from tpsim.predict.memory import activation_elements, param_elements, predict_memory, real_vocab_columns

CFG = GPTConfig(vocab_size=13, n_positions=6, n_embd=16, n_layer=2, n_head=8)
MiB = 2**20


def test_ring_time_is_steps_times_alpha_plus_wire_times_beta():
    a, beta = 1e-5, 1e-9
    assert ring_time("all_reduce", MiB, 4, a, beta) == pytest.approx(6 * a + 1.5 * MiB * beta)
    assert ring_time("all_gather", MiB, 4, a, beta) == pytest.approx(3 * a + 0.75 * MiB * beta)
    assert ring_time("reduce_scatter", MiB, 8, a, beta) == pytest.approx(7 * a + 7 / 8 * MiB * beta)
    assert ring_time("broadcast", MiB, 2, a, beta) == pytest.approx(a + MiB * beta)
    assert ring_time("all_reduce", MiB, 1, a, beta) == 0.0, "a group of one sends nothing and waits for nobody"


def test_a_step_estimate_prices_each_collective_as_ring_time():
    """hardware's running sum and ring_time share one α-β formula: three all-reduces cost three ring_times."""
    link, wire = NVLINK4_H100, 3 * ring_steps("all_reduce", 4) * MiB // 4
    preds = [Prediction("x", "forward", "all_reduce", "tp", 4, 3, 3 * MiB, wire)]
    assert estimate_step_time(preds, link) == pytest.approx(3 * ring_time("all_reduce", MiB, 4, link.alpha, link.beta))


def test_korthikanti_table2_by_hand():
    s, b, h, a = 4, 2, 8, 2  # s·b·h = 64, a·s/h = 1
    assert korthikanti_layer_bytes(s, b, h, a) == 64 * (34 + 5)  # 2496
    assert korthikanti_layer_bytes(s, b, h, a, t=2) == 64 * (10 + 12 + 2.5)  # 1568
    assert korthikanti_layer_bytes(s, b, h, a, t=2, sequence_parallel=True) == 64 / 2 * 39  # 1248
    # GPT-3 175B's layer (s 2048, b 1, h 12288, a 96) at t 8: the paper's §4 arithmetic
    sbh = 2048 * 12288
    expected = sbh * (10 + 24 / 8 + 5 * 96 * 2048 / (12288 * 8))
    assert korthikanti_layer_bytes(2048, 1, 12288, 96, t=8) == pytest.approx(expected)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_ours_in_16_bit_is_korthikanti_plus_the_rstd_vectors(t):
    """With dropout on, our cache counted at 2 bytes a float and 1 a mask is the paper's layer + 4·b·s bytes."""
    s, b, h, a = 32, 3, 64, 8
    floats, masks = block_activation_elements(b, s, h, a, t, dropout=True)
    paper = korthikanti_layer_bytes(s, b, h, a, t=t) if t > 1 else s * b * h * (10 + 24 + 5 * a * s / h)
    assert 2 * floats + masks == paper + 4 * b * s


def test_activation_elements_by_hand():
    b, s, h = 3, 6, 16  # block: 4bsh + 2bs + 12bsh/t + (a/t)·b·s²  at t = 2, a = 8
    block = 4 * b * s * h + 2 * b * s + 12 * b * s * h // 2 + 4 * b * s * s
    assert block_activation_elements(b, s, h, 8, 2) == (block, 0)
    # vocab 13 at t 2: Vp 14, rank 0 holds 7 real columns, rank 1 holds 6
    assert [real_vocab_columns(13, 2, r) for r in (0, 1)] == [7, 6]
    got = activation_elements(CFG, 2, b, s, tp_rank=1)
    assert got == {"floats": 2 * block + 2 * b * s * h + b * s + b * s * 6, "masks": 2 * b * s}


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_korthikanti_elements_priced_at_16_bit_are_table2(t, sequence_parallel):
    s, b, h, a = 32, 3, 64, 8
    floats, masks = korthikanti_layer_elements(s, b, h, a, t, sequence_parallel)
    assert 2 * floats + masks == pytest.approx(korthikanti_layer_bytes(s, b, h, a, t, sequence_parallel), rel=1e-15)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_ours_with_sp_in_16_bit_is_korthikanti_sp_plus_the_rstd_vectors(t):
    """The TP + SP line: our layer at 2 bytes a float and 1 a mask is the paper's + 4·b·s/t bytes."""
    s, b, h, a = 32, 3, 64, 8
    floats, masks = block_activation_elements(b, s, h, a, t, dropout=True, sequence_parallel=True)
    assert 2 * floats + masks == korthikanti_layer_bytes(s, b, h, a, t, sequence_parallel=True) + 4 * b * s // t
    paper_floats, paper_masks = korthikanti_layer_elements(s, b, h, a, t, sequence_parallel=True)
    assert (floats, masks) == (paper_floats + 2 * b * s // t, paper_masks)  # the same masks, to the element


def test_sequence_parallel_block_by_hand():
    b, s, h, t = 3, 8, 16, 4  # (4bsh + 2bs)/t + 12bsh/t + (a/t)·b·s²  at a = 8; masks 2bsh/t + (a/t)·b·s²
    probs = 2 * b * s * s
    assert block_activation_elements(b, s, h, 8, t, sequence_parallel=True) == (
        (4 * b * s * h + 2 * b * s) // t + 12 * b * s * h // t + probs, 0)
    assert block_activation_elements(b, s, h, 8, t, dropout=True, sequence_parallel=True) == (
        (4 * b * s * h + 2 * b * s) // t + 12 * b * s * h // t + 2 * probs, 2 * b * s * h // t + probs)
    with pytest.raises(ValueError, match="sequence length 6 is not divisible by tp 4"):
        block_activation_elements(b, 6, h, 8, t, sequence_parallel=True)


@pytest.mark.parametrize("dropout", [False, True], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_sequence_parallel_divides_the_layernorm_dropout_region_by_tp(t, dropout):
    b, s, h, a = 3, 16, 32, 8
    tp, sp = (block_activation_regions(b, s, h, a, t, dropout, flag) for flag in (False, True))
    assert [x * t for x in sp["ln_dropout"]] == list(tp["ln_dropout"]), "exactly 1/tp"
    assert sp["tensor_parallel"] == tp["tensor_parallel"], "heads and columns are split by TP either way"
    cfg = GPTConfig(vocab_size=13, n_positions=s, n_embd=h, n_layer=2, n_head=a, dropout=0.1 if dropout else 0.0)
    plain, split = (predict_memory(cfg, t, b, s, np.float64, sequence_parallel=flag) for flag in (False, True))
    if t == 1:
        assert split == plain
    else:
        assert split["activations"] < plain["activations"]
        assert split["masks"] < plain["masks"] if dropout else split["masks"] == plain["masks"]
        assert {k: split[k] for k in ("params", "grads", "optimizer")} == {
            k: plain[k] for k in ("params", "grads", "optimizer")}

    def outside_blocks(flag):  # ln_f's x̂ and rstd and the LM head's input: [b, s, h] under TP, ÷ t under SP
        per_block = block_activation_elements(b, s, h, a, t, dropout, flag)[0]
        return activation_elements(cfg, t, b, s, 0, dropout, flag)["floats"] - cfg.n_layer * per_block

    assert outside_blocks(False) - outside_blocks(True) == (2 * b * s * h + b * s) - (2 * b * s * h + b * s) // t


def test_param_elements_equal_the_full_shapes_at_tp1_and_shrink_with_tp():
    full = sum(math.prod(shape) for shape in CFG.param_shapes().values())
    assert param_elements(CFG, 1) == full
    h = CFG.n_embd  # at t 2: wte padded to 14 rows, split in 2; blocks' sharded part halved
    assert param_elements(CFG, 2) == 7 * h + 6 * h + 2 * ((12 * h * h + 7 * h) // 2 + 6 * h) + 2 * h


def test_predictions_for_tp2_dp2_by_hand():
    b, s, h, e = 4 // 2, 5, CFG.n_embd, 8
    run = RunConfig.of(CFG, tp=2, dp=2, batch_size=4, seq_len=s)
    preds = {p.key: p for p in predict_step(run, clip=True, ddp_buckets=3)}
    act = b * s * h * e
    tp_ar = [p for p in preds.values() if p.group == "tp" and p.op == "all_reduce" and p.layer != "loss"
             and p.layer != "clip_grad_norm"]
    assert sum(p.calls for p in tp_ar) == 4 * CFG.n_layer + 2 and all(p.bytes == act * p.calls for p in tp_ar)
    assert preds[("loss", "forward", "all_reduce", "tp")].bytes == 3 * b * s * e
    assert preds[("batch", "data", "broadcast", "tp")].bytes == 2 * b * s * 8
    assert preds[("loss_normalizer", "dp_sync", "all_reduce", "dp")].bytes == 16
    ddp = preds[("ddp", "dp_sync", "all_reduce", "dp")]
    assert (ddp.calls, ddp.bytes) == (3, param_elements(CFG, 2) * e)
    assert preds[("transformer.h.0.mlp", "backward", "all_reduce", "tp")].wire_bytes == act  # 2(p−1)/p = 1


def test_sequence_parallel_moves_the_same_bytes_in_gathers_and_scatters():
    plain = predict_step(RunConfig.of(CFG, tp=4, dp=1, batch_size=4, seq_len=8), clip=False)
    sp = predict_step(RunConfig.of(CFG, tp=4, dp=1, sp=True, batch_size=4, seq_len=8), clip=False)

    def rows(preds, layer, phase):
        return {p.op: p for p in preds if p.layer == layer and p.phase == phase}

    fwd, bwd = rows(sp, "transformer.h.0.attn", "forward"), rows(sp, "transformer.h.0.attn", "backward")
    assert {op: p.calls for op, p in fwd.items()} == {"all_gather": 1, "reduce_scatter": 1}
    assert {op: p.calls for op, p in bwd.items()} == {"all_gather": 2, "reduce_scatter": 1}  # + the re-gather
    # each collective's logical tensor is the all-reduce's b·s·h; the forward pair sends what it sent:
    # (p−1)/p twice = 2(p−1)/p once
    ar = rows(plain, "transformer.h.0.attn", "forward")["all_reduce"]
    assert fwd["all_gather"].bytes == fwd["reduce_scatter"].bytes == ar.bytes
    assert fwd["all_gather"].wire_bytes + fwd["reduce_scatter"].wire_bytes == ar.wire_bytes
    ln = [p for p in sp if p.phase == SP_GRAD_SYNC]
    assert len(ln) == 2 * CFG.n_layer + 1 and all(p.bytes == 2 * CFG.n_embd * 8 for p in ln)
    lean = predict_step(RunConfig.of(CFG, tp=4, dp=1, sp=True, batch_size=4, seq_len=8), clip=False,
                        sp_regather_in_backward=False)
    assert rows(lean, "transformer.h.0.mlp", "backward")["all_gather"].calls == 1
    assert "all_gather" not in rows(lean, "lm_head", "backward")
    with pytest.raises(ValueError, match="--seq-len 6 is not divisible by tp 4"):
        predict_step(RunConfig.of(CFG, tp=4, dp=1, sp=True, batch_size=4, seq_len=6), clip=False)


def test_presets_are_sane_nominal_figures():
    assert NVLINK4_H100.bandwidth == 450e9 and IB_NDR.bandwidth == 50e9 and PCIE4_X16.bandwidth == 31.5e9
    assert NVLINK4_H100.bandwidth > IB_NDR.bandwidth > PCIE4_X16.bandwidth
    for preset in PRESETS.values():
        assert 1e-7 < preset.alpha < 1e-4 and preset.source and preset.beta == 1 / preset.bandwidth


def records_from(preds, rank=0):
    """One fake comm.jsonl record per predicted call (per-call bytes = total / calls)."""
    out = []
    for p in preds:
        for _ in range(p.calls):
            out.append(dict(rank=rank, step=0, phase=p.phase, scope=p.layer, op=p.op, group=p.group,
                            group_size=p.group_size, bytes=p.bytes // p.calls,
                            wire_bytes=p.wire_bytes // p.calls, duration=0.0))
    return out


def test_compare_flags_a_wrong_byte_a_missing_call_and_an_unpredicted_one():
    preds = predict_step(RunConfig.of(CFG, tp=2, dp=2, batch_size=4, seq_len=5), clip=True, ddp_buckets=1)
    recs = records_from(preds, 0) + records_from(preds, 1)
    rows = compare(recs, preds)
    assert all(r.match for r in rows) and formula_verdict(rows)[0]
    assert formula_verdict(rows)[1] == f"FORMULA CHECK: all {len(preds)} rows match (calls, bytes and wire bytes per rank, exactly)"
    wrong = [dict(r) for r in recs]
    wrong[3]["bytes"] += 8
    wrong = [r for r in wrong if r["scope"] != "clip_grad_norm"] + [dict(recs[0], scope="mystery", phase="forward")]
    rows = compare(wrong, preds)
    ok, line = formula_verdict(rows)
    assert not ok and line.startswith("FORMULA CHECK FAILED: 3 of ")
    assert {r.layer for r in rows if not r.match} == {recs[3]["scope"], "clip_grad_norm", "mystery"}
    assert "NO" in format_comparison(rows)
    # records of phases the step does not predict (init broadcasts, verification) are left out
    assert all(r.match for r in compare(recs + [dict(recs[0], phase="init")], preds))


def test_compare_checks_wire_bytes_too():
    """The issue's planted bug: all-reduce wire bytes recorded as (p−1)/p·B instead of the ring's 2(p−1)/p·B.
    Calls and logical bytes still match, so only the wire column can fail the row — and it must."""
    preds = predict_step(RunConfig.of(CFG, tp=4, dp=1, batch_size=4, seq_len=5), clip=False)
    recs = records_from(preds)
    for r in recs:
        if r["op"] == "all_reduce":
            r["wire_bytes"] = (r["group_size"] - 1) * r["bytes"] // r["group_size"]
    rows = compare(recs, preds)
    bad = [r for r in rows if not r.match]
    assert bad and all(r.op == "all_reduce" and r.mismatches() == ["wire"] for r in bad)
    assert all(r.match for r in rows if r.op != "all_reduce")
    ok, line = formula_verdict(rows)
    assert not ok and line.startswith(f"FORMULA CHECK FAILED: {len(bad)} of {len(rows)} rows differ")
    assert f"wire {bad[0].measured_wire:,.0f} vs {bad[0].predicted_wire:,.0f}" in line
    table = format_comparison(rows).splitlines()
    assert all("yes" not in line for line in table if " all_reduce " in line)  # never "yes" beside a mismatch
    assert sum(line.endswith("NO: wire") for line in table) == len(bad)


def test_estimates_from_records_equal_estimates_from_predictions():
    preds = predict_step(RunConfig.of(CFG, tp=2, dp=2, batch_size=4, seq_len=5), clip=True, ddp_buckets=1)
    links = {"tp": NVLINK4_H100, "dp": IB_NDR}
    recs = records_from(preds, 0) + records_from(preds, 1)
    assert estimate_step_time(recs, links) == pytest.approx(estimate_step_time(preds, links))
    by_group = estimate_breakdown(preds, links)
    assert set(by_group) == {"tp", "dp"} and sum(by_group.values()) == pytest.approx(estimate_step_time(preds, links))
    with pytest.raises(KeyError, match="no link preset for group 'dp'"):
        estimate_step_time(preds, {"tp": NVLINK4_H100})


def test_whatif_tp_across_nodes_costs_more_than_tp_inside_a_node():
    """The figure's claim, as numbers: for every model, TP over InfiniBand is slower than TP over NVLink."""
    from tpsim.figures.whatif import whatif_numbers

    for model, places in whatif_numbers().items():
        inside, across = (sum(v.values()) for v in places.values())
        assert across > 3 * inside, f"{model}: {across * 1e3:.1f} ms vs {inside * 1e3:.1f} ms"
