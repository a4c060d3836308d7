"""What every lesson script shares: the rank check, ``CHECK`` lines, printing on rank 0, figures in ``--out``.

    RANKS = 4
    lesson = Lesson("03", RANKS)        # another world size: one line on rank 0, exit status 2 on every rank
    lesson.say("printed once, by rank 0")
    lesson.section("Row-parallel: each rank owns some input features")   # a markdown cell's ## heading
    lesson.expect("the partial sums add up to the serial output, to rounding")   # the line before a CHECK
    lesson.close("max |parallel − serial| of y", y, y_serial)     # CHECK ...: 2.2e-16 (tolerance 1e-12) ... OK
    lesson.equal("all-reduces in the forward", n_calls, 1)        # CHECK ...: 1 (expected 1) ... OK
    lesson.check("a claim", "what was measured", ok)              # the general form
    if lesson.rank == 0:
        plt = lesson.pyplot(); ...; lesson.save(fig, "03_collectives.png")
    lesson.takeaways()                  # the "What to take away" cell's heading and text, read from the file
    lesson.finish()                     # "lesson 03: 9 checks, all OK"; exit status 1 if any CHECK failed

Every CHECK is collective. Its verdict is combined over all ranks with one all-reduce on a private, untraced
world group (``tpsim.comm.agree.Agreement``), so the lesson's own traced collectives stay exactly the ones it
teaches about, every rank agrees on every verdict, and every rank exits with the same status.

A lesson is a script with cells at the top level, not a ``main()``: an uncaught exception on one rank would
leave the others waiting in their next collective forever. ``Lesson`` therefore installs a ``sys.excepthook``
that hands the exception to ``run_main``, which ends the job the way every tpsim entry point does: a
``ConfigError`` (the wrong world size) prints one line on rank 0 and exits 2 everywhere, anything else prints
its traceback and aborts the whole job.

Notebook mode (``tpsim lesson notebook NN``: the cells run as ``%%px`` on ipyparallel's MPI engines): inside an
IPython kernel ``Lesson`` installs no excepthook (an engine shows a cell's exception itself; an abort would end
the cluster), ``save`` also displays the figure inline, and a failed ``finish`` raises ``LessonFailed``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tpsim.comm.agree import Agreement
from tpsim.comm.launch import install_signal_handlers, run_main, world_rank, world_size
from tpsim.compare import max_abs_diff, shard_error  # noqa: F401 (shard_error: what lessons compare shards with)
from tpsim.errors import ConfigError
from tpsim.options import RankZeroParser
from tpsim.plotting import pyplot
from tpsim.table import format_table as table  # noqa: F401 (the lessons' name for the one table formatter)
from tpsim.teach.lessons import DEFAULT_OUT, LessonsNotFound, find_lesson, normalize
from tpsim.teach.notebook import in_kernel, show_inline
from tpsim.atomic import save_figure
from tpsim.paths import check_output_dir


def markdown_section(path: Path, title: str) -> list[str]:
    """The text of the markdown cell headed ``## title`` in a lesson file, ``# `` prefixes removed, heading dropped."""
    lines, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if inside and line.startswith("# %%"):
            break
        if inside:
            lines.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
        inside = inside or line == f"# ## {title}"
    return "\n".join(lines).strip().splitlines()


def _script_name(number: str) -> str:
    try:
        return find_lesson(number).path.name
    except (LessonsNotFound, ValueError):
        return f"{number}_*.py"


class LessonFailed(AssertionError):
    """A CHECK failed in a lesson run as a notebook, where ``finish`` cannot end the process."""


class Lesson:
    """One run of lesson ``number`` on ``ranks`` ranks; see the module docstring for the calls."""

    def __init__(self, number: str | int, ranks: int, argv: list[str] | None = None) -> None:
        self.number, self.ranks = normalize(number), int(ranks)
        self.script = _script_name(self.number)
        self.notebook = in_kernel()  # notebook mode (issue 11): ipyparallel engines, see tpsim.teach.notebook
        if not self.notebook:  # an engine reports its own exceptions; aborting would take the cluster down
            sys.excepthook = self._fail_loud  # before anything can raise
            install_signal_handlers(f"lessons/{self.script}")
        parser = RankZeroParser(prog=f"lessons/{self.script}")  # --help once; a bad flag: one line, exit 2
        parser.add_argument("--out", default=DEFAULT_OUT, help=f"folder for figures (default {DEFAULT_OUT}/)")
        args, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)  # a notebook adds its own
        self.out = Path(check_output_dir(args.out, "--out"))  # before any work: one line, exit 2
        self.rank, self.world_size = world_rank(), world_size()
        if self.world_size != self.ranks:  # the same on every rank, before any collective
            raise ConfigError(f"lesson {self.number} needs {self.ranks} rank{'s' if self.ranks > 1 else ''}: "
                              f"mpirun -n {self.ranks} python lessons/{self.script} "
                              f"(this run has {self.world_size})")
        self._agree = Agreement()  # untraced: CHECK verdicts never show up in a lesson's trace
        self.results: list[bool] = []

    def _fail_loud(self, exc_type, exc, tb) -> None:
        def reraise():
            raise exc.with_traceback(tb)

        run_main(reraise, prog=f"lessons/{self.script}")

    # --- output -----------------------------------------------------------------------------------------------
    def say(self, *lines: str) -> None:
        """Print on rank 0 only, one whole write (lines of several ranks never interleave)."""
        if self.rank == 0:
            print("\n".join(lines), flush=True)

    def section(self, title: str) -> None:
        """Print the ``## title`` heading of the markdown cell above, so a terminal run has the lesson's outline.

        ``tests/test_lesson_outline.py`` holds every lesson to printing each of its ``## `` headings, in order.
        """
        self.say("", f"## {title}")

    def takeaways(self) -> None:
        """The ``What to take away`` section: its heading and, read from this lesson's file, its text."""
        self.section("What to take away")
        try:
            self.say(*markdown_section(find_lesson(self.number).path, "What to take away"))
        except (LessonsNotFound, OSError):  # a copy of the lesson run outside the repository: the heading only
            pass

    def expect(self, text: str) -> None:
        """One line before a CHECK: what it should show and why, for a reader who has only the terminal."""
        self.say(f"expect: {text}")

    def gather(self, obj) -> list | None:
        """Every rank's ``obj`` in rank order on rank 0 (``None`` elsewhere); untraced."""
        return self._agree.gather(obj)

    def pyplot(self):
        """matplotlib.pyplot with the Agg backend (``tpsim.plotting.pyplot``), imported on the calling rank only."""
        return pyplot()

    def save(self, fig, name: str) -> Path:
        """Write ``fig`` as ``--out/name`` (rank 0 only) and say where."""
        if self.rank != 0:
            raise RuntimeError("only rank 0 writes figures")
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / name
        save_figure(fig, path, dpi=120)
        pyplot().close(fig)
        self.say(f"wrote {path}")
        if self.notebook:  # notebook mode: the figure shows in the cell too
            show_inline(path)
        return path

    # --- checks -----------------------------------------------------------------------------------------------
    def _verdict(self, claim: str, shown: str, ok: bool) -> bool:
        self.results.append(ok)
        self.say(f"CHECK {claim}: {shown} ... {'OK' if ok else 'FAILED'}")
        return ok

    def check(self, claim: str, shown: str, ok: bool) -> bool:
        """``CHECK claim: shown ... OK`` when ``ok`` holds on every rank; ``shown`` is rank 0's."""
        everywhere = self._agree.all_true(ok)
        if ok and not everywhere:
            shown += " (but not on every rank)"
        return self._verdict(claim, shown, everywhere)

    def close(self, claim: str, got, expected, tol: float = 1e-12) -> float:
        """Claim ``got`` equals ``expected`` within ``tol`` (absolute) on every rank; returns the worst difference."""
        worst = float(self._agree.reduce([max_abs_diff(got, expected)], op="max")[0])
        self._verdict(claim, f"{worst:.1e} (tolerance {tol:g})", worst <= tol)
        return worst

    def apart(self, claim: str, a, b, at_least: float) -> float:
        """Claim ``a`` and ``b`` differ by at least ``at_least`` somewhere, on every rank (a wrong way is wrong)."""
        least = float(self._agree.reduce([max_abs_diff(a, b)], op="min")[0])
        self._verdict(claim, f"max |difference| {least:.3g} (at least {at_least:g})", least >= at_least)
        return least

    def equal(self, claim: str, got, expected) -> bool:
        """Claim ``got == expected`` (numbers, strings, tuples or arrays) on every rank."""
        same = bool(np.array_equal(got, expected)) if isinstance(got, np.ndarray) else bool(got == expected)
        return self.check(claim, f"{got}" if same else f"{got} (expected {expected})", same)

    def finish(self) -> None:
        """The summary line; exit status 1 on every rank if any CHECK failed (the verdicts are world-wide).
        In a notebook it raises ``LessonFailed`` on every rank instead."""
        failed = self.results.count(False)
        verdict = "all OK" if not failed else f"{failed} FAILED"
        self.say(f"lesson {self.number}: {len(self.results)} checks, {verdict}")
        if failed and self.notebook:  # notebook mode: an exit would end the engine, not the run
            raise LessonFailed(f"lesson {self.number}: {failed} of {len(self.results)} checks FAILED")
        if failed:
            sys.exit(1)
