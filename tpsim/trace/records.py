"""Collective records as files: gathered to rank 0 and written as JSON Lines.

``comm.jsonl`` holds one JSON object per collective call per rank (``pandas.read_json(path, lines=True)``
loads it). Fields: ``rank, step, phase, scope, op, reduce_op, group, group_size, group_ranks, dtype, shape,
bytes, wire_bytes, start, duration`` plus ``start_us``/``dur_us`` (microseconds since the common t0 taken
after a barrier, for timelines).
"""

from __future__ import annotations

import json
from pathlib import Path

from tpsim.comm import Group, Tracer


def gather_records(tracer: Tracer, world: Group, root: int = 0) -> list[dict] | None:
    """Every rank's records as dicts, concatenated in rank order on ``root`` (``None`` elsewhere).

    The gather itself is traced (phase "trace") *after* the snapshot, so it does not appear in what it gathers.
    """
    mine = [e.as_dict() for e in tracer.events]
    with tracer.region(scope="", phase="trace"):
        per_rank = world.gather_objects(mine, root=root)
    if per_rank is None:
        return None
    return [rec for recs in per_rank for rec in recs]


def write_jsonl(records: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for rec in records:
            row = dict(rec, start_us=round(rec["start"] * 1e6, 3), dur_us=round(rec["duration"] * 1e6, 3))
            fh.write(json.dumps(row) + "\n")
    return path
