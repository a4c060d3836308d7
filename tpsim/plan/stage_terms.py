"""What each feature adds to one micro-batch's F, B and W on one GPU: the planner's per-feature terms, one table.

The pipeline clock (``tpsim.plan.pipeline``) charges every action its compute (``stage_costs``) plus the seconds
of the collectives it issues. Each feature that issues collectives inside the actions gives those seconds as one
``[rank][chunk][op]`` array (op F, B, W) and registers it here, as an architecture registers in
``tpsim.arch.ARCHITECTURES``; the clock adds them in the table's order and reports each rank's share of every
term but TP's as ``{name}_s`` (``pipeline.ranks``):

    tp      the layers' TP collectives, the embedding's and the head's, the loss's (``pipeline_comm.stage_comm``;
            under ``--tp-comm-overlap`` their exposed part)
    cp      what context parallelism's messages leave exposed in each layer's attention (``cp_terms.stage_cp``)
    zero3   what ZeRO-3's per-piece all-gathers and reduce-scatters leave exposed on the comm stream, prefetched
            one piece ahead (``zero3_time.stage_zero3``)

A term that does not apply to a layout is zeros. A new feature that issues collectives inside F, B or W (the
experts' all-to-all) is one more entry. Pure arithmetic, MPI-free.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tpsim.gpus import GPU
from tpsim.plan.cp_terms import stage_cp
from tpsim.plan.layout import Layout
from tpsim.plan.models import ModelSpec
from tpsim.plan.pipeline_comm import stage_comm
from tpsim.plan.zero3_time import stage_zero3

# (model, layout, gpu, tables, split) -> seconds [rank][chunk][op]; tables: one layer's and the head's F, B, W
StageTerm = Callable[[ModelSpec, Layout, GPU, dict, bool], np.ndarray]

STAGE_TERMS: dict[str, StageTerm] = {
    "tp": lambda model, lay, gpu, tables, split: stage_comm(model, lay, gpu, split),
    "cp": lambda model, lay, gpu, tables, split: stage_cp(model, lay, gpu),
    "zero3": lambda model, lay, gpu, tables, split: stage_zero3(model, lay, gpu, tables),
}


def stage_terms(model: ModelSpec, lay: Layout, gpu: GPU, tables: dict, split: bool) -> dict[str, np.ndarray]:
    """Every registered term of ``lay`` (``STAGE_TERMS``' order), each ``[rank][chunk][op]`` seconds."""
    return {name: term(model, lay, gpu, tables, split) for name, term in STAGE_TERMS.items()}


def charged(terms: dict[str, np.ndarray]) -> np.ndarray:
    """The terms summed in the table's order: the collectives' seconds each action is charged."""
    total = None
    for seconds in terms.values():
        total = seconds if total is None else total + seconds
    return total
