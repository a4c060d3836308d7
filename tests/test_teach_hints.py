"""The checker's pieces that need no ranks: symptoms, hint levels and their state file, exercise numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tpsim.teach.checks import CHECKS
from tpsim.teach.diagnose import diagnose, explain_difference
from tpsim.teach.hints import NEXT, reveal
from tpsim.teach.lessons import LessonsNotFound, exercise_files, lesson_of, normalize_exercise


def test_every_exercise_has_at_least_two_hint_levels_for_every_function():
    for number, check in CHECKS.items():
        for function in check.functions:
            assert len(check.hints[function]) >= 2, (number, function)


def test_harder_exercises_exist_with_stub_solution_and_check():
    stubs = exercise_files("exercises")
    for number in ("04b", "06b", "08b", "11b"):
        assert number in stubs and number in exercise_files("solutions") and number in CHECKS
        assert "raise NotImplementedError" in stubs[number].read_text()
        assert "TODO" in stubs[number].read_text()


def test_symptom_never_fires_when_the_mistake_gives_the_right_answer():
    expected = np.arange(6.0)
    lines, named = diagnose(expected * 2, expected, 1e-12, {"harmless": expected.copy(), "doubled": expected * 2})
    assert named and lines == ["doubled"]
    lines, named = diagnose(expected + 1, expected, 1e-12, {"doubled": expected * 2})
    assert not named and "max |got − expected| = 1 at index 0" in lines[0]
    lines, _ = diagnose(np.array(3.0), np.array(5.0), 1e-12)
    assert lines == ["got 3: too small"]  # a scalar is never shown beside the answer


def test_index_arrays_are_described_by_what_you_returned_not_by_the_answer():
    lines = explain_difference(np.array([4, 5, 6, 7]), np.array([0, 1, 8, 9]), 0)
    assert lines[0] == "yours: 4–7"
    assert lines[1] == "0 of your 4 entries belong in the answer; 4 of the answer's 4 entries are missing from yours"
    assert not any("0–1" in line or "8–9" in line for line in lines)


def test_reveal_counts_levels_per_exercise_and_function(tmp_path):
    state = tmp_path / "hints.json"
    levels = ("one", "two", "three")
    assert "hint 1 of 3 for f: one" in reveal("02", "f", levels, NEXT, state)[0]
    lines = reveal("02", "f", levels, NEXT, state)
    assert lines[1].endswith("two") and not any("three" in line for line in lines)
    reveal("02", "g", levels, 3, state)
    assert json.loads(state.read_text()) == {"02": {"f": 2, "g": 3}}
    state.write_text("not json")  # a broken state file starts over instead of failing the check
    assert reveal("02", "f", levels, NEXT, state)[-1].startswith("  (--hint again")


def test_exercise_numbers():
    assert normalize_exercise("4b") == "04b" and normalize_exercise("04B") == "04b" and normalize_exercise(2) == "02"
    assert lesson_of("11b") == "11"
    with pytest.raises(LessonsNotFound):
        normalize_exercise("4bb")
