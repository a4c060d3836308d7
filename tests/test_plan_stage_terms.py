"""The planner's per-feature terms (``tpsim.plan.stage_terms``): one table, and a new feature is one entry.

A term registered for a test (a constant on every F, as an expert all-to-all would be) is charged to every
forward of every rank, is reported as that rank's ``{name}_s``, and moves the step by exactly its seconds where
nothing else changes: the no-pipeline step, one forward a micro-batch on one rank.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.plan import stage_terms
from tpsim.plan.layout import Layout
from tpsim.plan.models import PRESETS
from tpsim.plan.planner import plan

GPT2 = PRESETS["gpt2"]


def constant_forward(seconds: float):
    def term(model, lay, gpu, tables, split):
        out = np.zeros((lay.pp, lay.vp, 3))
        out[:, :, 0] = seconds
        return out
    return term


def test_the_table_holds_tp_cp_and_zero3_in_that_order():
    assert list(stage_terms.STAGE_TERMS) == ["tp", "cp", "zero3"]


@pytest.mark.parametrize("pp, vp, schedule", [(1, 1, "1f1b"), (2, 1, "1f1b"), (2, 2, "interleaved"), (4, 1, "zb-h1")])
def test_a_registered_term_is_charged_to_every_action_and_reported_per_rank(monkeypatch, pp, vp, schedule):
    lay = Layout(tp=2, pp=pp, dp=2, vp=vp, schedule=schedule, seq_len=1024, global_batch=64, micro_batch=2)
    before = plan(GPT2, lay)
    monkeypatch.setitem(stage_terms.STAGE_TERMS, "extra", constant_forward(0.25))
    after = plan(GPT2, lay)
    m = lay.microbatches
    for a, b in zip(before.pipeline["ranks"], after.pipeline["ranks"]):
        assert b["extra_s"] == pytest.approx(0.25 * m * vp, rel=1e-12)  # every F of every chunk
        assert b["collectives_s"] - a["collectives_s"] == pytest.approx(0.25 * m * vp, rel=1e-9)
        assert "extra_s" not in a
    if pp == 1:  # no pipeline: the rank runs its m forwards one after another, nothing waits
        assert after.pipeline["makespan_s"] - before.pipeline["makespan_s"] == pytest.approx(0.25 * m,
                                                                                                   rel=1e-9)
    assert after.pipeline["makespan_s"] > before.pipeline["makespan_s"]
