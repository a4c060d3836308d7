"""Named α-β link presets, and what a step's collectives would cost on them.

The α-β model prices one collective as ``steps·α + wire_bytes·β`` (``tpsim.cost.alpha_beta_time``): α the
latency of one ring step, β = 1 / bandwidth the seconds per byte one rank sends. Summed over a step's
collectives it estimates the step's communication time with nothing overlapped — an upper bound on what the
network adds, and a fair way to compare placements, not a prediction of a real run.

The presets are nominal peak figures from vendor specifications, **not measurements**; α is an assumption of
the right order (NCCL's small-message latencies are a few µs inside a node and somewhat more across one),
not a datasheet value. Bandwidth is per GPU, per direction, which is what a ring step uses:

    NVLINK4_H100  NVIDIA H100 Tensor Core GPU datasheet (SXM5): NVLink 900 GB/s total per GPU, i.e. 450 GB/s
                  each way; α = 3 µs assumed
    IB_NDR        NVIDIA ConnectX-7 / Quantum-2 InfiniBand NDR: 400 Gb/s per port = 50 GB/s each way, one port
                  per GPU as in a DGX H100; α = 8 µs assumed (5–10 µs is typical across a switch)
    PCIE4_X16     PCI Express 4.0 x16: 16 GT/s × 16 lanes × 128/130 ≈ 31.5 GB/s each way (PCI-SIG
                  specification); α = 5 µs assumed
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from tpsim.cost import alpha_beta_time, ring_steps
from tpsim.predict.formulas import Prediction


@dataclass(frozen=True)
class LinkPreset:
    """A link as the α-β model sees it: ``alpha`` seconds per ring step, ``bandwidth`` bytes/s per direction."""

    name: str
    alpha: float
    bandwidth: float
    source: str

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1.0 / self.bandwidth


NVLINK4_H100 = LinkPreset("NVLink 4 (H100 SXM, intra-node)", 3e-6, 450e9,
                          "NVIDIA H100 datasheet: 900 GB/s total NVLink bandwidth per GPU; alpha assumed")
IB_NDR = LinkPreset("InfiniBand NDR 400 Gb/s (inter-node)", 8e-6, 50e9,
                    "NVIDIA ConnectX-7 spec: 400 Gb/s per port, one port per GPU; alpha assumed")
PCIE4_X16 = LinkPreset("PCIe 4.0 x16", 5e-6, 31.5e9,
                       "PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes, 128b/130b encoding; alpha assumed")
PRESETS = {"nvlink4": NVLINK4_H100, "ib_ndr": IB_NDR, "pcie4": PCIE4_X16}

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
