"""``tpsim plan --validate`` inside ``make test``: the small live layouts of ``tpsim.plan.validate.CASES`` (GPT and
Llama, TP, SP, DP, ZeRO-1, bfloat16) and of ``PIPELINE_CASES`` check every per-layer term the planner uses,
exactly. One run of ``tpsim plan --validate`` (it runs both lists); each test reads its part of the table."""

from __future__ import annotations

import subprocess
import sys

import pytest
from launch_program import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def validated() -> str:
    """The output of ``tpsim plan --validate``, once for the module: every case, the pipeline cases too."""
    done = subprocess.run([sys.executable, "-m", "tpsim.cli", "plan", "--validate"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_validate_all_terms_match(validated):
    last = validated.strip().splitlines()[-1]
    assert last.startswith("VALIDATION: all ") and last.endswith(" terms match"), validated
    assert "from the paper" in validated


def test_validate_runs_every_pipeline_case_live(validated):
    """The pipeline cases: every term of every schedule, zb-h1 included, matches on live ranks."""
    from tpsim.plan.validate_pipeline import PIPELINE_CASES

    live = list(PIPELINE_CASES)
    assert {c.schedule for c in live} == {"afab", "1f1b", "interleaved", "zb-h1"}
    assert any(c.sp for c in live) and any(c.arch == "llama" for c in live)
    terms = ("virtual makespan (s, 1e-12 rel.)", "virtual step time (s, 1e-12 rel.)", "p2p bytes per replica",
             "peak in flight per rank",
             "peak layer activation bytes per rank", "embedding all-reduce wire bytes",
             "TP collectives on the clock per rank (s, 1e-12 rel.)")
    dp_terms = ("exposed DP seconds (1e-12 of the step)", "bubble fraction (1e-12)")  # a case with a DP sync
    gather = ("exposed param all-gather (1e-12 of the step)",)  # ZeRO-1 and 2 at dp > 1
    zero3 = ("exposed ZeRO-3 collectives (1e-12 of the step)",)  # ZeRO-3's inside its actions
    assert {c.zero for c in live} == {0, 1, 2, 3}
    lines = validated.splitlines()
    for case in live:
        for term in terms + dp_terms * (case.dp > 1) + gather * (case.dp > 1 and case.zero in (1, 2)) + \
                zero3 * (case.dp > 1 and case.zero == 3):
            line = next(x for x in lines if x.startswith(case.name) and term in x)
            assert line.rstrip().endswith("yes"), line
    assert any(c.overlap for c in live)
    assert "not run live" not in validated
    count = (len(terms) * len(live) + len(dp_terms) * sum(c.dp > 1 for c in live)
             + sum(c.dp > 1 and c.zero > 0 for c in live))  # one term more: the all-gather or ZeRO-3's
    names = {c.name for c in live}
    rows = [x for x in lines if x.rstrip().endswith((" yes", " NO")) and x[:x.find("  ")].strip() in names]
    assert len(rows) == count, f"{len(rows)} pipeline rows, expected {count}:\n" + "\n".join(rows)
