"""The demo's optimizer, chosen once from its flags, and what it reports of it.

The library takes no flags: ``tpsim.train`` builds optimizers from numbers and objects. This module reads the
demo's run settings (``args``: ``--lr``, ``--dtype``, ``--zero``, ``--bucket-mb``, ``--loss-scale-interval``,
``--max-skipped-steps``) and turns them into the objects ``gpt_tour`` trains with:

    sync = make_sync(model, grid, args)                   # GradSync, or ZeRO-1's DistributedOptimizer (--zero 1)
    optimizer = demo_optimizer(model, grid, args, sync)   # the DistributedOptimizer itself, or (mixed-precision) AdamW
    guard = demo_guard(args)                              # StepGuard whose stop message names the demo's flags

After that the demo asks the objects (the optimizer protocol, ``tpsim.train.protocol``), never the flags again.
"""

from __future__ import annotations

import argparse

from tpsim.comm import ProcessGrid
from tpsim.demo.arch import no_decay
from tpsim.nn.module import Module
from tpsim.train import AdamW, DynamicLossScaler, GradSync, StepGuard, mixed_precision
from tpsim.train.protocol import OptimizerProtocol
from tpsim.train.zero import DistributedOptimizer

STOP_ADVICE = "lower --lr or turn clipping on (--clip), or raise --max-skipped-steps"


def demo_adamw(model: Module, args: argparse.Namespace) -> AdamW:
    """The demo's AdamW: decay 0.01, none on biases and norms (``tpsim.demo.arch.no_decay``)."""
    return AdamW(model, lr=args.lr, weight_decay=0.01, no_decay=no_decay)


def _scaler(args: argparse.Namespace) -> DynamicLossScaler | None:
    """float16's dynamic loss scaler (growth interval ``--loss-scale-interval``); None for every other dtype."""
    return DynamicLossScaler(growth_interval=args.loss_scale_interval) if args.dtype == "float16" else None


def make_sync(model: Module, grid: ProcessGrid, args: argparse.Namespace) -> GradSync | DistributedOptimizer:
    """The DP gradient sync: DDP's ``GradSync``, or with ``--zero 1`` the ``DistributedOptimizer``, which is the
    sync *and* the optimizer (16 bits: float32 main pieces; float16 also scales the loss)."""
    cap = int(args.bucket_mb * 2**20)
    if args.zero:
        return DistributedOptimizer(demo_adamw(model, args), grid, bucket_cap_bytes=cap, loss_scaler=_scaler(args))
    return GradSync(model, grid.dp_group, bucket_cap_bytes=cap)


def demo_optimizer(model: Module, grid: ProcessGrid, args: argparse.Namespace,
                   sync: GradSync | DistributedOptimizer) -> OptimizerProtocol:
    """The run's optimizer: ZeRO-1's ``sync`` itself, else AdamW — wrapped by ``mixed_precision`` for a 16-bit
    model (float16: dynamic loss scaling)."""
    if args.zero:
        return sync
    return mixed_precision(model, lambda m: demo_adamw(m, args), grid.world, loss_scaler=_scaler(args))


def demo_guard(args: argparse.Namespace) -> StepGuard:
    """Skip non-finite steps; stop after ``--max-skipped-steps`` in a row, saying which flags to change."""
    return StepGuard(args.max_skipped_steps, advice=STOP_ADVICE)


def scaler_metrics(optimizer: OptimizerProtocol) -> dict:
    """``{"loss_scale", "skipped"}`` for a loss-scaled optimizer (metrics.jsonl), ``{}`` otherwise."""
    if optimizer.loss_scaler is None:
        return {}
    return {"loss_scale": optimizer.loss_scaler.scale, "skipped": bool(optimizer.skipped)}
