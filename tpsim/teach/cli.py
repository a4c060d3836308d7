"""``tpsim lesson list|start|solution|run NN`` and ``tpsim check NN [FILE]`` — plain processes that launch ``mpiexec``.

The lessons and the checker run on real ranks, so these commands start ``mpiexec -n RANKS`` with the rank
count the lesson declares, using the ``mpiexec`` beside this Python (the venv's MPICH wheel) before the first
on PATH, and ``sys.executable`` for the ranks. Each launch runs in its own process group with a timeout; on
timeout the whole group is killed, so a rank stuck in a collective cannot hang the command. ``tpsim lesson start
NN`` copies the lesson's stubs into the learner's folder, where ``tpsim check NN`` looks first
(``tpsim.teach.workspace``).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from tpsim.errors import ConfigError
from tpsim.launcher import Launch
from tpsim.launcher import launch as run_mpiexec
from tpsim.paths import check_output_dir
from tpsim.table import format_table
from tpsim.teach.course import MEASURED, stop
from tpsim.teach.hints import HINT_STATE, NEXT
from tpsim.teach.lessons import (DEFAULT_OUT, LessonsNotFound, discover, exercise_file, exercise_files,
                                 find_lesson, lesson_of, normalize_exercise, shown_path)
from tpsim.teach.notebook_cli import NOTEBOOK_COMMANDS, add_notebook_commands
from tpsim.teach.workspace import WORK_ENV, answer_file, exercises_of, start, work_dir
from tpsim.options import OneLineParser, positive

LESSON_TIMEOUT, CHECK_TIMEOUT = 300.0, 120.0
LIST_WIDTH = 100  # `tpsim lesson list` fits a 100-column terminal


def launch(ranks: int, args: list[str], *, timeout: float, capture: bool = False) -> Launch:
    """``mpiexec -n RANKS python ARGS``; output streamed to this terminal, or captured (stdout + stderr) when asked."""
    result = run_mpiexec(ranks, args, timeout=timeout, capture=capture, merge_stderr=True)
    if result.timed_out:
        note = (f"stopped after {timeout:g} s: a rank is probably waiting in a collective that another rank "
                f"never entered")
        if capture:
            result.stdout += note + "\n"
        else:
            print(note, file=sys.stderr)
    return result


def run_lesson(number: str | int, out: str | None = None, *, timeout: float = LESSON_TIMEOUT,
               capture: bool = False) -> Launch:
    info = find_lesson(number)
    return launch(info.ranks, [str(info.path)] + (["--out", out] if out else []), timeout=timeout, capture=capture)


def run_check(number: str | int, file: str | Path | None = None, *, timeout: float = CHECK_TIMEOUT,
              capture: bool = False, hint: int = 0, hint_state: Path = HINT_STATE) -> Launch:
    """Check ``file`` (default: the learner's copy, else the exercise stub) for exercise ``number`` at its
    lesson's rank count; ``hint``: 0 none, ``NEXT`` one level more than last time, N levels 1..N
    (``tpsim.teach.hints``)."""
    number = normalize_exercise(number)
    path = Path(file) if file is not None else shown_path(answer_file(number)[0])
    ranks = find_lesson(lesson_of(number)).ranks
    hints = ["--hint", str(hint), "--hint-state", str(Path(hint_state).resolve())] if hint else []
    return launch(ranks, ["-m", "tpsim.teach.run_check", number, str(path), *hints], timeout=timeout,
                  capture=capture)


def start_main(number: str) -> int:
    """``tpsim lesson start NN``: the stubs of lesson NN (or of one exercise, 04b) copied into the work folder."""
    for n, stub, copy, copied in start(number):
        if copied:
            print(f"copied {shown_path(stub)} to {shown_path(copy)}: write your answer there, then tpsim check {n}")
        else:
            print(f"{shown_path(copy)} is already there (your answer is kept): tpsim check {n} checks it; delete it "
                  f"to start over")
    return 0


def solution_main(number: str) -> int:
    """``tpsim lesson solution NN``: where the reference answers of lesson NN (or of one exercise) are."""
    numbers = exercises_of(number)
    if not numbers:
        raise LessonsNotFound(f"there is no exercise {normalize_exercise(number)} (see tpsim lesson list)")
    for n in numbers:
        print(f"exercise {n}: {shown_path(exercise_file(n, 'solutions'))}")
    return 0


def _say_which(number: str) -> None:
    """The line before a check without FILE: which file it checks, and why that one."""
    path, mine = answer_file(number)
    if mine:
        print(f"checking your copy {shown_path(path)}", flush=True)
    else:
        print(f"checking the stub {shown_path(path)} (no copy in {work_dir()}/: tpsim lesson start "
              f"{lesson_of(number)} makes one to write your answer in)", flush=True)


def _level(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a hint level counts from 1, got {text!r}")
    return int(text)


def lesson_table(lessons, width: int = LIST_WIDTH) -> str:
    """Every lesson: number, ranks, run time and title; below it the command, then what it needs first, its
    exercises and what it checks (``tpsim.teach.course``) — all within ``width`` columns."""
    lessons = list(lessons)
    if not lessons:
        return "no lessons found"
    exercises = exercise_files()
    indent = len("lesson  ranks  run     ")
    rows = [["lesson", "ranks", "run", "title / command / needs first, exercises, what it checks"]]
    for info in lessons:
        place = stop(info.number)
        title = textwrap.wrap(info.title, width - indent, break_on_hyphens=False) or [""]
        seconds = f"~{place.seconds} s" if place else "?"
        rows += [[info.number, str(info.ranks), seconds, title[0]], *([["", "", "", more] for more in title[1:]])]
        rows.append(["", "", "", "  " + info.command])
        mine = [n for n in exercises if lesson_of(n) == info.number]
        facts = [f"needs {', '.join(place.needs) if place.needs else 'nothing'}" if place else "",
                 f"exercise {', '.join(mine)}" if mine else "no exercise", f"checks: {place.checks}" if place else ""]
        for more in textwrap.wrap(" · ".join(f for f in facts if f), width - indent - 2, break_on_hyphens=False):
            rows.append(["", "", "", "  " + more])
    table = format_table(rows, right=(1, 2))
    note = "\n".join(textwrap.wrap(f"run: the wall time of {MEASURED}", width))
    if all(info.command.startswith("tpsim ") for info in lessons):
        return f"{table}\n{note}"  # an installed package: the commands are already tpsim lesson run NN
    return f"{table}\n{note}\n(or: tpsim lesson run NN, the same command with a timeout)"


def lesson_main(argv: list[str]) -> int:
    parser = OneLineParser(prog="tpsim lesson", description="The guided lessons, on real MPI ranks.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="number, title and rank count of every lesson")
    begin = sub.add_parser("start", help=f"copy the lesson's exercise stubs into your work folder ({WORK_ENV}, "
                                         f"default ./tpsim-work/), where tpsim check looks first")
    begin.add_argument("number", help="lesson number, e.g. 03 (all its exercises), or one exercise, e.g. 04b")
    answer = sub.add_parser("solution", help="where the reference answers of a lesson's exercises are (try first)")
    answer.add_argument("number", help="lesson number, e.g. 03 (all its exercises), or one exercise, e.g. 04b")
    run = sub.add_parser("run", help="run one lesson at its rank count")
    run.add_argument("number", help="lesson number, e.g. 03")
    run.add_argument("--out", default=None, help=f"folder for the lesson's figures (default {DEFAULT_OUT}/)")
    run.add_argument("--timeout", type=positive, default=LESSON_TIMEOUT, help="seconds before the run is stopped")
    add_notebook_commands(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            print(lesson_table(discover()))
            return 0
        if args.command == "start":
            return start_main(args.number)
        if args.command == "solution":
            return solution_main(args.number)
        if args.command in NOTEBOOK_COMMANDS:
            check_output_dir(args.out, "--out")  # before minutes of lesson runs
            return NOTEBOOK_COMMANDS[args.command](args)
        return run_lesson(args.number, args.out, timeout=args.timeout).returncode
    except (LessonsNotFound, ConfigError) as err:
        print(f"tpsim lesson: error: {err}", file=sys.stderr)
        return 2


def check_main(argv: list[str]) -> int:
    parser = OneLineParser(prog="tpsim check", description="Check your exercise against the reference "
                                     "on real ranks, at its lesson's rank count.",
                                     epilog="exit status: 0 right, 1 wrong (explained), 2 usage, 3 not done yet "
                                            "(NotImplementedError), 124 stopped by --timeout. Hint levels are "
                                            f"remembered per exercise in {HINT_STATE} (delete it to start over).")
    parser.add_argument("number", help="exercise number, e.g. 02, or 04b for the harder one of lesson 04")
    parser.add_argument("file", nargs="?", default=None,
                        help=f"the file with your functions (default: your copy in ${WORK_ENV} or ./tpsim-work/ "
                             f"made by tpsim lesson start NN, else the committed stub; tpsim lesson solution NN: the "
                             f"reference answer)")
    parser.add_argument("--timeout", type=positive, default=CHECK_TIMEOUT, help="seconds before the check is stopped")
    parser.add_argument("--hint", nargs="?", type=_level, const=NEXT, default=0, metavar="N",
                        help="after the verdict, the next hint for the function that went wrong (one level more "
                             "each time), or levels 1..N")
    args = parser.parse_args(argv)
    try:
        if args.file is not None and not Path(args.file).is_file():
            raise LessonsNotFound(f"no such file: {args.file}")
        if args.file is None:
            _say_which(normalize_exercise(args.number))
        return run_check(args.number, args.file, timeout=args.timeout, hint=args.hint).returncode
    except LessonsNotFound as err:
        print(f"tpsim check: error: {err}", file=sys.stderr)
        return 2
