"""--tp-comm-overlap through the demo: every check holds (FORMULA CHECK counting the chunked steps, the serial
twin, on a GPU clock the planner's bubble and step), the losses equal the blocking run's to the last printed
digit and metrics.jsonl's to the bit, and a layout that cannot overlap is refused in one line before any work."""

from __future__ import annotations

import json

import pytest

from launch_program import run_mpi, without_launcher_notices

pytestmark = pytest.mark.slow


def losses(folder):
    return [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("args", [["--tp", "4"], ["--tp", "2", "--pp", "2", "--clock", "h100-80gb",
                                                 "--arch", "llama", "--schedule", "zb-h1"]],
                         ids=["tp4", "pp2-tp2-llama-zb-h1"])
def test_demo_with_the_flag_passes_every_check_and_trains_the_same_bits(tmp_path, args):
    common = ["-m", "tpsim.demo", "--sequence-parallel", "--steps", "3", *args]
    on = run_mpi(4, [*common, "--tp-comm-overlap", "--out", str(tmp_path / "on")], timeout=300)
    off = run_mpi(4, [*common, "--out", str(tmp_path / "off")], timeout=300)
    assert on.returncode == off.returncode == 0, on.stdout[-3000:] + on.stderr[-3000:]
    assert "FORMULA CHECK: all" in on.stdout and "every check holds" in on.stdout
    if "--clock" in args:
        assert "BUBBLE CHECK: MATCH" in on.stdout
        line = next(x for x in on.stdout.splitlines() if x.startswith("TP overlap: "))
        assert "pipelined with their GEMMs" in line and "a/(t-1) <= g/t" in line
        assert "TP overlap: " not in off.stdout
    assert losses(tmp_path / "on") == losses(tmp_path / "off")
    steps = [json.loads(line) for line in (tmp_path / "on" / "comm.jsonl").read_text().splitlines()]
    assert any("gemms" in r for r in steps) and all(r["overlap_step"] >= 1 for r in steps if "gemms" in r)


# one launch per case, by design: each is its own error path, and a program stops at its first error
@pytest.mark.parametrize("args, message", [
    (["--tp", "4"], "--tp-comm-overlap needs --sequence-parallel"),
    (["--tp", "1", "--sequence-parallel"], "--tp-comm-overlap needs --tp > 1"),
])
def test_a_layout_that_cannot_overlap_is_one_line_on_rank_zero(args, message):
    r = run_mpi(4, ["-m", "tpsim.demo", "--tp-comm-overlap", *args], timeout=60)
    assert r.returncode != 0
    errors = [line for line in without_launcher_notices(r.stderr).splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("tpsim.demo: error: ") and message in errors[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
