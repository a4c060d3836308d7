"""Turn a pile of collective records into the table a reader wants: who moved how many bytes, and when.

Records are plain dicts (``CommEvent.as_dict()``), possibly from every rank. ``summarize`` groups them by
any fields — by default (scope, phase, op, group) — and reports *per-rank averages*: the number of calls one
rank made and the bytes it saw, so a table from 8 ranks reads like the story of one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

from tpsim.table import RULE, format_table, human_bytes

DEFAULT_KEYS = ("scope", "phase", "op", "group")


@dataclass
class CommRow:
    key: tuple
    calls: float  # per rank
    bytes: float  # per rank, logical size of the collectives (see tpsim.cost)
    wire_bytes: float  # per rank, sent under the ring algorithm
    seconds: float  # per rank, wall time spent inside the calls


def summarize(records: Iterable[dict], keys: Sequence[str] = DEFAULT_KEYS, ranks: int | None = None) -> list[CommRow]:
    """Group ``records`` by ``keys``; totals divided by the number of ranks (counted from the records)."""
    records = list(records)
    if ranks is None:
        ranks = max(1, len({r["rank"] for r in records}))
    acc: dict[tuple, list[float]] = {}
    for r in records:
        key = tuple(r[k] for k in keys)
        a = acc.setdefault(key, [0.0, 0.0, 0.0, 0.0])
        a[0] += 1
        a[1] += r["bytes"]
        a[2] += r["wire_bytes"]
        a[3] += r["duration"]
    return [CommRow(k, a[0] / ranks, a[1] / ranks, a[2] / ranks, a[3] / ranks) for k, a in acc.items()]


def format_comm_table(rows: list[CommRow], keys: Sequence[str] = DEFAULT_KEYS, title: str = "") -> str:
    """A fixed-width text table with a total line; empty scopes print as ``(top level)``."""

    headers = [*keys, "calls", "bytes", "wire bytes", "time ms"]
    body = []
    for row in rows:
        cells = [("(top level)" if (k == "scope" and not v) else str(v)) for k, v in zip(keys, row.key)]
        calls = f"{row.calls:g}"
        body.append(cells + [calls, human_bytes(row.bytes), human_bytes(row.wire_bytes), f"{row.seconds * 1e3:.2f}"])
    total = ["total"] + [""] * (len(keys) - 1) + [f"{sum(r.calls for r in rows):g}",
                                                  human_bytes(sum(r.bytes for r in rows)),
                                                  human_bytes(sum(r.wire_bytes for r in rows)),
                                                  f"{sum(r.seconds for r in rows) * 1e3:.2f}"]
    return format_table([headers, RULE, *body, RULE, total], right=range(len(keys), len(headers)), title=title)


@lru_cache(maxsize=4096)  # a run has a few dozen scopes and every rank's every record asks (27 904 at 64 ranks)
def layer_of(scope: str) -> str:
    """The layer a scope belongs to: ``transformer.h.0.attn.c_proj`` → ``transformer.h.0.attn`` (a Llama's
    ``model.layers.0.self_attn.o_proj`` → ``model.layers.0.self_attn``),
    ``transformer.wte`` stays, ``ddp.bucket3`` → ``ddp``, ``""`` → ``(top level)``."""
    if not scope:
        return "(top level)"
    parts = scope.split(".")
    if parts[0] in ("transformer", "model"):  # GPT-2's and Llama's names: model.layers.0.mlp.down_proj
        if len(parts) >= 4 and parts[1] in ("h", "layers"):
            return ".".join(parts[:4])
        return ".".join(parts[:2])
    return parts[0]


def by_layer(records: Iterable[dict]) -> list[dict]:
    """Records with ``scope`` replaced by its layer (``layer_of``), for per-layer tables and figures."""
    return [dict(r, scope=layer_of(r["scope"])) for r in records]
