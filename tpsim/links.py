"""Links as the α-β model sees them: a latency per ring step and a bandwidth per direction, named presets.

``alpha`` is the seconds one ring step costs, ``bandwidth`` the bytes a second one rank sends each way
(``beta`` = 1 / bandwidth). The presets are nominal peak figures from vendor specifications, **not
measurements**; α is an assumption of the right order (NCCL's small-message latencies are a few µs inside a node
and somewhat more across one), not a datasheet value. Each preset names its source. ``tpsim.gpus`` puts them on
its GPUs (inside a node, between nodes); ``tpsim.predict.hardware`` prices a step's collectives on them.
Bandwidth is per GPU, per direction, which is what a ring step uses:

    NVLINK4_H100  NVIDIA H100 Tensor Core GPU datasheet (SXM5): NVLink 900 GB/s total per GPU, i.e. 450 GB/s
                  each way; α = 3 µs assumed
    IB_NDR        NVIDIA ConnectX-7 / Quantum-2 InfiniBand NDR: 400 Gb/s per port = 50 GB/s each way, one port
                  per GPU as in a DGX H100; α = 8 µs assumed (5–10 µs is typical across a switch)
    PCIE4_X16     PCI Express 4.0 x16: 16 GT/s × 16 lanes × 128/130 ≈ 31.5 GB/s each way (PCI-SIG
                  specification); α = 5 µs assumed

and the A100's and V100's NVLink 3 and 2, InfiniBand HDR and EDR, each with its datasheet. Pure data, no MPI.
"""

from __future__ import annotations

from dataclasses import dataclass


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
NVLINK3_A100 = LinkPreset("NVLink 3 (A100 SXM, intra-node)", 3e-6, 300e9,
                          "NVIDIA A100 datasheet: 600 GB/s total NVLink bandwidth per GPU; alpha assumed")
NVLINK2_V100 = LinkPreset("NVLink 2 (V100 SXM2, intra-node)", 3e-6, 150e9,
                          "NVIDIA V100 datasheet: 300 GB/s total NVLink bandwidth per GPU; alpha assumed")
IB_HDR = LinkPreset("InfiniBand HDR 200 Gb/s (inter-node)", 8e-6, 25e9,
                    "NVIDIA ConnectX-6 spec: 200 Gb/s per port, one port per GPU; alpha assumed")
IB_EDR = LinkPreset("InfiniBand EDR 100 Gb/s (inter-node)", 8e-6, 12.5e9,
                    "Mellanox ConnectX-5 spec: 100 Gb/s per port, one port per GPU; alpha assumed")
NVLINK4_H800 = LinkPreset("NVLink 4 (H800 SXM: 8 links, intra-node)", 3e-6, 200e9,
                          "NVIDIA H800 SXM: NVLink 400 GB/s total per GPU (8 of the H100's 18 links); alpha assumed")
NVLINK5_B200 = LinkPreset("NVLink 5 (Blackwell, intra-domain)", 3e-6, 900e9,
                          "NVIDIA Blackwell datasheet: 1.8 TB/s total NVLink bandwidth per GPU; alpha assumed")
IB_XDR = LinkPreset("ConnectX-8 800 Gb/s (inter-node)", 8e-6, 100e9,
                    "NVIDIA ConnectX-8 SuperNIC: 800 Gb/s per GPU, GB300 NVL72; alpha assumed")
PRESETS = {"nvlink4": NVLINK4_H100, "ib_ndr": IB_NDR, "pcie4": PCIE4_X16}  # by short name (tpsim.generate's report)
