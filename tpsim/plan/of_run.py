"""A live run as the planner sees it: the ``ModelSpec`` and ``Layout`` of a ``tpsim.config.RunConfig``.

One mapping, used wherever a live run and the planner must price the same thing — the demo's ``--clock GPU``
and ``tpsim plan --validate``'s pipeline cases:

    model_spec(config)        the architecture's sizes (vocab, hidden, layers, heads, KV heads, ffn, positions, tied)
    run_layout(run, gpu, mfu) ``Layout.of_run``: the run's Parallelism whole, the fields ``RUN_FIELDS`` names from
                              its other parts (sequence length, global batch, dtype, schedule, vp, layers per stage,
                              mfu, the DP overlaps and bucket size), its micro-batch (the DP replica's rows ÷
                              micro-batches); the GPU of its ``--clock``; p2p messages whole
    clock_costs(run, schedule, boundary, dtype)
                              what the live virtual clock charges (``tpsim.pipeline.clock.Costs``): ``unit(schedule)``
                              under ``--clock unit``; under a GPU the planner's own ``stage_costs`` (F, B, W a
                              (rank, chunk) from FLOPs at the GPU's peak × mfu), α + β·bytes on the link
                              ``links`` gives PP, the bytes those of the live boundary tensor, and every traced
                              collective priced as the planner prices it (``collective_seconds``: ``tpsim.cost``'s
                              steps·α + wire bytes·β on its group's link — tp and kv the TP link, embedding and
                              pp the PP link, dp the DP link; under --tp-comm-overlap a collective pipelined with
                              GEMMs (its records name them) only its exposed time, ``tpsim.plan.tp_overlap``)

The live boundary (``[b, s, h]``, ``[b, s/t, h]`` under SP, in the run's dtype) must hold exactly the planner's
``boundary_bytes``, and every message then costs exactly ``message_costs``' entry: both are checked, so a
mismatch is an error, never a silently different clock. The planner has no float64 peak (``GPU.peak`` gives the
16-bit one for every dtype but float32): a float64 run is charged at it, its messages at 8 bytes an element.
Pure arithmetic, no MPI.
"""

from __future__ import annotations

import numpy as np

from tpsim.config import RunConfig
from tpsim.cost import alpha_beta_time, ring_steps
from tpsim.nccl import message_bytes
from tpsim.config.clock_choice import UNIT_CLOCK
from tpsim.pipeline.actions import Schedule
from tpsim.pipeline.clock import Costs, unit
from tpsim.plan.comm import boundary_bytes, links
from tpsim.gpus import GPU, gpu as gpu_preset
from tpsim.plan.layout import Layout
from tpsim.plan.models import ModelSpec
from tpsim.plan.dp_overlap import piece_compute
from tpsim.plan.pipeline import head_seconds, layer_seconds, message_costs, stage_costs
from tpsim.plan.tp_overlap import exposed_seconds, gemms_seconds


def model_spec(config, name: str | None = None) -> ModelSpec:
    """The planner's ``ModelSpec`` of an architecture's config (``tpsim.arch``: GPTConfig, LlamaConfig)."""
    c = config
    return ModelSpec(name or f"live {c.arch}", c.arch, c.vocab, c.hidden, c.layers, c.heads, c.kv_heads, c.ffn,
                     c.max_positions, c.tied)


def run_layout(run: RunConfig, gpu: str | None = None, mfu: float | None = None) -> Layout:
    """The planner's ``Layout`` of ``run`` (module docstring) on ``gpu`` at ``mfu`` (default: the run's
    ``--clock`` GPU and ``--mfu``, else h100-80gb at the planner's 0.5)."""
    pipe = run.pipeline
    gpu = gpu or (pipe.clock if pipe.clock != UNIT_CLOCK else Layout.gpu)
    planner = {"mfu": mfu} if mfu is not None else {}  # else the run's --mfu (RUN_FIELDS)
    return Layout.of_run(run, gpu=gpu, p2p_scatter_gather=False, **planner)  # tpsim sends the whole boundary tensor


GROUP_LINKS = {"tp": "tp", "kv": "tp", "cp": "cp", "embedding": "pp", "pp": "pp", "dp": "dp"}  # a group -> its link


def collective_seconds(lay: Layout, gpu: GPU):
    """``(op, group, group size, wire bytes) -> seconds`` of one collective call of ``lay`` on ``gpu``: the α-β
    time of ``tpsim.cost`` on the link ``links`` gives its group (``GROUP_LINKS``); ValueError for a group the
    planner puts on no link."""
    link = links(lay, gpu)

    def seconds(op: str, group: str, size: int, wire: int, gemms=()) -> float:
        if group not in GROUP_LINKS:
            raise ValueError(f"a collective over group {group!r}: the planner prices groups {sorted(GROUP_LINKS)}")
        on = link[GROUP_LINKS[group]]
        if hasattr(on, "collective"):  # a group across nodes: NCCL's model, as the planner prices it (tpsim.nccl)
            comm = on.collective(op, message_bytes(op, wire, size), size)
        else:
            comm = alpha_beta_time(ring_steps(op, size), wire, on.alpha, on.beta)
        if gemms:  # pipelined with these GEMMs (--tp-comm-overlap): only what it leaves exposed
            return exposed_seconds(comm, gemms_seconds(gemms, lay, gpu), size)
        return comm
    return seconds


def clock_costs(run: RunConfig, schedule: Schedule, boundary: tuple[int, ...], dtype) -> Costs:
    """What the live clock of ``run`` charges for ``schedule`` (module docstring); ``boundary`` and ``dtype``:
    the live message tensor's shape and dtype. ValueError when the live message is not the planner's."""
    if run.pipeline.clock == UNIT_CLOCK:
        return unit(schedule)
    model, lay = model_spec(run.model), run_layout(run)
    if (lay.schedule, lay.pp, lay.microbatches, lay.vp) != (schedule.name, schedule.pp, schedule.microbatches,
                                                            schedule.vp):
        raise ValueError(f"the run's layout ({lay.schedule}, pp {lay.pp}, m {lay.microbatches}, vp {lay.vp}) is "
                         f"not the schedule's ({schedule.name}, pp {schedule.pp}, m {schedule.microbatches}, "
                         f"vp {schedule.vp})")
    live = int(np.prod(boundary)) * np.dtype(dtype).itemsize
    if live != boundary_bytes(model, lay):
        raise ValueError(f"a live message holds {live} bytes ({np.dtype(dtype).name} {tuple(boundary)}), the "
                         f"planner's boundary_bytes {boundary_bytes(model, lay)}")
    g = gpu_preset(lay.gpu)
    link = links(lay, g)["pp"]
    if not np.all(message_costs(model, lay, g) == link.alpha + link.beta * live):
        raise ValueError("the planner's message_costs are not alpha + beta x bytes of one boundary tensor")
    table = stage_costs(model, lay, g).tolist()  # [rank][chunk][F, B, W] seconds, as Python floats
    compute = {op: (lambda i: lambda rank, chunk, j: table[rank][chunk][i])(i) for i, op in enumerate("FBW")}
    return Costs(compute, alpha=link.alpha, beta=link.beta, message_bytes=lambda direction, j, stage: live,
                 collective=collective_seconds(lay, g),
                 pieces=piece_compute(model, lay, g, {"layer": layer_seconds(model, lay, g),
                                                      "head": head_seconds(model, lay, g)}))


def clock_words(run: RunConfig) -> str:
    """How the clock charges, in words (``pipeline.json``'s ``clock``, the BUBBLE CHECK line)."""
    pipe = run.pipeline
    if pipe.clock == UNIT_CLOCK:
        costs = "F 1, B 2" if pipe.vp == 1 else f"F 1, B 2 a stage; a chunk 1/{pipe.vp} of that"
        return f"unit ({costs}, messages free)"
    lay = run_layout(run)
    g = gpu_preset(lay.gpu)
    link = links(lay, g)["pp"]
    peak = f"{g.peak(lay.dtype) / 1e12:g} TFLOP/s" + (" (the 16-bit peak; the planner has none for float64)"
                                                      if lay.dtype == "float64" else "")
    costs = (f"each stage's kernels on its roofline (peak {peak}, HBM {g.hbm_bytes_per_s / 1e12:g} TB/s)"
             if lay.mfu is None else f"each stage's FLOPs at {peak} x mfu {lay.mfu}")
    return (f"{g.name}: {costs}, {lay.dtype} messages of alpha {link.alpha:g} s + bytes / {link.bandwidth:g} B/s "
            f"on {link.name}")
