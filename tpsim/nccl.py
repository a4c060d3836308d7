"""A collective across nodes as NCCL prices it: its algorithms, its protocols, its own latencies and bandwidths.

When a group's ranks sit in several nodes (NVLink domains), one flat α-β ring on one NIC is wrong twice over.
NCCL runs a ring's channels over every NIC the group's GPUs in a node have (one NIC per GPU on a DGX: rail
placement), so a DP ring with k of its ranks in each node crosses nodes at k NICs' bandwidth; and at many nodes it
switches to a tree, whose latency grows as log₂ of the nodes, not as the ranks. This module is NCCL's tuning model
(``src/graph/tuning.cc``, ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``; constants of NCCL 2.19–2.21, the
public source), restated for a group given by its size and its ranks per node:

    time(algorithm, protocol) = latency + bytes / algorithm bandwidth          NCCL picks the least
    ring bus bandwidth B = min(NVLink, min(k, NICs) · NIC)   (k ranks of the group a node; one node: NVLink)
    algorithm bandwidth: ring B · n / steps (all-reduce 2(n − 1) steps, all-gather and reduce-scatter n − 1),
                         tree 0.92 · B · ½ (all-reduce only)
    protocols: Simple at B; LL128 at 0.92 · B (0.7 at one rank a node); LL at B / 4 (ring), B / 3.8 (tree)
    ring latency = base + (steps − inter steps) · intra + inter steps · inter
                   (inter steps: all-reduce 2·nodes, all-gather / reduce-scatter nodes − 1, broadcast nodes)
    tree latency = base + 2 · ((k − 1) · intra + log₂(nodes) · inter)

All-to-all is no ring: NCCL runs it as grouped point-to-point sends, one chunk of B/n to every peer at once,
Simple protocol, so its time is the slowest path's (``alltoall_seconds``):

    all-to-all = base + hop + max((k − 1) · B/n / NVLink, (n − k) · B/n / NIC)
                 (k ranks of the group in a node; hop: NCCL's ring Simple hwLat, network row when a peer is in
                 another node; each GPU's network share on its own rail's NIC, as PXN routes it)

``BASE_US`` and ``HW_US`` are NCCL's ``baseLat`` and ``hwLat`` tables (µs, NVLink and network rows), and
``NET_OVERHEAD_US`` its per-step network post overhead (1 µs, ×3 for Simple), the floor of an intra step once a
ring leaves its node. NCCL's per-channel caps and its tree correction factors for mid-size messages are left
out: they shape messages below a few MB; DP buckets are tens of MB. The bandwidths NCCL sees are its topology's:
per NVLink link 20.0 GB/s on an A100 (12 links), 20.6 on an H100 (18; an H800 8), 40.1 on a B200 (18)
(``src/graph/topo.h``), and a NIC's usable rate (``tpsim.gpus``). Pure arithmetic, MPI-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALGORITHMS = ("tree", "ring")
PROTOCOLS = ("LL", "LL128", "Simple")
# NCCL's baseLat (µs): Tree {LL, LL128, Simple}, Ring {LL, LL128, Simple}
BASE_US = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}
# NCCL's hwLat (µs) per step: the NVLink row and the network row
HW_US = {"nvlink": {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4)},
         "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0)}}
NET_OVERHEAD_US = 1.0  # NCCL's getNetOverhead on an x86 host (×3 for Simple)


@dataclass(frozen=True)
class Fabric:
    """What a node offers NCCL: ``nvlink`` bytes/s one GPU's NVLink carries each way as NCCL's topology counts it,
    ``nic`` bytes/s one NIC carries each way, ``nics`` NICs a node (one per GPU on a rail-placed DGX)."""

    nvlink: float
    nic: float
    nics: int


def steps(op: str, n: int) -> int:
    """A ring's steps: all-reduce 2(n − 1), all-gather and reduce-scatter n − 1, broadcast and reduce n."""
    return 2 * (n - 1) if op == "all_reduce" else n - 1 if op in ("all_gather", "reduce_scatter") else n


def inter_steps(op: str, nodes: int) -> int:
    """The ring steps that cross nodes (NCCL's ``nInterSteps``)."""
    if op == "all_reduce":
        return 2 * nodes if nodes > 1 else 0
    return nodes - 1 if op in ("all_gather", "reduce_scatter") else nodes


def bus_bandwidth(fabric: Fabric, per_node: int, nodes: int) -> float:
    """Bytes/s a ring moves over its slowest hop: NVLink inside one node, else min(NVLink, the NICs of the
    group's ``per_node`` ranks)."""
    if nodes == 1:
        return fabric.nvlink
    return min(fabric.nvlink, min(per_node, fabric.nics) * fabric.nic)


def option_seconds(op: str, nbytes: float, n: int, per_node: int, fabric: Fabric, algorithm: str,
                   protocol: str) -> float | None:
    """Seconds of one algorithm and protocol (module docstring); None where NCCL does not offer it (a tree for
    anything but an all-reduce, or inside one node)."""
    nodes = -(-n // per_node)
    if algorithm == "tree" and (op != "all_reduce" or nodes == 1):
        return None
    p = PROTOCOLS.index(protocol)
    bus = bus_bandwidth(fabric, per_node, nodes)
    if algorithm == "ring":
        factor = (1 / 4, 0.7 if per_node < 2 else 0.92, 1.0)[p]
        bandwidth = bus * factor * n / steps(op, n)
    else:
        factor = (1 / 3.8, 120 / 128, 1.0)[p]
        bandwidth = 0.92 * bus * factor * 0.5
    hw_intra = HW_US["nvlink"][algorithm][p]
    inter = HW_US["net"][algorithm][p]
    if algorithm == "ring":
        intra = max(hw_intra, NET_OVERHEAD_US * (3 if protocol == "Simple" else 1)) if nodes > 1 else hw_intra
        crossing = inter_steps(op, nodes)
        latency = BASE_US["ring"][p] + max(0, steps(op, n) - crossing) * intra + crossing * inter
    else:
        latency = BASE_US["tree"][p] + 2 * ((per_node - 1) * hw_intra + math.log2(nodes) * inter)
    return latency * 1e-6 + nbytes / bandwidth


def alltoall_seconds(nbytes: float, n: int, per_node: int, fabric: Fabric) -> float:
    """Seconds of an all-to-all of ``nbytes`` a rank (B/n to each peer, its own chunk kept) over ``n`` ranks,
    ``per_node`` of them in each node (module docstring): the NVLink and the network parts run at once."""
    if n <= 1:
        return 0.0
    per_node = min(per_node, n)
    chunk, simple = nbytes / n, PROTOCOLS.index("Simple")
    remote = n - per_node
    hop = HW_US["net" if remote else "nvlink"]["ring"][simple]
    wire = max((per_node - 1) * chunk / fabric.nvlink, remote * chunk / fabric.nic if remote else 0.0)
    return (BASE_US["ring"][simple] + hop) * 1e-6 + wire


def collective_seconds(op: str, nbytes: float, n: int, per_node: int, fabric: Fabric) -> tuple[float, str, str]:
    """``(seconds, algorithm, protocol)`` of the fastest option for ``op`` on ``nbytes`` over ``n`` ranks,
    ``per_node`` of them in each node; 0 seconds for a group of one. An all-to-all is NCCL's grouped
    point-to-point (``alltoall_seconds``), reported as ("p2p", "Simple")."""
    if n <= 1:
        return 0.0, "none", "none"
    if op == "all_to_all":
        return alltoall_seconds(nbytes, n, per_node, fabric), "p2p", "Simple"
    options = [(t, a, p) for a in ALGORITHMS for p in PROTOCOLS
               if (t := option_seconds(op, nbytes, n, per_node, fabric, a, p)) is not None]
    return min(options)


def message_bytes(op: str, wire: float, n: int) -> float:
    """The logical bytes of a collective whose wire bytes (what one rank sends, ``tpsim.cost.wire_bytes``) are
    ``wire``."""
    if n <= 1:
        return 0.0
    return wire * n / (2 * (n - 1)) if op == "all_reduce" else wire * n / (n - 1) \
        if op in ("all_gather", "reduce_scatter", "all_to_all") else wire


@dataclass(frozen=True)
class SpanningLink:
    """A group that spans ``nodes`` nodes, ``per_node`` ranks in each, on ``fabric``; its point-to-point
    messages go as ``point`` (a ``tpsim.links.LinkPreset``: one NIC). ``collective`` prices a collective by NCCL's
    model; ``alpha``, ``beta``, ``bandwidth`` and ``name`` are the point-to-point link's."""

    point: object
    fabric: Fabric
    per_node: int

    @property
    def alpha(self) -> float:
        return self.point.alpha

    @property
    def beta(self) -> float:
        return self.point.beta

    @property
    def bandwidth(self) -> float:
        return self.point.bandwidth

    @property
    def name(self) -> str:
        return (f"{self.point.name}, {min(self.per_node, self.fabric.nics)} NIC(s) a node for a collective "
                "(NCCL's ring or tree)")

    def collective(self, op: str, nbytes: float, n: int) -> float:
        return collective_seconds(op, nbytes, n, min(self.per_node, n), self.fabric)[0]
