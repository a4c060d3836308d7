"""Launch a whole program under mpiexec from a test — with a timeout that kills every rank, never a hang."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def mpiexec() -> str:
    """The mpiexec beside this Python (the venv's MPICH wheel), else the first on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


def run_mpi(n: int, args: list[str], timeout: float = 120, cwd: Path | None = None) -> Result:
    """``mpiexec -n N python ARGS`` in its own process group; on timeout the whole group is killed."""
    env = dict(os.environ, MPLBACKEND="Agg")
    env.pop("PYTHONUNBUFFERED", None)
    cmd = [mpiexec(), "-n", str(n), sys.executable, *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd or ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(cmd)} did not finish within {timeout}s\nstdout:\n{out}\nstderr:\n{err}")
    return Result(proc.returncode, out, err, time.perf_counter() - t0)
