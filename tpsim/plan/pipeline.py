"""The planner's pipeline terms, from the schedule itself: its action lists run on the virtual clock at real size.

No formula stands in for the schedule. ``pipeline_terms(model, layout, gpu)`` builds ``--schedule`` for pp ranks,
m micro-batches and ``--vp`` chunks (``tpsim.pipeline.schedules.build``, checked, compiled once:
``tpsim.pipeline.stage_clock``) and times it with

- **per-stage costs from FLOPs**: virtual stage s runs its layers (``--pp-layers``, or L/(p·v) each) on
  b·s tokens a micro-batch, one GPU of its TP group doing 1/t of them at the GPU's peak × ``--mfu``;
  ``tpsim.plan.timing.layer_flops`` splits a layer into F, B (input gradient) and W (weight gradient), the last
  stage adds the LM head (``head_flops``; the first stage's embedding is a gather, no FLOPs). A schedule that
  does not split the backward (afab, 1f1b, interleaved) runs B + W as one B;
- **the collectives each action issues**, one registered term a feature (``tpsim.plan.stage_terms``), added to
  the action's cost in the table's order:
  - TP (``tpsim.plan.pipeline_comm.stage_comm``): a layer's TP collectives, the embedding's on the first
    stage, the head's and the loss's on the last; a split backward's weight-gradient ones in W; each
    steps·α + wire bytes·β on the TP link;
  - context parallelism's messages (``tpsim.plan.cp_terms``): what a layer's attention leaves exposed of them,
    in its F and B (``ranks[r]["cp_s"]`` says how much of ``collectives_s``);
  - ZeRO-3's per-piece all-gathers and reduce-scatters (``tpsim.plan.zero3_time``): what the stream,
    prefetching one piece ahead, leaves exposed in each F, B and W (``ranks[r]["zero3_s"]`` of
    ``collectives_s``); ZeRO-3 has no DP sync after the schedule and no parameter all-gather after the step;
- **point-to-point messages** of b·s·h elements (÷ t under SP) at the layout's bytes, each α + β·bytes on the
  link ``tpsim.plan.comm.links`` gives PP (NVLink while tp·pp GPUs fit in a node, else InfiniBand);
- **the collectives around the schedule** (``pipeline_comm.after_schedule``): the last stage starts after the
  loss normalizer's all-reduce over DP; after it the loss's all-reduce and broadcast, the tied embedding's
  gradient all-reduce and the DP gradient sync end at their group's latest clock plus their cost.

It returns what ``tpsim plan --json`` prints as ``pipeline``: ``step_s`` (the step on the clock: the schedule and
every collective around it, what a live run's ``--clock GPU`` reproduces), ``after_schedule`` (each rank's cost
of those collectives), the makespan with everything in the schedule, without the messages, without the
collectives (``makespan_without_collectives_s``) and with neither (``makespan_compute_only_s``), the
bubble Σ idle / (p · makespan) measured on that timeline beside the schedule's unit-cost formula
(``tpsim.predict.pipeline.bubble_fraction``), the p2p bytes of one replica from the schedule's sends beside
2·m·(v·p − 1)·b·s·h·e (÷ t), and per rank its layers, busy and idle seconds, peak micro-batches in flight and
sends. The measured bubble is larger than the formula's whenever the ranks are not equally loaded — the last
stage carries the LM head, ``--pp-layers`` can be uneven — because the pipeline runs at its slowest rank's pace
while the others wait, and when messages sit on the critical path. Pure arithmetic, MPI-free.
"""

from __future__ import annotations

import numpy as np

from tpsim.pipeline.stage_clock import compiled, in_flight_peak, timed
from tpsim.plan import dp_overlap, param_gather
from tpsim.plan.comm import boundary_bytes, links, ring_seconds
from tpsim.gpus import GPU
from tpsim.plan.layout import Layout, rank_layers, virtual_stage_layers
from tpsim.plan.memory import ACT_BYTES
from tpsim.plan.models import ModelSpec
from tpsim.plan.pipeline_comm import after_schedule, start_times
from tpsim.plan.stage_terms import charged, stage_terms
from tpsim.plan.kernel_time import head_seconds, layer_seconds
from tpsim.predict import pipeline as formula


def stage_costs(model: ModelSpec, lay: Layout, gpu: GPU) -> np.ndarray:
    """Seconds of F, B and W of one micro-batch on one GPU: ``[rank][chunk][op]`` (module docstring)."""
    layers, last = virtual_stage_layers(model, lay), lay.pp * lay.vp - 1
    per_layer, head = layer_seconds(model, lay, gpu), head_seconds(model, lay, gpu)
    split = compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp).splits_backward
    out = np.zeros((lay.pp, lay.vp, 3))
    for r in range(lay.pp):
        for c in range(lay.vp):
            s = c * lay.pp + r
            f, b, w = (layers[s] * per_layer[op] + (s == last) * head[op] for op in ("F", "B", "W"))
            out[r, c] = (f, b, w) if split else (f, b + w, 0.0)
    return out


def message_seconds(model: ModelSpec, lay: Layout, gpu: GPU) -> float:
    """One message: α + β·bytes on the PP link; with Megatron's scatter/gather (``p2p_scatter_gather``, plain
    TP: every TP rank holds the whole [s, b, h] tensor) each TP rank sends 1/t of it and the receivers
    all-gather it on the TP link (Narayanan et al. 2021 §4.1)."""
    link, nbytes = links(lay, gpu), boundary_bytes(model, lay)
    if lay.p2p_scatter_gather and lay.tp > 1 and not lay.sp:
        return link["pp"].alpha + link["pp"].beta * nbytes / lay.tp + ring_seconds("all_gather", nbytes, lay.tp,
                                                                                   link["tp"])
    return link["pp"].alpha + link["pp"].beta * nbytes


def message_costs(model: ModelSpec, lay: Layout, gpu: GPU) -> np.ndarray:
    """Seconds of one message, ``[sender's virtual stage][direction F, B]`` (``message_seconds``)."""
    return np.full((lay.pp * lay.vp, 2), message_seconds(model, lay, gpu))


def simulate(lay: Layout, compute: np.ndarray, message: np.ndarray, collectives: np.ndarray | None = None,
             start=None, timer=timed) -> dict:
    """Time ``lay``'s schedule under ``compute[rank][chunk][op]`` seconds (plus ``collectives``, the same shape),
    ``message[stage][direction]`` seconds and each rank's ``start``: the ``pipeline`` dict (module docstring)
    less what needs the model (layers, bytes, the collectives after the schedule)."""
    c = compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp)
    charged = compute if collectives is None else compute + collectives
    quiet = np.zeros_like(message)
    t, free = timer(c, charged, message, start), timer(c, charged, quiet, start)  # timer: with gathers' waits
    ungated = free if timer is timed else timed(c, charged, quiet, start)
    on_time = ungated if start is None else timed(c, charged, quiet)  # the last stage not held back
    bare, alone = timed(c, compute, message), timed(c, compute, quiet)
    peaks = in_flight_peak(c, np.ones((lay.pp, lay.vp)))
    p, m, v = lay.pp, lay.microbatches, lay.vp
    bubble = formula.bubble_fraction(lay.schedule, p, m, v)
    return {"schedule": lay.schedule, "pp": p, "vp": v, "microbatches": m,
            "bubble_fraction": {"measured": t.bubble_fraction, "formula": bubble},
            "messages": sum(c.sends), "makespan_s": t.step, "makespan_without_p2p_s": free.step,
            "makespan_without_collectives_s": bare.step, "makespan_compute_only_s": alone.step,
            "start_exposed_s": ungated.step - on_time.step, "gather_exposed_s": free.step - ungated.step,
            "ranks": [{"rank": r, "busy_s": t.busy[r], "collectives_s": t.busy[r] - bare.busy[r], "idle_s": t.idle[r],
                       "finish_s": t.finish[r], "peak_in_flight": round(peaks[r]), "sends": c.sends[r]}
                      for r in range(p)]}


def pipeline_terms(model: ModelSpec, lay: Layout, gpu: GPU, dp_buckets=None) -> dict:
    """The planner's pipeline terms of ``lay`` (a valid layout) on ``gpu`` (module docstring); ``dp_buckets``: each
    rank's DP gradient buckets when they are known (a live run's: bytes, or ``BucketSpec``s that also say which
    piece finishes each, needed for ``lay.overlap_grad_reduce``), else one bucket a stage. At dp > 1 the buckets
    run on each rank's comm stream (``tpsim.plan.dp_overlap``): ``after_schedule["dp_streams"]`` per rank."""
    compute = stage_costs(model, lay, gpu)
    split = compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp).splits_backward
    message, start = message_costs(model, lay, gpu), start_times(lay, gpu)
    tables = {"layer": layer_seconds(model, lay, gpu), "head": head_seconds(model, lay, gpu)}
    terms = stage_terms(model, lay, gpu, tables, split)  # each feature's collectives in F, B, W (TP, CP, ZeRO-3)
    comm = charged(terms)
    replicas = lay.grad_replicas  # dp·cp ranks average the gradients; ZeRO-3 syncs inside the actions instead
    buckets = dp_overlap.specs(model, lay, dp_buckets) if replicas > 1 and not lay.zero_stage.buckets_at_units \
        else None
    gathers = [param_gather.gather_seconds(lay, gpu, b) for b in buckets] \
        if buckets and lay.zero_stage.gathers_after_step else None
    timer = param_gather.timer(model, lay, gpu, tables, buckets, gathers) if gathers and lay.overlap_param_gather \
        else timed
    out = simulate(lay, compute, message, comm, start, timer)
    sizes = None if buckets is None else [[b.nbytes for b in r] for r in buckets]
    tail = after_schedule(model, lay, gpu, [r["finish_s"] for r in out["ranks"]], sizes)
    if buckets is not None:  # the DP buckets on each rank's comm stream, overlapped or not (tpsim.plan.dp_overlap)
        streams = dp_overlap.dp_terms(model, lay, gpu, tables, compute + comm, message, start, tail["before_dp"],
                                      buckets, timer)
        tail["ends"] = [s.end for s in streams]
        tail["dp_streams"] = [dp_overlap.stream_dict(s) for s in streams]
    if gathers is not None:  # ZeRO-1's all-gathers: waited at the forward's pieces, or all after the DP sync
        tail["param_gather"] = param_gather.terms(lay, gathers, timer, compute + comm, message, start, tail["ends"])
        tail["ends"] = [g["end_s"] for g in tail["param_gather"]]
    tail["step_s"] = max(tail["ends"])
    out["step_s"], out["after_schedule"] = tail.pop("step_s"), tail
    want = formula.p2p_bytes(lay.schedule, lay.pp, lay.microbatches, lay.vp, micro_batch=lay.micro_batch,
                             seq_len=lay.local_seq, hidden=model.hidden, bytes_per_element=ACT_BYTES[lay.dtype],
                             tp=lay.tp, sequence_parallel=lay.sp)
    out["p2p_bytes"] = {"measured": out["messages"] * boundary_bytes(model, lay), "formula": want}
    layers = rank_layers(model, lay)
    for r, rank in enumerate(out["ranks"]):
        rank["layers"] = layers[r]
        for name, seconds in terms.items():  # of collectives_s: every action once a micro-batch
            if name != "tp":
                rank[f"{name}_s"] = float(seconds[r].sum() * lay.microbatches)
    out["stages"] = []
    for s, n in enumerate(virtual_stage_layers(model, lay)):
        r, c = s % lay.pp, s // lay.pp
        out["stages"].append({"virtual_stage": s, "rank": r, "chunk": c, "layers": n,
                              **{f"{op}_s": float(compute[r, c, i]) for i, op in enumerate("FBW")},
                              **{f"{op}_collectives_s": float(comm[r, c, i]) for i, op in enumerate("FBW")}})
    return out
