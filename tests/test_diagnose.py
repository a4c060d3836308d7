"""The checker's diagnoses, one fixed bug at a time (the review of lessons 12–16, its "C" findings; issue 23).

Each test states what a learner saw and what is true instead: exercise 16's integer answer crashed the checker,
the shape was "named" when it agreed, an off-by-one on (0, 4) read as "0.75 × expected", one id per row read as
a sorted index set, "rank 0, kv_heads_of_rank(…, rank=1)" mixed the process with an argument. Then any value a
function can return, and the exceptions it can raise, on one rank or on all. The slow tests run ``tpsim check``.
"""

from __future__ import annotations

import textwrap
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tpsim.cli import main as tpsim_main
from tpsim.teach.diagnose import diagnose, explain_difference, infer_layout, ranges
from tpsim.teach.lessons import exercise_files
from tpsim.teach.returned import as_numbers, describe, safe_text
from tpsim.teach.verdict import PATIENCE_S, WRONG, Check, Finding, Report, summary
from wrong_answers import Unprintable, Unreadable

SOLUTIONS = exercise_files("solutions")


def test_a_one_number_integer_answer_is_a_number_not_an_index_set():
    """Exercise 16's first case is 1,000,003 × 18 B, an integer: a wrong float crashed in ranges() (exit 70)."""
    want = np.asarray(1_000_003 * 18)
    assert explain_difference(1_000_003 * 16.0, want, 1e-6 * want) == ["got 16000048: too small"]
    assert explain_difference(np.array([7]), np.array([5]), 0) == ["got 7: too large"]
    assert ranges(np.array(7)) == "7" and ranges(np.array([], int)) == "(empty)"
    assert infer_layout(want) == "values" and infer_layout(np.array([3])) == "values"


def test_the_shape_is_named_only_when_it_differs():
    expected = np.arange(6.0).reshape(2, 3)
    lines = explain_difference(expected + 1, expected, 1e-12)
    assert not any(line.startswith("expected shape") for line in lines), lines
    assert explain_difference(expected[:1], expected, 1e-12) == ["expected shape (2, 3), got shape (1, 3)"]
    assert explain_difference(expected.T, expected, 1e-12)[1] == "the transpose of the right values"
    assert explain_difference(expected.ravel(), expected, 1e-12)[1].startswith("the right values in the wrong shape")
    assert explain_difference(3.0, np.zeros(2), 0) == ["expected shape (2,), got shape () (a single number)"]


@pytest.mark.parametrize("got, expected, factor", [
    ((0, 3), (0, 4), None),  # exercise 14's off-by-one: "0.75 × expected" held only at the zero
    ((0, 0, 3), (0, 0, 4), None), ((0, 0, 8), (0, 0, 4), None),  # one non-zero entry is no "everywhere"
    ((0, 0, 4, 8), (0, 0, 2, 4), None),  # half the entries zero: not most
    ((0, 4, 8), (0, 2, 4), "2"), ((2, 4, 6), (1, 2, 3), "2"), ((-1, -2, -3), (1, 2, 3), "-1"),
    ((2, 4, 7), (1, 2, 3), None)])
def test_a_scale_factor_only_when_it_holds_everywhere_and_most_entries_are_not_zero(got, expected, factor):
    lines = explain_difference(np.array(got, float), np.array(expected, float), 0)
    said = [line for line in lines if "×" in line]
    assert said == ([f"yours is {factor} × the reference everywhere"] if factor else []), lines


def test_one_id_per_row_is_shown_as_rows_not_as_a_set():
    """Exercise 13's answer: one vocabulary id per row. It read "yours: 0, 0, 0–1, 0" and "4 of your 5 entries
    belong in the answer" (an np.isin count, meaningless per row)."""
    lines = explain_difference(np.array([0, 0, 1, 0, 0]), np.array([0, 4, 1, 2, 0]), 0, layout="rows")
    assert lines == ["2 of the 5 rows differ: row 1 (yours 0), row 3 (yours 0)"]
    pieces = np.array([[0, 0, 5], [1, 0, 3.0]])
    lines = explain_difference(pieces + [[0, 0, 0], [0, 0, 1]], pieces, 0, layout="rows")
    assert lines == ["1 of the 2 rows differs: row 1 (yours (1, 0, 4))"]
    many = explain_difference(np.zeros(9), np.arange(1, 10), 0, layout="rows")[0]
    assert many.startswith("9 of the 9 rows differ: row 0 (yours 0), row 1") and many.endswith(", and 5 more")


def test_index_sets_are_shown_as_sets_counted_and_told_apart_from_the_wrong_order():
    heads = np.array([0, 1, 2, 3, 8, 9])  # exercises 05 and 12: which columns, which heads
    assert infer_layout(heads) == "set"
    assert explain_difference(np.array([9, 8, 3, 2, 1, 0]), heads, 0) == [
        "yours, as a sorted set: 0–3, 8–9", "the right entries in the wrong order"]
    assert explain_difference(np.array([0, 1, 2, 3, 4]), heads, 0) == [
        "expected shape (6,), got shape (5,)", "yours: 0–4",
        "4 of your 5 entries belong in the answer; 2 of the answer's 6 entries are missing from yours"]
    assert explain_difference(np.array([0, 0, 1, 2, 3, 8, 9]), heads, 0)[1:] == [
        "yours, as a sorted set: 0–3, 8–9", "yours repeats 0", "the right entries, but some more than once"]
    lines = explain_difference([0, 4], np.array([0, 1]), 0, layout="set")  # exercise 12: "expected shape (2,),
    assert lines == ["yours: 0, 4",  # got shape (2,)" came first, a complaint about nothing
                     "1 of your 2 entries belongs in the answer; 1 of the answer's 2 entries is missing from yours"]
    assert explain_difference([0.5, 1], np.array([0, 1]), 0, layout="set")[0].startswith(
        "yours holds values that are not whole numbers (0.5 at index 0)")
    assert explain_difference([-3, -2, 7], np.array([0, 1, 2]), 0, layout="set")[0] == "yours: -3 to -2, 7"


def test_the_process_rank_is_never_confused_with_an_argument_named_rank():
    check = Check("12", ("kv_heads_of_rank",), lambda r: None, {})
    finding = Finding(0, "kv_heads_of_rank", "kv_heads_of_rank(heads=8, kv_heads=2, tp=4, rank=1)", ["yours: 0"])
    again = Finding(2, "kv_heads_of_rank", finding.what, ["yours: 1"])
    text = summary(check, "ex12.py", WRONG, "", [([finding], 1, 0.0), ([], 1, 0.0), ([again], 1, 0.0)], 4)
    assert "\n  on MPI rank 0 (of 4): kv_heads_of_rank(heads=8, kv_heads=2, tp=4, rank=1)\n    yours: 0\n" in text
    assert "the same goes wrong on MPI rank 2" in text and "rank 0," not in text
    alone = summary(check, "ex12.py", WRONG, "", [([finding], 1, 0.0)], 1)
    assert "MPI rank" not in alone and "\n  kv_heads_of_rank(heads=8" in alone


ANSWER = np.zeros(3)
ODD_VALUES = [None, "1.5", b"12", {"a": 1}, {1, 2}, (i for i in range(3)), len, object(), Unreadable(),
              [[1, 2], [3]], [1.0, None], 1 + 2j, [1, 2j, 3], np.datetime64("2024-01-01"),
              np.array([1, "a", None], dtype=object), [np.zeros(2), np.zeros(3)], np.array(["x", "y", "z"])]


@pytest.mark.parametrize("value", ODD_VALUES, ids=lambda v: type(v).__name__)
def test_any_value_a_function_returns_gets_one_true_sentence(value):
    lines, named = diagnose(value, ANSWER, 1e-12, {"a symptom": ANSWER + 1})
    assert not named and len(lines) == 2 and lines[1] == "the answer has shape (3,)", lines
    assert lines[0].startswith("your function returned ") and "0, 0" not in lines[0], lines
    assert isinstance(as_numbers(value), str) and isinstance(describe(value), str)


def test_numbers_of_every_kind_are_read_and_judged():
    assert explain_difference(True, np.array(3.0), 0) == [
        "your function returned booleans (True/False, read as 1/0), not numbers", "got 1: too small"]
    assert explain_difference(10 ** 30, np.array(2.0), 0) == ["got 1e+30: too large"]
    assert explain_difference([np.nan, 1.0, np.inf], np.zeros(3), 0) == [
        "got nan at index 0: not a finite number; 2 of the 3 entries are not finite (0/0, inf − inf or a log of a "
        "negative number?)"]
    assert explain_difference(np.array([1, 2], np.int8), np.array([1.0, 2.0]), 0) is None
    assert explain_difference((1, 2.0), np.array([1, 2]), 0) is None  # a tuple is as good as an array
    assert explain_difference(np.zeros((0, 3)), np.zeros((0, 3)), 0) is None
    assert explain_difference([np.inf], np.array([np.inf]), 0) is None
    assert explain_difference(np.zeros(3), np.arange(1.0, 4.0), 0)[-1] == "yours is all zeros"


def test_an_exception_is_told_even_when_it_cannot_be_printed():
    assert safe_text(Unprintable()) == "<Unprintable, which cannot be printed>"
    assert safe_text("x" * 500, 10) == "x" * 9 + "…" and safe_text("two\nlines") == "two lines"
    try:
        raise Unprintable()
    except Unprintable as err:
        said = Report.raised(SimpleNamespace(module=SimpleNamespace(__file__=__file__)), err)
    assert said.startswith("raised Unprintable: <Unprintable, which cannot be printed> (line ")


# --- tpsim check on real ranks ------------------------------------------------------------------------------

def tpsim(capfd, tmp_path, number: str, override: str) -> tuple[int, str, float]:
    path = tmp_path / f"ex{number}_mine.py"
    path.write_text(SOLUTIONS[number].read_text() + "\n\n# --- the mistake ---\n" + textwrap.dedent(override))
    capfd.readouterr()
    start = time.perf_counter()
    code = tpsim_main(["check", number, str(path), "--timeout", "60"])
    out, err = capfd.readouterr()
    return code, out + err, time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.parametrize("override, said", [
    ("""def model_state_bytes_per_gpu(params, dtype, zero, dp):
            return params * 16  # the ZeRO paper's 2 + 2 + 12
    """, "2-byte gradients (the ZeRO paper's 2 + 2 + 12): with bf16 weights Megatron keeps fp32 gradients"),
    ("""def model_state_bytes_per_gpu(params, dtype, zero, dp):
            return params * {"bf16": 18, "fp16": 16, "fp32": 16}[dtype] / 2 ** 30  # in GiB
    """, "your number is in GiB (bytes ÷ 2³⁰): the function returns bytes")])
def test_exercise_16_with_a_wrong_integer_sized_answer_is_diagnosed(capfd, tmp_path, override, said):
    code, out, _ = tpsim(capfd, tmp_path, "16", override)
    assert code == 1 and said in out and "Traceback" not in out, out


@pytest.mark.slow
def test_a_value_only_one_rank_returns_wrong_stops_the_check_on_every_rank(capfd, tmp_path):
    """Exercise 12's check reads the value with np.asarray(got, dtype=int64): None broke it on MPI rank 3 only."""
    code, out, _ = tpsim(capfd, tmp_path, "12", """
        _right = kv_heads_of_rank
        def kv_heads_of_rank(heads, kv_heads, tp, rank):
            from mpi4py import MPI
            return None if MPI.COMM_WORLD.Get_rank() == 3 else _right(heads, kv_heads, tp, rank)
        """)
    assert code == 1 and "Traceback" not in out, out
    assert "on MPI rank 3 (of 4): kv_heads_of_rank" in out and "returned None" in out, out


@pytest.mark.slow
@pytest.mark.parametrize("number, override", [
    ("12", """
        _right = kv_heads_of_rank
        def kv_heads_of_rank(heads, kv_heads, tp, rank):
            return [h + 0.6 for h in _right(heads, kv_heads, tp, rank)]  # truncated to the right ids by int64
        """),
    ("12", """
        _right = kv_gradient_ranks
        def kv_gradient_ranks(heads, kv_heads, tp, rank):
            return [str(r) for r in _right(heads, kv_heads, tp, rank)]  # text, not numbers
        """),
    ("08b", """
        _right = choose_layout
        def choose_layout(*args, **kwargs):
            found = _right(*args, **kwargs)
            return None if found is None else "".join(map(str, found))  # "12" once read as tp 1, dp 2
        """)])
def test_a_wrong_value_is_never_read_as_the_right_one(capfd, tmp_path, number, override):
    """Fractions, text or a string of digits are what the learner returned: never converted into the answer."""
    code, out, _ = tpsim(capfd, tmp_path, number, override)
    assert code == 1 and "Traceback" not in out and f"exercise {number} OK" not in out, out


@pytest.mark.slow
def test_an_exception_on_one_rank_is_diagnosed_even_unprintable_or_before_a_collective(capfd, tmp_path):
    code, out, _ = tpsim(capfd, tmp_path, "02", """
        class Weird(Exception):
            def __str__(self):
                raise RuntimeError("no str")
        def g_backward(dy, group):
            if group.rank == 1:
                raise Weird()
            return dy
        """)
    assert code == 1 and "on MPI rank 1 (of 2): g_backward\n    raised Weird: Weird() (line " in out, out
    code, out, seconds = tpsim(capfd, tmp_path, "02", """
        def f_backward(dy, group):
            if group.rank == 1:
                raise ValueError("rank 1 gives up")
            return group.all_reduce(dy)  # rank 0 waits here for rank 1
        """)
    assert code == 1 and "raised ValueError: rank 1 gives up (line " in out, out
    assert f"did not get past f_backward within {PATIENCE_S:g} s" in out and seconds < PATIENCE_S + 30, out
