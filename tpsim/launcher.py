"""Launching ``mpiexec`` from a plain process — the CLI, ``make figures`` and the tests all do it, one way.

    launch(4, ["-m", "tpsim.demo", "--steps", "3"], timeout=120)  ->  Launch(returncode, stdout, stderr, ...)

- The ``mpiexec`` beside this Python comes first (the venv's MPICH wheel), then the first one on PATH; the ranks
  run ``sys.executable``, so they see the same packages as the caller.
- The job runs in its own process group (session). On timeout, or on Ctrl-C in the caller, the whole group is
  killed: a rank stuck in a collective can never hang the command that launched it.
- ``MPLBACKEND=Agg`` so figures work without a screen; ``PYTHONUNBUFFERED`` is dropped (with ``-prepend-rank``
  it splits lines).

No MPI is imported here: the launching process is not a rank.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TIMED_OUT = 124  # the status ``timeout(1)`` uses


@dataclass
class Launch:
    returncode: int  # TIMED_OUT when the timeout killed the job
    stdout: str  # "" when not captured; stderr too when merged
    stderr: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode == TIMED_OUT


def mpiexec() -> str:
    """The mpiexec beside this Python (the venv's MPICH wheel), else the first on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


def launch(ranks: int, args: list[str], *, timeout: float, capture: bool = True, merge_stderr: bool = False,
           cwd: str | Path | None = None) -> Launch:
    """``mpiexec -n RANKS python ARGS``. ``capture=False`` streams the output to this terminal instead;
    ``merge_stderr`` interleaves stderr into ``stdout`` as a terminal would show it."""
    env = dict(os.environ)
    env.setdefault("MPLBACKEND", "Agg")
    env.pop("PYTHONUNBUFFERED", None)
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, *args]
    pipe = subprocess.PIPE if capture else None
    err_pipe = (subprocess.STDOUT if merge_stderr else subprocess.PIPE) if capture else None
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=pipe, stderr=err_pipe, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = TIMED_OUT
    except KeyboardInterrupt:  # Ctrl-C reaches only this process: the ranks run in their own session
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return Launch(code, out or "", err or "", time.perf_counter() - t0)
