"""Exercise 17 (stage i's 1F1B order, the micro-batches it holds): each classic slip, fed to ``tpsim check``, is
named by what the result looks like, and neither the answer nor a hint is printed.

As in ``test_exercise_diagnoses.py``: the reference solution with one function redefined is written to a
temporary file and checked on real ranks like a learner's file. The test asserts the slip's symptom sentence
appears (the check's own constant, so a reworded sentence cannot pass silently), that no hint is printed
unasked, and that no expected value is.
"""

from __future__ import annotations

import textwrap

import pytest

from tpsim.cli import main as tpsim_main
from tpsim.teach.checks import CHECKS, lesson_17 as ex17
from tpsim.teach.lessons import exercise_files

pytestmark = pytest.mark.slow

SOLUTION = exercise_files("solutions")["17"]

LOOP = """
        def one_f_one_b_order(p, m, i):
            warm = {warm}
            order = [("F", j) for j in range(warm)]
            for k in range(m - warm):
                order += [("F", warm + k), ("B", k)]
            return order + [("B", j) for j in range({drain_from}, m)]
        """

# (the redefined function, the sentence the diagnosis must contain)
SLIPS = {
    "warm_up_p_minus_i": (LOOP.format(warm="min(p - i, m)", drain_from="m - warm"), ex17.EXTRA_WARMUP),
    "warm_up_not_capped_at_m": (LOOP.format(warm="p - i - 1", drain_from="m - warm"), ex17.UNCAPPED),
    "every_stage_with_stage_0s_warm_up": (LOOP.format(warm="min(p - 1, m)", drain_from="m - warm"),
                                          ex17.STAGE0_WARMUP),
    "warm_up_growing_along_the_pipeline": (LOOP.format(warm="min(i, m)", drain_from="m - warm"),
                                           ex17.REVERSED_STAGES),
    "afab_instead_of_1f1b": ("""
        def one_f_one_b_order(p, m, i):
            return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
        """, ex17.AFAB),
    "drain_in_reverse": ("""
        def one_f_one_b_order(p, m, i):
            warm = min(p - i - 1, m)
            order = [("F", j) for j in range(warm)]
            for k in range(m - warm):
                order += [("F", warm + k), ("B", k)]
            return order + [("B", j) for j in reversed(range(m - warm, m))]
        """, ex17.DRAIN_REVERSED),
    "every_backward_in_reverse": ("""
        _right = one_f_one_b_order
        def one_f_one_b_order(p, m, i):
            order = _right(p, m, i)
            backwards = iter([j for op, j in order if op == "B"][::-1])
            return [(op, next(backwards)) if op == "B" else (op, j) for op, j in order]
        """, ex17.BACKWARDS_REVERSED),
    "backward_before_forward": ("""
        def one_f_one_b_order(p, m, i):
            warm = min(p - i - 1, m)
            order = [("F", j) for j in range(warm)]
            for k in range(m - warm):
                order += [("B", k), ("F", warm + k)]
            return order + [("B", j) for j in range(m - warm, m)]
        """, ex17.BACKWARD_FIRST),
    "peak_counts_every_forward": ("""
        def peak_in_flight(order):
            return sum(op == "F" for op, _ in order)
        """, ex17.COUNTED_FORWARDS),
    "peak_is_the_final_count": ("""
        def peak_in_flight(order):
            held = 0
            for op, _ in order:
                held += 1 if op == "F" else -1
            return held
        """, ex17.FINAL_COUNT),
    "peak_is_the_forwards_before_the_first_backward": ("""
        def peak_in_flight(order):
            ops = [op for op, _ in order]
            return ops.index("B")
        """, ex17.BEFORE_FIRST_BACKWARD),
}


def check_17(capfd, tmp_path, monkeypatch, override: str) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)  # no hint state of another test
    path = tmp_path / "ex17_mine.py"
    path.write_text(SOLUTION.read_text() + "\n\n# --- the slip ---\n" + textwrap.dedent(override))
    capfd.readouterr()
    code = tpsim_main(["check", "17", str(path)])
    out, err = capfd.readouterr()
    return code, out + err


@pytest.mark.parametrize("case", sorted(SLIPS))
def test_each_slip_is_named_and_the_answer_is_not_printed(capfd, tmp_path, monkeypatch, case):
    override, sentence = SLIPS[case]
    code, out = check_17(capfd, tmp_path, monkeypatch, override)
    assert code == 1, out
    assert "exercise 17 FAILED" in out and sentence in out, out
    assert "--hint reveals" in out, out
    assert not any(level in out for levels in CHECKS["17"].hints.values() for level in levels), out
    assert "expected " not in out.replace("expected shape", ""), out
    assert "Traceback" not in out, out


def test_an_order_that_is_not_pairs_of_an_op_and_a_micro_batch_gets_one_sentence(capfd, tmp_path, monkeypatch):
    code, out = check_17(capfd, tmp_path, monkeypatch, """
        _right = one_f_one_b_order
        def one_f_one_b_order(p, m, i):
            return [f"{op}{j}" for op, j in _right(p, m, i)]
        """)
    assert code == 1, out
    assert 'return a list of ("F", j) and ("B", j) pairs' in out and "Traceback" not in out, out


def test_the_edge_cases_are_in_the_inputs():
    """One stage, fewer micro-batches than stage 0's warm-up, m = p, more; the live pipeline's (p, m) on 4 ranks;
    and orders on which the forwards before the first backward are not the peak."""
    assert any(p == 1 for p, _ in ex17.CASES) and any(m < p - 1 for p, m in ex17.CASES)
    assert any(m == p for p, m in ex17.CASES) and any(m > p for p, m in ex17.CASES)
    assert (4, ex17.LIVE_M) in ex17.CASES
    tricky = [o for o in (ex17.random_order(m, seed) for m, seed in ex17.RANDOM_ORDERS)
              if ex17.peak_symptoms(o)[ex17.BEFORE_FIRST_BACKWARD] != ex17.held(o)]
    assert tricky, "no random order tells the warm-up count from the peak"
