"""Exercises 12 and 13: each classic slip is named by its symptom, the cases tell every slip apart, and the
answer is never printed.

The slow tests write a wrong implementation (the reference solution with one function redefined) to a
temporary file and run it through ``tpsim check`` on real ranks, as in ``test_exercise_diagnoses.py``. The fast
ones read the checks' own cases (no MPI): every named slip gives a wrong answer on at least one of them, so a
learner who makes it is never told OK — and the edge cases that separate the right answer from the classic
wrong ones are there (all-negative real logits beside zero padding, ties across ranks, strided KV heads).
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tpsim.cli import main as tpsim_main
from tpsim.generate.argmax import serial_argmax
from tpsim.teach.checks import CHECKS
from tpsim.teach.checks.lesson_12 import LAYOUTS, group_symptoms, head_symptoms, sharing
from tpsim.teach.checks.lesson_13 import argmax_cases, argmax_symptoms, rank_bests
from tpsim.teach.lessons import exercise_files
from tpsim.tp.gqa_attention import kv_head_layout

SOLUTIONS = exercise_files("solutions")
RANKS = 4  # tpsim check 12 and 13 run on 4 ranks

# (exercise, the redefined function, a sentence the diagnosis must contain)
MISTAKES = {
    "kv_heads_strided": ("12", """
        def kv_heads_of_rank(heads, kv_heads, tp, rank):
            if kv_heads % tp == 0:
                return list(range(rank, kv_heads, tp))  # every tp-th head, not a contiguous block
            return [rank // (tp // kv_heads)]
        """, "strided: KV heads rank, rank + tp, rank + 2·tp"),
    "kv_heads_divided_by_kv_heads": ("12", """
        def kv_heads_of_rank(heads, kv_heads, tp, rank):
            if kv_heads % tp == 0:
                return list(range(rank * kv_heads // tp, (rank + 1) * kv_heads // tp))
            return [rank // kv_heads]
        """, "divides by the number of KV heads, not by the number of ranks that share each one"),
    "kv_heads_one_per_rank": ("12", """
        def kv_heads_of_rank(heads, kv_heads, tp, rank):
            return [rank * kv_heads // tp]
        """, "one KV head per rank"),
    "kv_gradient_ranks_strided": ("12", """
        def kv_gradient_ranks(heads, kv_heads, tp, rank):
            if kv_heads >= tp:
                return [rank]
            return [q for q in range(tp) if q % kv_heads == rank % kv_heads]
        """, "the replicas of a KV head are neighbours, not a stride apart"),
    "kv_gradient_ranks_whole_group": ("12", """
        def kv_gradient_ranks(heads, kv_heads, tp, rank):
            return list(range(tp))
        """, "the whole TP group"),
    "argmax_offset_forgotten_reductions_kept": ("13", """
        def vocab_parallel_argmax(logits_local, vocab_start, vocab_size, group):
            ids = vocab_start + np.arange(logits_local.shape[-1])
            real = np.where(ids < vocab_size, logits_local, -np.inf)
            j = np.argmax(real, axis=-1)
            value = real[np.arange(real.shape[0]), j]
            best = group.all_reduce(value, op="max")
            return group.all_reduce(np.where(value == best, j, vocab_size).astype(np.int64), op="min")
        """, "the ranks' reductions compared local column numbers"),
    "argmax_first_id_per_rank_then_max": ("13", """
        def vocab_parallel_argmax(logits_local, vocab_start, vocab_size, group):
            ids = vocab_start + np.arange(logits_local.shape[-1])
            real = np.where(ids < vocab_size, logits_local, -np.inf)
            j = np.argmax(real, axis=-1)  # each rank's first id: right
            value = real[np.arange(real.shape[0]), j]
            best = group.all_reduce(value, op="max")
            return group.all_reduce(np.where(value == best, vocab_start + j, -1).astype(np.int64), op="max")
        """, "ties across ranks went to the last rank that reached the maximum"),
}


def tpsim(capfd, *args: str) -> tuple[int, str]:
    capfd.readouterr()
    code = tpsim_main(list(args))
    out, err = capfd.readouterr()
    return code, out + err


def hint_texts(number: str) -> list[str]:
    return [level for levels in CHECKS[number].hints.values() for level in levels]


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_each_slip_gets_its_symptom_and_not_the_answer(capfd, tmp_path, monkeypatch, case):
    number, override, diagnosis = MISTAKES[case]
    monkeypatch.chdir(tmp_path)  # no hint state of another test
    path = tmp_path / f"ex{number}_mine.py"
    path.write_text(SOLUTIONS[number].read_text() + "\n\n# --- the mistake ---\n" + textwrap.dedent(override))
    code, out = tpsim(capfd, "check", number, str(path))
    assert code == 1, out
    assert f"exercise {number} FAILED" in out and diagnosis in out, out
    assert "--hint reveals" in out, out
    assert not any(text in out for text in hint_texts(number)), out  # no hint printed unasked
    assert "expected " not in out.replace("expected shape", ""), out  # no expected value
    if number == "12":  # the finding names one call; the right KV heads and ranks of that call are not printed
        assert "n_rep" not in out, out
        for heads, kv, tp in LAYOUTS:
            for rank in range(tp):
                if f"(heads={heads}, kv_heads={kv}, tp={tp}, rank={rank})" in out:
                    right = kv_head_layout(heads, kv, tp, rank)[0].tolist()
                    ranks = sharing(heads, kv, tp, rank)
                    assert f"yours: {', '.join(map(str, right))}\n" not in out, out
                    assert str(right) not in out and str(ranks) not in out, out


def test_ex12_layouts_tell_every_slip_apart():
    """Each symptom of exercise 12 is wrong for some (layout, rank) the check runs: the slip cannot pass."""
    told = {}
    for heads, kv, tp in LAYOUTS:
        for rank in range(tp):
            right = kv_head_layout(heads, kv, tp, rank)[0].tolist()
            for sentence, value in head_symptoms(kv, tp, rank).items():
                told.setdefault(sentence, False)
                told[sentence] |= value is not None and value != right
            for sentence, value in group_symptoms(tp, rank, kv).items():
                told.setdefault(sentence, False)
                told[sentence] |= value is not None and value != sharing(heads, kv, tp, rank)
    assert told and all(told.values()), [s for s, ok in told.items() if not ok]
    split_wide = [(h, kv, tp) for h, kv, tp in LAYOUTS if kv > tp]  # where strided and contiguous differ
    replicated = [(h, kv, tp) for h, kv, tp in LAYOUTS if kv < tp and tp // kv != kv]  # rank // kv is wrong
    assert split_wide and replicated


def test_ex13_cases_hold_the_edge_cases_and_tell_every_slip_apart():
    cases = argmax_cases(RANKS)
    zero_pad_negative = any(
        full.shape[1] > vocab and np.all(full[:, vocab:] == 0.0) and np.any(np.all(full[:, :vocab] < 0, axis=1))
        for vocab, full in cases)
    assert zero_pad_negative, "no row of all-negative real logits beside padding logits of exactly 0"
    tie_across_ranks = False
    for vocab, full in cases:
        best, _ = rank_bests(full, vocab, RANKS)
        tie_across_ranks |= bool(np.any((best == best.max(axis=0)).sum(axis=0) >= 2))
    assert tie_across_ranks, "no row whose maximum is reached on two ranks"
    told = {}
    for vocab, full in cases:
        width = full.shape[1] // RANKS
        right = serial_argmax(full, vocab)
        for rank in range(RANKS):
            for sentence, value in argmax_symptoms(full, vocab, rank * width, width).items():
                told[sentence] = told.get(sentence, False) or not np.array_equal(value, right)
    assert told and all(told.values()), [s for s, ok in told.items() if not ok]
