"""Measured vs predicted: a step's traced collectives against the formulas' ``Prediction`` rows.

``tpsim.predict.formulas.predict_step`` says which collectives one rank issues in one training step (layer, phase,
op, group, calls, logical bytes, wire bytes); ``compare`` groups a measured step's records the same way and puts
the two side by side, ``format_comparison`` prints them, and ``formula_verdict`` is the demo's FORMULA CHECK
line. Every column printed is compared exactly: an "ok" never stands beside a mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from tpsim.phases import TRAINING
from tpsim.predict.formulas import Prediction
from tpsim.table import RULE, format_table
from tpsim.trace.aggregate import by_layer, summarize


@dataclass
class Row:
    """One (layer, phase, op, group): measured per-rank averages beside the prediction; None where absent."""

    layer: str
    phase: str
    op: str
    group: str
    measured_calls: float | None = None
    predicted_calls: int | None = None
    measured_bytes: float | None = None
    predicted_bytes: int | None = None
    measured_wire: float | None = None
    predicted_wire: int | None = None
    match: bool = field(default=False)

    def mismatches(self) -> list[str]:
        """What differs from the prediction: some of "calls", "bytes", "wire", or why nothing can be compared."""
        if self.measured_bytes is None:
            return ["not measured"]
        if self.predicted_bytes is None:
            return ["not predicted"]
        columns = (("calls", self.measured_calls, self.predicted_calls),
                   ("bytes", self.measured_bytes, self.predicted_bytes),
                   ("wire", self.measured_wire, self.predicted_wire))
        return [name for name, got, want in columns
                if got != want and not (name == "calls" and want is None)]  # None calls: not predicted (DDP)


def compare(measured_records: Iterable[dict], predictions: Sequence[Prediction],
            phases: Sequence[str] | None = TRAINING) -> list[Row]:
    """Measured records of *one* step (dicts as in ``comm.jsonl``, one rank or many) against ``predictions``.

    Records are grouped by (layer_of(scope), phase, op, group) and averaged per rank; records outside
    ``phases`` (init, verify, trace, ...) are left out. A row matches when both sides exist, the calls are
    equal (or not predicted) and the logical bytes and the wire bytes are exactly equal: every number the
    table prints is checked, so "yes" never stands beside a mismatch. Rows come in prediction order, then any
    measured row nobody predicted.
    """
    records = list(measured_records)
    ranks = max(1, len({r["rank"] for r in records}))
    kept = by_layer(r for r in records if phases is None or r["phase"] in phases)
    measured = {row.key: row for row in summarize(kept, keys=("scope", "phase", "op", "group"), ranks=ranks)}
    out = []
    for p in predictions:
        m = measured.pop(p.key, None)
        row = Row(*p.key, predicted_calls=p.calls, predicted_bytes=p.bytes, predicted_wire=p.wire_bytes)
        if m is not None:
            row.measured_calls, row.measured_bytes, row.measured_wire = m.calls, m.bytes, m.wire_bytes
            row.match = not row.mismatches()
        out.append(row)
    for key, m in measured.items():
        out.append(Row(*key, measured_calls=m.calls, measured_bytes=m.bytes, measured_wire=m.wire_bytes))
    return out


def _num(x) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"


def format_comparison(rows: Sequence[Row], title: str = "") -> str:
    """A fixed-width table: calls, logical bytes and wire bytes, measured | predicted, and a match mark."""

    headers = ["layer", "phase", "op", "group", "calls", "pred", "bytes", "pred bytes", "wire", "pred wire", "ok"]
    body = [[r.layer, r.phase, r.op, r.group, _num(r.measured_calls),
             "any" if r.predicted_calls is None and r.predicted_bytes is not None else _num(r.predicted_calls),
             _num(r.measured_bytes), _num(r.predicted_bytes), _num(r.measured_wire), _num(r.predicted_wire),
             "yes" if r.match else "NO: " + ", ".join(r.mismatches())] for r in rows]
    return format_table([headers, RULE, *body], right=range(4, 10), title=title)


def formula_verdict(rows: Sequence[Row]) -> tuple[bool, str]:
    """``(ok, loud line)``: ``FORMULA CHECK: all N rows match`` or ``FORMULA CHECK FAILED: ...`` naming rows."""
    bad = [r for r in rows if not r.match]
    if rows and not bad:
        return True, f"FORMULA CHECK: all {len(rows)} rows match (calls, bytes and wire bytes per rank, exactly)"
    what = "; ".join(f"{r.layer}/{r.phase}/{r.op}/{r.group}: calls {_num(r.measured_calls)} vs "
                     f"{_num(r.predicted_calls)}, bytes {_num(r.measured_bytes)} vs {_num(r.predicted_bytes)}, "
                     f"wire {_num(r.measured_wire)} vs {_num(r.predicted_wire)}" for r in bad[:5])
    more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
    return False, f"FORMULA CHECK FAILED: {len(bad)} of {len(rows)} rows differ (measured vs predicted): {what}{more}"
