"""Training on top of the models: optimizers on local shards, TP-aware clipping (the SenseParrots article,
§2.2.3), DP gradient sync (DDP), the broadcasts of the article's §3.1, replica checks, the training step, and
checkpoints with resharding."""

from tpsim.train.broadcast import broadcast_batch, broadcast_params, dp_slice
from tpsim.train.checkpoint import (CheckpointError, export_step0, full_tensors, load_into, load_tensors,
                                    save_tensors)
from tpsim.train.clip import clip_grad_norm, grad_entries, grad_norm
from tpsim.train.consistency import ConsistencyReport, Mismatch, check_replicas
from tpsim.train.ddp import Bucket, GradSync
from tpsim.train.loss_scale import DynamicLossScaler
from tpsim.train.mixed_precision import MixedPrecisionOptimizer, mixed_precision
from tpsim.train.optim import SGD, AdamW, Optimizer
from tpsim.train.step import StepResult, apply_update, compute_grads, train_step

__all__ = ["AdamW", "Bucket", "CheckpointError", "ConsistencyReport", "DynamicLossScaler", "GradSync", "Mismatch",
           "MixedPrecisionOptimizer", "Optimizer", "SGD", "mixed_precision",
           "StepResult", "apply_update", "broadcast_batch", "broadcast_params", "check_replicas", "clip_grad_norm",
           "compute_grads", "dp_slice", "export_step0", "full_tensors", "grad_entries", "grad_norm", "load_into",
           "load_tensors", "save_tensors", "train_step"]
