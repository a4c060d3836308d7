"""The demo's optimizer, chosen once from its run configuration, and what it reports of it.

The library takes no flags: ``tpsim.train`` builds optimizers from numbers and objects. This module reads the
demo's ``RunConfig`` (``tpsim.config``: ``--lr``, ``--dtype``, ``--zero``, ``--bucket-mb``,
``--loss-scale-interval``, ``--max-skipped-steps``) and turns it into the objects ``tpsim.demo.tour`` trains with:

    sync = make_sync(model, grid, run)                   # GradSync, or ZeRO's DistributedOptimizer (--zero 1|2)
    optimizer = demo_optimizer(model, grid, run, sync)   # the DistributedOptimizer itself, or (mixed-precision) AdamW
    guard = demo_guard(run)                              # StepGuard whose stop message names the demo's flags

After that the demo asks the objects (the optimizer protocol, ``tpsim.train.protocol``), never the settings again.
"""

from __future__ import annotations

from tpsim.comm import ProcessGrid
from tpsim.config import RunConfig
from tpsim.ep.params import expert_param_names
from tpsim.train.expert_sync import FoldedGradSync
from tpsim.nn.module import Module
from tpsim.train import AdamW, DynamicLossScaler, GradSync, StepGuard, mixed_precision
from tpsim.train.protocol import OptimizerProtocol
from tpsim.train.zero import DistributedOptimizer

STOP_ADVICE = "lower --lr or turn clipping on (--clip), or raise --max-skipped-steps"


def no_decay(name: str) -> bool:
    """Parameters AdamW does not decay: biases and norms (GPT-2's ln_*, Llama's *layernorm and model.norm)."""
    return name.endswith("bias") or ".ln_" in name or "norm." in name


def demo_adamw(model: Module, run: RunConfig) -> AdamW:
    """The demo's AdamW: decay 0.01, none on biases and norms (``no_decay``)."""
    return AdamW(model, lr=run.optimizer.lr, weight_decay=run.optimizer.weight_decay, no_decay=no_decay)


def _scaler(run: RunConfig) -> DynamicLossScaler | None:
    """float16's dynamic loss scaler (growth interval ``--loss-scale-interval``); None for every other dtype."""
    prec = run.precision
    return DynamicLossScaler(growth_interval=prec.loss_scale_interval) if prec.loss_scaling else None


def make_sync(model: Module, grid: ProcessGrid, run: RunConfig) -> GradSync | DistributedOptimizer:
    """The DP gradient sync: DDP's ``GradSync``, or with ``--zero 1|2`` the ``DistributedOptimizer``, which is the
    sync *and* the optimizer (16 bits: float32 main pieces; float16 also scales the loss)."""
    opt = run.optimizer
    cap, overlap = opt.bucket_cap_bytes, opt.overlap_grad_reduce
    shared = getattr(model, "shared_embedding", None)  # pp > 1: its bucket waits for the embedding group's sum
    held = (shared.grads["weight"],) if shared is not None else ()
    if run.parallel.zero_stage.shards_optimizer:
        return DistributedOptimizer(demo_adamw(model, run), grid, bucket_cap_bytes=cap, loss_scaler=_scaler(run),
                                    overlap_grad_reduce=overlap, overlap_param_gather=opt.overlap_param_gather,
                                    held=held, stage=run.parallel.zero)
    experts = expert_param_names(model)
    if experts:  # Parallel Folding: the expert buckets over expert-DP (tpsim.train.expert_sync)
        return FoldedGradSync(model, grid, experts, bucket_cap_bytes=cap, overlap=overlap, held=held)
    return GradSync(model, grid.dp_group, bucket_cap_bytes=cap, overlap=overlap, held=held)


def demo_optimizer(model: Module, grid: ProcessGrid, run: RunConfig,
                   sync: GradSync | DistributedOptimizer) -> OptimizerProtocol:
    """The run's optimizer: ZeRO's ``sync`` itself, else AdamW — wrapped by ``mixed_precision`` for a 16-bit
    model (float16: dynamic loss scaling)."""
    if run.parallel.zero_stage.shards_optimizer:
        return sync
    return mixed_precision(model, lambda m: demo_adamw(m, run), grid.world, loss_scaler=_scaler(run))


def demo_guard(run: RunConfig) -> StepGuard:
    """Skip non-finite steps; stop after ``--max-skipped-steps`` in a row, saying which flags to change."""
    return StepGuard(run.optimizer.max_skipped_steps, advice=STOP_ADVICE)


def scaler_metrics(optimizer: OptimizerProtocol) -> dict:
    """``{"loss_scale", "skipped"}`` for a loss-scaled optimizer (metrics.jsonl), ``{}`` otherwise."""
    if optimizer.loss_scaler is None:
        return {}
    return {"loss_scale": optimizer.loss_scaler.scale, "skipped": bool(optimizer.skipped)}
