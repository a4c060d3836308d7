"""Wire bytes per step by group, and their α-β time, on the busiest GPU.

**TP** comes from ``tpsim.predict.formulas.predict_step`` — the function every live run's FORMULA CHECK compares
its trace with — called for one micro-batch of a one-layer model of the architecture (``ModelSpec.config``):
the rows of block 0 (``transformer.h.0``, ``model.layers.0``) are one layer (plain TP 8·b·s·h·(t−1)/t elements,
Narayanan et al. 2021; SP the same bytes as all-gathers and reduce-scatters plus tpsim's re-gathers and
norm-gradient syncs: [2, h] for a LayerNorm, [h] for Llama's RMSNorm), the other rows the embedding, the loss
and the LM head. Llama's layer has the same f/g pattern (Megatron-LM splits its attention and SwiGLU MLP as it
does GPT's); when tp exceeds the KV heads, each replicated KV head's weight gradients [2, h, d] are all-reduced
over its tp/kv copies (group "kv", on the TP link), as tpsim.tp.gqa_attention does — gradients, so the planner
prices them at the layout's gradient bytes (fp32 main gradients under bf16), where ``predict_step`` given an
itemsize prices every tensor at that size.
Full recompute repeats each layer's forward collectives in the backward (Korthikanti et al. 2022, §5, "from the
paper": tpsim does not recompute); selective recompute adds none.

**DP**: the gradients of this GPU's parameters, all-reduced once per step (one bucket); with ``--zero 1``
reduce-scattered, then the updated parameters all-gathered (Megatron-LM's distributed optimizer).

**PP** (from the paper: tpsim does not run pipelines): per micro-batch an interior stage sends one activation
forward and one gradient backward, b·s·h elements each (÷ t under SP, where the boundary tensor is split).

Links: TP on the node's link when the TP group fits in a node, else the inter-node link; PP and DP inter-node
unless the whole job fits in one node.
"""

from __future__ import annotations

from dataclasses import replace

from tpsim.cost import alpha_beta_time, ring_steps, wire_bytes
from tpsim.phases import FORWARD
from tpsim.plan.gpus import GPU
from tpsim.plan.layout import Layout
from tpsim.plan.memory import ACT_BYTES, STATE_BYTES
from tpsim.plan.models import ModelSpec
from tpsim.config import RunConfig, dtype_name
from tpsim.predict.formulas import Prediction, predict_step

PER_STEP = ("clip_grad_norm",)  # once per step, not per micro-batch


def tp_rows(model: ModelSpec, lay: Layout, dtype: str | None = None) -> list[Prediction]:
    """``predict_step``'s TP rows (groups tp and kv) for one micro-batch of a one-layer model of ``model``."""
    name = dtype_name(dtype or lay.dtype)
    e, grad = ACT_BYTES[name], STATE_BYTES[name][1]
    one_layer = model.config(layers=1, max_positions=lay.seq_len)
    run = RunConfig.of(one_layer, tp=lay.tp, sp=lay.sp, batch_size=lay.micro_batch, seq_len=lay.seq_len)
    rows = predict_step(run, clip=True, itemsize=e)
    return [_as_grads(r, e, grad) if r.group == "kv" else r for r in rows if r.group in ("tp", "kv")]


def _as_grads(r: Prediction, itemsize: int, grad: int) -> Prediction:
    """A row of gradients (the replicated KV heads'), priced at ``grad`` bytes an element, not ``itemsize``."""
    n = r.bytes // itemsize * grad
    return replace(r, bytes=n, wire_bytes=wire_bytes(r.op, n // (r.calls or 1), r.group_size) * (r.calls or 1))


def _is_layer(model: ModelSpec, r: Prediction) -> bool:
    return r.layer.startswith(f"{model.architecture.config.layer_names.block}.0.")


def tp_layer_rows(model: ModelSpec, lay: Layout, dtype: str | None = None) -> list[Prediction]:
    """One layer's TP collectives for one micro-batch, with full recompute's repeated forward ones."""
    rows = [r for r in tp_rows(model, lay, dtype) if _is_layer(model, r)]
    if lay.recompute == "full":
        rows += [r for r in rows if r.phase == FORWARD]
    return rows


def tp_wire_bytes_per_layer(model: ModelSpec, lay: Layout, dtype: str | None = None) -> int:
    return sum(r.wire_bytes for r in tp_layer_rows(model, lay, dtype))


def _seconds(rows, link) -> float:
    t = 0.0
    for r in rows:
        t = alpha_beta_time((r.calls or 1) * ring_steps(r.op, r.group_size), r.wire_bytes, link.alpha, link.beta, t)
    return t


def links(lay: Layout, gpu: GPU) -> dict:
    """Which link each group uses (see the module docstring)."""
    one_node = lay.gpus <= lay.gpus_per_node
    return {"tp": gpu.intra if lay.tp <= lay.gpus_per_node else gpu.inter,
            "pp": gpu.intra if lay.tp * lay.pp <= lay.gpus_per_node else gpu.inter,
            "dp": gpu.intra if one_node else gpu.inter}


def dp_collectives(lay: Layout, stage_params: int) -> list[tuple[str, int]]:
    """``(op, logical bytes)`` of the DP gradient sync per step: an all-reduce of the gradients, or with ZeRO-1
    a reduce-scatter of the gradients and an all-gather of the updated parameters."""
    p_bytes, g_bytes, _ = STATE_BYTES[lay.dtype]
    if lay.zero:
        return [("reduce_scatter", stage_params * g_bytes), ("all_gather", stage_params * p_bytes)]
    return [("all_reduce", stage_params * g_bytes)]


def dp_wire_bytes(lay: Layout, stage_params: int) -> int:
    return sum(wire_bytes(op, n, lay.dp) for op, n in dp_collectives(lay, stage_params))


def step_comm(model: ModelSpec, lay: Layout, gpu: GPU, stage_params: int) -> dict[str, dict[str, float]]:
    """``{"wire_bytes": {"tp", "dp", "pp"}, "time_s": {...}}`` per step on the busiest GPU."""
    m, per_stage, link = lay.microbatches, model.layers // lay.pp, links(lay, gpu)
    rows = tp_rows(model, lay)
    layer = tp_layer_rows(model, lay)
    outside = [r for r in rows if not _is_layer(model, r) and r.layer not in PER_STEP]
    once = [r for r in rows if r.layer in PER_STEP]
    tp_wire = m * (per_stage * sum(r.wire_bytes for r in layer) + sum(r.wire_bytes for r in outside))
    tp_wire += sum(r.wire_bytes for r in once)
    tp_time = m * (per_stage * _seconds(layer, link["tp"]) + _seconds(outside, link["tp"])) + _seconds(once, link["tp"])
    dp_ops = dp_collectives(lay, stage_params)
    dp_wire = dp_wire_bytes(lay, stage_params)
    dp_time = sum(alpha_beta_time(ring_steps(op, lay.dp), wire_bytes(op, n, lay.dp), link["dp"].alpha,
                                  link["dp"].beta) for op, n in dp_ops)
    boundary = lay.micro_batch * lay.seq_len * model.hidden * ACT_BYTES[lay.dtype] // (lay.tp if lay.sp else 1)
    sends = 0 if lay.pp == 1 else 2 * m
    pp_wire = sends * boundary
    pp_time = sends * (link["pp"].alpha + boundary * link["pp"].beta)
    return {"wire_bytes": {"tp": tp_wire, "dp": dp_wire, "pp": pp_wire},
            "time_s": {"tp": tp_time, "dp": dp_time, "pp": pp_time}}
