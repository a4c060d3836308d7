"""Exercise 18 (ZB-H1's W's placed, a schedule's bubble and peak predicted): each classic slip, fed to ``tpsim
check``, is named by what the result looks like, and neither the answer nor a hint is printed; the reference
answer passes, live interleaved pipeline included.

As in ``test_diagnoses_17.py``: the reference solution with one function redefined is written to a temporary
file and checked on real ranks like a learner's file. The test asserts the slip's symptom sentence appears (the
check's own constant, so a reworded sentence cannot pass silently), that no hint is printed unasked, and that no
expected value is.
"""

from __future__ import annotations

import textwrap

import pytest

from tpsim.cli import main as tpsim_main
from tpsim.pipeline.schedules import build
from tpsim.teach.checks import CHECKS, lesson_18 as ex18
from tpsim.teach.lessons import exercise_files

pytestmark = pytest.mark.slow

SOLUTION = exercise_files("solutions")["18"]

ZB = """
        def zb_h1_order(p, m, i):
            warm = {warm}
            order = [("F", j) for j in range(warm)]
            owed = 0
            for k in range(m):
                if warm + k < m:
                    order.append(("F", warm + k))
                {body}
            return order + {left}
        """
B_THEN_W = """order.append(("B", k))
                if {when}:
                    order.append(("W", owed))
                    owed += 1"""
RIGHT = dict(warm="min(p - i - 1, m)", body=B_THEN_W.format(when="k >= i or warm + k >= m"),
             left='[("W", j) for j in range(owed, m)]')


def zb(**change) -> str:
    return ZB.format(**{**RIGHT, **change})


BUBBLE = """
        _right = bubble_fraction
        def bubble_fraction(schedule, p, m, v):
            {body}
            return _right(schedule, p, m, v)
        """
PEAK = """
        _right = peak_in_flight
        def peak_in_flight(schedule, p, m, v):
            {body}
            return _right(schedule, p, m, v)
        """

# (the redefined function, the sentence the diagnosis must contain)
SLIPS = {
    "w_right_after_its_b": (zb(body=B_THEN_W.format(when="True")), ex18.FUSED),
    "w_one_micro_batch_late": (zb(body=B_THEN_W.format(when="k >= i + 1 or warm + k >= m")), ex18.W_LATE),
    "w_one_micro_batch_early": (zb(body=B_THEN_W.format(when="k >= i - 1 or warm + k >= m")), ex18.W_EARLY),
    "w_delay_growing_the_wrong_way": (zb(body=B_THEN_W.format(when="k >= p - 1 - i or warm + k >= m")),
                                      ex18.DELAY_REVERSED),
    "every_w_at_the_end": (zb(body=B_THEN_W.format(when="False"), left='[("W", j) for j in range(m)]'),
                           ex18.W_AT_END),
    "w_before_its_b": (zb(body="""if k >= i or warm + k >= m:
                    order.append(("W", owed))
                    owed += 1
                order.append(("B", k))"""), ex18.W_BEFORE_B),
    "the_1f1b_order_with_no_w": ("""
        _right = zb_h1_order
        def zb_h1_order(p, m, i):
            return [(op, j) for op, j in _right(p, m, i) if op != "W"]
        """, ex18.NO_W),
    "warm_up_one_too_long": (zb(warm="min(p - i, m)"), ex18.EXTRA_WARMUP),
    "warm_up_not_capped_at_m": (zb(warm="p - i - 1"), ex18.UNCAPPED),
    "last_ws_in_reverse": (zb(left='[("W", j) for j in reversed(range(owed, m))]'), ex18.DRAIN_REVERSED),
    "interleaved_bubble_with_m_not_v_m": (BUBBLE.format(body="v = 1"), ex18.V_FORGOTTEN),
    "interleaved_bubble_divided_by_v": (BUBBLE.format(body="""if schedule == "interleaved":
                return (p - 1) / (m + p - 1) / v"""), ex18.V_OUTSIDE),
    "bubble_as_idle_over_busy": (BUBBLE.format(body="""f = _right(schedule, p, m, v)
            return f / (1 - f)"""), ex18.IDLE_OVER_BUSY),
    "bubble_with_p_not_p_minus_1": (BUBBLE.format(body="""if schedule != "zb-h1":
                return p / (v * m + p)"""), ex18.P_NOT_P_MINUS_1),
    "zb_bubble_as_1f1b": (BUBBLE.format(body="""if schedule == "zb-h1":
                return (p - 1) / (m + p - 1)"""), ex18.ZB_AS_1F1B),
    "zb_bubble_a_third_of_1f1b": (BUBBLE.format(body="""if schedule == "zb-h1":
                return (p - 1) / (m + p - 1) / 3"""), ex18.ZB_THIRD),
    "zb_bubble_ignoring_m_below_p": (BUBBLE.format(body="""if schedule == "zb-h1":
                return (p - 1) / (3 * m + p - 1)"""), ex18.ZB_SMALL_M),
    "peak_the_warm_up_only": (PEAK.format(body="""if schedule == "1f1b":
                return [min(p - i - 1, m) for i in range(p)]"""), ex18.WARMUP_ONLY),
    "peak_not_capped": (PEAK.format(body="""if schedule == "zb-h1":
                return [p] * p"""), ex18.PEAK_UNCAPPED),
    "1f1b_peak_stage_0s_everywhere": (PEAK.format(body="""if schedule == "1f1b":
                return [min(p, m)] * p"""), ex18.STAGE0_PEAK),
    "zb_peak_as_1f1b": (PEAK.format(body="""if schedule == "zb-h1":
                return [min(p - i, m) for i in range(p)]"""), ex18.ZB_PEAK_AS_1F1B),
    "interleaved_peak_as_1f1b": (PEAK.format(body="""if schedule == "interleaved":
                return [min(p - i, m) for i in range(p)]"""), ex18.INTERLEAVED_AS_1F1B),
    "interleaved_warm_up_at_v_1": (PEAK.format(body="""if schedule == "interleaved":
                return [min(2 * (p - i - 1) + (v - 1) * p + 1, v * m) for i in range(p)]"""),
                                   ex18.INTERLEAVED_AT_V1),
}


def check_18(capfd, tmp_path, monkeypatch, override: str, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)  # no hint state of another test
    path = tmp_path / "ex18_mine.py"
    path.write_text(SOLUTION.read_text() + "\n\n# --- the slip ---\n" + textwrap.dedent(override))
    capfd.readouterr()
    code = tpsim_main(["check", "18", str(path), *args])
    out, err = capfd.readouterr()
    return code, out + err


@pytest.mark.parametrize("case", sorted(SLIPS))
def test_each_slip_is_named_and_the_answer_is_not_printed(capfd, tmp_path, monkeypatch, case):
    override, sentence = SLIPS[case]
    code, out = check_18(capfd, tmp_path, monkeypatch, override)
    assert code == 1, out
    assert "exercise 18 FAILED" in out and sentence in out, out
    assert "--hint reveals" in out, out
    assert not any(level in out for levels in CHECKS["18"].hints.values() for level in levels), out
    assert "expected " not in out.replace("expected shape", ""), out
    assert "Traceback" not in out, out


def test_the_reference_answer_passes_with_the_live_pipeline(capfd, tmp_path, monkeypatch):
    code, out = check_18(capfd, tmp_path, monkeypatch, "")
    assert code == 0, out
    assert "exercise 18 OK: zb_h1_order, bubble_fraction, peak_in_flight match" in out, out


def test_an_order_that_is_not_pairs_of_an_op_and_a_micro_batch_gets_one_sentence(capfd, tmp_path, monkeypatch):
    code, out = check_18(capfd, tmp_path, monkeypatch, """
        _right = zb_h1_order
        def zb_h1_order(p, m, i):
            return [f"{op}{j}" for op, j in _right(p, m, i)]
        """)
    assert code == 1, out
    assert 'return a list of ("F", j), ("B", j) and ("W", j) pairs' in out and "Traceback" not in out, out


def test_hints_come_one_level_at_a_time(capfd, tmp_path, monkeypatch):
    override = SLIPS["w_right_after_its_b"][0]
    levels = CHECKS["18"].hints["zb_h1_order"]
    for level in range(1, len(levels) + 1):
        code, out = check_18(capfd, tmp_path, monkeypatch, override, "--hint")
        assert code == 1, out
        assert all(text in out for text in levels[:level]) and not any(text in out for text in levels[level:]), out


def test_the_inputs_reach_every_slip():
    """Every slip differs from the answer on some input the check gives, and on the inputs rank 0 compares first
    (cases 0, 4, 8, ... on 4 ranks) — so the finding shown is the named one; the edge cases are there."""
    assert any(p == 1 for p, _ in ex18.ORDER_CASES) and any(m < p - 1 for p, m in ex18.ORDER_CASES)
    assert any(m == p for p, m in ex18.ORDER_CASES) and any(m > p for p, m in ex18.ORDER_CASES)
    shown = [c for k, c in enumerate(ex18.PREDICT_CASES) if k % 4 == 0]
    assert {s for s, *_ in shown} == {"1f1b", "interleaved", "zb-h1"}
    assert any(s == "zb-h1" and m < p for s, p, m, _ in shown) and any(s == "interleaved" and v == 1
                                                                      for s, _, _, v in shown)
    assert ("interleaved", 4, ex18.LIVE_M, ex18.LIVE_V) in ex18.PREDICT_CASES
    for schedule, p, m, v in ex18.PREDICT_CASES:  # every case is a schedule tpsim builds
        build(schedule, p, m, vp=v)
