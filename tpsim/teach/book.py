"""``tpsim lesson book``: every lesson as a static HTML page — prose, code, a real run's output, its figures.

How a page is made, and why this way:

1. the lesson runs under ``mpiexec -n RANKS`` through ``tpsim.teach.run_cells``, which is the script run that
   ``tpsim lesson run`` and CI do, with a marker line before each code cell and one per figure the cell wrote;
2. the output is split at the markers and put under its cell, in a notebook made of the lesson's own cells
   (tpsim.teach.cells); a figure becomes an ``<img>`` of the PNG, which the run wrote next to the page;
3. nbconvert's HTML exporter (the Jupyter project's own, well kept) renders that notebook to one page, and
   ``index.html`` lists the lessons with their titles, rank counts, CHECK counts and figures.

Running each lesson as a notebook on ipyparallel engines and exporting that would also work, but it would
start a controller and RANKS engines per page (seconds each, 8 engines for lesson 08 on a 2-core CI machine),
prefix every output with ``[stdout:0]``, and show a run that is not the one CI checks. Here the book shows
exactly what ``mpirun`` prints, and nbconvert only renders. Building every lesson takes about a minute.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from tpsim.launcher import launch
from tpsim.teach.cells import html_output, stream_output
from tpsim.teach.course import stop
from tpsim.teach.lessons import LessonInfo, exercise_files, lesson_of, read_checks
from tpsim.teach.notebook import plain_notebook
from tpsim.teach.run_cells import split_output
from tpsim.atomic import write_text

DEFAULT_BOOK = "tpsim-out/book"
RUN_TIMEOUT = 300.0


@dataclass
class Page:
    info: LessonInfo
    html: Path
    returncode: int
    checks: list[tuple[str, bool]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.checks) and all(ok for _, ok in self.checks)


def run_lesson_cells(info: LessonInfo, out: Path, timeout: float = RUN_TIMEOUT):
    """Run the lesson cell by cell on its ranks in ``out`` (its figures land there, and its output names them as
    a reader of the page finds them); the ``Launch`` (stdout + stderr merged)."""
    args = ["-m", "tpsim.teach.run_cells", str(info.path.resolve()), "--out", "."]
    return launch(info.ranks, args, timeout=timeout, merge_stderr=True, cwd=out)


def filled_notebook(info: LessonInfo, output: str) -> tuple[dict, list[str]]:
    """The lesson's notebook with each code cell's share of ``output`` and ``<img>`` outputs for its figures."""
    nb = plain_notebook(info)
    code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
    texts, figures = split_output(output, len(code))
    for cell, text, names in zip(code, texts, figures):
        cell["outputs"] = ([stream_output(text + "\n")] if text else []) + [
            html_output(f'<img src="{html.escape(name)}" alt="{html.escape(name)}">', name) for name in names]
    back = {"cell_type": "markdown", "id": "tpsim-nav", "metadata": {},
            "source": ["[← all lessons](index.html)"]}
    nb["cells"].insert(0, back)
    return nb, [name for names in figures for name in names]


def render(nb: dict) -> str:
    """One HTML page from notebook JSON (nbconvert; input and output prompts left out, as in a book)."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nbformat.reads(json.dumps(nb), as_version=4))
    return body


def build_page(info: LessonInfo, out: Path, timeout: float = RUN_TIMEOUT) -> Page:
    run = run_lesson_cells(info, out, timeout)
    nb, figures = filled_notebook(info, run.stdout)
    page = out / f"{info.path.stem}.html"
    write_text(page, render(nb))
    return Page(info, page, run.returncode, read_checks(run.stdout), figures, run.seconds)


INDEX = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tpsim — the lessons</title>
<style>body {{font-family: sans-serif; max-width: 60em; margin: 2em auto}} td, th {{padding: .3em .8em;
text-align: left}} tr:nth-child(even) {{background: #f4f4f4}} .failed {{color: #b00}}</style></head>
<body><h1>tpsim — tensor parallelism, lesson by lesson</h1>
<p>Each page is a lesson: its prose, its code, and what a real run on its MPI ranks printed and drew.
Run one yourself with <code>tpsim lesson run NN</code>, or open it as a notebook with
<code>tpsim lesson notebook NN</code>.</p>
<table><tr><th>lesson</th><th>title</th><th>needs first</th><th>exercises</th><th>what it checks</th><th>ranks</th>
<th>run</th><th>checks</th><th>figures</th></tr>
{rows}
</table></body></html>
"""


def index_row(page: Page, exercises: list[str]) -> str:
    passed = sum(ok for _, ok in page.checks)
    checks = f"{passed} of {len(page.checks)} OK" if page.ok else \
        f'<span class="failed">{passed} of {len(page.checks)} OK, exit status {page.returncode}</span>'
    place = stop(page.info.number)
    needs = ", ".join(place.needs) or "—" if place else "?"
    cells = [page.info.number, f'<a href="{page.html.name}">{html.escape(page.info.title)}</a>', needs,
             ", ".join(exercises) or "—", html.escape(place.checks) if place else "", str(page.info.ranks),
             f"{page.seconds:.0f} s", checks, str(len(page.figures))]
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def build_book(lessons: list[LessonInfo], out: str | Path = DEFAULT_BOOK, timeout: float = RUN_TIMEOUT,
               progress=None) -> list[Page]:
    """A page per lesson and ``index.html`` in ``out``; ``progress(page)`` is called after each page."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pages = []
    for info in lessons:
        pages.append(build_page(info, out, timeout))
        if progress is not None:
            progress(pages[-1])
    exercises = exercise_files()
    rows = [index_row(p, [n for n in exercises if lesson_of(n) == p.info.number]) for p in pages]
    write_text(out / "index.html", INDEX.format(rows="\n".join(rows)))
    return pages
