"""The partial-FC demo as a whole program: 4 ranks, uneven class slices, both ways equal serial, a figure."""

from __future__ import annotations

import pytest

from launch_program import ROOT, run_mpi

pytestmark = pytest.mark.slow


def test_partial_fc_demo_4_ranks_both_ways_match_and_plot(tmp_path):
    r = run_mpi(4, [str(ROOT / "tests" / "programs" / "partial_fc_demo.py"), "--out", str(tmp_path),
                    "--classes", str(4 * 7 + 3)], timeout=120)
    assert r.returncode == 0, r.stderr
    verdicts = [line for line in r.stdout.splitlines() if line.startswith("VERDICT")]
    assert len(verdicts) == 2 and all(v.startswith("VERDICT: MATCH") for v in verdicts), r.stdout
    assert "Megatron way" in verdicts[0] and "InsightFace way" in verdicts[1]
    assert "uneven class slices" in r.stdout
    png = tmp_path / "partial_fc.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
