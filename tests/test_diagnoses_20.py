"""Exercise 20 (the online-softmax merge, the zigzag chunks, the ring's forward bytes): each classic slip, fed to
``tpsim check``, is named by what the result looks like, and neither the answer nor a hint is printed; the
reference answer passes, the live ring included.

As in ``test_diagnoses_19.py``: the reference solution with one function redefined is written to a temporary
file and checked on real ranks like a learner's file. The test asserts the slip's symptom sentence appears (the
check's own constant, so a reworded sentence cannot pass silently), that no hint is printed unasked, and that no
expected value is.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tpsim.cli import main as tpsim_main
from tpsim.teach.checks import CHECKS, lesson_20 as ex20
from tpsim.teach.diagnose import matches
from tpsim.teach.lessons import exercise_files

pytestmark = pytest.mark.slow

SOLUTION = exercise_files("solutions")["20"]

MERGE = """
        def merge_partials(out_a, lse_a, out_b, lse_b):
            top = np.maximum(lse_a, lse_b)
            wa, wb = np.exp(lse_a - top), np.exp(lse_b - top)
            ea, eb = np.exp(lse_a), np.exp(lse_b)
            return {out}, {lse}
        """
RIGHT_MERGE = dict(out="(wa / (wa + wb))[..., None] * out_a + (wb / (wa + wb))[..., None] * out_b",
                   lse="top + np.log(wa + wb)")


def merge(**change) -> str:
    return MERGE.format(**{**RIGHT_MERGE, **change})


ZIGZAG = """
        def zigzag_chunks(rank, cp):
            return {body}
        """
RING = """
        def ring_bytes(cp, b, s, heads, kv_heads, head_dim, e):
            block = b * {heads} * ({tokens}) * head_dim * e
            return {total}
        """
RIGHT_RING = dict(heads="kv_heads", tokens="s // cp", total="(cp - 1) * 2 * block")


def ring(**change) -> str:
    return RING.format(**{**RIGHT_RING, **change})


def zigzag(body: str) -> str:
    return ZIGZAG.format(body=body)


# (the redefined function, the sentence the diagnosis must contain)
SLIPS = {
    "lse_is_the_max": (merge(lse="top"), ex20.MAX_NOT_LSE),
    "lse_added": (merge(lse="lse_a + lse_b"), ex20.LSE_ADDED),
    "lse_without_the_max_trick": (merge(lse="np.log(ea + eb)"), ex20.LSE_OVERFLOW),
    "outputs_added_unweighted": (merge(out="out_a + out_b"), ex20.UNWEIGHTED),
    "outputs_averaged": (merge(out="(out_a + out_b) / 2"), ex20.AVERAGED),
    "rescaled_not_divided": (merge(out="wa[..., None] * out_a + wb[..., None] * out_b"), ex20.NOT_DIVIDED),
    "raw_exponential_weights": (merge(out="ea[..., None] * out_a + eb[..., None] * out_b"), ex20.RAW_WEIGHTS),
    "weights_swapped": (merge(out="(wb / (wa + wb))[..., None] * out_a + (wa / (wa + wb))[..., None] * out_b"),
                        ex20.SWAPPED),
    "larger_lse_wins": (merge(out="np.where((lse_a >= lse_b)[..., None], out_a, out_b)"), ex20.WINNER),
    "out_without_the_max_trick": (merge(out="(ea / (ea + eb))[..., None] * out_a "
                                            "+ (eb / (ea + eb))[..., None] * out_b"), ex20.OUT_OVERFLOW),
    "chunks_r_and_2cp_minus_r": (zigzag("rank, 2 * cp - rank"), ex20.MIRROR_2CP),
    "chunks_r_and_cp_plus_r": (zigzag("rank, cp + rank"), ex20.CP_PLUS_R),
    "chunks_side_by_side": (zigzag("2 * rank, 2 * rank + 1"), ex20.CONTIGUOUS),
    "chunks_mirrored_in_the_first_half": (zigzag("rank, cp - 1 - rank"), ex20.MIRROR_HALF),
    "late_chunk_first": (zigzag("2 * cp - 1 - rank, rank"), ex20.LATE_FIRST),
    "chunks_numbered_from_1": (zigzag("rank + 1, 2 * cp - rank"), ex20.ONE_BASED),
    "cp_steps_not_cp_minus_1": (ring(total="cp * 2 * block"), ex20.CP_STEPS),
    "v_forgotten": (ring(total="(cp - 1) * block"), ex20.NO_V),
    "query_heads_not_kv_heads": (ring(heads="heads"), ex20.QUERY_HEADS),
    "whole_sequence_a_step": (ring(tokens="s"), ex20.WHOLE_SEQUENCE),
    "elements_not_bytes": (ring(total="(cp - 1) * 2 * block // e"), ex20.ELEMENTS),
    "backward_counted_too": (ring(total="(cp - 1) * 4 * block + cp * 2 * block"), ex20.WITH_BACKWARD),
    "receives_counted_too": (ring(total="(cp - 1) * 4 * block"), ex20.RECV_COUNTED),
}


def check_20(capfd, tmp_path, monkeypatch, override: str, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)  # no hint state of another test
    path = tmp_path / "ex20_mine.py"
    path.write_text(SOLUTION.read_text() + "\n\n# --- the slip ---\n" + textwrap.dedent(override))
    capfd.readouterr()
    code = tpsim_main(["check", "20", str(path), *args])
    out, err = capfd.readouterr()
    return code, out + err


@pytest.mark.parametrize("case", sorted(SLIPS))
def test_each_slip_is_named_and_the_answer_is_not_printed(capfd, tmp_path, monkeypatch, case):
    override, sentence = SLIPS[case]
    code, out = check_20(capfd, tmp_path, monkeypatch, override)
    assert code == 1, out
    assert "exercise 20 FAILED" in out and sentence in out, out
    assert "--hint reveals" in out, out
    assert not any(level in out for levels in CHECKS["20"].hints.values() for level in levels), out
    assert "expected " not in out.replace("expected shape", ""), out
    assert "Traceback" not in out, out


def test_the_reference_answer_passes_with_the_live_ring(capfd, tmp_path, monkeypatch):
    code, out = check_20(capfd, tmp_path, monkeypatch, "")
    assert code == 0, out
    assert "exercise 20 OK: merge_partials, zigzag_chunks, ring_bytes match" in out, out


def test_an_answer_right_on_paper_but_not_on_the_live_ring_is_caught(capfd, tmp_path, monkeypatch):
    """Right on every size of the table (2 and 4 bytes an element), twice too large in float64 (8 bytes), which
    only the live ring uses: only its traced sends can tell it."""
    code, out = check_20(capfd, tmp_path, monkeypatch, """
        _right = ring_bytes
        def ring_bytes(cp, b, s, heads, kv_heads, head_dim, e):
            return _right(cp, b, s, heads, kv_heads, head_dim, e) * (2 if e == 8 else 1)
        """)
    assert code == 1, out
    assert "against the bytes of the sends traced in the forward of the live ring" in out, out
    assert "Traceback" not in out, out


def test_a_merge_that_returns_one_array_gets_one_sentence(capfd, tmp_path, monkeypatch):
    code, out = check_20(capfd, tmp_path, monkeypatch, """
        _right = merge_partials
        def merge_partials(out_a, lse_a, out_b, lse_b):
            return _right(out_a, lse_a, out_b, lse_b)[0]
        """)
    assert code == 1, out
    assert "return a tuple of 2 arrays (out, lse)" in out and "Traceback" not in out, out


def test_chunks_that_are_not_a_pair_get_one_sentence(capfd, tmp_path, monkeypatch):
    code, out = check_20(capfd, tmp_path, monkeypatch, zigzag('"early and late"'))
    assert code == 1, out
    assert "return a pair of chunk numbers (early, late)" in out and "Traceback" not in out, out


def test_hints_come_one_level_at_a_time(capfd, tmp_path, monkeypatch):
    override = SLIPS["outputs_averaged"][0]
    levels = CHECKS["20"].hints["merge_partials"]
    for level in range(1, len(levels) + 1):
        code, out = check_20(capfd, tmp_path, monkeypatch, override, "--hint")
        assert code == 1, out
        assert all(text in out for text in levels[:level]) and not any(text in out for text in levels[level:]), out


def first_differing(symptoms_by_case: list[dict], answers: list) -> dict:
    """For each slip, its value at the first case where it differs from the answer (the compare that names it)."""
    first = {}
    for symptoms, right in zip(symptoms_by_case, answers):
        for sentence, produced in symptoms.items():
            if sentence not in first and not matches(produced, right, 1e-12):
                first[sentence] = (produced, right, symptoms)
    return first


def test_the_cases_tell_every_slip_apart_and_reach_the_edges():
    """Where a slip first differs from the answer, it differs from every slip named before it there too (the first
    match names the finding); rank 0's block b is causal-blind for some rows, and the scores + 1000 overflow exp."""
    for rank in range(4):
        (out_a, lse_a, out_b, lse_b), (out, lse) = ex20.merge_inputs(rank, 4)
        cases = [(out_a, lse_a + s, out_b, lse_b + s) for s in (0.0, ex20.LARGE)]
        for symptoms, answers in (([ex20.lse_symptoms(c[1], c[3]) for c in cases], [lse, lse + ex20.LARGE]),
                                  ([ex20.out_symptoms(*c) for c in cases], [out, out])):
            first = first_differing(symptoms, answers)
            assert set(first) == set(symptoms[0]), (rank, set(symptoms[0]) - set(first))
            for sentence, (produced, right, named) in first.items():
                before = list(named)[:list(named).index(sentence)]
                assert not any(matches(produced, named[s], 1e-12) and not matches(named[s], right, 1e-12)
                               for s in before), (rank, sentence)
        assert (np.isinf(lse_b).any() if rank == 0 else True) and np.isfinite(lse).all()
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(ex20.merge_inputs(0, 4)[1][1] + ex20.LARGE)).all()
    for symptoms, right in ((ex20.zigzag_symptoms(), [(r, 2 * c - 1 - r) for r, c in ex20.zigzag_table()]),
                            (ex20.ring_symptoms(), [ex20.reference_ring(*c) for c in ex20.RING_CASES])):
        seen = []
        for sentence, produced in symptoms.items():
            assert not matches(produced, np.array(right, dtype=np.float64), 0), sentence
            assert not any(matches(produced, other, 0) for other in seen), sentence
            seen.append(produced)
    assert any(kv < heads for _, _, _, heads, kv, _, _ in ex20.RING_CASES)  # grouped-query sizes
    assert any(kv == heads for _, _, _, heads, kv, _, _ in ex20.RING_CASES)
