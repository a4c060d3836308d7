"""GPU presets, the planner's and the live clock's (``--clock GPU``): memory, peak dense matmul throughput, memory
bandwidth, and the links inside and between nodes.

Nominal vendor figures, **not measurements** (α, the per-step latency, is an assumption of the right order, as in
``tpsim.links``). Peak throughput is the dense (no sparsity) tensor-core figure for 16-bit inputs; for
``--dtype fp32`` the planner uses the TF32 figure (what a framework runs fp32 matmuls on), for ``--dtype fp8``
the FP8 one (Hopper only). HBM bandwidth prices the memory-bound kernels (``tpsim.plan.kernel_time``). Link
bandwidth is per GPU per direction, what one ring step uses; inter-node is one NIC per GPU, as in NVIDIA's DGX
systems.

    h100-80gb   NVIDIA H100 SXM5 datasheet: 80 GB HBM3 at 3.35 TB/s, BF16 989 TFLOP/s, FP8 1979, TF32 495;
                NVLink 4 900 GB/s total (450 each way); DGX H100: ConnectX-7 InfiniBand NDR 400 Gb/s (50 GB/s)
    h200-141gb  NVIDIA H200 SXM datasheet: 141 GB HBM3e at 4.8 TB/s, same compute and links as the H100 SXM
    a100-80gb   NVIDIA A100 SXM4 datasheet: 80 GB HBM2e at 2.039 TB/s, BF16 312 TFLOP/s, TF32 156; NVLink 3
                600 GB/s total (300 each way); DGX A100: ConnectX-6 InfiniBand HDR 200 Gb/s (25 GB/s) per GPU
    a100-40gb   the same with 40 GB HBM2 at 1.555 TB/s (Narayanan et al. 2021 trained on 80 GB A100s)
    v100-32gb   NVIDIA V100 SXM2 datasheet: 32 GB HBM2 at 900 GB/s, FP16 125 TFLOP/s; NVLink 2 300 GB/s total
                (150 each way); DGX-2 era InfiniBand EDR 100 Gb/s (12.5 GB/s) per GPU
    h800-80gb   the H100 SXM's compute and memory with NVLink cut to 400 GB/s total (8 links, 200 each way)
    b200        NVIDIA Blackwell datasheet, HGX B200 at 1,000 W: BF16 2,250 TFLOP/s dense, FP8 4,500, TF32 1,100;
                HBM3e 8 TB/s; DGX B200: 1,440 GB for 8 GPUs (180 GB each), NVLink 5 1.8 TB/s total, 8 ConnectX-7
                400 Gb/s
    gb200       the GB200 NVL72's B200 at 1,200 W: BF16 2,500 dense, FP8 5,000, TF32 1,250; 186 GB (13.4 TB for
                72); one NVLink domain of 72 GPUs; ConnectX-7 400 Gb/s a GPU
    gb300       the GB300 NVL72's B300: 288 GB HBM3e, 8 TB/s, the GB200's BF16 and FP8 rates (Blackwell Ultra
                raises FP4); NVLink domain 72; ConnectX-8 800 Gb/s a GPU

**Memory a GPU has** (``memory_bytes``): what the card reports, not the datasheet's decimal gigabytes —
``nvidia-smi``'s memory.total: an H100 80GB 81,559 MiB (85.5·10⁹ B), an H200 143,771 MiB, an A100 40GB
40,960 MiB (its deviceQuery: 42,405,855,232 B usable by CUDA); the A100 80GB and the V100 32GB are taken as
their 81,920 and 32,768 MiB of HBM (no card's report was at hand to check them), the Blackwell parts at their
datasheets' decimal gigabytes (180, 186, 288 GB) for the same reason. A run cannot use all of it:
``RESERVED_BYTES`` (1 GiB, an estimate of the right order, not a measurement) stands for the CUDA context,
cuBLAS's workspaces and NCCL's buffers, so a plan fits when its bytes ≤ memory_bytes − RESERVED_BYTES.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpsim.errors import ConfigError
from tpsim.nccl import Fabric
from tpsim.links import (IB_EDR, IB_HDR, IB_NDR, IB_XDR, NVLINK2_V100, NVLINK3_A100, NVLINK4_H100, NVLINK4_H800,
                         NVLINK5_B200, LinkPreset)

@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int
    peak_flops_16bit: float
    peak_flops_tf32: float
    intra: LinkPreset
    inter: LinkPreset
    hbm_bytes_per_s: float
    peak_flops_fp8: float | None = None  # None: no FP8 tensor cores
    fabric: Fabric | None = None  # what NCCL sees of a node (tpsim.nccl): None, the links' figures, one NIC a GPU
    nvlink_domain: int = 8  # GPUs one NVLink domain joins: a DGX/HGX node's 8, an NVL72 rack's 72

    def __post_init__(self) -> None:
        if self.fabric is None:
            object.__setattr__(self, "fabric", Fabric(self.intra.bandwidth, self.inter.bandwidth, 8))

    def peak(self, dtype) -> float:
        """FLOP/s of ``dtype`` (float32, fp32 or np.float32's dtype: TF32; float8/fp8: FP8; any other: the 16-bit
        peak). Spelled out here, not through ``tpsim.config.dtype_name``: the configuration reads ``GPUS``."""
        if str(dtype) in ("float8", "fp8"):
            if self.peak_flops_fp8 is None:
                raise ConfigError(f"--dtype fp8: the {self.name} has no FP8 tensor cores (Hopper and Blackwell parts have)")
            return self.peak_flops_fp8
        return self.peak_flops_tf32 if str(dtype) in ("float32", "fp32") else self.peak_flops_16bit

    @property
    def usable_bytes(self) -> int:
        """What a run's tensors can hold: the reported memory less ``RESERVED_BYTES``."""
        return self.memory_bytes - RESERVED_BYTES


MiB = 2 ** 20
RESERVED_BYTES = 2 ** 30  # CUDA context, cuBLAS workspaces, NCCL buffers: an estimate (module docstring)
# NCCL's view of a node (tpsim.nccl.Fabric): NVLink as links x NCCL's per-link GB/s (src/graph/topo.h: SM70 20.0,
# SM80 20.0, SM90 20.6), the NIC at its line rate (NCCL reads the port speed), 8 compute NICs a DGX node
HOPPER_FABRIC = Fabric(18 * 20.6e9, 50e9, 8)  # H100/H200 SXM: 18 NVLink 4 links; DGX H100: 8 x ConnectX-7 400 Gb/s
AMPERE_FABRIC = Fabric(12 * 20.0e9, 25e9, 8)  # A100 SXM4: 12 NVLink 3 links; DGX A100: 8 x ConnectX-6 200 Gb/s
VOLTA_FABRIC = Fabric(6 * 20.0e9, 12.5e9, 8)  # V100 SXM2: 6 NVLink 2 links; EDR 100 Gb/s
H800_FABRIC = Fabric(8 * 20.6e9, 50e9, 8)  # H800 SXM: 8 NVLink 4 links; 400 Gb/s NICs
BLACKWELL_FABRIC = Fabric(18 * 40.1e9, 50e9, 8)  # B200 / GB200: 18 NVLink 5 links (SM100 40.1); ConnectX-7 400 Gb/s
GB300_FABRIC = Fabric(18 * 40.1e9, 100e9, 8)  # GB300: ConnectX-8 800 Gb/s a GPU
GPUS = {g.name: g for g in [
    GPU("h100-80gb", 81_559 * MiB, 989e12, 495e12, NVLINK4_H100, IB_NDR, 3.35e12, 1979e12, HOPPER_FABRIC),
    GPU("h200-141gb", 143_771 * MiB, 989e12, 495e12, NVLINK4_H100, IB_NDR, 4.8e12, 1979e12, HOPPER_FABRIC),
    GPU("a100-80gb", 81_920 * MiB, 312e12, 156e12, NVLINK3_A100, IB_HDR, 2.039e12, None, AMPERE_FABRIC),
    GPU("a100-40gb", 40_960 * MiB, 312e12, 156e12, NVLINK3_A100, IB_HDR, 1.555e12, None, AMPERE_FABRIC),
    GPU("v100-32gb", 32_768 * MiB, 125e12, 125e12, NVLINK2_V100, IB_EDR, 0.9e12, None, VOLTA_FABRIC),
    GPU("h800-80gb", 81_559 * MiB, 989e12, 495e12, NVLINK4_H800, IB_NDR, 3.35e12, 1979e12, H800_FABRIC),
    GPU("b200", 180 * 10 ** 9, 2250e12, 1100e12, NVLINK5_B200, IB_NDR, 8e12, 4500e12, BLACKWELL_FABRIC),
    GPU("gb200", 186 * 10 ** 9, 2500e12, 1250e12, NVLINK5_B200, IB_NDR, 8e12, 5000e12, BLACKWELL_FABRIC, 72),
    GPU("gb300", 288 * 10 ** 9, 2500e12, 1250e12, NVLINK5_B200, IB_XDR, 8e12, 5000e12, GB300_FABRIC, 72),
]}


def gpu(name: str) -> GPU:
    if name not in GPUS:
        raise ConfigError(f"unknown GPU {name!r}; presets: {', '.join(GPUS)}")
    return GPUS[name]
