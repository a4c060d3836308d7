"""``tpsim plan``: the published numbers it must reproduce, and the command's behaviour (single process, no MPI).

Published numbers: Megatron-LM's bytes-per-parameter table (distributed optimizer), Korthikanti et al. 2022
Table 2's rows, the ZeRO paper's 7.5 B example, the presets' parameter counts, Narayanan et al. 2021's FLOPs
formula and plain TP's 8·b·s·h·(t−1)/t elements per layer, and the comparison with their Table 1 (printed).
"""

from __future__ import annotations

import json
import time

import pytest

from tpsim.plan.cli import main
from tpsim.plan.comm import tp_wire_bytes_per_layer
from tpsim.plan.layout import Layout
from tpsim.plan.memory import activation_bytes_per_layer, state_bytes_per_param, total_params
from tpsim.plan.models import PRESETS, from_hf_config
from tpsim.plan.planner import plan
from tpsim.plan.published import zero_paper_example
from tpsim.plan.search import search
from tpsim.plan.timing import flops_per_step, narayanan_flops
from tpsim.predict.gpt_memory import korthikanti_layer_bytes

GPT3 = PRESETS["gpt3-175b"]


@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_megatron_bytes_per_parameter_table(d):
    """dist_optimizer.md: 18 → 6 + 12/d (bf16 params, fp32 grads), 16 → 8 + 8/d (fp32); fp16 the bf16 row, as
    Megatron runs it (gradients accumulated and reduced in fp32) and Korthikanti et al. 2022 count it — not the
    table's fp16 row (20 → 4 + 16/d), which keeps a 16-bit gradient beside the fp32 main one."""
    for dtype, plain, sharded in (("fp16", 18, 6 + 12 / d), ("bf16", 18, 6 + 12 / d), ("fp32", 16, 8 + 8 / d)):
        assert state_bytes_per_param(dtype, 0, d)["total"] == plain
        assert state_bytes_per_param(dtype, 1, d)["total"] == pytest.approx(sharded, rel=1e-15)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_table_2_rows(t):
    """GPT-3's layer (s 2048, b 1, h 12288, a 96) at 16-bit: every row of Table 2, exactly."""
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h
    rows = {("none", False): korthikanti_layer_bytes(s, b, h, a, t),
            ("none", True): sbh / t * (34 + 5 * a * s / h),
            ("selective", False): sbh * (10 + 24 / t), ("selective", True): sbh * 34 / t,
            ("full", False): 2 * sbh, ("full", True): 2 * sbh / t}  # SP: the input's s/t rows
    if t > 1:
        assert rows[("none", False)] == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    for (recompute, sp), want in rows.items():
        lay = Layout(tp=t, sp=sp, recompute=recompute, seq_len=s, micro_batch=b, dtype="bf16")
        got = activation_bytes_per_layer(GPT3, lay)
        assert got["paper"] == pytest.approx(want, rel=1e-12), (recompute, sp)
        assert got["tpsim_extra"] == (0 if recompute == "full" else 2 * 2 * b * s / (t if sp else 1))


def test_zero_paper_7_5b_example():
    """Rajbhandari et al. 2019: 7.5 B parameters, 16 bytes each = 120 GB; optimizer states sharded over Nd = 64:
    (2 + 2 + 12/64)·7.5 B = 31.4 GB. A Megatron float16 run keeps its gradients in fp32: 2 more bytes, 6 + 12/64."""
    z = zero_paper_example()
    assert z["baseline_gb"] == pytest.approx(120.0)
    assert round(z["os_sharded_gb"], 1) == 31.4
    assert z["megatron_fp16_sharded_gb"] == pytest.approx(7.5 * (6 + 12 / 64))


@pytest.mark.parametrize("name", ["gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b"])
def test_parameter_counts_within_half_a_percent(name):
    m = PRESETS[name]
    assert abs(total_params(m) / m.published_params - 1) < 0.005, total_params(m)


def test_flops_are_narayanans_formula():
    lay = Layout(seq_len=2048, global_batch=1536)
    args = (1536, 2048, GPT3.layers, GPT3.hidden, GPT3.vocab)
    assert flops_per_step(GPT3, lay) == pytest.approx(narayanan_flops(*args), rel=1e-12)
    assert flops_per_step(GPT3, lay, "full") == pytest.approx(narayanan_flops(*args, recompute=True), rel=1e-12)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_plain_tp_layer_bytes_are_8bsh_times_t_minus_1_over_t(t):
    lay = Layout(tp=t, seq_len=2048, micro_batch=2, dtype="bf16")
    b, s, h = 2, 2048, GPT3.hidden
    assert tp_wire_bytes_per_layer(GPT3, lay) == 2 * 8 * b * s * h * (t - 1) // t


def test_pipeline_keeps_min_p_m_microbatches_in_flight():
    assert Layout(pp=4, global_batch=64).in_flight == 4
    assert Layout(pp=8, dp=2, micro_batch=2, global_batch=8).in_flight == 2


def test_hf_config_json_reader(tmp_path):
    llama = tmp_path / "llama" / "config.json"
    llama.parent.mkdir()
    llama.write_text(json.dumps({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
                                 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                                 "intermediate_size": 14336, "max_position_embeddings": 8192,
                                 "tie_word_embeddings": False}))
    assert total_params(from_hf_config(llama)) == PRESETS["llama3-8b"].published_params
    gpt2 = tmp_path / "config.json"
    gpt2.write_text(json.dumps({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12,
                                "n_head": 12, "n_positions": 1024}))
    assert total_params(from_hf_config(gpt2)) == total_params(PRESETS["gpt2"])


def test_json_last_line_has_the_documented_fields(capsys):
    assert main(["--model", "llama3-70b", "--tp", "8", "--pp", "4", "--dp", "2", "--sp", "--recompute",
                 "selective", "--seq-len", "8192", "--global-batch", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"name", "params_total"} <= set(out["model"]) and out["layout"]["gpus"] == 64
    g = out["per_gpu"]
    assert set(g["memory_bytes"]) == {"params", "grads", "optimizer", "activations", "total"}
    assert set(g["wire_bytes_per_step"]) == {"tp", "dp", "pp", "embedding"}
    assert {"model_state_bytes_per_param", "activation_bytes_per_layer", "tp_wire_bytes_per_layer_per_microbatch",
            "params"} <= set(g)
    assert set(out["time_s"]) >= {"compute", "tp", "dp", "pp", "bubble", "step"} and out["fits"] is True


def test_search_ranks_layouts_that_fit(capsys):
    plans = search(PRESETS["llama3-70b"], Layout(sp=True, recompute="selective", seq_len=8192, global_batch=64), 64)
    assert plans and all(p.fits for p in plans)
    steps = [p.time_s["step"] for p in plans]
    assert steps == sorted(steps)
    assert all(p.layout["tp"] * p.layout["pp"] * p.layout["dp"] == 64 for p in plans)
    assert main(["--model", "llama3-70b", "--gpus", "64", "--search", "--sp", "--seq-len", "8192", "--recompute",
                 "selective", "--global-batch", "64", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["layouts"]) == len(plans)


def test_a_bad_layout_is_one_line_and_exit_2(capsys):
    assert main(["--model", "llama3-70b", "--tp", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not divisible by tp 3" in err[0]


def test_one_plan_takes_milliseconds():
    t0 = time.perf_counter()
    plan(PRESETS["llama3-405b"], Layout(tp=8, pp=14, dp=8, sp=True, seq_len=8192, global_batch=1024))
    assert time.perf_counter() - t0 < 0.5


def test_gpus_without_search_must_be_the_layouts_gpus(capsys):
    """``--gpus 1024`` without ``--search`` used to plan one GPU in silence: now one line, exit 2, naming the
    product the layout has and the two ways out."""
    assert main(["--model", "llama3-70b", "--gpus", "1024"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--gpus 1024" in err[0] and "= 1 GPUs" in err[0] and "--search" in err[0]
    assert main(["--model", "gpt2", "--tp", "2", "--dp", "2", "--gpus", "4"]) == 0  # the layout's own count


def test_model_and_hardware_tflops_apart_under_full_recompute():
    """Full recompute repeats each layer's forward: the hardware runs 4/3 of the layers' FLOPs, the model counts
    them once (Megatron-LM's and NeMo's tables print model TFLOP/s)."""
    lay = Layout(tp=8, pp=8, dp=2, global_batch=64, recompute="full")
    p = plan(GPT3, lay)
    assert p.model_flops_per_step < p.flops_per_step < 4 / 3 * p.model_flops_per_step
    assert p.hardware_tflops_per_gpu / p.tflops_per_gpu == pytest.approx(
        p.flops_per_step / p.model_flops_per_step, rel=1e-12)
    plain = plan(GPT3, Layout(tp=8, pp=8, dp=2, global_batch=64))
    assert plain.tflops_per_gpu == plain.hardware_tflops_per_gpu
