"""Wrong answers of every kind against every exercise's checker: never a crash, never a sentence that is untrue
or that gives the answer away.

One launch per rank count (``tests/programs/checks_under_fire.py``) runs every check twice over: once with the
reference solution, keeping what each ``Report.compare`` saw (the exercises' real answers, tolerances, layouts
and symptoms: nothing of a check is repeated here), and then on learners' files whose functions return wrong
answers hypothesis drew (``tests/wrong_answers.py``; derandomized, one pickle for every rank).

(a) In process: thousands of wrong answers per exercise through ``diagnose``, each sentence held against the
    truth computed here — the shape line only when the shapes differ, a scale factor only when it holds at
    every entry and most entries are not zero, the counts of a set, the rows that differ, "the right entries
    in the wrong order" only when they are — and no value of the answer that the learner did not return.
(b) End to end, on real ranks: a verdict on every plan, exit status 1 (3 when the first call raised
    NotImplementedError), no traceback, no expected value.
"""

from __future__ import annotations

import json
import pickle
import re
import zlib
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from launch_program import ROOT, run_mpi
from tpsim.teach.checks import CHECKS
from tpsim.teach.diagnose import diagnose, ranges
from tpsim.teach.lessons import find_lesson, lesson_of
from tpsim.teach.returned import as_numbers, number
from wrong_answers import GARBAGE, RAISES, answers, build, specs

pytestmark = pytest.mark.slow

PLANS = 3  # learners' files per exercise, end to end
EXAMPLES, BATCH = 100, 12  # hypothesis examples per exercise in process, wrong answers per example
CHECK_FILES = {p.name for p in (ROOT / "tpsim" / "teach" / "checks").glob("*.py")}
NUMBER = r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"


def plans_for(exercise: str) -> list[list[tuple]]:
    """Plans of specs, the first one garbage or an exception (so the first compare fails), then anything."""
    drawn = []

    @seed(zlib.crc32(exercise.encode()))
    @settings(max_examples=PLANS, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(first=specs(GARBAGE) | specs(RAISES), rest=st.lists(answers(raises=True) | st.just(("right",)),
                                                                max_size=5))
    def collect(first, rest):
        drawn.append([first, *rest])

    collect()
    return drawn[:PLANS]


@pytest.fixture(scope="module")
def fired(tmp_path_factory) -> SimpleNamespace:
    out = tmp_path_factory.mktemp("fire")
    by_ranks, plans = defaultdict(list), {}
    for exercise in CHECKS:
        by_ranks[find_lesson(lesson_of(exercise)).ranks].append(exercise)
        plans[exercise] = plans_for(exercise)
        (out / f"{exercise}.plans.pkl").write_bytes(pickle.dumps(plans[exercise]))
    verdicts = {}
    for n, exercises in sorted(by_ranks.items()):
        r = run_mpi(n, [str(ROOT / "tests" / "programs" / "checks_under_fire.py"), str(out), *exercises],
                    timeout=300)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
        for line in r.stdout.splitlines():
            if line.startswith("{"):
                v = json.loads(line)
                verdicts[v["number"], v["plan"]] = v
    records = {e: [rec for path in sorted(out.glob(f"{e}.[0-9]*.pkl")) for rec in pickle.loads(path.read_bytes())]
               for e in CHECKS}
    return SimpleNamespace(plans=plans, verdicts=verdicts, records=records)


# --- (b) end to end -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("exercise", sorted(CHECKS))
def test_every_wrong_learner_gets_a_verdict_and_exit_status_1(fired, exercise):
    for k, plan in enumerate(fired.plans[exercise]):
        v = fired.verdicts[exercise, k]
        text = v["text"]
        not_done = plan[0][0] == "not_implemented"
        assert v["status"] == (3 if not_done else 1), (plan, text)
        assert text.startswith(f"exercise {exercise} is not done yet" if not_done else
                               f"exercise {exercise} FAILED: "), (plan, text)
        assert "Traceback" not in text and "expected " not in text.replace("expected shape", ""), (plan, text)
        broke = re.search(r"which the check cannot use: .*\((\w+\.py), line \d+\)$", text, re.MULTILINE)
        assert broke is None or broke.group(1) in CHECK_FILES, (plan, text)  # a check's own conversion, not ours


# --- (a) in process -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("exercise", sorted(CHECKS))
def test_diagnose_tells_the_truth_about_any_wrong_answer(fired, exercise):
    records = fired.records[exercise]
    if not records:
        assert exercise == "08b", exercise
        pytest.skip("exercise 08b compares no numbers: its verdict is a sentence of its own, fired at in (b)")

    @seed(zlib.crc32(exercise.encode()))
    @settings(max_examples=EXAMPLES, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def wrong_answers_are_described_truly(data):
        record = data.draw(st.sampled_from(records), label="record")
        symptoms = record["symptoms"] or {}
        strategy = answers(np.shape(record["expected"]), symptoms=len(symptoms))
        for spec in data.draw(st.lists(strategy, min_size=BATCH, max_size=BATCH), label="answers"):
            answer = build(spec, record["got"], symptoms)
            assert_true_diagnosis(record, answer)

    wrong_answers_are_described_truly()


def _close(g: np.ndarray, e: np.ndarray, tol: float) -> np.ndarray:
    return (np.abs(g - e) <= tol) | (g == e) | (np.isnan(g) & np.isnan(e))


def _same(a, b, tol: float) -> bool:
    a, b = as_numbers(a), as_numbers(b)
    return not isinstance(a, str) and not isinstance(b, str) and a[0].shape == b[0].shape and \
        bool(_close(a[0], b[0], tol).all())


def assert_true_diagnosis(record: dict, answer) -> None:
    expected, tol = np.asarray(record["expected"], dtype=np.float64), record["tol"]
    symptoms = record["symptoms"] or {}
    with np.errstate(all="ignore"):
        lines, named = diagnose(answer, record["expected"], tol, symptoms, record["layout"])
        read = as_numbers(answer)
        right = _same(answer, expected, tol)
        assert (lines is None) == right, (answer, lines)
        if right:
            return
        assert lines and all(isinstance(line, str) and "\n" not in line and len(line) < 400 for line in lines)
        live = {s: v for s, v in symptoms.items() if v is not None and not _same(v, expected, tol)}
        first = next((s for s, v in live.items() if _same(answer, v, tol)), None)
        assert named == (first is not None) and (not named or lines == [first]), (answer, lines)
        if named:
            return
        if isinstance(read, str):
            answer_is = "a single number" if expected.ndim == 0 else f"shape {expected.shape}"
            assert lines == [read, f"the answer {'is' if expected.ndim == 0 else 'has'} {answer_is}"]
            assert read.startswith("your function returned ")
            return
        got = read[0]
        with_bools = read[1] == "b" and np.asarray(record["expected"]).dtype.kind != "b"
        assert (lines[0] == "your function returned booleans (True/False, read as 1/0), not numbers") == with_bools
        for line in lines[with_bools:]:
            assert_line_is_true(line, got, expected, tol)
        if got.shape != expected.shape:
            assert lines[with_bools].startswith("expected shape"), lines
        assert_no_answer_given_away(lines, got, expected)


def assert_line_is_true(line: str, got: np.ndarray, e: np.ndarray, tol: float) -> None:
    same_shape = got.shape == e.shape
    close = _close(got, e, tol) if same_shape else None
    g, flat = got.ravel(), e.ravel()
    if m := re.fullmatch(r"expected shape (\(.*?\))(?: \(a single number\))?, got shape (\(.*?\))"
                         r"(?: \(a single number\))?", line):
        assert (m.group(1), m.group(2)) == (str(e.shape), str(got.shape)) and not same_shape, line
    elif line.startswith("the right values in the wrong shape"):
        assert not same_shape and got.size == e.size and _close(g, flat, tol).all(), line
    elif line == "the transpose of the right values":
        assert got.ndim == 2 and _close(got.T, e, tol).all(), line
    elif m := re.fullmatch(rf"got ({NUMBER}|nan|-?inf)(?: at index (.+?))?: not a finite number.*", line):
        where = () if m.group(2) is None else tuple(int(i) for i in re.findall(r"\d+", m.group(2)))
        assert not np.isfinite(got[where]) and (close is None or not close[where]), line
    elif m := re.fullmatch(rf"got ({NUMBER}): too (large|small)", line):
        assert e.size == 1 and same_shape and (g[0] > flat[0]) == (m.group(2) == "large"), line
        assert m.group(1) == number(g[0]), line
    elif m := re.fullmatch(rf"max \|got − expected\| = ({NUMBER}|inf|nan) at index (.+)", line):
        diff = np.where(close, 0.0, np.abs(got - e))
        where = tuple(int(i) for i in re.findall(r"\d+", m.group(2)))
        assert m.group(1) == f"{float(diff.max()):.3g}" and diff[where] == diff.max(), line
    elif m := re.fullmatch(r"(\d+) of the (\d+) entr(?:y|ies) differs?(?: by more than \S+)?", line):
        assert (int(m.group(1)), int(m.group(2))) == (int((~close).sum()), e.size), line
    elif m := re.fullmatch(rf"yours is ({NUMBER}) × the reference everywhere", line):
        nonzero = int(((e != 0) & np.isfinite(e)).sum())
        assert nonzero >= 2 and 2 * nonzero > e.size, line  # most entries not zero
        assert np.allclose(got, float(m.group(1)) * e, rtol=1e-5, atol=max(tol, 1e-12)), line
    elif line == "yours is all zeros":
        assert not got.any(), line
    elif m := re.fullmatch(r"(\d+) of the (\d+) rows? differs?: (.*)", line):
        wrong = np.flatnonzero(~close.reshape(e.shape[0], -1).all(axis=1))
        assert (int(m.group(1)), int(m.group(2))) == (len(wrong), e.shape[0]), line
        assert [int(i) for i in re.findall(r"row (\d+)", m.group(3))] == wrong[:4].tolist(), line
    elif m := re.fullmatch(r"yours(, as a sorted set)?: (.*)", line):
        assert m.group(2) == ranges(np.unique(g)), line
        assert bool(m.group(1)) == (not bool(np.all(np.diff(g) > 0))), line
    elif m := re.fullmatch(r"yours repeats (.*)", line):
        values, counts = np.unique(g, return_counts=True)
        assert m.group(1) == ranges(values[counts > 1]), line
    elif line == "yours is empty":
        assert g.size == 0, line
    elif line.startswith("yours holds values that are not whole numbers"):
        assert (g != np.round(g)).any(), line
    elif line in ("the right entries in the wrong order", "the right entries, but some more than once"):
        mine, wanted = np.unique(g), np.unique(flat)  # the same entries within the check's tolerance, as diagnose
        assert mine.size == wanted.size and _close(mine, wanted, tol).all(), line
        assert not (same_shape and close.all()), line
        assert (line == "the right entries in the wrong order") == (len(np.unique(g)) == g.size), line
    elif m := re.fullmatch(r"(\d+) of your (\d+) (?:distinct )?entr(?:y|ies) belongs? in the answer; (.*)", line):
        mine, wanted = np.unique(g), np.unique(flat)
        assert (int(m.group(1)), int(m.group(2))) == (int(np.isin(mine, wanted).sum()), mine.size), line
        missing = re.fullmatch(r"(\d+) of the answer's (\d+) entr(?:y|ies) (?:is|are) missing from yours", m.group(3))
        assert (missing and (int(missing.group(1)), int(missing.group(2))) ==
                (int((~np.isin(wanted, mine)).sum()), wanted.size)) or (m.group(3) == "the answer has none" and
                                                                         not wanted.size), line
    else:
        raise AssertionError(f"a sentence this test cannot verify: {line!r}")


def assert_no_answer_given_away(lines: list[str], got: np.ndarray, e: np.ndarray) -> None:
    """No number of the answer that the learner did not return (or that is not a size, an index, a count or a
    difference) appears among the numbers of the sentences."""
    said = set(re.findall(rf"(?<![\w.]){NUMBER}", " ".join(lines)))
    renderings = lambda v: {number(v), f"{v:.6g}", f"{v:.3g}"}  # noqa: E731
    allowed = {str(i) for i in range(max(got.size, e.size, *got.shape, *e.shape, 1) + 2)}
    for v in got.ravel():
        allowed |= renderings(v)
    if got.shape == e.shape:
        for d in np.abs(got - e).ravel():
            allowed |= renderings(d)
    for v in set(e.ravel().tolist()) - set(got.ravel().tolist()):
        leaked = said & (renderings(v) - allowed)
        assert not leaked, (lines, v)
