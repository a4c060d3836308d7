"""The shared FP8 development rows (``tpsim.plan.published_fp8``): every knob the row states reaches the plan, and
``tpsim plan --published`` prints them apart from the fitted rows, with their own median and worst error."""

from __future__ import annotations

import statistics

import pytest

from tpsim.plan.cli import main
from tpsim.plan.published_fp8 import compare_fp8, fp8_layout, load_fp8


def test_ten_rows_each_with_its_source_and_its_gpus():
    rows = load_fp8()
    assert len(rows) == 10 and all("NeMo" in r["source"] for r in rows)
    for r in rows:
        k, lay = r["lay"], fp8_layout(r)
        assert lay.gpus == k["gpus"] == k["tp"] * k["cp"] * k["pp"] * k["dp"]
        assert (lay.fp8, lay.dtype, lay.zero, lay.attention) == (True, "bfloat16", k["zero"], k["attention"])
        assert lay.overlap_grad_reduce == ("grad" in k["overlap"]) and lay.tp_comm_overlap == ("tp" in k["overlap"])
        assert lay.microbatches * lay.dp * lay.micro_batch == k["batch"]
        # the published step: global batch x sequence / (tokens a second a GPU x GPUs)
        want = k["batch"] * k["seq"] / (r["published"]["tokens_per_s_per_gpu"] * k["gpus"])
        assert r["published"]["time_s"] == pytest.approx(want, rel=1e-9)


def test_published_prints_the_fp8_rows_apart_with_their_errors(capsys):
    result = compare_fp8()
    assert result["median"] == statistics.median(abs(r["ratio"] - 1) for r in result["rows"])
    assert main(["--published"]) == 0
    out = capsys.readouterr().out
    assert "NeMo 24.07 pretraining on DGX-H100 in FP8" in out
    assert f"median {result['median']:.1%}, worst {result['worst']:.1%} over 10 runs" in out
    assert all(r["name"].removeprefix("NEMO-") in out for r in result["rows"])
    assert max(len(line) for line in out.splitlines()) <= 100
