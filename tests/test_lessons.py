"""The lessons and exercises as whole programs under mpiexec: every lesson's CHECKs, every solution, every stub.

Lessons and exercises are discovered by file name, so a new ``lessons/NN_*.py`` (with its exercise, solution
and check) is tested here without touching this file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launch_program import ROOT, run_mpi
from tpsim.cli import main as tpsim_main
from tpsim.teach.checks import CHECKS
from tpsim.teach.lessons import CHECK_LINE, discover, exercise_files, lesson_of, read_checks
from tpsim.teach.workspace import WORK_ENV, committed_stub

pytestmark = pytest.mark.slow

LESSONS = discover()
STUBS, SOLUTIONS = exercise_files("exercises"), exercise_files("solutions")
NOT_DONE = 3  # tpsim check's exit status for an exercise that still raises NotImplementedError
PRINTED_HEADING = re.compile(r"^## (.+?)\s*$", re.MULTILINE)


def markdown_headings(path: Path) -> list[str]:
    """The ``## `` headings of a lesson's markdown cells (``# ## title`` lines), in order."""
    headings, markdown = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# %%"):
            markdown = "[markdown]" in line
        elif markdown and line.startswith("# ## "):
            headings.append(line[5:].strip())
    return headings


def checks_without_expect(output: str) -> list[str]:
    """CHECK lines with no ``expect:`` line since the last section heading (nothing told the reader why)."""
    unexplained, told = [], False
    for line in output.splitlines():
        if line.startswith("## "):
            told = False
        elif line.startswith("expect: "):
            told = True
        elif CHECK_LINE.match(line) and not told:
            unexplained.append(line)
    return unexplained


def tpsim(capfd, *args: str) -> tuple[int, str, str]:
    """The ``tpsim`` command in this process: ``(exit status, stdout, stderr)``, including mpiexec's output.

    The commands launch mpiexec themselves, in their own process group with a timeout (``--timeout``), so a
    hung check is killed by the command under test; pytest-timeout is the backstop.
    """
    capfd.readouterr()
    code = tpsim_main(list(args))
    out, err = capfd.readouterr()
    return code, out, err


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda info: info.path.stem)
def test_lesson_runs_at_its_rank_count_with_every_check_ok(lesson, tmp_path):
    r = run_mpi(lesson.ranks, [str(lesson.path), "--out", str(tmp_path)], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    checks = read_checks(r.stdout)
    assert checks, f"lesson {lesson.number} printed no CHECK line"
    assert [claim for claim, ok in checks if not ok] == []
    assert f"lesson {lesson.number}: {len(checks)} checks, all OK" in r.stdout
    assert all(png.read_bytes()[:4] == b"\x89PNG" for png in tmp_path.glob("*.png"))
    # the run reads on its own: the lesson's outline, and a line of what to expect before the checks
    assert PRINTED_HEADING.findall(r.stdout) == markdown_headings(lesson.path)
    assert checks_without_expect(r.stdout) == []
    recap = r.stdout.split("\n## What to take away\n")[-1]
    assert recap.startswith("* ") and f"tpsim check {lesson.number}" in recap, recap


def test_every_exercise_has_a_solution_a_lesson_and_a_check():
    numbers = {info.number for info in LESSONS}
    assert set(STUBS) == set(SOLUTIONS)
    assert {lesson_of(n) for n in STUBS} <= numbers and set(STUBS) <= set(CHECKS)


@pytest.mark.parametrize("number", sorted(SOLUTIONS))
def test_reference_solution_passes_tpsim_check(capfd, number):
    code, out, err = tpsim(capfd, "check", number, str(SOLUTIONS[number]))
    assert code == 0, out + err
    assert f"exercise {number} OK" in out


@pytest.mark.parametrize("number", sorted(STUBS))
def test_stub_is_reported_not_done_yet(capfd, monkeypatch, tmp_path, number):
    """The stub as committed (not a learner's answer written into it, nor their copy in the work folder)."""
    monkeypatch.setenv(WORK_ENV, str(tmp_path / "no-work-here"))
    stub = committed_stub(STUBS[number], tmp_path)
    code, out, err = tpsim(capfd, "check", number, str(stub))
    assert code == NOT_DONE, out + err
    assert f"exercise {number} is not done yet: implement " in out and "see the TODO" in out


def test_wrong_rank_count_is_one_line_on_rank_zero_and_a_nonzero_exit():
    r = run_mpi(2, [str(ROOT / "lessons" / "03_column_row_parallel.py")], timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert "lesson 03 needs 4 ranks: mpirun -n 4 python lessons/03_column_row_parallel.py" in lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_wrong_g_backward_is_explained(capfd, tmp_path):
    """A g backward that triples the gradient (no known mistake): the check names the rank, the tensor and the
    difference, and offers hints without printing one."""
    bad = tmp_path / "ex02_wrong.py"
    bad.write_text(SOLUTIONS["02"].read_text() + "\n\ndef g_backward(dy, group):  # redefined: the bug\n"
                                                "    return dy * 3\n")
    code, out, err = tpsim(capfd, "check", "02", str(bad))
    assert code == 1, out + err
    assert "exercise 02 FAILED: g_backward" in out
    assert "on MPI rank 0 (of 2): g_backward(dy) for dy of shape (3, 5), the same dy on every rank" in out
    assert "expected shape" not in out and "max |got − expected| = " in out  # the shapes agree: not named
    assert "yours is 3 × the reference everywhere" in out and "the same goes wrong on MPI rank 1" in out
    assert "tpsim check 02 " in out and " --hint reveals g_backward's " in out


def test_a_function_that_raises_is_reported_without_a_hang(capfd, tmp_path):
    bad = tmp_path / "ex05_raises.py"
    bad.write_text("def qkv_columns(hidden, heads, tp, tp_rank):\n    return [][tp_rank]\n")
    code, out, err = tpsim(capfd, "check", "05", str(bad), "--timeout", "60")
    assert code == 1, out + err
    assert "raised IndexError: list index out of range (line 2: return [][tp_rank])" in out


def test_a_collective_on_one_rank_only_is_stopped_by_the_timeout(capfd, tmp_path):
    bad = tmp_path / "ex02_hangs.py"
    bad.write_text(SOLUTIONS["02"].read_text() + "\n\ndef g_backward(dy, group):  # rank 0 waits for rank 1\n"
                                                "    return group.all_reduce(dy) if group.rank == 0 else dy\n")
    code, out, err = tpsim(capfd, "check", "02", str(bad), "--timeout", "4")
    assert code == 124, out + err
    assert "stopped after 4 s: a rank is probably waiting in a collective" in err


def test_lesson_list_and_run_from_the_cli(capfd, tmp_path):
    code, out, _ = tpsim(capfd, "lesson", "list")
    assert code == 0
    flat = " ".join(out.split())  # a long title wraps onto a second line
    for info in LESSONS:
        assert " ".join(info.title.split()) in flat and info.command in out
    assert max(map(len, out.splitlines())) <= 100, "tpsim lesson list fits a 100-column terminal"
    code, out, err = tpsim(capfd, "lesson", "run", "1", "--out", str(tmp_path))
    assert code == 0, out + err
    assert "lesson 01: " in out and (tmp_path / "01_block_splits.png").exists()
    code, _, err = tpsim(capfd, "lesson", "run", "99")
    assert code == 2 and "there is no lesson 99" in err
