"""Launching ``mpiexec`` from a plain process — the CLI, ``make figures`` and the tests all do it, one way.

    launch(4, ["-m", "tpsim.demo", "--steps", "3"], timeout=120)  ->  Launch(returncode, stdout, stderr, ...)
    python -m tpsim.launcher -n 4 -m tpsim.demo --steps 3        (the same from a shell or a Makefile)

- The ``mpiexec`` beside this Python comes first (the venv's MPI wheel), then the first one on PATH; the ranks
  run ``sys.executable``, so they see the same packages as the caller.
- Which MPI that ``mpiexec`` belongs to is read once from ``mpiexec --version`` (``mpi_kind``), and the launch
  adds what that MPI needs to start a job on one machine (``mpi_needs``): nothing for MPICH (Hydra) or Intel
  MPI; for Open MPI ``--oversubscribe`` (it gives each physical core one slot and refuses more ranks than slots —
  8 ranks on a 2-core laptop is how tpsim is used) and, as root, ``OMPI_ALLOW_RUN_AS_ROOT=1
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`` in the job's environment (Open MPI refuses root otherwise), said once.
- The job runs in its own process group (session). On timeout, or on Ctrl-C in the caller, the whole group is
  killed: a rank stuck in a collective can never hang the command that launched it.
- ``MPLBACKEND=Agg`` so figures work without a screen; ``PYTHONUNBUFFERED`` is dropped (with ``-prepend-rank``
  it splits lines).

No MPI is imported here: the launching process is not a rank.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tpsim.mpi_library import INSTALL, MpiLibraryMissing, exit_without_mpi

TIMED_OUT = 124  # the status ``timeout(1)`` uses
MPICH, OPEN_MPI, INTEL_MPI, UNKNOWN = "MPICH", "Open MPI", "Intel MPI", "unknown"
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@dataclass
class Launch:
    returncode: int  # TIMED_OUT when the timeout killed the job
    stdout: str  # "" when not captured; stderr too when merged
    stderr: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode == TIMED_OUT


@dataclass(frozen=True)
class MpiNeeds:
    """What one MPI needs beyond ``mpiexec -n N``: flags before ``-n``, environment entries, a note for the user."""

    flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    note: str = ""


def mpiexec() -> str:
    """The mpiexec beside this Python (the venv's MPI wheel), else the first on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


def mpi_kind(version_text: str) -> str:
    """Which MPI printed this ``mpiexec --version`` text: MPICH, Open MPI, Intel MPI or unknown (pure).

    Intel MPI is MPICH-derived and its Hydra may print "HYDRA" too, so it is recognised first."""
    if "Intel(R) MPI" in version_text or "Intel MPI" in version_text:
        return INTEL_MPI
    if "Open MPI" in version_text or "OpenRTE" in version_text:  # OpenRTE: Open MPI <= 4's mpiexec
        return OPEN_MPI
    if "HYDRA" in version_text or "MPICH" in version_text:  # MPICH's launcher (also MVAPICH's)
        return MPICH
    return UNKNOWN


@functools.lru_cache(maxsize=None)
def detect_mpi(path: str | None = None) -> str:
    """The kind of MPI of ``path`` (default: ``mpiexec()``), from its ``--version`` (read once per path)."""
    try:
        done = subprocess.run([path or mpiexec(), "--version"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return UNKNOWN
    return mpi_kind(done.stdout + done.stderr)


def mpi_needs(kind: str, *, root: bool, environ: dict[str, str] | None = None) -> MpiNeeds:
    """What a one-machine launch under ``kind`` needs (pure: the caller says whether it runs as root).

    Open MPI always gets ``--oversubscribe``: it counts *physical* cores as slots (hyperthreads and cgroups make
    that count hard to know from here), and the flag only allows more ranks than slots — placement and binding
    are unchanged when they fit. A root entry the user already set is left alone, and then nothing is said."""
    if kind != OPEN_MPI:
        return MpiNeeds()
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in ROOT_ENV.items() if root and k not in environ}
    note = (f"tpsim: running Open MPI as root, so this launch sets {' '.join(f'{k}=1' for k in env)} "
            f"(Open MPI refuses root without them)") if env else ""
    return MpiNeeds(flags=("--oversubscribe",), env=env, note=note)


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _mpiexec_and_needs() -> tuple[str, MpiNeeds]:
    path = mpiexec()
    return path, mpi_needs(detect_mpi(path), root=_is_root())


def mpiexec_command(ranks: int, args: list[str], mpiexec_flags: tuple[str, ...] = ()
                    ) -> tuple[list[str], dict[str, str], str]:
    """``(argv, environment, note)`` of ``mpiexec [FLAGS] -n RANKS python ARGS`` for the MPI found here."""
    path, needs = _mpiexec_and_needs()
    env = dict(os.environ)
    env.setdefault("MPLBACKEND", "Agg")
    env.pop("PYTHONUNBUFFERED", None)
    env.update(needs.env)
    return [path, *needs.flags, *mpiexec_flags, "-n", str(ranks), sys.executable, *args], env, needs.note


def mpiexec_prefix() -> list[str]:
    """``[mpiexec, flags...]`` for a launcher that adds ``-n N program`` itself (ipyparallel's MPI engines);
    what the MPI needs in the environment goes into this process's (the launcher's parent) ``os.environ``."""
    path, needs = _mpiexec_and_needs()
    if needs.note:
        _say_once(needs.note)
    os.environ.update(needs.env)
    return [path, *needs.flags]


@functools.lru_cache(maxsize=None)
def _say_once(note: str) -> None:
    print(note, file=sys.stderr, flush=True)


def launch(ranks: int, args: list[str], *, timeout: float | None, capture: bool = True, merge_stderr: bool = False,
           cwd: str | Path | None = None, mpiexec_flags: tuple[str, ...] = ()) -> Launch:
    """``mpiexec -n RANKS python ARGS``. ``capture=False`` streams the output to this terminal instead;
    ``merge_stderr`` interleaves stderr into ``stdout`` as a terminal would show it; ``timeout=None``: no limit;
    ``mpiexec_flags`` go to mpiexec itself (e.g. ``("-hosts", "a,b")``)."""
    cmd, env, note = mpiexec_command(ranks, args, mpiexec_flags)
    if note:
        _say_once(note)
    pipe = subprocess.PIPE if capture else None
    err_pipe = (subprocess.STDOUT if merge_stderr else subprocess.PIPE) if capture else None
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=pipe, stderr=err_pipe, text=True,
                                start_new_session=True)
    except FileNotFoundError as err:
        if shutil.which(cmd[0]) is not None:  # the program exists: something else is missing (e.g. cwd)
            raise
        raise MpiLibraryMissing(f"no mpiexec beside {sys.executable} or on PATH: {INSTALL}") from err
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


USAGE = """usage: python -m tpsim.launcher [--show] [--timeout S] -n N ARGS...
Runs `mpiexec -n N python ARGS` with what the MPI found here needs (Open MPI: --oversubscribe; as root, the
OMPI_ALLOW_RUN_AS_ROOT pair); --show prints the command and the added environment instead of running it."""


def main(argv: list[str] | None = None) -> int:
    """``python -m tpsim.launcher [--show] [--timeout S] -n N ARGS...`` — the launch above from a shell."""
    argv = list(sys.argv[1:] if argv is None else argv)
    show, timeout, ranks = False, None, None
    try:
        while argv and ranks is None:
            opt = argv.pop(0)
            if opt == "--show":
                show = True
            elif opt == "--timeout":
                timeout = float(argv.pop(0))
            elif opt == "-n":
                ranks = int(argv.pop(0))
            else:
                raise ValueError(opt)
    except (IndexError, ValueError):
        ranks = None
    if ranks is None or ranks < 1 or not argv:
        print(USAGE, file=sys.stderr)
        return 2
    if show:
        cmd, env, _ = mpiexec_command(ranks, argv)
        added = [f"{k}={env[k]}" for k in ROOT_ENV if env.get(k) and os.environ.get(k) != env[k]]
        print(f"# {detect_mpi(cmd[0])}: {cmd[0]}")
        print(" ".join([*added, *map(shlex.quote, cmd)]))
        return 0
    with exit_without_mpi("tpsim.launcher"):
        code = launch(ranks, argv, timeout=timeout, capture=False).returncode
    return 128 - code if code < 0 else code  # killed by signal N: the shell's 128 + N


if __name__ == "__main__":
    sys.exit(main())
