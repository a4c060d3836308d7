"""The learner's own folder: ``tpsim lesson start NN`` copies lesson NN's exercise stubs there, ``tpsim check NN``
looks there first.

An answer written into ``lessons/exercises/`` itself changes the repository's stubs, and the tests and
``make lessons`` check that every stub still says "not done yet" — so a solved exercise would turn them red.
The stubs therefore stay as committed and the learner works on a copy:

    tpsim lesson start 03     lessons/exercises/ex03_column_row_parallel.py -> tpsim-work/ex03_column_row_parallel.py
    tpsim check 03            checks tpsim-work/ex03_*.py when it is there, else the committed stub

The folder is ``$TPSIM_WORK``, else ``tpsim-work/`` of the working directory. ``committed_stub`` gives the tests
and ``lessons/run_all.py`` the stub as the repository holds it (``git show HEAD:...``), whatever a learner did to
the file in place. Pure file handling, no MPI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tpsim.teach.lessons import LessonsNotFound, exercise_file, exercise_files, lesson_of, normalize_exercise

WORK_ENV, DEFAULT_WORK = "TPSIM_WORK", "tpsim-work"


def work_dir() -> Path:
    """``$TPSIM_WORK``, else ``./tpsim-work``: where the learner's copies of the stubs live."""
    return Path(os.environ.get(WORK_ENV) or DEFAULT_WORK)


def exercises_of(number: str) -> list[str]:
    """``"04"`` -> ``["04", "04b"]`` (a lesson's exercises); ``"04b"`` -> ``["04b"]`` (that one)."""
    number = normalize_exercise(number)
    if len(number) == 3:
        return [number] if number in exercise_files() else []
    return [n for n in exercise_files() if lesson_of(n) == number]


def start(number: str) -> list[tuple[str, Path, Path, bool]]:
    """Copy the stubs of ``number`` (a lesson: all its exercises) into ``work_dir()``; never overwrites an answer.

    Returns ``(exercise, stub, copy, copied)`` per exercise; ``copied`` is False where the copy was already there."""
    numbers = exercises_of(number)
    if not numbers:
        raise LessonsNotFound(f"there is no exercise {normalize_exercise(number)} "
                              f"(exercises: {', '.join(exercise_files()) or 'none'})")
    done = []
    for n in numbers:
        stub = exercise_file(n)
        copy = work_dir() / stub.name
        fresh = not copy.exists()
        if fresh:
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(stub, copy)
        done.append((n, stub, copy, fresh))
    return done


def answer_file(number: str) -> tuple[Path, bool]:
    """The file ``tpsim check NN`` checks: ``(the learner's copy, True)`` if there is one, else ``(stub, False)``."""
    stub = exercise_file(number)
    copy = work_dir() / stub.name
    return (copy, True) if copy.is_file() else (stub, False)


def committed_stub(stub: Path, into: Path) -> Path:
    """The stub as the repository's HEAD holds it, written into the folder ``into`` (same file name).

    Where there is no git checkout (an unpacked sdist) or git does not know the file, ``stub`` itself."""
    stub = Path(stub).resolve()
    try:
        done = subprocess.run(["git", "show", f"HEAD:./{stub.name}"], cwd=stub.parent, capture_output=True,
                              timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return stub
    if done.returncode != 0:
        return stub
    copy = Path(into) / stub.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(done.stdout)
    return copy
