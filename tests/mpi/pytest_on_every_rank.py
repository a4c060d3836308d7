"""The entry point of the every-rank tests: pytest on every rank of one mpiexec launch, rank 0 reporting.

    mpiexec -n 4 python tests/mpi/pytest_on_every_rank.py [pytest options]

Other ranks write their stdout to /dev/null (their failures still reach rank 0 through the conftest's
agreement step, and their tracebacks go to stderr). Exits with pytest's status on every rank.

A watchdog bounds the whole run (``TPSIM_EVERY_RANK_TIMEOUT`` seconds, default 1200): a rank that outlives it
names itself on stderr and aborts the MPI job, so a collective some rank never joins (one rank stopped by
pytest-timeout, the others waiting for it) ends the run instead of hanging it. Each test's own limit is
pytest-timeout's ``--timeout``.
Not to be confused with ``tests/launch_program.py``, which a single-process test uses to start a whole program.
"""

import os
import sys
import threading

import pytest
from mpi4py import MPI

if __name__ == "__main__":
    args = sys.argv[1:]
    if not any(os.path.exists(a.split("::")[0]) for a in args if not a.startswith("-")):
        args.insert(0, os.path.dirname(os.path.abspath(__file__)))  # no path given: the whole folder
    if MPI.COMM_WORLD.Get_rank() != 0:  # silence stdout before pytest saves it; stderr stays
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        sys.stdout = open(os.devnull, "w")
    limit = float(os.environ.get("TPSIM_EVERY_RANK_TIMEOUT", "1200"))
    stderr = os.dup(2)  # the real stderr, before pytest's capture redirects fd 2 during a test

    def abort() -> None:
        os.write(stderr, f"pytest_on_every_rank: rank {MPI.COMM_WORLD.Get_rank()} still running after {limit:g} s "
                         "(TPSIM_EVERY_RANK_TIMEOUT): aborting the MPI job\n".encode())
        MPI.COMM_WORLD.Abort(3)

    watchdog = threading.Timer(limit, abort)
    watchdog.daemon = True
    watchdog.start()
    status = pytest.main(args)
    watchdog.cancel()
    sys.exit(status)
