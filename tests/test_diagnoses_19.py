"""Exercise 19 (the exposed seconds of an overlapped DP sync, and the Playbook's inequality bucket by bucket):
each classic slip, fed to ``tpsim check``, is named by what the result looks like, and neither the answer nor a
hint is printed; the reference answer passes, the live PP 2 × DP 2 step included.

As in ``test_diagnoses_18.py``: the reference solution with one function redefined is written to a temporary
file and checked on real ranks like a learner's file. The test asserts the slip's symptom sentence appears (the
check's own constant, so a reworded sentence cannot pass silently), that no hint is printed unasked, and that no
expected value is.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tpsim.cli import main as tpsim_main
from tpsim.teach.checks import CHECKS, lesson_19 as ex19
from tpsim.teach.diagnose import matches
from tpsim.teach.lessons import exercise_files

pytestmark = pytest.mark.slow

SOLUTION = exercise_files("solutions")["19"]

STREAM = """
        def exposed_dp_seconds(ready, durations, compute_end):
            end = float("-inf")
            ends = []
            for k, (r, d) in enumerate(zip(ready, durations)):
                end = {start} + d
                ends.append(end)
            return {result}
        """
RIGHT = dict(start="max(r, end)", result="max(0.0, end - compute_end)")


def stream(**change) -> str:
    return STREAM.format(**{**RIGHT, **change})


HIDES = """
        def hides_fully(ready, durations, compute_end):
            return {body}
        """

# (the redefined function, the sentence the diagnosis must contain)
SLIPS = {
    "buckets_back_to_back_from_the_first_ready": (stream(start="(ready[0] if k == 0 else end)"), ex19.NO_WAIT),
    "exposure_from_the_first_ready_time": (stream(result="end - ready[0]"), ex19.FROM_FIRST_READY),
    "negative_exposure_not_clamped": (stream(result="end - compute_end"), ex19.NOT_CLAMPED),
    "all_reduces_in_parallel": (stream(start="r", result="max(0.0, max(ends) - compute_end)"), ex19.PARALLEL),
    "no_overlap_at_all": (stream(result="sum(durations)"), ex19.ALL_EXPOSED),
    "only_the_last_bucket": (stream(result="durations[-1]"), ex19.LAST_ONLY),
    "every_overrun_summed": (stream(result="sum(max(0.0, x - compute_end) for x in ends)"), ex19.SUM_OF_OVERRUNS),
    "last_bucket_from_its_ready_time": (stream(start="r"), ex19.LAST_FROM_READY),
    "inequality_for_the_whole_backward_only": (HIDES.format(body="compute_end - ready[0] >= sum(durations)"),
                                               ex19.TOTAL_ONLY),
    "inequality_per_bucket_without_the_queue": (HIDES.format(
        body="all(compute_end - r >= d for r, d in zip(ready, durations))"), ex19.PER_BUCKET),
    "strict_inequality": (HIDES.format(
        body="all(compute_end - ready[k] > sum(durations[k:]) for k in range(len(ready)))"), ex19.STRICT),
    "only_the_last_bucket_checked": (HIDES.format(body="compute_end - ready[-1] >= durations[-1]"),
                                     ex19.LAST_BUCKET_ONLY),
}


def check_19(capfd, tmp_path, monkeypatch, override: str, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)  # no hint state of another test
    path = tmp_path / "ex19_mine.py"
    path.write_text(SOLUTION.read_text() + "\n\n# --- the slip ---\n" + textwrap.dedent(override))
    capfd.readouterr()
    code = tpsim_main(["check", "19", str(path), *args])
    out, err = capfd.readouterr()
    return code, out + err


@pytest.mark.parametrize("case", sorted(SLIPS))
def test_each_slip_is_named_and_the_answer_is_not_printed(capfd, tmp_path, monkeypatch, case):
    override, sentence = SLIPS[case]
    code, out = check_19(capfd, tmp_path, monkeypatch, override)
    assert code == 1, out
    assert "exercise 19 FAILED" in out and sentence in out, out
    assert "--hint reveals" in out, out
    assert not any(level in out for levels in CHECKS["19"].hints.values() for level in levels), out
    assert "expected " not in out.replace("expected shape", ""), out
    assert "Traceback" not in out, out


def test_the_reference_answer_passes_with_the_live_step(capfd, tmp_path, monkeypatch):
    code, out = check_19(capfd, tmp_path, monkeypatch, "")
    assert code == 0, out
    assert "exercise 19 OK: exposed_dp_seconds, hides_fully match" in out, out


def test_an_answer_right_on_paper_but_not_on_the_live_clock_is_caught(capfd, tmp_path, monkeypatch):
    """Right on every hand-made schedule (compute_end of seconds), twice too large on the live step's (microseconds):
    only the live DP sync can tell it."""
    code, out = check_19(capfd, tmp_path, monkeypatch, """
        _right = exposed_dp_seconds
        def exposed_dp_seconds(ready, durations, compute_end):
            return _right(ready, durations, compute_end) * (1 if compute_end > 1e-3 else 2)
        """)
    assert code == 1, out
    assert "of a live PP 2 × DP 2 step" in out and "against its virtual clock's DP sync" in out, out
    assert "Traceback" not in out, out


def test_a_verdict_that_is_not_true_or_false_gets_one_sentence(capfd, tmp_path, monkeypatch):
    code, out = check_19(capfd, tmp_path, monkeypatch, """
        def hides_fully(ready, durations, compute_end):
            return "yes"
        """)
    assert code == 1, out
    assert "return True or False" in out and "Traceback" not in out, out


def test_hints_come_one_level_at_a_time(capfd, tmp_path, monkeypatch):
    override = SLIPS["negative_exposure_not_clamped"][0]
    levels = CHECKS["19"].hints["exposed_dp_seconds"]
    for level in range(1, len(levels) + 1):
        code, out = check_19(capfd, tmp_path, monkeypatch, override, "--hint")
        assert code == 1, out
        assert all(text in out for text in levels[:level]) and not any(text in out for text in levels[level:]), out


def test_the_cases_tell_every_slip_apart_and_reach_the_edges():
    """Each slip's vector differs from the answer and from every slip named before it (the first match names the
    finding); the hand-picked cases hold one bucket, one ready at compute_end, an exact cover and a queue."""
    for symptoms, right in ((ex19.exposed_symptoms(), [ex19.reference_exposed(*c) for c in ex19.CASES]),
                            (ex19.hides_symptoms(), [float(ex19.reference_hides(*c)) for c in ex19.CASES])):
        seen = []
        for sentence, produced in symptoms.items():
            assert not matches(produced, np.array(right), 1e-9), sentence
            assert not any(matches(produced, other, 1e-9) for other in seen), sentence
            seen.append(produced)
    hand = ex19.HAND
    assert any(len(r) == 1 for r, _, _ in hand) and any(r[-1] == e for r, _, e in hand)
    exact = [c for c in hand if ex19.stream_ends(c[0], c[1])[-1] == c[2]]
    assert exact and all(ex19.reference_hides(*c) for c in exact)  # equality hides
    assert any(ex19.stream_ends(r, d)[k] > r[k + 1] for r, d, _ in hand for k in range(len(r) - 1))  # a queue
    assert 0 < sum(ex19.reference_hides(*c) for c in ex19.CASES) < len(ex19.CASES)
