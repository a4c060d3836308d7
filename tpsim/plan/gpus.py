"""GPU presets for the planner: memory, peak dense matmul throughput, and the links inside and between nodes.

Nominal vendor figures, **not measurements** (α, the per-step latency, is an assumption of the right order, as in
``tpsim.predict.hardware``). Peak throughput is the dense (no sparsity) tensor-core figure for 16-bit inputs; for
``--dtype fp32`` the planner uses the TF32 figure (what a framework runs fp32 matmuls on). Bandwidth is per GPU
per direction, what one ring step uses; inter-node is one NIC per GPU, as in NVIDIA's DGX systems.

    h100-80gb   NVIDIA H100 SXM5 datasheet: 80 GB HBM3, BF16 989 TFLOP/s, TF32 495; NVLink 4 900 GB/s total
                (450 each way); DGX H100: ConnectX-7 InfiniBand NDR 400 Gb/s (50 GB/s) per GPU
    h200-141gb  NVIDIA H200 SXM datasheet: 141 GB HBM3e, same compute and links as the H100 SXM
    a100-80gb   NVIDIA A100 SXM4 datasheet: 80 GB HBM2e, BF16 312 TFLOP/s, TF32 156; NVLink 3 600 GB/s total
                (300 each way); DGX A100: ConnectX-6 InfiniBand HDR 200 Gb/s (25 GB/s) per GPU
    a100-40gb   the same with 40 GB HBM2 (Narayanan et al. 2021 trained on 80 GB A100s)
    v100-32gb   NVIDIA V100 SXM2 datasheet: 32 GB HBM2, FP16 125 TFLOP/s; NVLink 2 300 GB/s total (150 each
                way); DGX-2 era InfiniBand EDR 100 Gb/s (12.5 GB/s) per GPU
"""

from __future__ import annotations

from dataclasses import dataclass

from tpsim.errors import ConfigError
from tpsim.predict.hardware import IB_NDR, NVLINK4_H100, LinkPreset

NVLINK3_A100 = LinkPreset("NVLink 3 (A100 SXM, intra-node)", 3e-6, 300e9,
                          "NVIDIA A100 datasheet: 600 GB/s total NVLink bandwidth per GPU; alpha assumed")
NVLINK2_V100 = LinkPreset("NVLink 2 (V100 SXM2, intra-node)", 3e-6, 150e9,
                          "NVIDIA V100 datasheet: 300 GB/s total NVLink bandwidth per GPU; alpha assumed")
IB_HDR = LinkPreset("InfiniBand HDR 200 Gb/s (inter-node)", 8e-6, 25e9,
                    "NVIDIA ConnectX-6 spec: 200 Gb/s per port, one port per GPU; alpha assumed")
IB_EDR = LinkPreset("InfiniBand EDR 100 Gb/s (inter-node)", 8e-6, 12.5e9,
                    "Mellanox ConnectX-5 spec: 100 Gb/s per port, one port per GPU; alpha assumed")


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int
    peak_flops_16bit: float
    peak_flops_tf32: float
    intra: LinkPreset
    inter: LinkPreset

    def peak(self, dtype) -> float:
        """FLOP/s of ``dtype`` (float32, fp32 or np.float32's dtype: TF32; any other: the 16-bit peak). Spelled
        out here, not through ``tpsim.config.dtype_name``: the configuration reads ``GPUS`` for ``--clock``."""
        return self.peak_flops_tf32 if str(dtype) in ("float32", "fp32") else self.peak_flops_16bit


GB = 10 ** 9
GPUS = {g.name: g for g in [
    GPU("h100-80gb", 80 * GB, 989e12, 495e12, NVLINK4_H100, IB_NDR),
    GPU("h200-141gb", 141 * GB, 989e12, 495e12, NVLINK4_H100, IB_NDR),
    GPU("a100-80gb", 80 * GB, 312e12, 156e12, NVLINK3_A100, IB_HDR),
    GPU("a100-40gb", 40 * GB, 312e12, 156e12, NVLINK3_A100, IB_HDR),
    GPU("v100-32gb", 32 * GB, 125e12, 125e12, NVLINK2_V100, IB_EDR),
]}


def gpu(name: str) -> GPU:
    if name not in GPUS:
        raise ConfigError(f"unknown GPU {name!r}; presets: {', '.join(GPUS)}")
    return GPUS[name]
