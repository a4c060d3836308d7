"""``tpsim lesson notebook NN|all [--out DIR]`` and ``tpsim lesson book [NN ...] [--out DIR]``.

``notebook`` writes ``.ipynb`` files (tpsim.teach.notebook) and needs no Jupyter package; ``book`` runs every
lesson under mpiexec and renders the pages with nbconvert (tpsim.teach.book), so it needs the ``notebooks``
extra and says so when it is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from tpsim.teach.lessons import LessonInfo, discover, find_lesson
from tpsim.options import positive

EXTRA = 'pip install -e ".[notebooks]"'


def add_notebook_commands(sub) -> None:
    """The two subcommands, added to ``tpsim lesson``'s subparsers."""
    from tpsim.teach.book import DEFAULT_BOOK, RUN_TIMEOUT
    from tpsim.teach.notebook import DEFAULT_NOTEBOOKS

    nb = sub.add_parser("notebook", help="write lessons as Jupyter notebooks that run on their ranks (%%%%px cells)",
                        description="Write lesson NN as a notebook whose code cells run on the lesson's rank "
                                    "count as ipyparallel MPI engines. Opening it needs Jupyter and the "
                                    f"notebooks extra: {EXTRA}")
    nb.add_argument("numbers", nargs="+", metavar="NN", help="lesson numbers, or all")
    nb.add_argument("--out", default=DEFAULT_NOTEBOOKS, help=f"folder for the .ipynb files (default "
                                                             f"{DEFAULT_NOTEBOOKS}/)")
    book = sub.add_parser("book", help="render the lessons, with a real run's output and figures, to HTML",
                          description=f"Run every lesson (or those named) and write an HTML page per lesson "
                                      f"plus index.html. Needs the notebooks extra: {EXTRA}")
    book.add_argument("numbers", nargs="*", metavar="NN", help="lesson numbers (default: all)")
    book.add_argument("--out", default=DEFAULT_BOOK, help=f"folder for the pages (default {DEFAULT_BOOK}/)")
    book.add_argument("--timeout", type=positive, default=RUN_TIMEOUT, help="seconds before one lesson's run is "
                                                                          "stopped")


def selected(numbers: list[str]) -> list[LessonInfo]:
    """Every lesson for ``[]`` or ``["all"]``, else the ones named."""
    return discover() if not numbers or numbers == ["all"] else [find_lesson(n) for n in numbers]


def notebook_command(args: argparse.Namespace) -> int:
    from tpsim.teach.notebook import write_notebook

    for info in selected(args.numbers):
        print(f"wrote {write_notebook(info, args.out)}  (lesson {info.number}, {info.ranks} "
              f"rank{'s' if info.ranks > 1 else ''})")
    return 0


def book_command(args: argparse.Namespace) -> int:
    missing = [name for name in ("nbformat", "nbconvert") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"tpsim lesson book: error: needs {' and '.join(missing)}: {EXTRA}", file=sys.stderr)
        return 2
    from tpsim.teach.book import build_book

    def progress(page) -> None:
        verdict = "all OK" if page.ok else f"FAILED (exit status {page.returncode})"
        print(f"wrote {page.html}  ({len(page.checks)} checks {verdict}, {len(page.figures)} figures, "
              f"{page.seconds:.1f} s)", flush=True)

    pages = build_book(selected(args.numbers), args.out, args.timeout, progress)
    print(f"wrote {args.out}/index.html  ({len(pages)} lesson{'s' if len(pages) != 1 else ''})")
    return 0 if all(page.ok for page in pages) else 1


NOTEBOOK_COMMANDS = {"notebook": notebook_command, "book": book_command}
