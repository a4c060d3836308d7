"""Trace records as files: gathered to rank 0, written and read back as JSON Lines.

``comm.jsonl`` holds one JSON object per collective call per rank, ``spans.jsonl`` one per compute span per
rank (``pandas.read_json(path, lines=True)`` loads either). Fields are documented in ``tpsim.trace.schema``:
``rank, step, phase, scope, op, reduce_op, group, group_size, group_ranks, dtype, shape, bytes, wire_bytes,
start, duration`` plus ``start_us``/``dur_us`` (microseconds since the common t0 taken after a barrier).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from tpsim.phases import TRACE
from tpsim.atomic import write_lines

if TYPE_CHECKING:  # only for the hints: reading a run folder (tpsim plot/report) must not start MPI
    from tpsim.comm import Group, Tracer


def _gather(rows: list[dict], tracer: Tracer, world: Group, root: int) -> list[dict] | None:
    # The gather itself is traced (phase "trace") *after* the caller's snapshot, so it is not in what it gathers.
    with tracer.region(scope="", phase=TRACE):
        per_rank = world.gather_objects(rows, root=root)
    if per_rank is None:
        return None
    return [row for rows_of_rank in per_rank for row in rows_of_rank]


def gather_records(tracer: Tracer, world: Group, root: int = 0) -> list[dict] | None:
    """Every rank's collective records as dicts, concatenated in rank order on ``root`` (``None`` elsewhere)."""
    return _gather([e.as_dict() for e in tracer.events], tracer, world, root)


def gather_spans(tracer: Tracer, world: Group, last_steps: int | None = 2, root: int = 0) -> list[dict] | None:
    """Every rank's compute spans of its ``last_steps`` highest steps (``None``: all), on ``root``.

    Spans are many (a dozen per layer per step, and the kind marks inside them), so a run keeps only the steps
    a timeline will show.
    """
    steps = sorted({s.step for s in tracer.spans})
    if last_steps is not None:
        steps = steps[max(0, len(steps) - last_steps):]
    keep = set(steps)
    return _gather([s.as_dict() for s in tracer.span_events() if s.step in keep], tracer, world, root)


def with_microseconds(rec: dict) -> dict:
    """``rec`` plus ``start_us``/``dur_us`` (rounded to the nanosecond) when it has ``start``/``duration``."""
    if "start" not in rec:
        return rec
    return dict(rec, start_us=round(rec["start"] * 1e6, 3), dur_us=round(rec["duration"] * 1e6, 3))


def write_jsonl(records: list[dict], path: str | Path) -> Path:
    """One JSON object per line; timed records get ``start_us``/``dur_us`` beside ``start``/``duration``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_lines(path, (json.dumps(with_microseconds(rec)) for rec in records))


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of a ``.jsonl`` file; a line that is not a JSON object raises ``ValueError`` naming it."""
    path = Path(path)
    rows = []
    with path.open() as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} line {number}: not JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path} line {number}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def grid_of(records: list[dict]) -> dict[int, tuple[int, ...]]:
    """``{rank: (tp_rank, dp_rank)}`` read off the records' group memberships (ranks never seen in a TP or DP
    collective are left out); ``(tp_rank, dp_rank, pp_rank)`` for a rank seen in a pipeline group of size > 1."""
    coords: dict[int, list[int | None]] = {}
    for r in records:
        c = coords.setdefault(r["rank"], [None, None, None])
        for i, name in enumerate(("tp", "dp", "pp")):
            if c[i] is None and r["group"] == name and r["rank"] in r["group_ranks"] and (i < 2 or r["group_size"] > 1):
                c[i] = r["group_ranks"].index(r["rank"])
    return {rank: tuple(c[:2]) if c[2] is None else tuple(c) for rank, c in coords.items() if None not in c[:2]}


def grid_sizes(records: list[dict]) -> tuple[int, int] | None:
    """``(tp, dp)`` of the run that wrote ``records``, or ``None`` if they do not say."""
    sizes = {}
    for r in records:
        if r["group"] in ("tp", "dp"):
            sizes.setdefault(r["group"], r["group_size"])
    return (sizes["tp"], sizes["dp"]) if len(sizes) == 2 else None


def pipeline_size(records: list[dict]) -> int:
    """The number of pipeline stages of the run that wrote ``records`` (1 when no pipeline group shows)."""
    return max((r["group_size"] for r in records if r["group"] == "pp"), default=1)
