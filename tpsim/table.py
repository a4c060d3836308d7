"""Rows of text cells as an aligned, fixed-width table: the one formatter behind every table tpsim prints.

    format_table([["op", "calls", "bytes"], RULE, ["all_reduce", "2", "64.0 KiB"]], title="per rank:")

    per rank:
    op          calls     bytes
    ----------  -----  --------
    all_reduce      2  64.0 KiB

Each column is as wide as its widest cell; text columns are left-aligned, numbers right-aligned (``right``
names the right-aligned columns; by default every column but the first). A ``RULE`` row draws dashes under
every column. Lines carry no trailing spaces. Pure text, no NumPy and no MPI.
"""

from __future__ import annotations

from typing import Collection, Sequence

RULE = None  # a row of dashes, as wide as each column


def column_widths(rows: Sequence[Sequence[str] | None]) -> list[int]:
    """The width of each column: its widest cell (``RULE`` rows do not count)."""
    cells = [row for row in rows if row is not RULE]
    return [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]


def format_table(rows: Sequence[Sequence[str] | None], *, right: Collection[int] | None = None,
                 sep: str | Sequence[str] = "  ", title: str = "") -> str:
    """``rows`` (lists of strings, or ``RULE``) as aligned lines, under ``title`` when one is given.

    ``right``: the indices of right-aligned columns (default: all but the first). ``sep``: the text between
    two columns, or one string per gap (len = columns − 1) where groups of columns stand further apart.
    """
    widths = column_widths(rows)
    right = range(1, len(widths)) if right is None else right
    gaps = [sep] * (len(widths) - 1) if isinstance(sep, str) else list(sep)

    def line(row: Sequence[str] | None) -> str:
        cells = ["-" * w for w in widths] if row is RULE else \
            [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "".join(c + g for c, g in zip(cells, gaps + [""])).rstrip()

    return "\n".join(([title] if title else []) + [line(row) for row in rows])


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover
