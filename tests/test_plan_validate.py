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
