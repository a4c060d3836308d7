"""Compute time: the model's FLOPs per step at the GPU's peak × MFU, the pipeline bubble, and the step.

FLOPs (Narayanan et al. 2021, arXiv:2104.04473, Appendix): a matmul of a [tokens, k] by a [k, n] costs 2·k·n
FLOPs a token forward and twice that backward, so training costs 6 FLOPs per weight per token, plus attention's
QKᵀ and AV, 4·s·h a token a layer forward (12·s·h in all). For GPT (12h² weights a layer, V·h in the logits):

    F = 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h))           (B sequences of s tokens per step)

— Narayanan et al.'s formula without recomputation; their 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) is the same with
full recompute, which repeats each layer's forward (×4/3 on the layers, the logits not). Selective recompute
repeats only attention's QKᵀ and AV forward (+4·B·s²·h·L). Llama: the same rule with its own weights a layer
(2·h·(a + g)·d + 3·h·f).

Per layer and token, split the way a zero-bubble schedule runs it (``layer_flops``): the forward F = 2·w + 4·s·h
(w the layer's matmul weights; 4·s·h attention's QKᵀ and AV); the backward's input-gradient half B = 2·w + 8·s·h
(a matmul's dX costs its forward's 2·w; attention has no weights, so both its products' gradients, 8·s·h, are
dX) and its weight-gradient half W = 2·w (a matmul's dW costs its forward again). F + B + W = 3·(2w + 4sh), the
rule above. Recomputation runs before the gradients, so it joins B: full recompute F again, selective 4·s·h.
The LM head (``head_flops``, the last stage) is one matmul: F = B = W = 2·h·V. The embedding is a gather and the
loss's softmax elementwise: neither is counted, here as in Narayanan et al.'s formula.

Time: ``compute = F / (N · peak · mfu)`` with N = tp·pp·dp GPUs (``--mfu`` is the kernels' efficiency, bubble not
included) — also the mean over the pipeline ranks of their busy time on the virtual clock (``tpsim.plan.pipeline``
times each stage's F, B and W from these FLOPs). ``step_times`` takes the clock's two makespans without the
collectives (``tpsim.plan.pipeline``'s ``makespan_without_collectives_s`` and ``makespan_compute_only_s``: the
additive picture, which adds TP, DP and the embedding on its own), with and without the point-to-point
messages: ``bubble`` = makespan without messages − compute (the schedule's idle time at these stage costs; (p − 1)/m of compute under 1F1B only when every stage costs the same), ``pp`` = what the
messages add to the makespan (the exposed p2p time), TP, DP and the tied embedding's gradient all-reduce
(``embedding``, first and last stage) from ``tpsim.plan.comm``, outside the clock. Two step times, stated as
such: ``step`` adds everything (the makespan + TP + DP + embedding: nothing else overlapped); ``step_overlapped``
hides DP and PP behind compute (TP stays exposed: it sits between a layer's matmuls; so does the embedding's
all-reduce, which runs after the pipeline's last backward).
"""

from __future__ import annotations

from tpsim.pipeline.stage_clock import ROUNDING
from tpsim.plan.layout import Layout
from tpsim.plan.memory import layer_param_elements
from tpsim.plan.models import ModelSpec


def layer_flops(model: ModelSpec, lay: Layout, recompute: str | None = None) -> dict[str, float]:
    """``{"F", "B", "W"}`` FLOPs of one layer for one token (the whole TP group's; the module docstring)."""
    recompute = lay.recompute if recompute is None else recompute
    s, h = lay.seq_len, model.hidden
    weights = layer_param_elements(model, 1) - model.architecture.memory.layer_vector_elements(model)  # matmuls only
    attention = 4 * s * h
    forward = 2 * weights + attention
    redo = {"full": forward, "selective": attention}.get(recompute, 0)
    return {"F": float(forward), "B": float(2 * weights + 2 * attention + redo), "W": float(2 * weights)}


def head_flops(model: ModelSpec) -> dict[str, float]:
    """``{"F", "B", "W"}`` FLOPs of the LM head for one token: 2·h·V each."""
    return dict.fromkeys(("F", "B", "W"), float(2 * model.hidden * model.vocab))


def flops_per_step(model: ModelSpec, lay: Layout, recompute: str | None = None) -> float:
    """Training FLOPs of one step of ``lay.global_batch`` sequences (the module docstring's formula)."""
    tokens = lay.global_batch * lay.seq_len
    return float(tokens * (model.layers * sum(layer_flops(model, lay, recompute).values())
                           + sum(head_flops(model).values())))


def narayanan_flops(B: int, s: int, L: int, h: int, V: int, recompute: bool = False) -> float:
    """Narayanan et al. 2021's closed forms, for GPT: 72·B·s·L·h²·(1 + s/6h + V/12Lh), or 96·…(… + V/16Lh)."""
    if recompute:
        return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))


def step_times(compute: float, comm: dict[str, float], pipeline: float, no_p2p: float) -> dict[str, float]:
    """``{"compute", "tp", "dp", "embedding", "pp", "bubble", "pipeline", "step", "step_overlapped"}`` seconds,
    from the mean compute, the TP, DP and embedding times ``comm`` (no ``embedding``: 0) and the clock's
    makespans with (``pipeline``) and without messages."""
    bubble, pp, emb = no_p2p - compute, pipeline - no_p2p, comm.get("embedding", 0.0)
    if abs(bubble) <= ROUNDING * no_p2p:  # one stage, or equal ones never waiting: the same FLOPs summed twice
        bubble = 0.0
    exposed = compute + bubble + comm["tp"] + emb
    return {"compute": compute, "tp": comm["tp"], "dp": comm["dp"], "embedding": emb, "pp": pp, "bubble": bubble,
            "pipeline": pipeline, "step": pipeline + comm["tp"] + comm["dp"] + emb,
            "step_overlapped": exposed + max(0.0, comm["dp"] + pp - compute)}


def gemm_seconds(m: int, n: int, k: int, lay: Layout, gpu) -> float:
    """Seconds of one [m, k] × [k, n] matmul on one GPU (2·m·n·k FLOPs at its peak × ``lay.mfu``)."""
    return 2.0 * m * n * k / (gpu.peak(lay.dtype) * lay.mfu)
