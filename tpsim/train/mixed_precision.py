"""Megatron's mixed-precision optimizer (``Float16OptimizerWithFloat16Params``; Micikevicius et al. 2017,
arXiv:1710.03740), by hand, around any tpsim optimizer:

    model (16-bit)         parameters bfloat16/float16 — what the forward and backward compute with
    main gradients (fp32)  the model's own ``grads``: float32 for 16-bit parameters (``tpsim.nn.precision``),
                           accumulated in float32 by the backward and averaged over DP in float32 (GradSync)
    main parameters (fp32) ``main_params``: float32 copies, made once from the 16-bit weights (``MainParams``,
                           which ZeRO-1 reuses for the slices it owns: one implementation of the copies)
    inner optimizer        AdamW/SGD stepping the main parameters with the main gradients (its state float32)

    step:  [float16: unscale the main grads by 1/S, agree on found-inf, maybe skip]  → clip →
           the inner rule on the float32 main parameters → round them into the 16-bit parameters (nearest-even)

So a weight update smaller than half a 16-bit ulp is not lost: it accumulates in the float32 main parameter
until it shows in the 16-bit copy. ``state_bytes()`` counts the float32 main parameters with the inner state
(Megatron's 12 bytes per parameter of fp32 params + Adam m and v); ``main_params`` and ``main_grads`` are the
live arrays, by parameter name, for memory accounting.

    opt = mixed_precision(model, lambda m: AdamW(m, lr=3e-4), grid.world, loss_scaler=DynamicLossScaler())
    compute_grads(..., loss_scale=opt.loss_scale); apply_update(model, opt, grid, clip)   # tpsim.train.step
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from tpsim.comm import Group
from tpsim.nn.module import Module
from tpsim.nn.precision import FP32, is_half
from tpsim.train.loss_scale import DynamicLossScaler, unscale_and_agree
from tpsim.train.optim import Optimizer
from tpsim.train.protocol import MAIN_PARAM, Overflow, StateSlice

if TYPE_CHECKING:  # type-only
    from tpsim.comm import ProcessGrid


class MainParams:
    """Float32 main copies of 16-bit model elements (Micikevicius et al. 2017, §3.1): made once from the 16-bit
    values, stepped in place by an optimizer, rounded (nearest-even) into the model after every step.

    One implementation for both 16-bit optimizers: the copies live in flat float32 ``buffers`` of the given
    lengths, and ``add(b, at, model)`` registers the 16-bit array ``model`` at ``[at, at + model.size)`` of buffer
    ``b`` and returns its main copy, shaped like it. ``MixedPrecisionOptimizer`` gives each parameter a buffer of
    its own; ZeRO-1 gives each bucket's owned range one and registers the flat views of its owned slices. Elements
    nobody registers (ZeRO-1's padding) stay zero and count in ``nbytes``, as the state of the same range does.
    """

    def __init__(self, lengths: Iterable[int]) -> None:
        self.buffers = [np.zeros(n, FP32) for n in lengths]
        self.pairs: list[tuple[np.ndarray, np.ndarray]] = []  # (16-bit model elements, their float32 main copy)

    def add(self, b: int, at: int, model: np.ndarray) -> np.ndarray:
        main = self.buffers[b][at:at + model.size].reshape(model.shape)  # a contiguous slice: a view
        main[...] = model  # exact: every 16-bit value is a float32 value
        self.pairs.append((model, main))
        return main

    def round_into_model(self) -> None:
        for model, main in self.pairs:
            np.copyto(model, main, casting="unsafe")  # round-to-nearest-even into bfloat16/float16

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    def state_dict(self) -> list[np.ndarray]:
        return [b.copy() for b in self.buffers]

    def load_state_dict(self, saved: list[np.ndarray]) -> None:
        for mine, src in zip(self.buffers, saved, strict=True):
            np.copyto(mine, src)  # into the live buffers: the registered copies are views of them


class MixedPrecisionOptimizer:
    """16-bit model, float32 main parameters and gradients, optional dynamic loss scaling (see the module doc).
    Implements the optimizer protocol (``tpsim.train.protocol``) with ``zero_stage`` 0."""

    zero_stage = 0

    def __init__(self, model: Module, make_inner: Callable[[Module], Optimizer], world: Group, *,
                 loss_scaler: DynamicLossScaler | None = None) -> None:
        self.model, self.world, self.loss_scaler = model, world, loss_scaler
        self.inner = make_inner(model)  # its state has the gradients' dtype: float32
        params = list(model.named_parameters())
        self.main = MainParams(p.size for _, p in params)
        self.main_params = {name: self.main.add(b, 0, p) for b, (name, p) in enumerate(params)}
        self.skipped = False  # whether the last step was skipped for an overflow

    @property
    def rule(self) -> Optimizer:
        return self.inner

    @property
    def main_grads(self) -> dict[str, np.ndarray]:
        """Float32 main gradients by name: the model's gradient arrays themselves."""
        return dict(self.model.named_grads())

    @property
    def loss_scale(self) -> float:
        """What to multiply the loss gradient by before the backward (1.0 without a scaler)."""
        return 1.0 if self.loss_scaler is None else self.loss_scaler.scale

    @property
    def lr(self) -> float:
        return self.inner.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.inner.lr = value

    @property
    def step_count(self) -> int:
        return self.inner.step_count

    def unscale_grads(self) -> Overflow:
        """Before clipping: divide the main gradients by S and agree on overflow over the world."""
        self.skipped = False
        if self.loss_scaler is not None:
            self.skipped = unscale_and_agree([g for _, g in self.model.named_grads()], self.loss_scaler, self.world)
        return Overflow(self.skipped, self.skipped and self.loss_scaler.at_minimum)

    def grad_norm(self, grid: ProcessGrid, norm_type: float = 2.0) -> float:
        return self.inner.grad_norm(grid, norm_type)  # the main gradients are the model's

    def clip_grads(self, max_norm: float, norm: float) -> None:
        self.inner.clip_grads(max_norm, norm)

    def step(self) -> None:
        """The inner rule on the float32 main parameters, then the 16-bit copies refreshed from them."""
        inner = self.inner
        inner.step_slices((self.main_params[name], g, inner.state[name], inner.decay_for(name))
                          for name, _, g in inner.entries())
        self.main.round_into_model()

    def zero_grad(self) -> None:
        self.model.zero_grad()

    def state_slices(self) -> list[StateSlice]:
        """The inner rule's slots with each parameter's float32 main copy (slot ``main_param``): all a checkpoint
        needs to continue bit for bit, since rounding the main copy loses what the 16-bit weight does not hold."""
        return [StateSlice(name, 0, {**slots, MAIN_PARAM: self.main_params[name]})
                for name, slots in self.inner.state.items()]

    def state_bytes(self) -> int:
        """Optimizer state held by this rank: the inner state (float32) plus the float32 main parameters."""
        return self.inner.state_bytes() + self.main.nbytes

    def grad_bytes(self) -> int:
        """Gradient bytes beside the model's arrays: none (a 16-bit parameter's float32 gradient is its main one)."""
        return 0

    def param_bytes(self) -> int:
        """Parameter bytes beside the model's arrays: none (the float32 main parameters are ``state_bytes``)."""
        return 0

    def state_dict(self) -> dict:
        sd = self.inner.state_dict()
        sd["main_params"] = self.main.state_dict()
        if self.loss_scaler is not None:
            sd["loss_scaler"] = self.loss_scaler.state_dict()
        return sd

    def load_state_dict(self, sd: dict) -> None:
        self.inner.load_state_dict(sd)
        self.main.load_state_dict(sd["main_params"])
        if self.loss_scaler is not None and "loss_scaler" in sd:
            self.loss_scaler.load_state_dict(sd["loss_scaler"])


def mixed_precision(model: Module, make_inner: Callable[[Module], Optimizer], world: Group, *,
                    loss_scaler: DynamicLossScaler | None = None):
    """``make_inner(model)`` for a float32/float64 model (nothing changes); for a 16-bit one the
    ``MixedPrecisionOptimizer`` — with a ``DynamicLossScaler()`` by default when the parameters are float16."""
    dtypes = {p.dtype for _, p in model.named_parameters()}
    if not any(is_half(d) for d in dtypes):
        return make_inner(model)
    if loss_scaler is None and np.dtype(np.float16) in dtypes:
        loss_scaler = DynamicLossScaler()
    return MixedPrecisionOptimizer(model, make_inner, world, loss_scaler=loss_scaler)


TOLERANCE_NOTE = """The demo's step-0 check compares TP with the serial model in the *same* 16-bit dtype. Both round every
matmul result, activation and collective to 16 bits, but TP adds partial products in another order (the
row-parallel all-reduce sums p partial matmuls, each already rounded; the vocab-parallel softmax sums per
shard), so the two roundings differ by up to one unit roundoff per rounded value: u = 2^-8 for bfloat16
(8 significand bits), 2^-11 for float16. Through two blocks, backward included, these relative errors of
single roundings add up to a few u in the gradients: the check allows 5e-2 ≈ 13·u for bfloat16 and 1e-2 ≈
20·u for float16 (max |Δ| relative to each gradient's largest element); float32 keeps 1e-4, float64 1e-10."""
