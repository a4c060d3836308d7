"""The demo's text, without running it: the model-state table's header and Megatron's rows only where they
apply, and the closing summary and "next:" lines."""

from __future__ import annotations

from types import SimpleNamespace

from tpsim.demo.report import closing_lines, passed
from tpsim.predict.model_state import ModelState, format_model_state, layout_for

GRID = SimpleNamespace(tp=4, dp=2)


def model_state_text(distributed: bool, dp: int = 2) -> str:
    layout = layout_for(8)
    params = 1000
    optimizer = params * layout.sharded // (dp if distributed else 1)
    measured = ModelState(params=params * 8, grads=params * 8, optimizer=optimizer, parameters=params)
    return format_model_state(measured, layout, dp, int(distributed), optimizer)


def test_every_column_of_the_model_state_table_has_a_header():
    header = model_state_text(False).splitlines()[0].split()
    assert header == ["bytes", "per", "parameter", "formula", "check"]


def test_megatrons_table_is_shown_only_for_a_distributed_optimizer():
    plain = model_state_text(False)
    assert "= 12" not in plain and "--zero 1 shows it" in plain
    zero = model_state_text(True)
    assert zero.count("= 12") == 3 and "all three come to 12 at d = 2" in zero and "at d = 8 they part, 6 / 7.5 / 9" in zero
    assert "all three come to" not in model_state_text(True, dp=4)


def test_closing_lines_say_what_held_or_what_failed_and_what_next():
    metrics = [{"loss": 3.45265}, {"loss": 0.31281}]
    ok = closing_lines(GRID, 100, metrics, "tpsim-out", {"step 0 = serial": True, "formulas": True})
    assert ok == ["summary: TP(4) x DP(2), 100 steps, loss 3.4527 -> 0.3128; every check holds: step 0 = serial, "
                  "formulas",
                  "next: tpsim report tpsim-out --by kind · tpsim-out/timeline.json in ui.perfetto.dev · "
                  "tpsim lesson list"]
    bad = closing_lines(GRID, 100, metrics, "out", {"step 0 = serial": True, "trained = serial": False})
    assert bad[0].endswith("; FAILED: trained = serial (see above)")


def test_a_check_that_cannot_decide_is_named_as_such_and_fails_nothing():
    """The final state of a training that amplifies rounding past what a bug makes is neither equal nor different
    (tpsim.demo.noise_floor): the summary must not count it as held, and the run must not fail for it."""
    metrics = [{"loss": 3.45265}, {"loss": 0.31281}]
    checks = {"step 0 = serial": True, "trained = serial": None, "formulas": True}
    line = closing_lines(GRID, 30, metrics, "out", checks)[0]
    assert line.endswith("; every check holds: step 0 = serial, formulas; not decided: trained = serial (see above)")
    assert passed(checks) and not passed({**checks, "formulas": False})
    failed = closing_lines(GRID, 30, metrics, "out", {**checks, "formulas": False})[0]
    assert failed.endswith("; FAILED: formulas (see above); not decided: trained = serial (see above)")
