"""Compute time: the model's FLOPs per step at the GPU's peak × MFU, the pipeline bubble, and the step.

FLOPs (Narayanan et al. 2021, arXiv:2104.04473, Appendix): a matmul of a [tokens, k] by a [k, n] costs 2·k·n
FLOPs a token forward and twice that backward, so training costs 6 FLOPs per weight per token, plus attention's
QKᵀ and AV, 4·s·h a token a layer forward (12·s·h in all). For GPT (12h² weights a layer, V·h in the logits):

    F = 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h))           (B sequences of s tokens per step)

— Narayanan et al.'s formula without recomputation; their 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) is the same with
full recompute, which repeats each layer's forward (×4/3 on the layers, the logits not). Selective recompute
repeats only attention's QKᵀ and AV forward (+4·B·s²·h·L). Llama: the same rule with its own weights a layer
(2·h·(a + g)·d + 3·h·f).

Time: ``compute = F / (N · peak · mfu)`` with N = tp·pp·dp GPUs (``--mfu`` is the kernels' efficiency, bubble not
included); ``bubble = compute · (p − 1)/m`` (1F1B, Narayanan et al. §2.2.1); communication from
``tpsim.plan.comm``. Two step times, stated as such: ``step`` adds everything (nothing overlapped);
``step_overlapped`` hides DP and PP behind compute (TP stays exposed: it sits between a layer's matmuls).
"""

from __future__ import annotations

from tpsim.plan.layout import Layout
from tpsim.plan.memory import layer_param_elements
from tpsim.plan.models import ModelSpec


def flops_per_step(model: ModelSpec, lay: Layout, recompute: str | None = None) -> float:
    """Training FLOPs of one step of ``lay.global_batch`` sequences (the module docstring's formula)."""
    recompute = lay.recompute if recompute is None else recompute
    tokens, s, h, L = lay.global_batch * lay.seq_len, lay.seq_len, model.hidden, model.layers
    weights = layer_param_elements(model, 1) - model.architecture.memory.layer_vector_elements(model)  # matmuls only
    layer_fwd = 2 * weights + 4 * s * h  # per token
    total = tokens * L * 3 * layer_fwd + 6 * tokens * h * model.vocab
    if recompute == "full":
        total += tokens * L * layer_fwd
    elif recompute == "selective":
        total += tokens * L * 4 * s * h
    return float(total)


def narayanan_flops(B: int, s: int, L: int, h: int, V: int, recompute: bool = False) -> float:
    """Narayanan et al. 2021's closed forms, for GPT: 72·B·s·L·h²·(1 + s/6h + V/12Lh), or 96·…(… + V/16Lh)."""
    if recompute:
        return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))


def step_times(compute: float, lay: Layout, comm: dict[str, float]) -> dict[str, float]:
    """``{"compute", "tp", "dp", "pp", "bubble", "step", "step_overlapped"}`` seconds."""
    bubble = compute * (lay.pp - 1) / lay.microbatches
    exposed = compute + bubble + comm["tp"]
    return {"compute": compute, **comm, "bubble": bubble, "step": exposed + comm["dp"] + comm["pp"],
            "step_overlapped": exposed + max(0.0, comm["dp"] + comm["pp"] - compute)}
