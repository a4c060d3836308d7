"""Whole programs in 16 bits: the demo in bfloat16 (MATCH, FORMULA CHECK, 2-byte TP traffic, training) and the
drift study on a tiny setting (python -m tpsim.figures.drift)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from launch_program import run_mpi

pytestmark = pytest.mark.slow


def test_bfloat16_demo_matches_serial_formulas_and_trains(tmp_path):
    r = run_mpi(4, ["-m", "tpsim.demo", "--tp", "2", "--dtype", "bfloat16", "--steps", "20", "--out", str(tmp_path)],
                timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "VERDICT: MATCH" in r.stdout and "(bfloat16, 28 parameters)" in r.stdout
    assert "FORMULA CHECK: all" in r.stdout and "OK: replicas consistent" in r.stdout
    recs = [json.loads(line) for line in (tmp_path / "comm.jsonl").read_text().splitlines()]
    acts = [x for x in recs if x["group"] == "tp" and x["phase"] in ("forward", "backward")
            and not x["scope"].startswith("loss")]
    assert acts and all(x["dtype"] == "bfloat16" and x["bytes"] == 2 * np.prod(x["shape"]) for x in acts)
    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < 0.95 * losses[0], "bfloat16 training makes progress"


def test_drift_study_on_a_tiny_setting(tmp_path):
    r = run_mpi(2, ["-m", "tpsim.figures.drift", "--steps", "2", "--tp", "1", "2", "--out", str(tmp_path)],
                timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "drift.png").stat().st_size > 0
    summary = json.loads((tmp_path / "drift.json").read_text())["summary"]
    assert summary["tp2 float64"]["step0_grad_difference"] < 1e-12, "float64: TP equals serial to rounding"
    assert summary["tp2 bfloat16"]["step0_grad_difference"] > 1e-4, "bfloat16: the summation order shows"
    both = summary["tp2 bfloat16 fp32 at both"]["step0_grad_difference"]
    assert both < 0.01 * summary["tp2 bfloat16"]["step0_grad_difference"], "float32 TP sums remove it"
    again = run_mpi(2, ["-m", "tpsim.figures.drift", "--steps", "2", "--tp", "1", "2", "--out", str(tmp_path / "b")],
                    timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (tmp_path / "b" / "drift.json").read_bytes() == (tmp_path / "drift.json").read_bytes(), \
        "the drift study is deterministic on one machine (figures/drift.json is rewritten byte for byte)"
    # --replot redraws the same figure from the two files, without training, and refuses curves of another run
    png = (tmp_path / "drift.png").read_bytes()
    replot = run_mpi(1, ["-m", "tpsim.figures.drift", "--replot", "--out", str(tmp_path)], timeout=120)
    assert replot.returncode == 0 and (tmp_path / "drift.png").read_bytes() == png, replot.stdout + replot.stderr
    curves = json.loads((tmp_path / "drift_curves.json").read_text())
    curves["tp2 bfloat16"][-1] += 1e-3
    (tmp_path / "drift_curves.json").write_text(json.dumps(curves))
    wrong = run_mpi(1, ["-m", "tpsim.figures.drift", "--replot", "--out", str(tmp_path)], timeout=120)
    assert wrong.returncode != 0 and "not the run" in wrong.stdout + wrong.stderr, wrong.stdout + wrong.stderr
