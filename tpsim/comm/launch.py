"""Entry-point plumbing: fail loud, never hang.

An unhandled exception on one rank leaves the others blocked in their next collective forever, so every entry
point (demo, lessons, CLI) runs its ``main`` through ``run_main``:

- a ``ConfigError`` (or ``SystemExit`` with a message) raised identically on every rank before any collective
  prints one line on rank 0 and exits every rank with status 2 — no traceback, no abort;
- any other exception prints its traceback (prefixed with the rank) and calls ``MPI.COMM_WORLD.Abort(1)``,
  which ends the whole job within seconds.

Library code never calls ``Abort``; it raises.
"""

from __future__ import annotations

import sys
import traceback
from typing import Callable

from mpi4py import MPI

from tpsim.errors import ConfigError


def world_rank() -> int:
    return MPI.COMM_WORLD.Get_rank()


def world_size() -> int:
    return MPI.COMM_WORLD.Get_size()


def run_main(main: Callable[[], int | None], prog: str = "tpsim") -> None:
    """Run ``main()`` and turn its failures into a clean, job-wide exit (see the module docstring)."""
    rank = MPI.COMM_WORLD.Get_rank()
    try:
        status = main()
    except ConfigError as err:  # same on every rank by construction: exit together, quietly
        if rank == 0:
            print(f"{prog}: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except SystemExit as err:  # argparse errors and explicit exits
        if err.code in (None, 0):
            raise
        if isinstance(err.code, str) and rank == 0:
            print(err.code, file=sys.stderr, flush=True)
        sys.exit(err.code if isinstance(err.code, int) else 2)
    except BaseException:  # anything else: one rank may be alone with it, so take the whole job down
        lines = traceback.format_exc().rstrip().splitlines()
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in lines))
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    sys.exit(status or 0)
