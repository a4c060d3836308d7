"""``mpiexec -n N python -m tpsim.teach.run_check NN FILE`` — the checker's side of ``tpsim check NN [FILE]``.

Runs on every rank of a launch at lesson NN's rank count (exercise 04b: lesson 04's);
``tpsim.teach.cli.check_main`` starts it.
Exit status: 0 OK, 1 wrong, 2 usage (bad number, missing file, wrong rank count), 3 not done yet.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tpsim.mpi_library import exit_without_mpi

with exit_without_mpi("tpsim check"):  # no MPI library: one line naming the extras, not mpi4py's traceback
    from tpsim.comm.launch import run_main, world_size
    from tpsim.errors import ConfigError
    from tpsim.teach.checks import CHECKS
    from tpsim.teach.hints import HINT_STATE
    from tpsim.teach.lessons import LessonsNotFound, find_lesson, lesson_of, normalize_exercise
    from tpsim.teach.verdict import run


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ConfigError(message)  # the same on every rank: run_main prints it once


def main() -> int:
    parser = _Parser(prog="python -m tpsim.teach.run_check")
    parser.add_argument("number", help="exercise number, e.g. 02 or 04b")
    parser.add_argument("file", type=Path, help="the file holding your functions")
    parser.add_argument("--hint", type=int, default=0, help="0 none, -1 the next level, N levels 1..N")
    parser.add_argument("--hint-state", type=Path, default=HINT_STATE, help="the file remembering hint levels")
    args = parser.parse_args()
    try:
        number = normalize_exercise(args.number)
        ranks = find_lesson(lesson_of(number)).ranks
    except LessonsNotFound as err:
        raise ConfigError(str(err)) from None
    if number not in CHECKS:
        raise ConfigError(f"exercise {number} has no check (add one to tpsim/teach/checks/)")
    if world_size() != ranks:
        raise ConfigError(f"exercise {number} runs on {ranks} ranks like its lesson: tpsim check {number} "
                          f"(this run has {world_size()})")
    return run(CHECKS[number], args.file, args.hint, args.hint_state)


if __name__ == "__main__":
    run_main(main, prog="tpsim check")
