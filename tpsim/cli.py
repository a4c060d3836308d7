"""The ``tpsim`` command: a thin dispatcher to the tools that live beside the code they serve.

    tpsim plot RUN_DIR        regenerate a run's figures                       (tpsim.trace.cli)
    tpsim report RUN_DIR      per-module communication table of a run          (tpsim.trace.cli)
    tpsim lesson list|run NN  the guided lessons                               (tpsim.teach.cli)
    tpsim check NN [FILE]     check an exercise against the reference          (tpsim.teach.cli)
    tpsim plan ...            memory, bytes and time of a real-size layout     (tpsim.plan.cli)
"""

from __future__ import annotations

import importlib
import sys

from tpsim.mpi_library import exit_without_mpi

COMMANDS = {
    "plot": ("tpsim.trace.cli", "plot_main", "regenerate the figures of a run folder"),
    "report": ("tpsim.trace.cli", "report_main", "print the per-module communication table of a run folder "
                                                   "(--by kind: where each layer's time goes)"),
    "lesson": ("tpsim.teach.cli", "lesson_main", "list or run the guided lessons"),
    "check": ("tpsim.teach.cli", "check_main", "check your exercise against the reference on real ranks"),
    "plan": ("tpsim.plan.cli", "main", "plan a real-size run: memory, bytes and time per GPU (--search, --validate)"),
}


def usage() -> str:
    lines = ["usage: tpsim COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "tpsim COMMAND --help for the command's own options"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tpsim: error: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    with exit_without_mpi("tpsim"):  # no MPI library or mpiexec: one line naming the extras, exit status 2
        return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
