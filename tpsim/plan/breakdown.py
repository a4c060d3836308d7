"""Where the compute goes: the step's kernel time on the mean GPU split by kernel class.

``time_s.compute`` is the ranks' mean time in their kernels (``tpsim.plan.timing``): m micro-batches of every
virtual stage's layers and, on the last, the LM head, over pp ranks. The same kernels
(``tpsim.plan.kernels``), priced by the same roofline (``tpsim.plan.kernel_time``), split into

    GEMM          the layers' weight matmuls and the LM head's (forward, input gradient, weight gradient)
    attention     the attention core: QKᵀ and PV with their softmax and dropout, or the fused kernel
    memory-bound  norms, activations, residual adds, RoPE, the loss's float32 passes
    FP8 casts     ``--dtype fp8``: each FP8 linear's casts (``tpsim.plan.kernels.fp8_casts``)
    recompute     what ``--recompute`` runs again in the backward, all classes together

so the classes add up to ``time_s.compute`` exactly (the same sums in another order). Under ``--mfu`` the passes
cost nothing, so memory-bound and FP8 casts are 0. Pure arithmetic, no MPI.
"""

from __future__ import annotations

from tpsim.gpus import GPU
from tpsim.plan.kernel_time import kernel_seconds
from tpsim.plan.kernels import Kernel, head, layer
from tpsim.plan.layout import Layout, virtual_stage_layers
from tpsim.plan.models import ModelSpec

CLASSES = ("GEMM", "attention", "memory-bound", "FP8 casts", "recompute")
ATTENTION = {"scores", "context", "softmax", "attention_dropout", "flash_attention", "d_context_v", "d_probs",
             "d_q", "d_k"}


def kernel_class(k: Kernel) -> str:
    """The class of one kernel (module docstring; recompute is told apart by ``compute_classes``)."""
    if "fp8_cast_" in k.name:
        return "FP8 casts"
    if k.name in ATTENTION:
        return "attention"
    return "GEMM" if k.is_matmul else "memory-bound"


def _by_class(kernels: dict[str, list[Kernel]], lay: Layout, gpu: GPU) -> dict[str, float]:
    out = dict.fromkeys(CLASSES, 0.0)
    for ks in kernels.values():
        for k in ks:
            out[kernel_class(k)] += kernel_seconds(k, lay, gpu)
    return out


def compute_classes(model: ModelSpec, lay: Layout, gpu: GPU) -> dict[str, float]:
    """Seconds a step the mean GPU spends in each class of kernel (``CLASSES``)."""
    plain = _by_class(layer(model, lay, "none"), lay, gpu)
    redone = sum(_by_class(layer(model, lay), lay, gpu).values()) - sum(plain.values())
    per_layer = {**plain, "recompute": redone}
    end = _by_class(head(model, lay), lay, gpu)
    layers = sum(virtual_stage_layers(model, lay))
    scale = lay.microbatches / lay.pp
    return {c: scale * (layers * per_layer[c] + end[c]) for c in CLASSES}


def class_line(classes: dict[str, float]) -> str:
    """One line: each class's share of the compute, the empty ones left out."""
    total = sum(classes.values())
    shares = [f"{c} {v / total:.0%}" for c, v in classes.items() if v > 0] if total else []
    return "compute by kernel class: " + ", ".join(shares)
