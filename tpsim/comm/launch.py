"""Entry-point plumbing: fail loud, never hang.

An unhandled exception on one rank leaves the others blocked in their next collective forever, so every entry
point (demo, lessons, CLI) runs its ``main`` through ``run_main``:

- a ``ConfigError`` (or ``SystemExit`` with a message; or an unknown ``TPSIM_WAIT``/``TPSIM_MALLOC``) raised identically on every rank before any collective
  prints one line on rank 0 and exits every rank with status 2 — no traceback, no abort;
- a ``TrainingStopped`` (reached identically on every rank, e.g. too many non-finite steps) does the same with
  status 1;
- any other exception prints its traceback (prefixed with the rank) and calls ``MPI.COMM_WORLD.Abort(70)``
  (``ABORTED``: sysexits' "internal software error", kept apart from 1 = a check failed and 2 = bad input),
  which ends the whole job within seconds — and nothing runs after it (no second exception on any rank);
- SIGTERM or SIGINT (Ctrl-C, or ``kill`` of ``mpirun``: MPICH's Hydra forwards both to every rank) ends the rank
  at once with status 128 + the signal's number (143, 130) and one line on rank 0; files being written
  atomically are discarded (``tpsim.atomic``), so no half-written file is left under a real name.

The signal is caught at C level through ``signal.set_wakeup_fd``, read by a small thread: a Python handler alone
would run only when the main thread comes back from C, and a rank blocked in a collective never does. When one
rank ends, Hydra ends the others (the job never hangs on a lone rank).

Library code never calls ``Abort``; it raises.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from typing import Callable

from mpi4py import MPI

from tpsim import allocator, atomic
from tpsim.comm import waiting
from tpsim.errors import ABORTED, ConfigError, TrainingStopped


def world_rank() -> int:
    return MPI.COMM_WORLD.Get_rank()


def world_size() -> int:
    return MPI.COMM_WORLD.Get_size()


SIGNALS = (signal.SIGTERM, signal.SIGINT)
ABORT_GRACE_S = 0.25  # before Abort: time for the launcher to forward this rank's last lines
_installed: list[str] = []  # the prog name once the handlers are in place (once per process)


def _stop_on_signal(read_fd: int, prog: str) -> None:
    """The watcher thread: wait for a signal number on the wake-up pipe, then end this rank cleanly."""
    while True:
        data = os.read(read_fd, 1)
        if data and data[0] in tuple(int(s) for s in SIGNALS):
            break
    signum = data[0]
    atomic.discard_partial()
    if world_rank() == 0:
        name = signal.Signals(signum).name
        sys.stderr.write(f"{prog}: stopped by {name}: every rank ends now (exit status {128 + signum})\n")
        sys.stderr.flush()
    os._exit(128 + signum)


def install_signal_handlers(prog: str = "tpsim") -> None:
    """SIGTERM/SIGINT end this rank within a moment, even inside a blocking collective (module docstring)."""
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    for signum in SIGNALS:  # a Python-level handler must exist for the C handler to write the wake-up byte
        signal.signal(signum, lambda *_: None)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_stop_on_signal, args=(read_fd, prog), name="tpsim-signals", daemon=True).start()
    _installed.append(prog)


def check_environment() -> None:
    """tpsim's own environment variables (``TPSIM_WAIT``, ``TPSIM_MALLOC``): read at import, where an unknown
    value cannot fail, so every entry point checks them here, before any work (a ConfigError: one line, exit 2)."""
    waiting.check_mode()
    allocator.check_mode()


def abort(code: int = ABORTED) -> None:
    """End the whole job with ``code``; never returns (if ``Abort`` ever did, ``os._exit`` still ends this rank)."""
    try:
        sys.stderr.flush()
        # Abort makes the launcher kill every process at once, and a loaded machine may not yet have let
        # Hydra's proxy read the traceback just written to its pipe (seen once: exit 70 and an empty stderr
        # under a full test run). A moment first, so what went wrong reaches the user.
        time.sleep(ABORT_GRACE_S)
        MPI.COMM_WORLD.Abort(code)
    finally:
        os._exit(code)


def run_main(main: Callable[[], int | None], prog: str = "tpsim") -> None:
    """Run ``main()`` and turn its failures into a clean, job-wide exit (see the module docstring)."""
    rank = MPI.COMM_WORLD.Get_rank()
    install_signal_handlers(prog)
    status = 1  # never read unless main() returned: every other path exits or aborts
    try:
        check_environment()
        status = main()
    except ConfigError as err:  # same on every rank by construction: exit together, quietly
        if rank == 0:
            print(f"{prog}: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except TrainingStopped as err:  # decided on every rank alike (e.g. too many non-finite steps): status 1
        if rank == 0:
            print(f"{prog}: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    except SystemExit as err:  # argparse errors and explicit exits
        if err.code in (None, 0):
            raise
        if isinstance(err.code, str) and rank == 0:
            print(err.code, file=sys.stderr, flush=True)
        sys.exit(err.code if isinstance(err.code, int) else 2)
    except BaseException:  # anything else: one rank may be alone with it, so take the whole job down
        lines = traceback.format_exc().rstrip().splitlines()
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in lines))
        abort(ABORTED)
    sys.exit(status or 0)
