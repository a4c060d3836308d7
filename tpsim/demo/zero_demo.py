"""The demo's ZeRO reports (``--zero 1``, ``--zero 2``): the extra formula arguments and the model-state table.

``tpsim.demo.tour`` calls these so that its own flow stays the same with and without ZeRO; the sync and the
optimizer themselves are built in ``tpsim.demo.optimizer_setup``.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.config import RunConfig
from tpsim.nn.module import Module
from tpsim.predict.model_state import (format_model_state, layout_for, measure_model_state, zero_buffer_elements,
                                     zero_optimizer_bytes)
from tpsim.table import human_bytes
from tpsim.train.protocol import OptimizerProtocol, zero_of


def grad_bytes_of(run: RunConfig, sync) -> int | None:
    """``predict_step``'s DP bytes under ZeRO: the padded buckets' (None: every parameter's, the default)."""
    return sync.total_bytes if run.parallel.zero_stage.shards_optimizer else None


def held_of(sync) -> tuple[int, int] | None:
    """ZeRO-2/3's ``(bytes, buckets)`` held for the tied embedding's sum (reduce-scattered once a step, the rest
    once a micro-batch: ``tpsim.predict.pipeline_comm.zero2_reduce_scatter``); None for any other sync."""
    if not zero_of(sync).shards_grads:
        return None
    held = sync.sharded.held
    return sum(sync.buckets[i].nbytes for i in held), len(held)


def _dtype_name(model: Module) -> str:
    return str(next(p for _, p in model.named_parameters()).dtype)


def state_table(model: Module, optimizer: OptimizerProtocol, grid: ProcessGrid) -> str:
    """Rank 0's model state per parameter, measured from the live arrays at rest (after a step), beside the
    formula; ZeRO-2's gradients are its owned slices, checked exactly like the optimizer's."""
    zero, stage = optimizer.zero_stage, zero_of(optimizer)  # sharded: the slices of a DistributedOptimizer
    itemsize = next(p for _, p in model.named_parameters()).itemsize
    grads = params = None
    if stage.shards_optimizer:
        sizes = dict((n, p.size) for n, p in model.named_parameters())
        elements = [sum(sizes[n] for n in b.names) for b in optimizer.buckets]
        grad_itemsize = np.dtype(optimizer.buckets[0].dtype).itemsize
        predicted = zero_optimizer_bytes(elements, grid.replicas, grad_itemsize, len(optimizer.rule.slots),
                                         main_param_bytes=4 * optimizer.half)
        owned = zero_buffer_elements(elements, grid.replicas) // grid.replicas  # elements of the owned slices
        grads = owned * grad_itemsize if stage.shards_grads else None
        params = owned * itemsize if stage.shards_params else None
    else:  # AdamW's two slots (and, in 16 bits, the float32 main parameters) for every parameter
        predicted = layout_for(itemsize).sharded * sum(p.size for _, p in model.named_parameters())
    how = f"ZeRO-{zero} over DP {grid.replicas}" if stage.shards_optimizer else "AdamW on every DP rank"
    title = f"Model state per parameter on rank 0 ({how}, {_dtype_name(model)}, live arrays):"
    text = format_model_state(measure_model_state(model, optimizer), layout_for(itemsize), grid.replicas, zero,
                              predicted, title=title, grads_formula=grads, params_formula=params)
    return text + in_flight_line(optimizer)


def in_flight_line(optimizer: OptimizerProtocol) -> str:
    """ZeRO-2/3: what is whole only for a while — the gradient buckets materialised at once and (ZeRO-3) the
    parameters gathered at once in the last step, at most, beside the whole buckets."""
    if not zero_of(optimizer).shards_grads:
        return ""
    whole = human_bytes(optimizer.total_bytes)
    line = (f"\n  in flight in the last step, at most: {human_bytes(optimizer.sharded.peak_bytes)} of gradient "
            f"buckets (of {whole} whole)")
    if optimizer.sharded_params is not None:
        line += f", {human_bytes(optimizer.sharded_params.peak_bytes)} of gathered parameters (one layer at a time)"
    return line
