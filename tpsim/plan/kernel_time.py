"""The time of one kernel on one GPU: a roofline, with two efficiencies fitted once on published runs.

Each kernel of ``tpsim.plan.kernels`` (a matmul with its shape, or a memory-bound pass with its bytes) takes

    matmul    max(FLOPs / (peak · GEMM_EFFICIENCY), bytes / (HBM · HBM_EFFICIENCY))     the roofline
    pass      bytes / (HBM · HBM_EFFICIENCY)

so a matmul's efficiency follows its shape: a layer's big weight matmuls ([b·s, h] × [h, 3h/t]: hundreds of
FLOPs a byte) run compute-bound at GEMM_EFFICIENCY of the peak, attention's per-head products ([s, d] × [d, s]
with d = 64–160 FLOPs a byte, below an A100's ridge of 153 or an H100's 295) are memory-bound, and the norms,
softmax, dropout, GeLU and residual adds cost their bytes. That is why a bigger hidden size reaches more of the
peak: the matmuls grow as h², the passes as h (and the scores as s²·a).

**Fitted** (``python -m tpsim.plan.fit``, on the 18 development rows of Narayanan et al. 2021 Table 1 and
Korthikanti et al. 2022 Table 5 only, one pair for every row, nothing per row): GEMM_EFFICIENCY = 0.70 (of the
dense peak) and HBM_EFFICIENCY = 0.85 (of the datasheet's bandwidth) — the grid point of least worst error, then
least median, with the DP collectives across nodes priced by NCCL's model (``tpsim.nccl``) and float16's
gradients in float32. Both are of the order kernels are measured at (cuBLAS's large half-precision GEMMs reach
70–85 % of an A100's peak, streaming kernels 75–90 % of its HBM bandwidth); they also absorb what the kernel
list leaves out (bias adds, launch gaps; the optimizer's own kernels are priced apart).

``Layout.mfu`` set (``--mfu``): the textbook's flat model instead — every matmul at that fraction of the peak,
the passes free — what the live ``--clock GPU`` tests and lesson 17 price by hand. ``Layout.fp8``: the layers'
weight matmuls at ``FP8_GEMM_SPEEDUP`` times the 16-bit GEMM rate (capped at the FP8 peak; **fitted**, the third
constant, on NeMo 24.07's FP8 rows: ``tpsim.plan.fit_fp8``), and the casts that feed them
(``tpsim.plan.kernels.fp8_casts``: each input and incoming gradient, each weight once a step, at HBM speed, their
bytes by ``--fp8-recipe``); attention's products, the LM head and every other pass stay bfloat16. Under ``--mfu``
the FP8 matmuls run at that fraction of the FP8 peak. Pure arithmetic, no MPI.
"""

from __future__ import annotations

from tpsim.plan.kernels import Kernel, head, layer
from tpsim.plan.layout import Layout
from tpsim.plan.memory import ACT_BYTES
from tpsim.plan.models import ModelSpec

GEMM_EFFICIENCY = 0.70  # fitted (module docstring)
HBM_EFFICIENCY = 0.85  # fitted (module docstring)
FP8_GEMM_SPEEDUP = 1.30  # fitted (module docstring): an FP8 GEMM's rate over the 16-bit GEMM's
FP8_MATMULS = ("qkv", "proj", "fc1", "fc2", "gate_up", "down")  # the layers' weight matmuls, F, B and W


def _fp8(lay: Layout, k: Kernel) -> bool:
    return lay.fp8 and k.name.removeprefix("d_").removesuffix("_input").removesuffix("_weight") in FP8_MATMULS


def fp8_speedup(lay: Layout) -> float:
    """How many times the 16-bit GEMM rate ``lay``'s FP8 GEMMs run at: its own (``--fp8-gemm-speedup``) or the
    fitted ``FP8_GEMM_SPEEDUP``."""
    return FP8_GEMM_SPEEDUP if lay.fp8_gemm_speedup is None else lay.fp8_gemm_speedup


def efficiencies(lay: Layout) -> tuple[float, float]:
    """(GEMM, HBM) efficiency of ``lay``: its own (``--gemm-efficiency``, ``--hbm-efficiency``) or the fitted."""
    return (GEMM_EFFICIENCY if lay.gemm_efficiency is None else lay.gemm_efficiency,
            HBM_EFFICIENCY if lay.hbm_efficiency is None else lay.hbm_efficiency)


def kernel_seconds(k: Kernel, lay: Layout, gpu) -> float:
    """Seconds of ``k`` on one GPU (module docstring)."""
    gemm, hbm = efficiencies(lay)
    fp8 = _fp8(lay, k)
    if lay.mfu is not None:
        return k.flops / (gpu.peak("fp8" if fp8 else lay.dtype) * lay.mfu) if k.is_matmul else 0.0
    rate = gpu.peak(lay.dtype) * gemm * (min(fp8_speedup(lay), gpu.peak("fp8") / gpu.peak(lay.dtype)) if fp8 else 1)
    nbytes = k.nbytes or (k.matmul_bytes(ACT_BYTES[lay.dtype]) if k.is_matmul else 0.0)
    memory = nbytes / (gpu.hbm_bytes_per_s * hbm)
    return max(k.flops / rate, memory) if k.is_matmul else memory


def seconds(kernels: dict[str, list[Kernel]], lay: Layout, gpu) -> dict[str, float]:
    return {op: sum(kernel_seconds(k, lay, gpu) for k in ks) for op, ks in kernels.items()}


def layer_seconds(model: ModelSpec, lay: Layout, gpu) -> dict[str, float]:
    """``{"F", "B", "W"}`` seconds of one layer for one micro-batch on one GPU of its TP group."""
    return seconds(layer(model, lay), lay, gpu)


def head_seconds(model: ModelSpec, lay: Layout, gpu) -> dict[str, float]:
    """``{"F", "B", "W"}`` seconds of the LM head and the loss for one micro-batch on one GPU."""
    return seconds(head(model, lay), lay, gpu)


# Bytes the optimizer step moves per parameter it updates (Megatron's fused mixed-precision Adam): read the
# fp32 main gradient, main parameter, m and v (16), write the main parameter, m and v (12) and the 16-bit model
# parameter (2); the clip norm reads the gradient once more (4); float16 unscales it and checks for inf/NaN
# (read + write, 8). float32 keeps no separate copy: read g, p, m, v, write p, m, v, the norm's read.
OPTIMIZER_BYTES = {"bfloat16": 16 + 12 + 2 + 4, "float16": 16 + 12 + 2 + 4 + 8, "float32": 16 + 12 + 4,
                   "float64": 2 * (16 + 12 + 4)}


def optimizer_seconds(params: int, lay: Layout, gpu) -> float:
    """Seconds of one optimizer step over ``params`` local parameters (÷ dp under ZeRO-1: each rank updates its
    slice): ``OPTIMIZER_BYTES`` a parameter at the HBM rate; 0 under the flat ``--mfu`` model."""
    if lay.mfu is not None:
        return 0.0
    hbm = efficiencies(lay)[1]
    owned = params / lay.grad_replicas if lay.zero_stage.shards_optimizer else params  # ZeRO-1 shards over dp·cp
    return owned * OPTIMIZER_BYTES[lay.dtype] / (gpu.hbm_bytes_per_s * hbm)
