"""``tpsim plan --validate`` inside ``make test``: the small live layouts of ``tpsim.plan.validate.CASES`` (GPT and
Llama, TP, SP, DP, ZeRO-1, bfloat16) check every per-layer term the planner uses, exactly. Seconds to a minute."""

from __future__ import annotations

import subprocess
import sys

import pytest
from launch_program import ROOT

pytestmark = pytest.mark.slow


def test_validate_all_terms_match():
    done = subprocess.run([sys.executable, "-m", "tpsim.cli", "plan", "--validate"], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("VALIDATION: all ") and last.endswith(" terms match"), done.stdout
    assert "from the paper" in done.stdout


def test_validate_runs_the_pipeline_cases_live_and_lists_what_it_cannot_run():
    """The pipeline cases on their own: every term of every live schedule matches, zb-h1 carries its reason."""
    from tpsim.plan.validate_pipeline import PIPELINE_CASES

    done = subprocess.run([sys.executable, "-c", "import sys; from tpsim.plan.validate import main; "
                           "sys.exit(main(cases=[]))"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    live = [c for c in PIPELINE_CASES if c.schedule != "zb-h1"]
    for case in live:
        for term in ("virtual step time (s, 1e-12 rel.)", "p2p bytes per replica", "peak in flight per rank",
                     "embedding all-reduce wire bytes"):
            line = next(x for x in done.stdout.splitlines() if x.startswith(case.name) and term in x)
            assert line.rstrip().endswith("yes"), line
    assert "PP 4, zb-h1: not run live — --schedule zb-h1 splits the backward into B and W" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == f"VALIDATION: all {4 * len(live)} terms match"
