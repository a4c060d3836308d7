"""The demo with ``--overlap-grad-reduce`` / ``--overlap-param-gather``: every check holds, the DP OVERLAP CHECK
matches the planner, the overlap hides part of the DP communication on the virtual clock, and the trained
model is the plain run's bit for bit (the same final loss printed, the same trained parameters written)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from launch_program import run_mpi
from tpsim.hf.folder import read_folder
from tpsim.trace.cli import report_main
from tpsim.trace.exposed import modelled

pytestmark = pytest.mark.slow


def demo(tmp_path, name, *flags):
    out, save = tmp_path / name, tmp_path / f"{name}-model"
    r = run_mpi(4, ["-m", "tpsim.demo", "--steps", "3", "--clock", "h100", "--bucket-mb", "0.1", "--out", str(out),
                    "--save", str(save), *flags], timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout, json.loads((out / "pipeline.json").read_text()), save


def reported(capsys, *argv) -> str:
    assert report_main(list(argv)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("layout", [["--tp", "2", "--dp", "2"], ["--pp", "2", "--dp", "2", "--zero", "1"]],
                         ids=["pp1-tp2-dp2", "pp2-dp2-zero1"])
def test_overlapped_demo_hides_part_of_the_dp_sync_and_trains_the_same_model(tmp_path, layout, capsys):
    extra = ["--overlap-param-gather"] if "--zero" in layout else []
    plain, plain_doc, plain_save = demo(tmp_path, "plain", *layout)
    over, over_doc, over_save = demo(tmp_path, "over", *layout, "--overlap-grad-reduce", *extra)
    for text in (plain, over):
        assert "DP OVERLAP CHECK: MATCH" in text and "every check holds" in text
    assert "overlapped with the last backward" in over and "DP overlap: " in over
    for p, o in zip(plain_doc["dp"]["ranks"], over_doc["dp"]["ranks"]):
        assert p["exposed_s"] == pytest.approx(p["comm_s"], rel=1e-12)  # no overlap: all of it exposed
        assert o["comm_s"] == pytest.approx(p["comm_s"], rel=1e-12) and o["exposed_s"] < p["exposed_s"]
        assert o["hidden_s"] > 0
    summary = [line for line in plain.splitlines() if line.startswith("summary:")]
    assert summary == [line for line in over.splitlines() if line.startswith("summary:")]
    a, b = read_folder(str(plain_save), np.float64)[1], read_folder(str(over_save), np.float64)[1]
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
    for doc, name in ((plain_doc, "plain"), (over_doc, "over")):  # tpsim report shows the exposure per rank
        for text in (reported(capsys, str(tmp_path / name), "--exposed"),
                     reported(capsys, str(tmp_path / name), "--by", "kind")):
            table = [line for line in text.splitlines() if str(tmp_path) not in line]  # titles name the folder
            assert "DP gradient buckets on the virtual clock" in text and max(map(len, table)) <= 100
            for r in doc["dp"]["ranks"]:
                assert modelled(r["exposed_s"]) in text and modelled(r["comm_s"]) in text
