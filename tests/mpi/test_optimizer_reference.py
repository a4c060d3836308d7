"""The plain mixed-precision optimizer and ZeRO-1 step float16 as the independent reference does (unscale →
agree on found-inf → clip → AdamW → round), on every rank: DP = the world, so ZeRO-1 owns 1/1, 1/2, 1/4 or 1/8
of each bucket and an inf planted in one gradient is seen by its owner alone (tests/optimizer_reference_story.py
tells the story and its tolerances)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import get_grid

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the story is shared with the one-process test
from optimizer_reference_story import CLIP, INF_STEP, against_reference  # noqa: E402


@pytest.mark.parametrize("zero", [False, True], ids=["mixed-precision", "zero1"])
def test_float16_steps_equal_the_independent_reference_on_every_rank(zero):
    grid = get_grid(1)
    failures, norms = against_reference(grid, zero)
    assert not failures, "\n".join(failures[:10])
    assert norms[INF_STEP] is None and any(n is not None and n > CLIP for n in norms), norms
