"""The step taken apart (``tpsim.plan.step_figure``): the parts add up to the step, the expected error is the
validation's own number (leave one family out; the FP8 rows under FP8; none under --mfu), the figure is a PNG and
the command line refuses what it cannot draw."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpsim.plan.cli import main
from tpsim.plan.layout import Layout
from tpsim.plan.lofo import fp8_committed as committed_fp8
from tpsim.plan.lofo import committed
from tpsim.plan.models import PRESETS
from tpsim.plan.planner import plan
from tpsim.plan.published_fp8 import compare_fp8
from tpsim.plan.report import format_plan
from tpsim.plan.step_figure import expected_error, plot_step, step_parts

LAYOUTS = {
    "pp4-selective": ("llama3-70b", Layout(tp=8, pp=4, dp=2, sp=True, seq_len=8192, recompute="selective")),
    "zero1-overlaps": ("llama3-8b", Layout(tp=2, dp=8, sp=True, zero=1, overlap_grad_reduce=True,
                                           overlap_param_gather=True, global_batch=64)),
    "cp-interleaved": ("llama3-8b", Layout(tp=2, cp=2, pp=2, dp=2, sp=True, schedule="interleaved", vp=2,
                                           seq_len=8192, global_batch=16, attention="fused")),
    "zero3-fp8": ("gpt3-175b", Layout(tp=8, pp=8, dp=4, sp=True, zero=3, dtype="bfloat16", fp8=True)),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_parts_add_up_to_the_step(name):
    model, lay = LAYOUTS[name]
    p = plan(PRESETS[model], lay)
    parts = step_parts(p)
    assert sum(s for _, s in parts) == pytest.approx(p.time_s["step"], rel=1e-12)
    assert all(s > 0 for _, s in parts) and len({label for label, _ in parts}) == len(parts)
    compute = sum(s for label, s in parts if label.startswith("compute: "))
    assert compute == pytest.approx(p.time_s["compute"], rel=1e-12)


def test_the_expected_error_is_the_validations_own():
    model, lay = LAYOUTS["pp4-selective"]
    lofo = committed()
    band = expected_error(plan(PRESETS[model], lay))
    assert (band["median"], band["worst"]) == (lofo["median"], lofo["worst"]) and 0 < band["median"] < band["worst"]
    fp8 = committed_fp8()
    band = expected_error(plan(PRESETS[model], replace(lay, fp8=True)))
    assert (band["median"], band["worst"]) == (fp8["median"], fp8["worst"]) and "family left out" in band["rows"]
    for hand in ({"mfu": 0.4}, {"gemm_efficiency": 0.6}, {"hbm_efficiency": 0.6},
                 {"fp8": True, "fp8_gemm_speedup": 1.5}):
        p = plan(PRESETS[model], replace(lay, **hand))
        assert expected_error(p) is None and "none claimed" in format_plan(p)
    text = format_plan(plan(PRESETS[model], lay))
    assert f"expected error of the step: {lofo['median']:.1%} median, {lofo['worst']:.1%} worst" in text


def test_the_figure_is_written_and_the_cli_refuses_what_it_cannot_draw(tmp_path, capsys):
    model, lay = LAYOUTS["zero1-overlaps"]
    out = plot_step(plan(PRESETS[model], lay), tmp_path / "step.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    args = ["--model", "llama3-8b", "--tp", "2", "--dp", "4"]
    assert main([*args, "--figure", str(tmp_path / "cli.png")]) == 0
    assert f"wrote {tmp_path / 'cli.png'}" in capsys.readouterr().out and (tmp_path / "cli.png").exists()
    for bad, why in (([*args, "--figure", str(tmp_path / "no" / "x.png")], "its folder does not exist"),
                     (["--model", "llama3-8b", "--gpus", "8", "--search", "--figure", str(tmp_path / "s.png")],
                      "drop --search")):
        assert main(bad) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err
