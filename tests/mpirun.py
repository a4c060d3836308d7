"""Launch a whole program under mpiexec from a test — with a timeout that kills every rank, never a hang."""

from __future__ import annotations

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
