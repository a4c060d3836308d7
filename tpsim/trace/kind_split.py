"""Where a step's time goes, per layer: matmul, elementwise, softmax/norm, communication (waiting apart from
moving bytes) and the rest — ``tpsim report DIR --by kind``. Reads records, needs no MPI.

Each rank's spans (``spans.jsonl``: the layers' spans and the ``tpsim.kinds`` marks inside them) and its
collectives (``comm.jsonl``) lie on one clock and nest, so every interval's *self* time is its duration minus
its children's. A mark's self time goes to its kind, a collective's to ``comm_wait`` + ``comm_transfer``, a
layer span's own self time to ``other`` (Python, layout copies, embedding lookups, ...), and all of it to the
row of the innermost enclosing layer span (its scope: ``transformer.h.0`` holds the block's residual adds,
``transformer.h.0.mlp`` its MLP). So a row's kinds add up to its span minus its child layers' spans, and the
rows add up to the step's spans — nothing is counted twice. A collective outside every span (the DP sync, the
batch broadcast) gets a row of its own, named ``layer_of`` its scope (``ddp``). A collective issued to overlap
compute (``overlap`` true: ``--overlap-grad-reduce``, ``--overlap-param-gather``) is left out: it runs beside
the spans, not inside them (``tpsim report DIR --exposed`` says how much of it the virtual clock exposes).

Waiting apart from moving bytes, with no extra communication (``comm_waits``): the k-th call on one group is
the same collective on every member, and none of all-reduce, all-gather, reduce-scatter or barrier can end on
any rank before the last member has arrived. So the member that spent the *least* time inside the call is the
last to arrive, and its time is the call itself (latency, bytes, the reduction); every other member's surplus
over it is time spent waiting for the group:

    wait_i = duration_i − min_j duration_j          transfer_i = duration_i − wait_i

What it cannot tell: which rank made the others wait (a straggler's own compute is in its spans); whether the
"transfer" of the last arrival was bytes moving or a rank the OS had descheduled inside MPI (with more ranks
than cores, both happen); a rank that leaves late after the data arrived looks like one that waited. Broadcast
and gather can let a root leave before the others arrive, so they are not split (all of it counts as
transfer), nor is a call whose group's records are incomplete (one rank's file, ``--rank`` picks from the
split, it does not change it).
"""

from __future__ import annotations

from typing import Iterable

from tpsim.kinds import LAYER, MARKED
from tpsim.table import RULE, format_table
from tpsim.trace.aggregate import layer_of

COMM_WAIT, COMM_TRANSFER, OTHER = "comm_wait", "comm_transfer", "other"
COLUMNS = (*MARKED, COMM_WAIT, COMM_TRANSFER, OTHER)
SPLIT_OPS = ("all_reduce", "all_gather", "reduce_scatter", "barrier")  # nobody leaves before the last arrives
_EPS = 1e-9  # one nanosecond: times are differences of perf_counter readings, rounded independently


def comm_waits(records: list[dict]) -> list[float]:
    """Seconds each record's rank waited for the rest of its group (see the module docstring), in order."""
    waits = [0.0] * len(records)
    calls: dict[tuple, dict[int, list[int]]] = {}
    for i, r in enumerate(records):
        calls.setdefault((r["step"], r["group"], tuple(r["group_ranks"])), {}).setdefault(r["rank"], []).append(i)
    for (_, _, members), per_rank in calls.items():
        if set(per_rank) != set(members) or len({len(v) for v in per_rank.values()}) != 1:
            continue  # some member's records are missing: no honest split
        ordered = [sorted(v, key=lambda i: records[i]["start"]) for v in per_rank.values()]
        for same_call in zip(*ordered):
            ops = {records[i]["op"] for i in same_call}
            if len(ops) != 1 or ops.pop() not in SPLIT_OPS:
                continue
            shortest = min(records[i]["duration"] for i in same_call)
            for i in same_call:
                waits[i] = records[i]["duration"] - shortest
    return waits


def _intervals(spans: list[dict], records: list[dict], waits: list[float]) -> list[tuple]:
    """(start, end, order, what, layer-or-scope, duration, wait) for one rank: parents sort before children."""
    out = []
    for s in spans:
        kind = s.get("kind", LAYER)
        out.append((s["start"], s["start"] + s["duration"], 0 if kind == LAYER else 1, kind, s["scope"],
                    s["duration"], 0.0))
    for r, w in zip(records, waits):
        out.append((r["start"], r["start"] + r["duration"], 2, "comm", r["scope"], r["duration"], w))
    return sorted(out, key=lambda t: (t[0], -t[1], t[2]))


def _split_rank(intervals: list[tuple], rows: dict[str, dict[str, float]]) -> None:
    """Add one rank's self times into ``rows[layer][kind]`` (the nesting sweep of the module docstring)."""
    stack: list[list] = []  # [end, layer, column, self seconds]
    finished: list[list] = []
    for start, end, _, what, scope, duration, wait in intervals:
        while stack and stack[-1][0] <= start + _EPS:
            finished.append(stack.pop())
        if stack:
            stack[-1][3] -= duration  # a child's time is not its parent's own
        if what == LAYER:
            layer, column = scope or "(top level)", OTHER
        else:
            layer = stack[-1][1] if stack else layer_of(scope)  # a collective outside every span: its scope
            column = what
        if what == "comm":
            rows.setdefault(layer, {}).setdefault(COMM_WAIT, 0.0)
            rows[layer][COMM_WAIT] += wait
            column, duration = COMM_TRANSFER, duration - wait
        stack.append([end, layer, column, duration])
    for _, layer, column, seconds in finished + stack:
        row = rows.setdefault(layer, {})
        row[column] = row.get(column, 0.0) + max(seconds, 0.0)


def kind_split(spans: Iterable[dict], records: Iterable[dict], step: int,
               rank: int | None = None) -> tuple[dict[str, dict[str, float]], int]:
    """``({layer: {kind: seconds per rank}}, ranks averaged over)`` for one step; rows in order of first use."""
    # a collective issued to overlap compute (--overlap-grad-reduce) runs beside the spans, not inside them
    records = [r for r in records if r["step"] == step and not r.get("overlap")]
    waits = comm_waits(records)  # over every rank's records, before --rank picks one
    spans = [s for s in spans if s["step"] == step]
    ranks = sorted({s["rank"] for s in spans} | {r["rank"] for r in records})
    if rank is not None:
        ranks = [r for r in ranks if r == rank]
    rows: dict[str, dict[str, float]] = {}
    for first in sorted(spans, key=lambda x: x["start"]):  # rows in the order the step reaches them
        if first["rank"] in ranks and first.get("kind", LAYER) == LAYER:
            rows.setdefault(first["scope"] or "(top level)", {})
    for rk in ranks:
        mine = [(r, w) for r, w in zip(records, waits) if r["rank"] == rk]
        _split_rank(_intervals([s for s in spans if s["rank"] == rk], [r for r, _ in mine], [w for _, w in mine]),
                    rows)
    n = max(1, len(ranks))
    return {layer: {k: v / n for k, v in row.items()} for layer, row in rows.items() if row}, n


HEADER = {COMM_WAIT: "wait", COMM_TRANSFER: "transfer"}  # short column names: the table fits 100 columns
LEGEND = "ms and % of the row; wait: a collective waiting for its group, transfer: the call itself"


def _ms(seconds: float) -> str:
    """Milliseconds in at most 5 characters: 0.01 ms below 100 ms, 0.1 ms below 1 s, whole ms above."""
    ms = seconds * 1e3
    return f"{ms:.2f}" if ms < 99.995 else f"{ms:.1f}" if ms < 999.95 else f"{ms:.0f}"


def format_kind_table(rows: dict[str, dict[str, float]], title: str = "") -> str:
    """Layer × kind: milliseconds and the share of the row in one cell, a total row; ≤ 100 columns for the
    demo's layer names (cells of at most 10 characters, one space between the kinds)."""
    header = ["layer", *(HEADER.get(k, k) for k in COLUMNS), "total"]
    body = []
    for layer, row in [*rows.items(), ("total", {k: sum(r.get(k, 0.0) for r in rows.values()) for k in COLUMNS})]:
        total = sum(row.get(k, 0.0) for k in COLUMNS)
        cells = [f"{_ms(row.get(k, 0.0))} {row.get(k, 0.0) / total:>4.0%}" if total > 0
                 else f"{_ms(row.get(k, 0.0))}    -" for k in COLUMNS]
        body.append([layer, *cells, _ms(total)])
        if layer != "total" and len(body) == len(rows):
            body.append(RULE)
    gaps = ["  ", *[" "] * len(COLUMNS)]
    return format_table([header, RULE, *body], sep=gaps, title=f"{title}\n{LEGEND}" if title else LEGEND)
