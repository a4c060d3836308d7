"""Run every lesson and check every exercise — what ``make lessons`` calls.

    python lessons/run_all.py [--timeout SECONDS] [--out DIR]

1. every ``lessons/NN_*.py`` under mpiexec at the rank count it declares: exit 0, and every CHECK line OK;
2. ``tpsim check NN lessons/solutions/exNN_*.py``: the reference solution passes;
3. ``tpsim check NN lessons/exercises/exNN_*.py`` as committed (``git show HEAD:...``, so an answer a learner
   wrote into the stub itself is not what is checked): the stub reports "not done yet" (the stubs stay stubs).

Each run has a timeout. One line per run, the output of a failed run, then ``lessons: N passed, M failed``;
exit status 1 on any failure. New lessons and exercises are picked up by their file names.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Callable

from tpsim.teach.cli import Launch, run_check, run_lesson
from tpsim.teach.lessons import DEFAULT_OUT, discover, exercise_files, read_checks
from tpsim.teach.workspace import committed_stub

NOT_DONE = 3  # tpsim check's exit status for an exercise that still raises NotImplementedError


def lesson_verdict(number: str, run: Launch) -> str | None:
    """``None`` if the lesson passed, else why not."""
    checks = read_checks(run.stdout)
    if run.returncode != 0:
        return f"exit status {run.returncode}"
    if not checks:
        return "no CHECK lines"
    failed = [claim for claim, ok in checks if not ok]
    if failed:
        return f"{len(failed)} CHECK(s) FAILED"
    if f"lesson {number}: {len(checks)} checks, all OK" not in run.stdout:
        return "no summary line (did the lesson end with lesson.finish()?)"
    return None


def check_exercises(committed: Path, timeout: float, report: Callable) -> None:
    """Every reference solution through ``tpsim check`` (exit 0), every stub as committed (exit 3, not done yet)."""
    solutions, stubs = exercise_files("solutions"), exercise_files("exercises")
    stubs = {number: committed_stub(path, committed) for number, path in stubs.items()}
    for number in sorted(set(solutions) | set(stubs)):
        for kind, files, expect in (("solution", solutions, 0), ("stub", stubs, NOT_DONE)):
            if number not in files:
                report(f"{kind} {number}", None, f"there is no lessons/{kind}s/ex{number}_*.py")
                continue
            run = run_check(number, files[number], timeout=timeout, capture=True)
            problem = None
            if run.returncode != expect:
                problem = f"exit status {run.returncode}, expected {expect}"
            elif kind == "stub" and "is not done yet" not in run.stdout:
                problem = "no 'not done yet' message"
            report(f"tpsim check {number} {kind}" + (" (must say: not done yet)" if kind == "stub" else ""),
                   run, problem)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python lessons/run_all.py", description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per run (default 120)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"folder for the lessons' figures (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)

    passed, failed = 0, 0

    def report(what: str, run: Launch | None, problem: str | None) -> None:
        """One line per run (``run`` None: nothing could run), then a failed run's last 40 lines."""
        nonlocal passed, failed
        status = "ok  " if problem is None else "FAIL"
        took = f"{run.seconds:5.1f} s" if run is not None else "      -"
        print(f"{status} {what:<56} {took}" + ("" if problem is None else f"   {problem}"), flush=True)
        if problem is None:
            passed += 1
        else:
            failed += 1
            for line in run.stdout.rstrip().splitlines()[-40:] if run is not None else []:
                print("     | " + line, flush=True)

    for info in discover():
        run = run_lesson(info.number, args.out, timeout=args.timeout, capture=True)
        ranks = f"{info.ranks} rank{'s' if info.ranks > 1 else ''}"
        report(f"lesson {info.number} ({ranks}) {info.path.name}", run, lesson_verdict(info.number, run))

    with tempfile.TemporaryDirectory(prefix="tpsim-stubs-") as committed:
        check_exercises(Path(committed), args.timeout, report)

    print(f"lessons: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
