"""Launch a whole program under mpiexec from a single-process test, with a timeout that kills every rank.

The program tests (``test_programs_*.py``, ``test_lessons.py``, ``test_trace_outputs.py``) import it by its bare
name (pytest puts ``tests/`` on ``sys.path``): ``from launch_program import ROOT, run_mpi``. A hang becomes a
failed test carrying the output so far, never a stuck suite. Not to be confused with
``tests/mpi/pytest_on_every_rank.py``, which runs pytest itself on every rank.
"""

from __future__ import annotations

import re
from pathlib import Path

from tpsim.launcher import Launch, launch

ROOT = Path(__file__).resolve().parent.parent


def run_mpi(n: int, args: list[str], timeout: float = 120, cwd: Path | None = None) -> Launch:
    """``mpiexec -n N python ARGS`` from the repository root; a timeout fails the test with the output so far."""
    result = launch(n, args, timeout=timeout, cwd=cwd or ROOT)
    if result.timed_out:
        raise AssertionError(f"mpiexec -n {n} {' '.join(args)} did not finish within {timeout}s\n"
                             f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result


# Open MPI's launcher frames its own notices in lines of dashes ("prterun detected that one or more processes
# exited with non-zero status, ..."), and its event library sometimes warns while the job ends ("[warn] Epoll MOD(4)
# on fd 24 failed. ... Bad file descriptor", harmless); MPICH adds neither after a clean non-zero exit.
_OPEN_MPI_NOTICES = re.compile(r"^-{60,}\n.*?^-{60,}\n?|^\[warn\] Epoll .*\n?", re.MULTILINE | re.DOTALL)


def without_launcher_notices(stderr: str) -> str:
    """``stderr`` without the notices Open MPI's launcher adds (the programs' own lines stay)."""
    return _OPEN_MPI_NOTICES.sub("", stderr)
