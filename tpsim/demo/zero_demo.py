"""The demo's ZeRO reports (``--zero 1``, ``--zero 2``): the extra formula arguments and the model-state table.

``gpt_tour`` calls these so that its own flow stays the same with and without ZeRO; the sync and the
optimizer themselves are built in ``tpsim.demo.optimizer_setup``.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.config import RunConfig
from tpsim.nn.module import Module
from tpsim.predict.model_state import (format_model_state, layout_for, measure_model_state, zero_buffer_elements,
                                     zero_optimizer_bytes)
from tpsim.train.protocol import OptimizerProtocol


def grad_bytes_of(run: RunConfig, sync) -> int | None:
    """``predict_step``'s DP bytes under ZeRO: the padded buckets' (None: every parameter's, the default)."""
    return sync.total_bytes if run.parallel.zero else None


def held_of(sync) -> tuple[int, int] | None:
    """ZeRO-2's ``(bytes, buckets)`` held for the tied embedding's sum (reduce-scattered once a step, the rest
    once a micro-batch: ``tpsim.predict.pipeline_comm.zero2_reduce_scatter``); None for any other sync."""
    if sync.zero_stage != 2:
        return None
    held = sync.sharded.held
    return sum(sync.buckets[i].nbytes for i in held), len(held)


def _dtype_name(model: Module) -> str:
    return str(next(p for _, p in model.named_parameters()).dtype)


def state_table(model: Module, optimizer: OptimizerProtocol, grid: ProcessGrid) -> str:
    """Rank 0's model state per parameter, measured from the live arrays at rest (after a step), beside the
    formula; ZeRO-2's gradients are its owned slices, checked exactly like the optimizer's."""
    zero = optimizer.zero_stage  # > 0: the slices of a DistributedOptimizer
    itemsize = next(p for _, p in model.named_parameters()).itemsize
    grads = None
    if zero:
        sizes = dict((n, p.size) for n, p in model.named_parameters())
        elements = [sum(sizes[n] for n in b.names) for b in optimizer.buckets]
        grad_itemsize = np.dtype(optimizer.buckets[0].dtype).itemsize
        predicted = zero_optimizer_bytes(elements, grid.replicas, grad_itemsize, len(optimizer.rule.slots),
                                         main_param_bytes=4 * optimizer.half)
        if zero >= 2:  # the owned slices of the padded buckets
            grads = zero_buffer_elements(elements, grid.replicas) // grid.replicas * grad_itemsize
    else:  # AdamW's two slots (and, in 16 bits, the float32 main parameters) for every parameter
        predicted = layout_for(itemsize).sharded * sum(p.size for _, p in model.named_parameters())
    how = f"ZeRO-{zero} over DP {grid.replicas}" if zero else "AdamW on every DP rank"
    title = f"Model state per parameter on rank 0 ({how}, {_dtype_name(model)}, live arrays):"
    return format_model_state(measure_model_state(model, optimizer), layout_for(itemsize), grid.replicas, zero,
                              predicted, title=title, grads_formula=grads)
