"""The ``tpsim`` command: a thin dispatcher to the tools that live beside the code they serve.

    tpsim plot RUN_DIR        regenerate a run's figures                       (tpsim.trace.cli)
    tpsim report RUN_DIR      per-module communication table of a run          (tpsim.trace.cli)
    tpsim lesson list|start|run NN  the guided lessons                         (tpsim.teach.cli)
    tpsim check NN [FILE]     check an exercise against the reference          (tpsim.teach.cli)
    tpsim plan ...            memory, bytes and time of a real-size layout     (tpsim.plan.cli)
    tpsim schedule ...        a pipeline schedule as a time x rank grid        (tpsim.schedule_cli)
    tpsim --version           the installed version (package metadata, else ``tpsim.__version__``)

The programs that run on ranks are started with mpirun, not through this command: the demo
(``python -m tpsim.demo``) and greedy decoding (``python -m tpsim.generate``); ``tpsim --help`` names them.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib import metadata

import tpsim
from tpsim.mpi_library import exit_without_mpi

COMMANDS = {
    "plot": ("tpsim.trace.cli", "plot_main", "regenerate the figures of a run folder"),
    "report": ("tpsim.trace.cli", "report_main", "communication per module of a run folder "
                                                   "(--by kind: where the time goes)"),
    "lesson": ("tpsim.teach.cli", "lesson_main", "list, start (your own copy of the exercises) or run the lessons"),
    "check": ("tpsim.teach.cli", "check_main", "check your exercise against the reference on real ranks"),
    "plan": ("tpsim.plan.cli", "main", "plan a real-size run: memory, bytes and time per GPU (--search, --validate)"),
    "schedule": ("tpsim.schedule_cli", "main", "a pipeline schedule checked, timed and drawn as a time x rank grid"),
}
PROGRAMS = [  # run on ranks under mpirun: not subcommands of this one
    ("mpirun -n 8 python -m tpsim.demo", "the demo: TP x DP training, checked against the serial model"),
    ("mpirun -n 4 python -m tpsim.generate", "greedy decoding with TP and a KV cache (--init-from DIR)"),
]


def version() -> str:
    """The installed distribution's version; ``tpsim.__version__`` when tpsim runs from a plain checkout."""
    try:
        return metadata.version("tpsim")
    except metadata.PackageNotFoundError:
        return tpsim.__version__


def usage() -> str:
    lines = ["usage: tpsim COMMAND [ARGS]", "       tpsim --version", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "programs on MPI ranks (start them with mpirun):"]
    lines += [f"  {command}\n      {help_}" for command, help_ in PROGRAMS]
    lines += ["", "tpsim COMMAND --help for the command's own options"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"tpsim {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tpsim: error: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    try:
        with exit_without_mpi("tpsim"):  # no MPI library or mpiexec: one line naming the extras, exit status 2
            return int(getattr(importlib.import_module(module), func)(rest) or 0)
    except BrokenPipeError:  # `tpsim lesson list | head`: the reader has what it wanted, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's advice for SIGPIPE
        return 0


if __name__ == "__main__":
    sys.exit(main())
