"""One layout's plan: a ``Plan`` (the fields are documented in README, "Planning a real run").

    plan(model, layout) -> Plan(model, layout, per_gpu, cp, compute_classes_s, pipeline, time_s, flops_per_step,
                                model_flops_per_step, tflops_per_gpu, hardware_tflops_per_gpu, fits, sources)
    Plan.as_dict()       -> the same fields as one JSON-ready dict (``tpsim plan --json``)

The parts (``per_gpu``, ``time_s``, ``pipeline``, ...) are the JSON objects ``--json`` prints, read by key.

``tflops_per_gpu`` counts the model's FLOPs (no recompute: what Megatron-LM's and NeMo's tables call model
TFLOP/s), ``hardware_tflops_per_gpu`` the FLOPs the GPUs run (full recompute repeats each layer's forward: 4/3 of
the layers').
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from tpsim.pipeline.stage_clock import ROUNDING, compiled
from tpsim.plan.breakdown import compute_classes
from tpsim.plan.comm import links, ring_seconds, step_comm, tp_wire_bytes_per_layer
from tpsim.plan.pipeline_comm import stage_comm
from tpsim.plan.cp_terms import cp_terms
from tpsim.gpus import gpu as gpu_preset
from tpsim.plan.kernel_time import optimizer_seconds
from tpsim.plan.layout import Layout, check
from tpsim.plan.memory import activation_bytes_per_layer, busiest_stage, state_bytes_per_param, total_params
from tpsim.plan.models import ModelSpec
from tpsim.plan.pipeline import pipeline_terms
from tpsim.plan.timing import flops_per_step, step_times


def hidden_s(model: ModelSpec, lay: Layout, g, pipe: dict, times: dict) -> dict[str, float]:
    """What the overlap flags hid under compute, on the rank that ends last (not part of the step's sum): the DP
    sync's hidden seconds, ZeRO-1's all-gather's, and the TP collectives' that ``--tp-comm-overlap`` pipelined."""
    tail = pipe["after_schedule"]
    last = max(range(lay.pp), key=lambda r: tail["ends"][r])
    dp = tail["dp_streams"][last]["hidden_s"] if "dp_streams" in tail else 0.0
    gather = tail["param_gather"][last]["comm_s"] - times["dp_gather"] if "param_gather" in tail else 0.0
    gather = 0.0 if gather <= ROUNDING * max(times["dp_gather"], 1e-300) else gather  # all exposed, summed twice
    tp = 0.0
    if lay.tp_comm_overlap:
        split = compiled(lay.schedule, lay.pp, lay.microbatches, lay.vp).splits_backward
        full = stage_comm(model, replace(lay, tp_comm_overlap=False), g, split).sum() * lay.microbatches / lay.pp
        tp = full - times["tp"]
    return {"tp": tp, "dp": dp, "dp_gather": gather}


def optimizer_s(model: ModelSpec, lay: Layout, g, params: int) -> float:
    """The optimizer step of the busiest stage: its kernels and the clip norm's all-reduce over the world."""
    norm = ring_seconds("all_reduce", 4, lay.gpus, links(lay, g)["dp" if lay.gpus > lay.tp else "tp"])
    return optimizer_seconds(params, lay, g) + (norm if lay.gpus > 1 else 0.0)

SOURCES = {
    "model_state_bytes_per_param": "Megatron-LM distributed-optimizer table (docs/source/api-guide/dist_optimizer.md); "
                                   "ZeRO-2/3 shard the gradients / parameters too (Rajbhandari et al. 2019 §5)",
    "activation_bytes_per_layer": "GPT: Korthikanti et al. 2022 Table 2; Llama: derived from the architecture "
                                  "in Megatron's way of counting; tpsim's own extra terms apart (paper + extra = "
                                  "what tpsim's layers cache, checked by --validate)",
    "tp_wire_bytes": "tpsim.predict.formulas.predict_step (checked against every live run's trace)",
    "pp": "the schedule's own action lists (tpsim.pipeline) on the virtual clock: per-stage F, B, W from their "
          "kernels plus the alpha-beta TP collectives each issues, alpha-beta p2p messages, then the loss, "
          "embedding and DP collectives on each rank's comm stream (step_s); the bubble formula and p2p bytes of "
          "tpsim.predict.pipeline beside",
    "time": "each layer's kernels (tpsim.plan.kernels) on a roofline (tpsim.plan.kernel_time: GEMM and HBM "
            "efficiencies fitted once on 18 published runs, tpsim plan --published), or --mfu's flat model",
    "cp": "tpsim.predict.cp_comm's messages of every attention layer (what the live run sends), alpha-beta on "
          "the CP link; the ring's steps overlapped with the attention's blocks, the others exposed",
    "flops": "Narayanan et al. 2021: 72·B·s·L·h²·(1 + s/6h + V/12Lh); full recompute repeats the layers' forward",
}


@dataclass(frozen=True)
class Plan:
    """Everything the planner predicts for one layout (module docstring); ``as_dict()`` for JSON."""

    model: dict  # the ModelSpec's fields and params_total
    layout: dict  # the Layout's fields, gpus, microbatches, in_flight, and the GPU's memory and peak
    per_gpu: dict  # the busiest stage's GPU: params, stage, memory_bytes, bytes per param and per layer, wire bytes
    cp: dict  # context parallelism's bytes and time (tpsim.plan.cp_terms)
    compute_classes_s: dict  # time_s.compute by kernel class (tpsim.plan.breakdown)
    pipeline: dict  # the schedule on the virtual clock (tpsim.plan.pipeline)
    time_s: dict  # the step's time by part, and "step" (the critical path)
    flops_per_step: float  # the FLOPs the GPUs run (full recompute included)
    model_flops_per_step: float  # the model's FLOPs (no recompute)
    tflops_per_gpu: float  # model TFLOP/s per GPU (Megatron's, NeMo's tables)
    hardware_tflops_per_gpu: float  # with what recompute repeats
    fits: bool  # memory_bytes.total <= the GPU's usable bytes
    sources: dict  # where each term comes from

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def plan(model: ModelSpec, lay: Layout) -> Plan:
    """Everything the planner predicts for ``model`` on ``lay`` (``ConfigError`` if the layout is invalid)."""
    check(model, lay)
    g = gpu_preset(lay.gpu)
    mem = busiest_stage(model, lay)
    comm = step_comm(model, lay, g, int(mem["stage"]), int(mem["param_count"]))  # that stage's own
    flops, model_flops = flops_per_step(model, lay), flops_per_step(model, lay, "none")
    pipe = pipeline_terms(model, lay, g)
    times = step_times(pipe, optimizer_s(model, lay, g, int(mem["param_count"])), lay.overlap_param_gather)
    times["hidden"] = hidden_s(model, lay, g, pipe, times)
    memory_bytes = {k: int(round(mem[k])) for k in ("params", "grads", "optimizer", "activations", "total")}
    act = activation_bytes_per_layer(model, lay)
    return Plan(
        model={**model.as_dict(), "params_total": total_params(model)},
        layout={**lay.as_dict(), "gpu_memory_bytes": g.memory_bytes, "gpu_usable_bytes": g.usable_bytes,
                "peak_flops": g.peak(lay.dtype)},
        per_gpu={
            "params": int(mem["param_count"]),
            "stage": int(mem["stage"]),
            "memory_bytes": memory_bytes,
            "zero3_gathered_bytes": int(round(mem["zero3_gathered"])),  # of the activations (tpsim.plan.zero3)
            "model_state_bytes_per_param": state_bytes_per_param(lay.dtype, lay.zero, lay.grad_replicas),
            "activation_bytes_per_layer": act,
            "tp_wire_bytes_per_layer_per_microbatch": tp_wire_bytes_per_layer(model, lay),
            "wire_bytes_per_step": comm["wire_bytes"],
        },
        cp=cp_terms(model, lay, g, int(mem["stage"]), times["cp"]),
        compute_classes_s=compute_classes(model, lay, g),
        pipeline=pipe,
        time_s=times,
        flops_per_step=flops,
        model_flops_per_step=model_flops,
        tflops_per_gpu=model_flops / lay.gpus / times["step"] / 1e12,
        hardware_tflops_per_gpu=flops / lay.gpus / times["step"] / 1e12,
        fits=memory_bytes["total"] <= g.usable_bytes,
        sources=SOURCES,
    )
