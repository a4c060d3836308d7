"""A layer as kernels (``tpsim.plan.kernels``) and their roofline time (``tpsim.plan.kernel_time``): the FLOPs add
up to Narayanan's count, each kernel's seconds by hand, fused attention, FP8, and GPU memory as reported."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpsim.errors import ConfigError
from tpsim.gpus import RESERVED_BYTES, gpu
from tpsim.plan.kernel_time import (FP8_GEMM_SPEEDUP, GEMM_EFFICIENCY, HBM_EFFICIENCY, kernel_seconds, layer_seconds,
                                    optimizer_seconds)
from tpsim.plan.kernels import Kernel, causal_tiles, forward, head, layer
from tpsim.plan.layout import Layout, check
from tpsim.plan.memory import activation_bytes_per_layer
from tpsim.plan.models import PRESETS
from tpsim.plan.planner import plan
from tpsim.plan.timing import layer_flops

GPT3, LLAMA70 = PRESETS["gpt3-175b"], PRESETS["llama3-70b"]
A100, H100 = gpu("a100-80gb"), gpu("h100-80gb")


@pytest.mark.parametrize("model", [GPT3, LLAMA70], ids=["gpt3", "llama70"])
@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_a_layers_kernels_do_exactly_the_flops_of_the_papers_count(model, t, recompute):
    """Σ of the kernels' FLOPs for one micro-batch on one GPU = layer_flops (a token, the TP group) × b·s / t."""
    lay = Layout(tp=t, recompute=recompute, seq_len=2048, micro_batch=2)
    want, tokens = layer_flops(model, lay), lay.micro_batch * lay.seq_len
    for op, kernels in layer(model, lay).items():
        assert sum(k.flops for k in kernels) == pytest.approx(want[op] * tokens / t, rel=1e-12), op


def test_forward_order_names_and_every_pass_in_its_slot():
    assert [k.name for k in forward(GPT3, Layout(tp=8))] == [
        "norm", "qkv", "scores", "softmax", "attention_dropout", "context", "proj", "bias_dropout_add", "norm", "fc1",
        "bias_gelu", "fc2", "bias_dropout_add"]
    assert [k.name for k in forward(LLAMA70, Layout(tp=8))] == [
        "norm", "qkv", "rope", "scores", "softmax", "context", "proj", "residual", "norm", "gate_up", "swiglu",
        "down", "residual"]


def test_the_roofline_by_hand():
    """A100, float16: a matmul takes the longer of its FLOPs at 0.70 of 312 TFLOP/s and its bytes at 0.85 of
    2.039 TB/s; a pass its bytes."""
    lay = Layout(dtype="float16", gpu="a100-80gb")
    qkv = Kernel("qkv", 2048, 3 * 12288 // 8, 12288)
    flops, nbytes = 2 * 2048 * 4608 * 12288, 2 * (2048 * 12288 + 12288 * 4608 + 2048 * 4608)
    assert kernel_seconds(qkv, lay, A100) == max(flops / (312e12 * 0.70), nbytes / (2.039e12 * 0.85))
    assert kernel_seconds(qkv, lay, A100) == flops / (312e12 * GEMM_EFFICIENCY)  # compute-bound
    scores = Kernel("scores", 2048, 2048, 128, 12)  # 12 heads of [s, d] x [d, s], d = 128 FLOPs a byte
    read_write = 12 * 2 * (2048 * 128 + 128 * 2048 + 2048 * 2048)  # q, k in; the [s, s] scores out, 2 bytes
    assert kernel_seconds(scores, lay, A100) == read_write / (2.039e12 * 0.85)
    assert scores.flops / read_write < 312e12 / 2.039e12  # 114 FLOPs a byte, below the ridge: memory-bound
    assert kernel_seconds(Kernel("norm", nbytes=1e9), lay, A100) == 1e9 / (2.039e12 * HBM_EFFICIENCY)
    flat = replace(lay, mfu=0.5)
    assert kernel_seconds(qkv, flat, A100) == flops / (312e12 * 0.5) and kernel_seconds(
        Kernel("norm", nbytes=1e9), flat, A100) == 0


def test_fused_attention_keeps_no_scores_and_recomputes_them_in_its_backward():
    lay = Layout(tp=8, seq_len=4096)
    fused = replace(lay, attention="fused")
    assert not [k for k in layer(GPT3, fused)["F"] if k.name in ("softmax", "attention_dropout", "scores")]
    f = {op: sum(k.flops for k in ks if k.name in ("scores", "context", "flash_attention")) for op, ks in
         layer(GPT3, lay).items()}
    g = {op: sum(k.flops for k in ks if k.name == "flash_attention") for op, ks in layer(GPT3, fused).items()}
    # the flash kernel skips the causal square's tiles above the diagonal: 32 x 33 / 2 of 32² tiles of 128 at s 4096
    assert g["F"] == pytest.approx(f["F"] * 33 / 64, rel=1e-12) and g["B"] == pytest.approx(g["F"] * 5 / 2, rel=1e-12)
    assert layer_seconds(GPT3, fused, H100)["F"] < layer_seconds(GPT3, lay, H100)["F"]
    s, b, h, a, t = 4096, 1, GPT3.hidden, GPT3.heads, 8  # Korthikanti's selective row + the log-sum-exp
    assert activation_bytes_per_layer(GPT3, fused)["paper"] == pytest.approx(
        s * b * h * (10 + 24 / t) + 4 * a * s * b / t, rel=1e-12)
    assert not [k for k in layer(GPT3, replace(fused, recompute="selective"))["B"] if k.name == "scores"]


def test_causal_tiles_counts_the_flash_kernels_tiles_by_hand():
    """n = ⌈s/128⌉ tiles a side, n(n + 1)/2 of n² computed: one tile whole, two 3 of 4, 2048's 16 · 17/2 of 256."""
    assert [causal_tiles(s) for s in (1, 128, 129, 256, 2048)] == [1.0, 1.0, 0.75, 0.75, 136 / 256]


@pytest.mark.parametrize("speedup", [None, 1.6, 2.0])
def test_fp8_runs_only_the_layers_weight_matmuls_at_the_fp8_rate(speedup):
    """The weight matmuls at the fitted (or given) speed-up over the 16-bit rate — these GPT-3 shapes are
    compute-bound, so their time falls by exactly that factor — every other kernel unchanged."""
    lay = Layout(tp=8, seq_len=2048, gpu="h100-80gb")
    fp8 = replace(lay, fp8=True, fp8_gemm_speedup=speedup)
    want = FP8_GEMM_SPEEDUP if speedup is None else speedup
    for k in layer(GPT3, lay)["F"] + layer(GPT3, lay)["W"] + head(GPT3, lay)["F"]:
        fast = k.name.removeprefix("d_").removesuffix("_weight") in ("qkv", "proj", "fc1", "fc2")
        ratio = kernel_seconds(k, lay, H100) / kernel_seconds(k, fp8, H100) if k.is_matmul else 1.0
        assert ratio == pytest.approx(want if fast else 1.0, rel=1e-12) or not fast, k.name
        if not fast:
            assert kernel_seconds(k, fp8, H100) == kernel_seconds(k, lay, H100), k.name
    with pytest.raises(ConfigError, match="no FP8"):
        plan(GPT3, replace(fp8, gpu="a100-80gb"))
    with pytest.raises(ConfigError, match="bfloat16"):
        check(GPT3, replace(fp8, dtype="float16"))


def test_gpu_memory_is_what_the_card_reports_less_the_reserve():
    assert H100.memory_bytes == 81_559 * 2 ** 20 and gpu("h200-141gb").memory_bytes == 143_771 * 2 ** 20
    assert H100.usable_bytes == H100.memory_bytes - RESERVED_BYTES == 81_559 * 2 ** 20 - 2 ** 30
    p = plan(GPT3, Layout(tp=8, pp=16, dp=8, sp=True, recompute="full", seq_len=2048, global_batch=1536))
    assert p.fits == (p.per_gpu["memory_bytes"]["total"] <= H100.usable_bytes)
    assert p.per_gpu["memory_bytes"]["activations"] == pytest.approx(0.60e9, rel=0.01)  # 2sbh/t a layer


def test_the_optimizer_moves_its_bytes_at_hbm_speed_and_zero_1_divides_them():
    lay = Layout(dp=8, dtype="bfloat16")
    assert optimizer_seconds(10 ** 9, lay, H100) == 10 ** 9 * 34 / (3.35e12 * HBM_EFFICIENCY)
    assert optimizer_seconds(10 ** 9, replace(lay, zero=1), H100) == pytest.approx(
        optimizer_seconds(10 ** 9, lay, H100) / 8, rel=1e-12)
    assert optimizer_seconds(10 ** 9, replace(lay, mfu=0.5), H100) == 0
