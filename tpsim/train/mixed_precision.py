"""Megatron's mixed-precision optimizer (``Float16OptimizerWithFloat16Params``; Micikevicius et al. 2017,
arXiv:1710.03740), by hand, around any tpsim optimizer:

    model (16-bit)         parameters bfloat16/float16 — what the forward and backward compute with
    main gradients (fp32)  the model's own ``grads``: float32 for 16-bit parameters (``tpsim.nn.precision``),
                           accumulated in float32 by the backward and averaged over DP in float32 (GradSync)
    main parameters (fp32) ``main_params``: float32 copies, made once from the 16-bit weights
    inner optimizer        AdamW/SGD stepping the main parameters with the main gradients (its state float32)

    step:  [float16: unscale the main grads by 1/S, agree on found-inf, maybe skip]  → clip →
           inner.step() on the float32 main parameters → round them into the 16-bit parameters (nearest-even)

So a weight update smaller than half a 16-bit ulp is not lost: it accumulates in the float32 main parameter
until it shows in the 16-bit copy. ``state_bytes()`` counts the float32 main parameters with the inner state
(Megatron's 12 bytes per parameter of fp32 params + Adam m and v); ``main_params`` and ``main_grads`` are the
live arrays, by parameter name, for memory accounting.

    opt = mixed_precision(model, lambda m: AdamW(m, lr=3e-4), grid.world, loss_scaler=DynamicLossScaler())
    compute_grads(..., loss_scale=opt.loss_scale); apply_update(model, opt, grid, clip)   # tpsim.train.step
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from tpsim.comm import Group
from tpsim.nn.module import Module
from tpsim.nn.precision import FP32, is_half
from tpsim.train.loss_scale import DynamicLossScaler, unscale_and_agree
from tpsim.train.optim import Optimizer


class MainParams:
    """What an ``Optimizer`` needs of a module, over float32 copies of a 16-bit model's parameters: one flat
    "module" whose params are the main parameters and whose grads are the model's (float32) gradients, read
    afresh each time (GradSync replaces them with bucket views)."""

    def __init__(self, model: Module) -> None:
        self.model = model
        self.params = {name: p.astype(FP32) for name, p in model.named_parameters()}

    @property
    def grads(self) -> dict[str, np.ndarray]:
        return dict(self.model.named_grads())

    def named_modules(self) -> Iterator[tuple[str, "MainParams"]]:
        yield "", self

    def named_parameters(self) -> Iterator[tuple[str, np.ndarray]]:
        return iter(self.params.items())

    def named_grads(self) -> Iterator[tuple[str, np.ndarray]]:
        return self.model.named_grads()

    def zero_grad(self) -> None:
        self.model.zero_grad()


class MixedPrecisionOptimizer:
    """16-bit model, float32 main parameters and gradients, optional dynamic loss scaling (see the module doc)."""

    def __init__(self, model: Module, make_inner: Callable[[Module], Optimizer], world: Group, *,
                 loss_scaler: DynamicLossScaler | None = None) -> None:
        self.model, self.world, self.loss_scaler = model, world, loss_scaler
        self.main = MainParams(model)
        self.inner = make_inner(self.main)
        self.skipped = False  # whether the last step was skipped for an overflow

    @property
    def main_params(self) -> dict[str, np.ndarray]:
        """Float32 main parameters by name (this rank's shards)."""
        return self.main.params

    @property
    def main_grads(self) -> dict[str, np.ndarray]:
        """Float32 main gradients by name: the model's gradient arrays themselves."""
        return self.main.grads

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

    def prepare_grads(self) -> bool:
        """Before clipping: unscale the main gradients and agree on overflow; False = skip this step."""
        if self.loss_scaler is None:
            self.skipped = False
            return True
        found = unscale_and_agree([g for _, g in self.model.named_grads()], self.loss_scaler, self.world)
        self.skipped = found
        return not found

    def step(self) -> None:
        """The inner optimizer on the float32 main parameters, then the 16-bit copies refreshed from them."""
        self.inner.step()
        for (name, p), main in zip(self.model.named_parameters(), self.main.params.values()):
            np.copyto(p, main, casting="unsafe")  # round-to-nearest-even into bfloat16/float16

    def zero_grad(self) -> None:
        self.model.zero_grad()

    def state_bytes(self) -> int:
        """Optimizer state held by this rank: the inner state (float32) plus the float32 main parameters."""
        return self.inner.state_bytes() + sum(p.nbytes for p in self.main.params.values())

    def state_dict(self) -> dict:
        sd = self.inner.state_dict()
        sd["main_params"] = {n: p.copy() for n, p in self.main.params.items()}
        if self.loss_scaler is not None:
            sd["loss_scaler"] = self.loss_scaler.state_dict()
        return sd

    def load_state_dict(self, sd: dict) -> None:
        self.inner.load_state_dict(sd)
        for name, p in self.main.params.items():
            np.copyto(p, sd["main_params"][name])
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


def demo_optimizer(model: Module, grid, args, make_inner: Callable[[Module], Optimizer]):
    """The demo's optimizer for ``args.dtype``: ``make_inner(model)`` in float32/float64, else the
    mixed-precision wrapper (float16: dynamic loss scaling, growth interval ``args.loss_scale_interval``)."""
    scaler = None
    if args.dtype == "float16":
        scaler = DynamicLossScaler(growth_interval=getattr(args, "loss_scale_interval", 1000))
    return mixed_precision(model, make_inner, grid.world, loss_scaler=scaler)


def scaler_metrics(optimizer) -> dict:
    """``{"loss_scale", "skipped"}`` for a loss-scaled optimizer (metrics.jsonl), ``{}`` otherwise."""
    scaler = getattr(optimizer, "loss_scaler", None)
    if scaler is None:
        return {}
    return {"loss_scale": scaler.scale, "skipped": bool(optimizer.skipped)}
