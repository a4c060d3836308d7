"""Time: the model's FLOPs per step, and the step as the critical path of the virtual clock, broken into parts.

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

Time (``step_times``) is not a sum of terms: it is the pipeline's virtual clock at real size
(``tpsim.plan.pipeline``: every F, B and W of the schedule from its kernels, ``tpsim.plan.kernel_time``, with
the TP collectives it issues; the p2p messages; the loss, tied-embedding and DP collectives after the
schedule), then the optimizer step and ZeRO-1's parameter all-gather. The breakdown splits that critical path
into parts that add up to it exactly, each what the step *exposes*:

    compute      the ranks' mean busy time in F, B, W kernels
    tp           the ranks' mean time in TP collectives inside the actions (sequence parallelism's with
                 ``--tp-comm-overlap``: only what the GEMMs beside them do not hide)
    cp           the ranks' mean time in context parallelism's messages inside F and B: what the attention
                 beside them does not hide (``tpsim.plan.cp_terms``; 0 at cp 1)
    zero3_gather the ranks' mean time in ZeRO-3's per-piece all-gathers and reduce-scatters that the prefetching
                 comm stream leaves exposed inside F, B and W (``tpsim.plan.zero3_time``; 0 below stage 3)
    bubble       the makespan without messages − compute − tp: the schedule's idle time at these costs (less
                 the loss normalizer's delay of the last stage, counted in loss)
    pp           what the messages add to the makespan (exposed p2p)
    loss, embedding, dp
                 the collectives after the schedule on the rank that finishes last, and what the loss normalizer
                 before it delays the step (dp: its gradient sync —
                 with ``--overlap-grad-reduce`` only the part the backward did not hide; ZeRO-2: every
                 micro-batch's reduce-scatters, issued under the backward, what spills past its end)
    optimizer    the optimizer step's kernels (``optimizer_seconds``) and the clip norm's all-reduce
    dp_gather    ZeRO-1/2's all-gather of the updated parameters: after the DP sync, or with
                 ``--overlap-param-gather`` only the next forward's waits for it (``tpsim.plan.param_gather``)

``step`` is their sum, the clock's ``step_s`` + the optimizer; ``pipeline.after_schedule["dp_streams"]`` says what
of the DP sync ran under the backward instead (``hidden_s``).
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


def step_times(pipe: dict, optimizer: float, overlap_param_gather: bool = False) -> dict[str, float]:
    """The module docstring's breakdown from the planner's ``pipeline`` dict (``tpsim.plan.pipeline``: the DP
    streams and ZeRO-1's all-gathers on its clock) and the optimizer's seconds: every part and ``step``, their
    sum."""
    ranks, tail = pipe["ranks"], pipe["after_schedule"]
    last = max(range(len(ranks)), key=lambda r: tail["ends"][r])
    inside = pipe["gather_exposed_s"] if overlap_param_gather else 0.0  # what the forward's waits add to it
    gather = inside if overlap_param_gather else tail["param_gather"][last]["exposed_s"] if "param_gather" in tail \
        else 0.0
    compute = sum(r["busy_s"] - r["collectives_s"] for r in ranks) / len(ranks)
    cp = sum(r.get("cp_s", 0.0) for r in ranks) / len(ranks)  # context parallelism's, inside the collectives
    zero3 = sum(r.get("zero3_s", 0.0) for r in ranks) / len(ranks)  # ZeRO-3's exposed stream, inside them too
    tp = sum(r["collectives_s"] - r.get("cp_s", 0.0) - r.get("zero3_s", 0.0) for r in ranks) / len(ranks)
    late = pipe["start_exposed_s"]  # the loss normalizer before the last stage's schedule, where it delays it
    bubble = pipe["makespan_without_p2p_s"] - late - compute - tp - cp - zero3 - inside
    pp = pipe["makespan_s"] - pipe["makespan_without_p2p_s"]
    if abs(bubble) <= ROUNDING * pipe["makespan_without_p2p_s"]:  # one stage, or equal ones never waiting
        bubble = 0.0
    streams = tail.get("dp_streams")
    dp = streams[last]["exposed_s"] if streams else tail["dp_s"][last]
    embedding = tail["embedding_s"][last]
    loss = pipe["step_s"] - pipe["makespan_s"] - dp - embedding - (gather - inside) + late
    parts = {"compute": compute, "tp": tp, "cp": cp, "bubble": bubble, "pp": pp, "loss": loss, "embedding": embedding,
             "dp": dp, "optimizer": optimizer, "dp_gather": gather, "zero3_gather": zero3}
    return {**parts, "step": pipe["step_s"] + optimizer, "pipeline": pipe["makespan_s"]}


def gemm_seconds(m: int, n: int, k: int, lay: Layout, gpu) -> float:
    """Seconds of one [m, k] × [k, n] matmul on one GPU: ``tpsim.plan.kernel_time``'s roofline (or the flat
    ``--mfu``)."""
    from tpsim.plan.kernel_time import kernel_seconds
    from tpsim.plan.kernels import Kernel
    return kernel_seconds(Kernel("gemm", m, n, k), lay, gpu)
