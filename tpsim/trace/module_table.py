"""Communication per module, as a tree — PyTorch's CommDebugMode, with bytes.

    module                 forward: calls bytes wire ms | backward: ... | other phases: ...
    transformer
      wte                     1  64.0 KiB  96.0 KiB  2.20
      h.0
        attn
          c_proj              1  64.0 KiB  96.0 KiB  2.40
    ...
    total

A node's numbers include its whole subtree (``h.0`` = everything its attention and MLP moved), so a reader
can stop at any depth. List indices stay with their list (``h.0``, not ``h`` → ``0``). Numbers are per-rank
averages over the ranks in the records (``rank=`` picks one rank instead), like the demo's tables.
"""

from __future__ import annotations

from typing import Iterable

from tpsim.phases import PASSES
from tpsim.table import column_widths, format_table
from tpsim.trace.aggregate import layer_of
from tpsim.table import human_bytes

COLUMN_PHASES = PASSES  # forward and backward have their own columns; every other phase goes under "other"
BY = ("module", "layer", "op")


def scope_parts(scope: str) -> list[str]:
    """``transformer.h.0.attn.c_proj`` → ``['transformer', 'h.0', 'attn', 'c_proj']``; ``''`` → ``[]``."""
    parts: list[str] = []
    for p in scope.split(".") if scope else []:
        if p.isdigit() and parts:
            parts[-1] += "." + p
        else:
            parts.append(p)
    return parts


def _column(phase: str) -> int:
    return COLUMN_PHASES.index(phase) if phase in COLUMN_PHASES else len(COLUMN_PHASES)


class _Node:
    __slots__ = ("name", "children", "totals", "phases")

    def __init__(self, name: str) -> None:
        self.name = name
        self.children: dict[str, _Node] = {}
        self.totals = [[0.0, 0.0, 0.0, 0.0] for _ in range(len(COLUMN_PHASES) + 1)]  # calls, bytes, wire, s
        self.phases: set[str] = set()

    def add(self, rec: dict) -> None:
        t = self.totals[_column(rec["phase"])]
        t[0] += 1
        t[1] += rec["bytes"]
        t[2] += rec["wire_bytes"]
        t[3] += rec["duration"]
        self.phases.add(rec["phase"])


def _rows_of(records: list[dict], by: str) -> list[tuple[int, _Node]]:
    """(depth, node) in display order: first-call order, children under their parent."""
    root = _Node("")
    for rec in records:
        if by == "module":
            path = scope_parts(rec["scope"]) or ["(top level)"]
        elif by == "layer":
            path = [layer_of(rec["scope"])]
        else:
            path = [f"{rec['op']} ({rec['group']})"]
        node = root
        node.add(rec)
        for part in path:
            node = node.children.setdefault(part, _Node(part))
            node.add(rec)
    rows: list[tuple[int, _Node]] = []

    def walk(node: _Node, depth: int) -> None:
        for child in node.children.values():
            rows.append((depth, child))
            walk(child, depth + 1)

    walk(root, 0)
    return [(-1, root)] + rows


def module_table(records: Iterable[dict], by: str = "module", rank: int | None = None, title: str = "") -> str:
    """The table as text; ``records`` are one step's (any phases). Every number is per rank."""
    if by not in BY:
        raise ValueError(f"by must be one of {BY}, got {by!r}")
    records = [r for r in records if rank is None or r["rank"] == rank]
    ranks = max(1, len({r["rank"] for r in records}))
    rows = _rows_of(records, by)
    groups = [*COLUMN_PHASES, "other phases"]
    labels, cells = [], []
    for depth, node in rows[1:] + rows[:1]:  # the root is the total, printed last
        if depth < 0:
            label = "total"
        else:
            label = "  " * depth + node.name
            single = next(iter(node.phases)) if len(node.phases) == 1 else None
            if by == "module" and depth == 0 and single not in (None, *COLUMN_PHASES):
                label += f" [{single}]"  # e.g. "ddp [dp_sync]": which phase the "other" column means here
        labels.append(label)
        line = []
        for calls, nbytes, wire, seconds in node.totals:
            if calls == 0:
                line += ["", "", "", ""]
            else:
                line += [f"{calls / ranks:g}", human_bytes(nbytes / ranks), human_bytes(wire / ranks),
                         f"{seconds / ranks * 1e3:.2f}"]
        cells.append(line)

    head = {"module": "module", "layer": "layer", "op": "op (group)"}[by]
    out = [title] if title else []
    # forward and backward side by side, the other phases in a table of their own below: ~100 columns
    out += _phase_block(head, labels, cells, groups[:2], 0)
    if any(line[8:] != ["", "", "", ""] for line in cells[:-1]):
        out += [""] + _phase_block(head, labels, cells, groups[2:], 2)
    who = f"on rank {rank}" if rank is not None else f"per rank (average over {ranks} ranks)"
    calls, nbytes, wire = (sum(t[i] for t in rows[0][1].totals) for i in range(3))
    out.append(f"all phases: {calls / ranks:g} calls, {nbytes / ranks:,.0f} bytes, {wire / ranks:,.0f} wire bytes "
               f"{who};\nbytes = logical tensor size, wire = ring algorithm")
    return "\n".join(out)


def _phase_block(head: str, labels: list[str], cells: list[list[str]], groups: list[str], first: int) -> list[str]:
    """The lines of one table: ``groups`` (4 columns each, from group index ``first``), the rows that have any."""
    sub = ["calls", "bytes", "wire", "ms"]
    keep = [(label, line[4 * first:4 * (first + len(groups))]) for label, line in zip(labels, cells)]
    keep = [(label, line) for i, (label, line) in enumerate(keep) if any(line) or i == len(keep) - 1]
    text = [[head, *sub * len(groups)], *([label, *line] for label, line in keep)]
    # two spaces inside a phase's four columns, three between phases
    gaps = ["  "] + ["   " if i % 4 == 3 else "  " for i in range(len(sub) * len(groups) - 1)]
    lines = format_table(text, sep=gaps).split("\n")
    widths = column_widths(text)
    top = " " * widths[0] + "  " + "   ".join(f" {g} ".center(sum(widths[1 + 4 * i:5 + 4 * i]) + 6, "-")
                                             for i, g in enumerate(groups))
    rule = "-" * max(map(len, lines))
    return [top.rstrip(), lines[0], rule, *lines[1:-1], rule, lines[-1]]
