"""The collectives on the planner's pipeline clock: what each F, B and W issues, and what follows the schedule.

The issue's virtual clock (item 4) ends a collective at its group's latest arrival plus its α-β cost
(``tpsim.cost``). Inside a compute action the group is the stage's TP group, whose ranks run the same actions
with the same clocks, so the cost simply adds to the action's: one micro-batch of virtual stage s issues

    F   its layers' forward rows × layers, the first stage's embedding rows, the last stage's final norm, LM head
        and loss forward rows
    B   the backward rows (+ full recompute's repeated forward ones, Korthikanti et al. 2022 §5)
    W   (a split backward, ZB-H1) the weight gradients' own collectives, as the live chunks issue them
        (``tpsim.nn.module.deferred_weight_grads``): the SP norms' gradient all-reduce (phase sp_grad_sync),
        the replicated KV heads' gradient sum (group kv), and under SP the re-gather of each column-parallel
        layer's input — one call of every backward all-gather row but the embedding's (attention's qkv, the
        MLP's first linear, the LM head; the other call of a layer's row is the row-parallel g-bar's, in B)

— ``predict_step``'s rows of ``tpsim.plan.comm`` (the batch broadcast is not the step's: the clock starts with
the batch read; the clip norm's all-reduce is the optimizer's), each steps·α + wire bytes·β on the TP link.
``stage_comm`` is their seconds per [rank][chunk][F, B, W], added to ``stage_costs``' FLOPs. Under
``Layout.tp_comm_overlap`` the collectives a live run pipelines with a GEMM are charged their exposed time
instead (``tpsim.plan.tp_overlap``), as the live clock charges them.

Around the schedule (``tpsim.live_pipeline.step``), on the link each group has (``tpsim.plan.of_run.GROUP_LINKS``):

    before     the last stage's loss normalizer, an all-reduce of [1] over DP × CP (dp·cp > 1): its clock
               starts there
    after      the last stage's loss all-reduce of [1] over DP × CP; the loss broadcast of [2] over the
               pipeline group, which ends every stage at the pipeline's latest clock + its cost; the tied
               embedding's gradient all-reduce over the first and the last stage (``embedding_collectives``);
               the DP gradient sync of each stage (``dp_collectives``' all-reduce; ZeRO-1's reduce-scatter —
               its all-gather of the updated parameters belongs to the optimizer step, as the clip norm does;
               ZeRO-3's only for the tied embedding's held bucket under a pipeline: each piece's reduce-scatter
               runs inside its backward, ``tpsim.plan.zero3_time``)

``step_s``: the latest clock after the last of them, the step's virtual time. MPI-free.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tpsim.phases import FORWARD, SP_GRAD_SYNC
from tpsim.plan.comm import (EMBEDDING_GROUP, in_first_layer, rows_seconds, dp_collectives, embedding_collectives,
                             end_rows, links, ring_seconds, tp_rows)
from tpsim.gpus import GPU
from tpsim.plan.layout import Layout, rank_layers, virtual_stage_layers
from tpsim.plan.memory import STATE_BYTES, stage_param_elements
from tpsim.plan.models import ModelSpec
from tpsim.plan import tp_overlap
from tpsim.plan.zero3 import held_bucket

LOSS_BYTES = 8  # the loss scalars travel as float64: the normalizer and the loss [1], the broadcast [2]


def by_action(model: ModelSpec, rows, split: bool, recompute: str = "none") -> dict[str, list]:
    """``rows`` sorted into the compute actions that issue them, ``{"F", "B", "W"}`` (the module docstring;
    W empty unless the schedule splits the backward)."""
    embed = model.architecture.config.layer_names.embed
    out: dict[str, list] = {"F": [], "B": [], "W": []}
    for r in rows:
        calls = r.calls or 1
        if r.phase == FORWARD:
            out["F"].append(r)
        elif r.group == "kv" or r.phase == SP_GRAD_SYNC:
            out["W"].append(r)
        elif r.op == "all_gather" and r.layer != embed:  # one call re-gathers a column-parallel layer's input
            one = replace(r, calls=1, bytes=r.bytes // calls, wire_bytes=r.wire_bytes // calls)
            out["W"].append(one)
            if calls > 1:
                out["B"].append(replace(r, calls=calls - 1, bytes=r.bytes - one.bytes,
                                        wire_bytes=r.wire_bytes - one.wire_bytes))
        else:
            out["B"].append(r)
    if recompute == "full":
        out["B"] += out["F"]
    if not split:
        out["B"], out["W"] = out["B"] + out["W"], []
    return out


def piece_comm(model: ModelSpec, lay: Layout, gpu: GPU, split: bool) -> dict[str, list[float]]:
    """Seconds of the collectives of one micro-batch's F, B and W on one GPU: ``{"layer", "embedding", "head"}``
    (one layer's; the first stage's embedding's; the last stage's final norm, LM head and loss), each [F, B, W]."""
    link, rows = links(lay, gpu)["tp"], tp_rows(model, lay)
    ops = ("F", "B", "W")
    hidden = tp_overlap if lay.tp_comm_overlap else None  # --tp-comm-overlap: pipelined ones at their exposed time

    def seconds(of, overlaps=None) -> list[float]:
        if hidden is None or overlaps is None:
            return [rows_seconds(of[op], link) for op in ops]
        return [hidden.action_seconds(of[op], overlaps[op], link, lay, gpu) for op in ops]
    return {"layer": seconds(by_action(model, [r for r in rows if in_first_layer(model, r)], split, lay.recompute),
                             hidden and hidden.layer_overlaps(model, lay)),
            "embedding": seconds(by_action(model, end_rows(model, lay, True, False, rows, batch=False), split)),
            "head": seconds(by_action(model, end_rows(model, lay, False, True, rows, batch=False), split),
                            hidden and hidden.head_overlaps(model, lay))}


def stage_comm(model: ModelSpec, lay: Layout, gpu: GPU, split: bool) -> np.ndarray:
    """Seconds of the collectives of one micro-batch's F, B and W on one GPU: ``[rank][chunk][op]``."""
    parts = piece_comm(model, lay, gpu, split)
    layer, first, last = parts["layer"], parts["embedding"], parts["head"]
    layers, top = virtual_stage_layers(model, lay), lay.pp * lay.vp - 1
    out = np.zeros((lay.pp, lay.vp, 3))
    for r in range(lay.pp):
        for c in range(lay.vp):
            s = c * lay.pp + r
            out[r, c] = [layers[s] * layer[i] + (s == 0) * first[i] + (s == top) * last[i] for i in range(3)]
    return out


def loss_normalizer_s(lay: Layout, gpu: GPU) -> float:
    """The last stage's all-reduce of its valid-token count over DP, before the schedule (0 at dp 1)."""
    n = lay.grad_replicas  # the tokens of a step are cut over DP and CP
    return ring_seconds("all_reduce", LOSS_BYTES, n, links(lay, gpu)["dp"]) if n > 1 else 0.0


def start_times(lay: Layout, gpu: GPU) -> list[float]:
    """Each pipeline rank's clock when its schedule starts: the last stage after the loss normalizer."""
    return [0.0] * (lay.pp - 1) + [loss_normalizer_s(lay, gpu)]


def after_schedule(model: ModelSpec, lay: Layout, gpu: GPU, finish, dp_buckets=None) -> dict:
    """The collectives after the schedule from each rank's ``finish`` on the clock: ``{"loss_s", "embedding_s",
    "dp_s"}`` (each rank's cost of each) and ``ends`` (each rank's clock after them), ``step_s`` (their latest),
    ``before_dp`` (each rank's clock when its DP sync starts: ``tpsim.plan.dp_overlap`` puts it on a stream).
    ``dp_buckets``: each pipeline rank's DP gradient buckets in bytes, each its own all-reduce (ZeRO-1: its own
    reduce-scatter), as a live run's ``GradSync`` cut them; None: one bucket of the stage's gradients."""
    link, p = links(lay, gpu), lay.pp
    loss = [0.0] * p
    loss[-1] = loss_normalizer_s(lay, gpu)  # the loss's own all-reduce over DP: the normalizer's twin
    latest = max(t + c for t, c in zip(finish, loss))
    bcast = ring_seconds("broadcast", 2 * LOSS_BYTES, p, link["pp"])
    emb = [sum(ring_seconds(op, n, EMBEDDING_GROUP, link["pp"]) for op, n in embedding_collectives(model, lay, r))
           for r in range(p)]
    layers, group = rank_layers(model, lay), lay.grad_replicas  # dp·cp ranks average the gradients
    dp = [sum(ring_seconds(op, n, group, link["dp"])
              for op, n in dp_collectives(lay, stage_param_elements(model, lay.tp, p, r, layers[r]))[:1])
          for r in range(p)]  # ZeRO-1: the reduce-scatter (its all-gather: tpsim.plan.param_gather)
    if lay.zero_stage.buckets_at_units:  # ZeRO-3: each piece scattered in its backward (plan.zero3_time), but the
        g_bytes = STATE_BYTES[lay.dtype][1]  # tied embedding's held bucket: once, after its embedding-group sum
        dp = [sum(ring_seconds("reduce_scatter", held_bucket(model, lay, c * p + r) * g_bytes, group, link["dp"])
                  for c in range(lay.vp) if held_bucket(model, lay, c * p + r)) if group > 1 else 0.0
              for r in range(p)]
    if dp_buckets is not None:  # the live run's own buckets: one collective each, α paid per bucket
        op = lay.zero_stage.grad_collective
        dp = [sum(ring_seconds(op, n, group, link["dp"]) for n in buckets) if group > 1 else 0.0
              for buckets in dp_buckets]
    ends = [latest + bcast + e + d for e, d in zip(emb, dp)]
    return {"loss_s": [c + bcast for c in loss], "embedding_s": emb, "dp_s": dp, "ends": ends,
            "before_dp": [latest + bcast + e for e in emb], "step_s": max(ends)}

