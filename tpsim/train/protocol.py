"""The one contract every optimizer in tpsim follows: what a training step (``tpsim.train.step.apply_update``)
calls, in Megatron's order (Megatron-LM's ``MixedPrecisionOptimizer.step``; PyTorch's ``GradScaler.unscale_``,
then ``clip_grad_norm_``, then ``optimizer.step``):

    overflow = opt.unscale_grads()       # float16: main grads ÷ S, found-inf agreed over the world; else nothing
    norm = opt.grad_norm(grid)           # the serial model's ‖g‖₂ from this rank's gradients (one all-reduce)
    if not overflow.found:               # (and the StepGuard agrees: tpsim.train.nonfinite)
        opt.clip_grads(max_norm, norm)   # g ← g · max_norm / (norm + 1e-6) where that is below 1
        opt.step()                       # the update rule on what this rank owns, 16-bit copies refreshed

Three classes implement it, fully — nothing is optional, nothing is discovered with ``getattr``:

- ``AdamW`` / ``SGD`` (``tpsim.train.optim``): the element-wise update rule on a module's own shards. No loss
  scaler (``unscale_grads`` finds nothing), the norm and clip of ``tpsim.train.clip`` over the TP group.
- ``MixedPrecisionOptimizer`` (``tpsim.train.mixed_precision``): a 16-bit model, float32 main parameters
  (``MainParams``) stepped by an inner AdamW/SGD, float16's dynamic loss scaler.
- ``DistributedOptimizer`` (``tpsim.train.zero``): ZeRO-1 — the same rule and the same ``MainParams`` on this
  DP rank's 1/d slice of every bucket, the norm over the world from the owned slices; ZeRO-2 (``stage=2``) with
  only those slices of the gradients kept (``tpsim.train.zero2``), ZeRO-3 (``stage=3``) of the parameters too
  (``tpsim.train.zero3``).

What an optimizer *is* is said by the object, once (``zero_stage``), never by sniffing its type: a caller that
must know whether the state is sliced asks ``zero_of(opt)`` (the stage as data, ``tpsim.zero_stage``); the state
itself is ``opt.state_slices()`` (whole shards, or the owned slices with their offsets) and the hyper-parameters
are ``opt.rule``'s.

The step reads nothing else; checkpoints read ``state_dict``/``load_state_dict``, memory accounting
``state_bytes``, the training loop ``loss_scale`` (the backward starts from S·dloss), ``lr`` (a schedule may
set it), ``step_count`` and ``skipped``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import numpy as np

from tpsim.zero_stage import ZeroStage, zero_stage

if TYPE_CHECKING:  # type-only: the protocol names these, it runs none of them
    from tpsim.comm import ProcessGrid
    from tpsim.train.loss_scale import DynamicLossScaler


class Overflow(NamedTuple):
    """What ``unscale_grads`` found: ``found`` — some rank's unscaled gradients hold an inf/NaN, so this step
    must not update (identical on every rank); ``counts`` — the scale already sits at its minimum, so backing off
    cannot cure it: a real non-finite step that a ``StepGuard`` counts, not the scaler finding its scale."""

    found: bool = False
    counts: bool = False


class StateSlice(NamedTuple):
    """Optimizer state this rank holds for one parameter: its slots over the flattened local shard's elements
    ``[start, start + size)`` — the whole shard (start 0) or, under ZeRO-1, the slice this DP rank owns."""

    name: str
    start: int
    slots: dict[str, np.ndarray]  # e.g. {"exp_avg": ..., "exp_avg_sq": ...}, views of the live state; a 16-bit
    # model's float32 main parameters are state too: slot MAIN_PARAM


MAIN_PARAM = "main_param"  # the slot of a 16-bit model's float32 main parameter in a StateSlice


def zero_of(holder) -> ZeroStage:
    """The ZeRO stage an optimizer or a gradient sync runs (its ``zero_stage``; None, no sync: plain DP), as data:
    what it shards and when it reduces and gathers (``tpsim.zero_stage``)."""
    return zero_stage(0 if holder is None else holder.zero_stage)


@runtime_checkable
class OptimizerProtocol(Protocol):
    """The methods and attributes above; see the module docstring for the order a step calls them in."""

    zero_stage: int  # 0: every DP rank holds the whole state; 1: ZeRO-1, this rank holds 1/d of it; 2: ZeRO-2,
    # the gradients too (the model's gradient arrays are placeholders at rest, ``grad_bytes`` the owned slices);
    # 3: ZeRO-3, the parameters too (``param_bytes``; each layer's gathered around its forward and backward)
    loss_scaler: DynamicLossScaler | None  # float16's dynamic loss scaler; None without loss scaling
    skipped: bool  # the last ``unscale_grads`` found an overflow (the step was skipped)

    @property
    def rule(self):  # a tpsim.train.optim.Optimizer: not imported, optim.py imports this protocol
        """The element-wise update rule (AdamW, SGD) and its hyper-parameters: ``lr``, ``betas``, ``decay_for``."""

    @property
    def loss_scale(self) -> float:
        """S: what the backward multiplies the loss gradient by (1.0 without a loss scaler)."""

    lr: float
    step_count: int

    def unscale_grads(self) -> Overflow:
        """Divide the (main) gradients by S and agree on found-inf over every rank; ``Overflow()`` without one."""

    def grad_norm(self, grid: ProcessGrid, norm_type: float = 2.0) -> float:
        """The serial model's gradient norm from this rank's gradients, the same number on every rank."""

    def clip_grads(self, max_norm: float, norm: float) -> None:
        """Scale the gradients the step reads by max_norm / (norm + 1e-6) where that is below 1 (PyTorch's rule)."""

    def step(self) -> None:
        """One update of everything this rank owns; afterwards the model's parameters hold the new values."""

    def zero_grad(self) -> None:
        """Zero the model's gradients in place (they may be views into buckets)."""

    def state_slices(self) -> list[StateSlice]:
        """The optimizer state this rank holds, per parameter slice (to compare against a serial twin)."""

    def state_dict(self) -> dict:
        """This rank's state, copied: what a checkpoint saves."""

    def load_state_dict(self, sd: dict) -> None:
        """Restore ``state_dict()``'s state into the live arrays."""

    def state_bytes(self) -> int:
        """Bytes of optimizer state on this rank (float32 main parameters included)."""

    def grad_bytes(self) -> int:
        """Gradient bytes this optimizer holds beside the model's gradient arrays (ZeRO-2's owned slices)."""

    def param_bytes(self) -> int:
        """Parameter bytes this optimizer holds beside the model's parameter arrays (ZeRO-3's owned slices)."""
