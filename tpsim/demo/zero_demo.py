"""The demo's ZeRO-1 hooks (``--zero 1``): the gradient sync / optimizer, and the model-state table.

``gpt_tour`` calls these so that its own flow stays the same with and without ZeRO-1: ``make_sync`` returns a
``GradSync`` (plain DP) or a ``DistributedOptimizer`` (which is the gradient sync *and* the optimizer).
"""

from __future__ import annotations

from tpsim.comm import ProcessGrid
from tpsim.config import RunConfig
from tpsim.demo.arch import no_decay
from tpsim.nn.module import Module
from tpsim.predict.model_state import format_model_state, layout_for, measure_model_state, zero_optimizer_bytes
from tpsim.train import AdamW, DynamicLossScaler, GradSync
from tpsim.train.zero import DistributedOptimizer


def demo_adamw(model: Module, run: RunConfig) -> AdamW:
    """The demo's AdamW: decay 0.01, none on biases and norms (``tpsim.demo.arch.no_decay``)."""
    return AdamW(model, lr=run.optimizer.lr, weight_decay=run.optimizer.weight_decay, no_decay=no_decay)


def make_sync(model: Module, grid: ProcessGrid, run: RunConfig) -> GradSync | DistributedOptimizer:
    cap = run.optimizer.bucket_cap_bytes
    if run.parallel.zero:  # 16 bits: float32 main pieces; float16 also scales the loss
        prec = run.precision
        scaler = DynamicLossScaler(growth_interval=prec.loss_scale_interval) if prec.loss_scaling else None
        return DistributedOptimizer(demo_adamw(model, run), grid, bucket_cap_bytes=cap, loss_scaler=scaler)
    return GradSync(model, grid.dp_group, bucket_cap_bytes=cap)


def grad_bytes_of(run: RunConfig, sync) -> int | None:
    """``predict_step``'s DP bytes under ZeRO-1: the padded buckets' (None: every parameter's, the default)."""
    return sync.total_bytes if run.parallel.zero else None


def _dtype_name(model: Module) -> str:
    return str(next(p for _, p in model.named_parameters()).dtype)


def state_table(model: Module, optimizer, grid: ProcessGrid) -> str:
    """Rank 0's model state per parameter, measured from the live arrays, beside the formula."""
    distributed = isinstance(optimizer, DistributedOptimizer)
    itemsize = next(p for _, p in model.named_parameters()).itemsize
    if distributed:
        sizes = dict((n, p.size) for n, p in model.named_parameters())
        elements = [sum(sizes[n] for n in b.names) for b in optimizer.buckets]
        predicted = zero_optimizer_bytes(elements, grid.dp, optimizer.buffers[0].itemsize,
                                         len(optimizer.optimizer._slots), main_param_bytes=4 * optimizer.half)
    else:  # AdamW's two slots (and, in 16 bits, the float32 main parameters) for every parameter
        predicted = layout_for(itemsize).sharded * sum(p.size for _, p in model.named_parameters())
    how = f"ZeRO-1 over DP {grid.dp}" if distributed else "AdamW on every DP rank"
    title = f"Model state per parameter on rank 0 ({how}, {_dtype_name(model)}, live arrays):"
    return format_model_state(measure_model_state(model, optimizer), layout_for(itemsize), grid.dp, distributed,
                              predicted, title=title)
