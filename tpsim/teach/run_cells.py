"""Run a lesson cell by cell on every rank, marking where each cell's output starts (what the book reads).

    mpiexec -n 4 python -m tpsim.teach.run_cells lessons/03_column_row_parallel.py --out DIR

The same run as ``mpirun -n 4 python lessons/03_...py --out DIR`` — one namespace, the cells in order, the
lesson's own ``--out`` — except that rank 0 prints a marker line before each code cell, and after it one line
per image the cell wrote into ``--out``. ``split_output`` turns the captured output back into one text and one
list of figures per cell. Each cell is compiled with the script's own line numbers, so a traceback points into
the lesson file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tpsim.teach.cells import read_cells
from tpsim.teach.lessons import DEFAULT_OUT
from tpsim.options import OneLineParser

CELL_MARK = "::tpsim-cell:: {index}"  # printable: str.splitlines() would split at a control character
FIGURE_MARK = "::tpsim-figure:: {name}"
MARK = re.compile(r"^::tpsim-(cell|figure):: (.+)$")
IMAGES = ("*.png", "*.svg", "*.jpg")


def _images(folder: Path) -> dict[str, int]:
    """Image files in ``folder`` with their modification times (ns)."""
    return {p.name: p.stat().st_mtime_ns for pattern in IMAGES for p in folder.glob(pattern)}


def run_cells(script: Path, out: Path, rank: int) -> None:
    namespace = {"__name__": "__main__", "__file__": str(script)}
    for index, cell in enumerate(c for c in read_cells(script) if c.kind == "code"):
        before = _images(out) if rank == 0 else {}
        if rank == 0:
            print(CELL_MARK.format(index=index), flush=True)
        code = compile("\n" * (cell.line - 1) + cell.source + "\n", str(script), "exec")
        exec(code, namespace)  # noqa: S102 — the lesson's own cell, as `python lessons/NN_*.py` would run it
        sys.stdout.flush()
        if rank == 0:
            after = _images(out)
            for name in sorted(n for n in after if before.get(n) != after[n]):
                print(FIGURE_MARK.format(name=name), flush=True)


def split_output(text: str, cells: int) -> tuple[list[str], list[list[str]]]:
    """``(text of each code cell, figure names of each code cell)`` from ``run_cells``' output; anything before
    the first marker (a start-up warning) goes with the first cell."""
    texts: list[list[str]] = [[] for _ in range(max(cells, 1))]
    figures: list[list[str]] = [[] for _ in range(max(cells, 1))]
    current = 0
    for line in text.splitlines():
        mark = MARK.match(line)
        if mark is None:
            texts[current].append(line)
        elif mark.group(1) == "cell":
            current = min(int(mark.group(2)), len(texts) - 1)
        else:
            figures[current].append(mark.group(2))
    return ["\n".join(lines).strip("\n") for lines in texts], figures


def main(argv: list[str] | None = None) -> None:
    from tpsim.comm.launch import run_main, world_rank

    parser = OneLineParser(prog="python -m tpsim.teach.run_cells")
    parser.add_argument("script", type=Path)
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_OUT))
    args, _ = parser.parse_known_args(argv)
    sys.argv = [str(args.script), *(sys.argv[2:] if argv is None else argv[1:])]  # what the lesson parses
    args.out.mkdir(parents=True, exist_ok=True)
    run_main(lambda: run_cells(args.script, args.out, world_rank()), prog=f"lessons/{args.script.name}")


if __name__ == "__main__":
    main()
