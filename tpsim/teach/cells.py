"""A lesson's cells, read from its jupytext "percent" script, and the notebook JSON they make.

The format, as the lessons use it (no jupytext needed to read it):

    # %% [markdown]          starts a prose cell: each line is "# text" (or a lone "#" for a blank line)
    # # Lesson 02 — ...
    # %%                     starts a code cell (anything after "# %%" other than "[markdown]" is a title)
    RANKS = 2

A cell runs to the next ``# %%`` line; blank lines at either end of a cell are dropped. Lines before the first
marker form a code cell when they hold anything. ``Cell.line`` is the file line of a cell's first source line,
so code run cell by cell still reports the script's own line numbers.

The notebook side writes nbformat 4.5 JSON by hand (a few dictionaries), so ``tpsim lesson notebook`` needs no
Jupyter package to write a notebook, only to run one. Pure text, no MPI.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path

MARKER = re.compile(r"^# %%(?P<rest>.*)$")
MARKDOWN = re.compile(r"^\s*\[markdown\]")
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


@dataclass(frozen=True)
class Cell:
    kind: str  # "code" or "markdown"
    source: str  # without the "# " of prose lines
    line: int  # 1-based line in the script of the first source line


def _uncomment(line: str) -> str:
    """``# text`` -> ``text``, ``#`` -> ``""`` (a prose line of a percent script)."""
    if line.startswith("# "):
        return line[2:]
    return line[1:] if line.startswith("#") else line


def _make(kind: str, lines: list[str], first: int) -> Cell | None:
    if kind == "markdown":
        lines = [_uncomment(line) for line in lines]
    start, end = 0, len(lines)
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return Cell(kind, "\n".join(lines[start:end]), first + start) if end > start else None


def parse_cells(text: str) -> list[Cell]:
    """The cells of a percent script's text, in order (empty cells dropped)."""
    cells: list[Cell | None] = []
    kind, lines, first = "code", [], 1
    for number, line in enumerate(text.splitlines(), start=1):
        marker = MARKER.match(line)
        if marker is None:
            lines.append(line)
            continue
        cells.append(_make(kind, lines, first))
        kind = "markdown" if MARKDOWN.match(marker.group("rest")) else "code"
        lines, first = [], number + 1
    cells.append(_make(kind, lines, first))
    return [cell for cell in cells if cell is not None]


def read_cells(path: str | Path) -> list[Cell]:
    return parse_cells(Path(path).read_text(encoding="utf-8"))


# --- nbformat 4.5 JSON ------------------------------------------------------------------------------------------
def _lines(text: str) -> list[str]:
    """Notebook JSON stores multi-line text as a list of lines, each but the last ending in a newline."""
    return text.splitlines(keepends=True)


def markdown_cell(source: str) -> dict:
    return {"cell_type": "markdown", "id": uuid.uuid4().hex[:8], "metadata": {}, "source": _lines(source)}


def code_cell(source: str, outputs: list[dict] | None = None) -> dict:
    return {"cell_type": "code", "id": uuid.uuid4().hex[:8], "metadata": {}, "execution_count": None,
            "outputs": outputs or [], "source": _lines(source)}


def stream_output(text: str, name: str = "stdout") -> dict:
    return {"output_type": "stream", "name": name, "text": _lines(text)}


def html_output(html: str, plain: str) -> dict:
    return {"output_type": "display_data", "metadata": {}, "data": {"text/html": _lines(html), "text/plain": plain}}


def notebook(cells: list[dict], title: str) -> dict:
    """A whole notebook (Python 3 kernel) holding ``cells``."""
    return {"nbformat": 4, "nbformat_minor": 5, "cells": cells,
            "metadata": {"kernelspec": KERNELSPEC, "title": title,
                         "language_info": {"name": "python", "pygments_lexer": "ipython3"}}}


def as_notebook_cells(cells: list[Cell], code_prefix: str = "") -> list[dict]:
    """Prose as markdown cells, code as code cells (each opening with ``code_prefix``, e.g. ``"%%px\\n"``)."""
    return [markdown_cell(c.source) if c.kind == "markdown" else code_cell(code_prefix + c.source) for c in cells]
