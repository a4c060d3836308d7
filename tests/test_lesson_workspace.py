"""A learner's answers live in their own folder: ``tpsim lesson start NN`` copies the stub there, ``tpsim check NN``
finds it first and says which file it checked, and the committed stubs stay stubs whatever the learner does.
"""

from __future__ import annotations

import subprocess

import pytest

from launch_program import ROOT
from tpsim.cli import main as tpsim_main
from tpsim.teach.lessons import exercise_files
from tpsim.teach.workspace import WORK_ENV, committed_stub

STUBS, SOLUTIONS = exercise_files("exercises"), exercise_files("solutions")
NOT_DONE = 3


def tpsim(capfd, *args: str) -> tuple[int, str, str]:
    capfd.readouterr()
    code = tpsim_main(list(args))
    out, err = capfd.readouterr()
    return code, out, err


def test_lesson_start_copies_every_stub_of_the_lesson_and_keeps_an_answer(capfd, monkeypatch, tmp_path):
    work = tmp_path / "work"
    monkeypatch.setenv(WORK_ENV, str(work))
    code, out, err = tpsim(capfd, "lesson", "start", "4")
    assert code == 0, out + err
    for number in ("04", "04b"):
        copy = work / STUBS[number].name
        assert copy.read_text() == STUBS[number].read_text()
        assert f"to {copy}: write your answer there, then tpsim check {number}" in out
    (work / STUBS["04"].name).write_text("# my answer\n")
    code, out, _ = tpsim(capfd, "lesson", "start", "04")
    assert code == 0 and (work / STUBS["04"].name).read_text() == "# my answer\n"
    assert "is already there (your answer is kept)" in out
    code, _, err = tpsim(capfd, "lesson", "start", "99")
    assert code == 2 and "there is no exercise 99" in err


@pytest.mark.slow
def test_a_solved_copy_passes_tpsim_check_while_the_committed_stub_is_not_done_yet(capfd, monkeypatch, tmp_path):
    work = tmp_path / "work"
    monkeypatch.setenv(WORK_ENV, str(work))
    code, out, err = tpsim(capfd, "check", "03")  # no copy yet: the stub, and how to get a copy
    assert code == NOT_DONE, out + err
    assert "checking the stub " in out and "tpsim lesson start 03 makes one" in out
    assert tpsim(capfd, "lesson", "start", "03")[0] == 0
    copy = work / STUBS["03"].name
    copy.write_text(SOLUTIONS["03"].read_text())  # the learner solves it in their copy
    code, out, err = tpsim(capfd, "check", "03")
    assert code == 0, out + err
    assert f"checking your copy {copy}" in out and "exercise 03 OK" in out
    code, out, err = tpsim(capfd, "check", "03", str(committed_stub(STUBS["03"], tmp_path / "committed")))
    assert code == NOT_DONE and "exercise 03 is not done yet" in out, out + err


def test_committed_stub_is_the_file_as_committed_not_as_edited_in_place(tmp_path):
    """What the stub tests check: an answer written into a tracked stub is not what they read."""
    repo = tmp_path / "repo"
    (repo / "lessons" / "exercises").mkdir(parents=True)
    stub = repo / "lessons" / "exercises" / "ex03_x.py"
    stub.write_text("raise NotImplementedError\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(git[:5] + ["init", "-q", str(repo)], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "stub"], check=True)
    stub.write_text("def answer(): return 42\n")  # solved in place
    copy = committed_stub(stub, tmp_path / "committed")
    assert copy != stub and copy.read_text() == "raise NotImplementedError\n"
    untracked = repo / "lessons" / "exercises" / "ex04_y.py"
    untracked.write_text("x = 1\n")
    assert committed_stub(untracked, tmp_path / "committed") == untracked.resolve()  # nothing committed: as is


def test_the_stub_tests_check_committed_stubs_not_the_work_folder():
    text = (ROOT / "tests" / "test_lessons.py").read_text()
    stub_test = text.split("def test_stub_is_reported_not_done_yet")[1].split("\ndef ")[0]
    assert "committed_stub(" in stub_test and "WORK_ENV" in stub_test
    assert "committed_stub(" in (ROOT / "lessons" / "run_all.py").read_text()
