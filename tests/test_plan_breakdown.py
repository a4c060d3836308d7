"""The compute split by kernel class (``tpsim.plan.breakdown``): the classes add up to ``time_s.compute``, each
class holds the kernels it names, and the report prints their shares."""

from __future__ import annotations

import pytest

from tpsim.plan.breakdown import CLASSES, class_line, kernel_class
from tpsim.plan.kernels import Kernel
from tpsim.plan.layout import Layout
from tpsim.plan.models import PRESETS
from tpsim.plan.planner import plan

LAYOUTS = {
    "1f1b selective": Layout(tp=8, pp=4, dp=2, sp=True, recompute="selective", seq_len=4096, global_batch=64),
    "interleaved full fp8": Layout(tp=4, pp=4, dp=2, vp=2, schedule="interleaved", recompute="full", fp8=True,
                                   seq_len=4096, global_batch=64),
    "zb-h1 fused": Layout(tp=2, pp=4, dp=4, schedule="zb-h1", attention="fused", seq_len=4096, global_batch=64),
    "one stage mfu": Layout(tp=8, dp=4, mfu=0.5, seq_len=4096, global_batch=64),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_classes_add_up_to_the_compute(name):
    lay = LAYOUTS[name]
    p = plan(PRESETS["llama3-70b"], lay)
    classes = p.compute_classes_s
    assert set(classes) == set(CLASSES) and all(v >= 0 for v in classes.values())
    assert sum(classes.values()) == pytest.approx(p.time_s["compute"], rel=1e-9)
    assert (classes["recompute"] > 0) == (lay.recompute != "none")
    assert (classes["FP8 casts"] > 0) == lay.fp8
    if lay.mfu is not None:  # the flat model prices matmuls only
        assert classes["memory-bound"] == classes["FP8 casts"] == 0


def test_each_kernel_falls_in_its_class():
    assert kernel_class(Kernel("qkv", 8, 8, 8)) == kernel_class(Kernel("d_logits_weight", 8, 8, 8)) == "GEMM"
    assert kernel_class(Kernel("scores", 8, 8, 8)) == kernel_class(Kernel("softmax", nbytes=1)) == "attention"
    assert kernel_class(Kernel("flash_attention", 8, 8, 8)) == "attention"
    assert kernel_class(Kernel("norm", nbytes=1)) == kernel_class(Kernel("d_swiglu", nbytes=1)) == "memory-bound"
    assert kernel_class(Kernel("fp8_cast_qkv", nbytes=1)) == kernel_class(Kernel("d_fp8_cast_fc2", nbytes=1)) \
        == "FP8 casts"


def test_the_line_gives_each_nonzero_class_its_share():
    assert class_line({"GEMM": 3.0, "attention": 1.0, "memory-bound": 0.0, "FP8 casts": 0.0, "recompute": 0.0}) \
        == "compute by kernel class: GEMM 75%, attention 25%"
