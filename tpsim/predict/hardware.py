"""What a step's collectives would cost on α-β links, nothing overlapped.

The α-β model prices one collective as ``steps·α + wire_bytes·β`` (``tpsim.cost.alpha_beta_time``): α the
latency of one ring step, β = 1 / bandwidth the seconds per byte one rank sends. Summed over a step's
collectives it estimates the step's communication time with nothing overlapped — an upper bound on what the
network adds, and a fair way to compare placements, not a prediction of a real run.

The links are ``tpsim.links``' presets (NVLink 4, InfiniBand NDR, PCIe 4.0, ...: nominal vendor figures, α
assumed), or any ``LinkPreset``, one for every group or one per group name.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from tpsim.cost import alpha_beta_time, ring_steps
from tpsim.links import LinkPreset
from tpsim.predict.formulas import Prediction


Links = LinkPreset | Mapping[str, LinkPreset]  # one link for every group, or one per group name ("tp", "dp")


def _link(links: Links, group: str) -> LinkPreset:
    if isinstance(links, LinkPreset):
        return links
    if group not in links:
        raise KeyError(f"no link preset for group {group!r} (have {sorted(links)})")
    return links[group]


def estimate_breakdown(rows: Iterable[Prediction | dict], links: Links, key: str = "group") -> dict[str, float]:
    """Seconds per rank per step by ``key`` ("group", "phase", "layer"/"scope", "op") on ``links``.

    ``rows``: ``Prediction``s (one per layer/phase/op/group, ``calls`` each; None counts as one), or records
    (``comm.jsonl`` dicts of one step, any number of ranks: the total is divided by the ranks seen).
    """
    out: dict[str, float] = {}
    ranks: set[int] = set()
    for r in rows:
        if isinstance(r, Prediction):
            op, group, p, calls, wire = r.op, r.group, r.group_size, r.calls or 1, r.wire_bytes
            label = getattr(r, "layer" if key == "scope" else key)
        else:
            op, group, p, calls, wire = r["op"], r["group"], r["group_size"], 1, r["wire_bytes"]
            label = r["scope" if key == "layer" else key]
            ranks.add(r["rank"])
        link = _link(links, group)
        out[label] = alpha_beta_time(calls * ring_steps(op, p), wire, link.alpha, link.beta, out.get(label, 0.0))
    n = max(1, len(ranks))
    return {k: v / n for k, v in out.items()}


def estimate_step_time(rows: Iterable[Prediction | dict], links: Links) -> float:
    """Seconds per rank per step spent in collectives on ``links``, nothing overlapped (α-β ring model)."""
    return sum(estimate_breakdown(rows, links).values())
