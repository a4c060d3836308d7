"""Training pieces that sit on top of the models: optimizers on local shards and TP-aware gradient clipping."""

from tpsim.train.clip import clip_grad_norm, grad_entries, grad_norm
from tpsim.train.optim import SGD, AdamW, Optimizer

__all__ = ["AdamW", "Optimizer", "SGD", "clip_grad_norm", "grad_entries", "grad_norm"]
