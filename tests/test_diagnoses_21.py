"""Exercise 21 (ZeRO's bytes per parameter, an owned slice and its padding, a ZeRO-3 step's bytes): each classic
slip, fed to ``tpsim check``, is named by what the result looks like, and neither the answer nor a hint is
printed; the reference answer passes, the live ZeRO-1 and ZeRO-2 included.

As in ``test_diagnoses_20.py``: the reference solution with one function redefined is written to a temporary
file and checked on real ranks like a learner's file. The test asserts the slip's symptom sentence appears (the
check's own constant, so a reworded sentence cannot pass silently), that no hint is printed unasked, and that no
expected value is.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tpsim.cli import main as tpsim_main
from tpsim.teach.checks import CHECKS, lesson_21 as ex21
from tpsim.teach.diagnose import matches
from tpsim.teach.lessons import exercise_files

pytestmark = pytest.mark.slow

SOLUTION = exercise_files("solutions")["21"]

STAGES = """
        def bytes_per_param(stage, d):
            p, g, k = {p}, {g}, {k}
            return (p / d if stage >= {ps} else p) + (g / d if stage >= {gs} else g) + (k / d if stage >= {ks} else k)
        """
RIGHT_STAGES = dict(p=2, g=2, k=12, ps=3, gs=2, ks=1)
SLICE = """
        def owned_slice(n, d, rank):
            shard = {shard}
            start, stop = rank * shard, (rank + 1) * shard
            return {ret}
        """
RIGHT_SLICE = dict(shard="-(-n // d)", ret="start, stop, max(0, stop - max(start, n))")
ZERO3 = """
        def zero3_step_bytes(params, d, e):
            shard = -(-params // d)
            return {ret}
        """


def stages(**change) -> str:
    return STAGES.format(**{**RIGHT_STAGES, **change})


def owned(**change) -> str:
    return SLICE.format(**{**RIGHT_SLICE, **change})


def zero3(ret: str) -> str:
    return ZERO3.format(ret=ret)


# (the redefined function, the sentence the diagnosis must contain)
SLIPS = {
    "parameters_sharded_at_stage_2": (stages(ps=2), ex21.PARAMS_AT_2),
    "gradients_sharded_at_stage_1": (stages(gs=1), ex21.GRADS_AT_1),
    "optimizer_never_sharded": (stages(ks=4), ex21.OPTIMIZER_WHOLE),
    "four_byte_gradients": (stages(g=4), ex21.FP32_GRADS),
    "no_fp32_master_copy": (stages(k=8), ex21.NO_MASTER),
    "stage_3_keeps_the_parameters": (stages(ps=4), ex21.THREE_AS_TWO),
    "stage_2_keeps_the_gradients": (stages(gs=3), ex21.TWO_AS_ONE),
    "optimizer_sharded_at_stage_0": (stages(ks=0), ex21.SHARDED_AT_0),
    "slices_rounded_down": (owned(shard="n // d", ret="start, stop, 0"), ex21.ROUNDED_DOWN),
    "last_rank_takes_the_remainder": (owned(shard="n // d", ret="start, (n if rank == d - 1 else stop), 0"),
                                      ex21.REMAINDER),
    "ranges_clipped_at_n": (owned(ret="min(start, n), min(stop, n), 0"), ex21.CLIPPED),
    "inclusive_stop": (owned(ret="start, stop - 1, max(0, stop - max(start, n))"), ex21.INCLUSIVE),
    "padding_on_every_rank": (owned(ret="start, stop, shard * d - n"), ex21.PAD_EVERYWHERE),
    "padding_in_front": (owned(ret="start, stop, max(0, min(stop, shard * d - n) - start)"), ex21.PAD_IN_FRONT),
    "real_elements_counted": (owned(ret="start, stop, min(stop, n) - min(start, n)"), ex21.REAL_COUNTED),
    "slices_one_too_long": (owned(shard="n // d + 1"), ex21.PLUS_ONE),
    "one_all_gather": (zero3("2 * (d - 1) * shard * e"), ex21.ONE_GATHER),
    "all_reduce_bytes_each": (zero3("6 * (d - 1) * shard * e"), ex21.ALL_REDUCE_EACH),
    "no_padding": (zero3("3 * (d - 1) * params * e / d"), ex21.NO_PADDING),
    "whole_buffer_each": (zero3("3 * d * shard * e"), ex21.WHOLE_BUFFER),
    "elements_not_bytes": (zero3("3 * (d - 1) * shard"), ex21.ELEMENTS),
    "one_shard_each": (zero3("3 * shard * e"), ex21.ONE_SHARD),
    "d_minus_1_not_divided": (zero3("3 * (d - 1) * shard * d * e"), ex21.NOT_DIVIDED),
}


def check_21(capfd, tmp_path, monkeypatch, override: str, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)  # no hint state of another test
    path = tmp_path / "ex21_mine.py"
    path.write_text(SOLUTION.read_text() + "\n\n# --- the slip ---\n" + textwrap.dedent(override))
    capfd.readouterr()
    code = tpsim_main(["check", "21", str(path), *args])
    out, err = capfd.readouterr()
    return code, out + err


@pytest.mark.parametrize("case", sorted(SLIPS))
def test_each_slip_is_named_and_the_answer_is_not_printed(capfd, tmp_path, monkeypatch, case):
    override, sentence = SLIPS[case]
    code, out = check_21(capfd, tmp_path, monkeypatch, override)
    assert code == 1, out
    assert "exercise 21 FAILED" in out and sentence in out, out
    assert "--hint reveals" in out, out
    assert not any(level in out for levels in CHECKS["21"].hints.values() for level in levels), out
    assert "expected " not in out.replace("expected shape", ""), out
    assert "Traceback" not in out, out


def test_the_reference_answer_passes_with_the_live_optimizer(capfd, tmp_path, monkeypatch):
    code, out = check_21(capfd, tmp_path, monkeypatch, "")
    assert code == 0, out
    assert "exercise 21 OK: bytes_per_param, owned_slice, zero3_step_bytes match" in out, out


def test_an_answer_right_on_paper_but_not_on_the_live_optimizer_is_caught(capfd, tmp_path, monkeypatch):
    """Right on every size of the table, wrong for small float64 buckets over d = 2, which only the live ZeRO-1
    (TP 2 × DP 2, buckets of a few hundred elements) has: only its traced bytes can tell it."""
    code, out = check_21(capfd, tmp_path, monkeypatch, """
        _right = zero3_step_bytes
        def zero3_step_bytes(params, d, e):
            return _right(params, d, e) * (2 if (d, e) == (2, 8) and params < 900 else 1)
        """)
    assert code == 1, out
    assert "against 3/2 of the reduce-scatter and all-gather bytes" in out, out
    assert "Traceback" not in out, out


def test_padding_forgotten_only_where_the_live_optimizer_pads_is_caught(capfd, tmp_path, monkeypatch):
    """The table's only bucket over d = 2 is the empty one; the live model's 95-element bucket is padded on DP
    rank 1: only the live optimizer's owned slice can tell a padding of 0 there."""
    code, out = check_21(capfd, tmp_path, monkeypatch, """
        _right = owned_slice
        def owned_slice(n, d, rank):
            start, stop, padding = _right(n, d, rank)
            return start, stop, 0 if d == 2 else padding
        """)
    assert code == 1, out
    assert "for every bucket of the live ZeRO-1" in out and "Traceback" not in out, out


def test_a_slice_that_is_not_three_numbers_gets_one_sentence(capfd, tmp_path, monkeypatch):
    code, out = check_21(capfd, tmp_path, monkeypatch, owned(ret="start, stop"))
    assert code == 1, out
    assert "return three whole numbers (start, stop, padding)" in out and "Traceback" not in out, out


def test_hints_come_one_level_at_a_time(capfd, tmp_path, monkeypatch):
    override = SLIPS["gradients_sharded_at_stage_1"][0]
    levels = CHECKS["21"].hints["bytes_per_param"]
    for level in range(1, len(levels) + 1):
        code, out = check_21(capfd, tmp_path, monkeypatch, override, "--hint")
        assert code == 1, out
        assert all(text in out for text in levels[:level]) and not any(text in out for text in levels[level:]), out


def test_the_cases_tell_every_slip_apart():
    """Every slip's vector differs from the answer and from every slip named before it (the first match names
    the finding); the cases reach d = 1, an empty bucket, a bucket shorter than d and padding over two slices."""
    stage_right = [float(ex21.PAPER.bytes_per_zero_stage(s, d)) for s, d in ex21.STAGE_CASES]
    slice_right = [ex21.right_slice(*c) for c in ex21.slice_table()]
    zero3_right = [ex21.right_zero3(*c) for c in ex21.ZERO3_CASES]
    for symptoms, right in ((ex21.stage_symptoms(), stage_right), (ex21.slice_symptoms(), slice_right),
                            (ex21.zero3_symptoms(), zero3_right)):
        seen = []
        for sentence, produced in symptoms.items():
            assert not matches(produced, np.array(right, dtype=np.float64), 1e-9), sentence
            assert not any(matches(produced, other, 1e-9) for other in seen), sentence
            seen.append(produced)
    assert (0, 2) in ex21.SLICE_CASES and any(n < d for n, d in ex21.SLICE_CASES)
    assert [ex21.right_slice(5, 4, r)[2] for r in range(4)] == [0, 0, 1, 2]  # 3 padded positions, two slices
    assert any(p % d for p, d, _ in ex21.ZERO3_CASES) and any(d == 1 for _, d, _ in ex21.ZERO3_CASES)
