"""Training on top of the models: optimizers on local shards, TP-aware clipping (the SenseParrots article,
§2.2.3), DP gradient sync (DDP) or ZeRO-1's distributed optimizer, the broadcasts of the article's §3.1,
replica checks and the training step.
Checkpoints and their resharding are model I/O and live beside the Hugging Face folders: ``tpsim.hf.checkpoint``."""

from tpsim.train.broadcast import broadcast_batch, broadcast_params, dp_slice
from tpsim.train.clip import clip_grad_norm, grad_entries, grad_norm
from tpsim.train.consistency import ConsistencyReport, Mismatch, check_replicas
from tpsim.train.ddp import Bucket, GradSync
from tpsim.train.loss_scale import DynamicLossScaler
from tpsim.train.mixed_precision import MixedPrecisionOptimizer, mixed_precision
from tpsim.train.nonfinite import StepGuard, StepVerdict
from tpsim.train.optim import SGD, AdamW, Optimizer
from tpsim.train.step import StepResult, apply_update, compute_grads, train_step
from tpsim.train.zero import DistributedOptimizer

__all__ = ["AdamW", "Bucket", "ConsistencyReport", "DistributedOptimizer", "DynamicLossScaler",
           "GradSync", "Mismatch", "MixedPrecisionOptimizer", "Optimizer", "SGD", "StepGuard", "StepResult",
           "StepVerdict", "apply_update", "broadcast_batch", "broadcast_params", "check_replicas",
           "clip_grad_norm", "compute_grads", "dp_slice", "grad_entries",
           "grad_norm", "mixed_precision", "train_step"]
