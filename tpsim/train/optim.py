"""Optimizers that update each rank's *local* shards: SGD (with momentum / Nesterov) and AdamW, by hand.

Every update here is element-wise: the new value of one weight depends only on that weight, its gradient and
its own optimizer state. So a rank that holds columns 8..15 of ``c_fc.weight`` can update exactly those
columns with no communication, and tensor-parallel training then equals serial training slice by slice.
Optimizer state (momentum, Adam's m and v) has the shard's shape, which is why it costs 1/tp of the serial
memory per rank for sharded parameters and the full size for replicated ones (see ``state_bytes``).

    opt = AdamW(model, lr=3e-4, no_decay=lambda name: name.endswith("bias"))
    model.zero_grad(); loss = ...; model.backward(...)   # grads accumulate into model.grads
    opt.step()                                           # p <- update(p, g, state), in place

Parameters come from ``module.named_parameters()`` / ``named_grads()``, which list an array registered in two
modules (a tied weight) once, so it is updated once per step. A tied weight must share its gradient buffer too
(both modules ``+=`` into one array); the constructor checks that, because a second buffer would be silently
ignored. The formulas follow PyTorch's ``torch.optim.SGD`` (dampening 0) and ``torch.optim.AdamW``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import numpy as np

from tpsim.ep.params import expert_param_names
from tpsim.nn.module import Module
from tpsim.nn.precision import grad_dtype
from tpsim.train.clip import grad_entries, grad_norm, scale_grads
from tpsim.train.expert_norm import folded_grad_norm
from tpsim.train.protocol import Overflow, StateSlice

if TYPE_CHECKING:  # type-only
    from tpsim.comm import ProcessGrid

State = dict[str, np.ndarray]  # one parameter's optimizer state, e.g. {"exp_avg": ..., "exp_avg_sq": ...}


def _check_tied_grads(module: Module) -> None:
    """Raise if one parameter array is registered in several modules with *different* gradient buffers."""
    grad_of: dict[int, tuple[str, np.ndarray]] = {}
    for mod_name, mod in module.named_modules():
        for name, value in mod.params.items():
            full = f"{mod_name}.{name}" if mod_name else name
            first = grad_of.setdefault(id(value), (full, mod.grads[name]))
            if first[1] is not mod.grads[name]:
                raise ValueError(f"tied parameter {first[0]} / {full} has two gradient buffers; register the same "
                                 "grad array in both modules so their contributions add up in one place")


class Optimizer:
    """What SGD and AdamW share: the parameter walk, weight-decay exclusion, state and checkpoints; and the whole
    optimizer protocol (``tpsim.train.protocol``) for a model stepped in its own dtype: no loss scaler, every DP
    rank holding the whole state (``zero_stage`` 0), the norm and clip of ``tpsim.train.clip`` over the TP group
    (TP × PP with pipeline stages).

    A subclass supplies ``slots`` (names of its per-parameter state arrays) and ``update(p, g, state, wd)``:
    the rule on one array (a whole shard, or a flat slice of one: ZeRO-1 and the mixed-precision wrapper call it
    on their own arrays through ``step_slices``). It changes ``p`` (and ``state``) in place and must never write
    into ``g``: the gradient belongs to the module (clipping, logging or a DP sync may read it after the step).
    """

    slots: tuple[str, ...] = ()
    zero_stage = 0
    loss_scaler = None  # no loss scaling: the model's gradients are the loss's
    skipped = False  # nothing to skip for: without a scaler no overflow is ever found
    loss_scale = 1.0

    def __init__(self, module: Module, lr: float, weight_decay: float,
                 no_decay: Callable[[str], bool] | None) -> None:
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        _check_tied_grads(module)
        self.module = module
        self.lr = lr  # validated by the property setter
        self.weight_decay = float(weight_decay)
        self.no_decay = no_decay
        self.param_names: list[str] = [name for name, _ in module.named_parameters()]
        self.experts = expert_param_names(module)  # Parallel Folding's expert parameters (tpsim.ep)
        self.step_count = 0
        # State arrays exist from the start (zeros), so memory accounting is right before the first step.
        # For SGD/AdamW, a zero buffer gives bit-for-bit PyTorch's first step (m·0 + g == g exactly). They have
        # the gradients' dtype: float32 for a 16-bit model, whose float32 main parameters they step.
        self.state: dict[str, State] = {name: {slot: np.zeros(p.shape, grad_dtype(p.dtype)) for slot in self.slots}
                                        for name, p in module.named_parameters()}

    @property
    def rule(self) -> "Optimizer":
        """Itself: the update rule and the hyper-parameters are this optimizer's."""
        return self

    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:  # a schedule may change lr between steps; keep it valid
        if not value >= 0:  # also rejects NaN
            raise ValueError(f"lr must be >= 0, got {value}")
        self._lr = float(value)

    def entries(self) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        """(name, param, grad) for each parameter, read afresh so a replaced array is still the one updated."""
        pairs = list(zip(self.module.named_parameters(), self.module.named_grads()))
        names = [name for (name, _), _ in pairs]
        if names != self.param_names:
            raise RuntimeError("the module's parameters changed after the optimizer was built: "
                               f"{self.param_names} -> {names}")
        for (name, p), (_, g) in pairs:
            yield name, p, g

    def decay_for(self, name: str) -> float:
        """The weight decay applied to parameter ``name`` (0 where ``no_decay(name)`` is true)."""
        return 0.0 if self.no_decay is not None and self.no_decay(name) else self.weight_decay

    def step(self) -> None:
        """Update every parameter in place from its current gradient."""
        self.step_slices((p, g, self.state[name], self.decay_for(name)) for name, p, g in self.entries())

    def step_slices(self, parts: Iterable[tuple[np.ndarray, np.ndarray, State, float]]) -> None:
        """One step of this rule: ``step_count`` + 1, then ``update(p, g, state, weight_decay)`` for each slice."""
        self.step_count += 1
        for p, g, state, weight_decay in parts:
            self.update(p, g, state, weight_decay)

    def update(self, p: np.ndarray, g: np.ndarray, state: State, weight_decay: float) -> None:
        """The rule on one array, in place: ``p`` and ``state`` change, ``g`` is only read."""
        raise NotImplementedError  # pragma: no cover - interface

    def release_state(self) -> None:
        """Drop the per-parameter state: for a wrapper that keeps the state itself and uses only this rule
        (ZeRO-1 keeps the slots of its owned slices)."""
        self.state = {}

    # --- the rest of the optimizer protocol (tpsim.train.protocol) ---------------------------------------------
    def unscale_grads(self) -> Overflow:
        return Overflow()  # nothing to unscale: no loss scaler

    def grad_norm(self, grid: ProcessGrid, norm_type: float = 2.0) -> float:
        """The serial model's gradient norm over ``grid``'s model-parallel group (``tpsim.train.clip.grad_norm``):
        the TP group, or TP × PP when the model is cut into pipeline stages; with experts, two sums."""
        if self.experts:  # Parallel Folding: the experts' part over the expert groups (tpsim.train.expert_norm)
            return folded_grad_norm(grad_entries(self.module), self.experts, grid, norm_type)
        return grad_norm(self.module, grid.model_parallel_group, norm_type, count_replicated=grid.tp_rank == 0)

    def clip_grads(self, max_norm: float, norm: float) -> None:
        scale_grads([g for _, g, _ in grad_entries(self.module)], max_norm, norm)

    def zero_grad(self) -> None:
        self.module.zero_grad()

    def state_slices(self) -> list[StateSlice]:
        return [StateSlice(name, 0, slots) for name, slots in self.state.items()]

    # --- checkpoints and accounting ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{"step": int, "state": {param name: {slot: array copy}}}`` — this rank's shards only."""
        return {"step": self.step_count,
                "state": {name: {k: v.copy() for k, v in slots.items()} for name, slots in self.state.items()}}

    def load_state_dict(self, sd: dict) -> None:
        """Restore from ``state_dict()``; names, slots and shapes must match this optimizer's exactly."""
        state = sd["state"]
        if list(state) != self.param_names:
            raise ValueError(f"state_dict parameters {list(state)} do not match {self.param_names}")
        for name, slots in self.state.items():
            if set(state[name]) != set(slots):
                raise ValueError(f"{name}: state slots {sorted(state[name])} != {sorted(slots)}")
            for k, v in slots.items():
                src = np.asarray(state[name][k])
                if src.shape != v.shape:
                    raise ValueError(f"{name}.{k}: shape {src.shape} != {v.shape} (another TP size or rank?)")
                np.copyto(v, src)  # into the existing arrays: nothing else holds a stale reference
        self.step_count = int(sd["step"])

    def state_bytes(self) -> int:
        """Bytes of optimizer state held by this rank (shard-sized for sharded parameters)."""
        return sum(v.nbytes for slots in self.state.values() for v in slots.values())

    def grad_bytes(self) -> int:
        """Gradient bytes held beside the model's own arrays: none (the model's gradients are the gradients)."""
        return 0

    def param_bytes(self) -> int:
        """Parameter bytes held beside the model's own arrays: none."""
        return 0


class SGD(Optimizer):
    """Stochastic gradient descent, PyTorch semantics with dampening 0:

        g' = g + wd·p                    (L2-style decay, folded into the gradient)
        buf = momentum·buf + g'          (only if momentum > 0)
        d = g' + momentum·buf if nesterov else buf      (d = g' without momentum)
        p -= lr·d
    """

    def __init__(self, module: Module, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False, *, no_decay: Callable[[str], bool] | None = None) -> None:
        if momentum < 0:
            raise ValueError(f"momentum must be >= 0, got {momentum}")
        if nesterov and momentum <= 0:
            raise ValueError("nesterov momentum needs momentum > 0")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)
        self.slots = ("momentum_buffer",) if momentum > 0 else ()
        super().__init__(module, lr, weight_decay, no_decay)

    def update(self, p: np.ndarray, g: np.ndarray, state: State, weight_decay: float) -> None:
        d = g + weight_decay * p if weight_decay else g  # a new array: the module's grad stays untouched
        if self.momentum:
            buf = state["momentum_buffer"]
            buf *= self.momentum
            buf += d
            d = d + self.momentum * buf if self.nesterov else buf
        p -= self.lr * d


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter), exactly as ``torch.optim.AdamW``:

        p *= 1 - lr·wd                   (decay acts on the weight, not through m and v)
        m = β1·m + (1-β1)·g              v = β2·v + (1-β2)·g²
        p -= lr/(1-β1^t) · m / (√v/√(1-β2^t) + eps)      i.e. lr · m̂ / (√v̂ + eps)
    """

    slots = ("exp_avg", "exp_avg_sq")

    def __init__(self, module: Module, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, *,
                 no_decay: Callable[[str], bool] | None = None) -> None:
        beta1, beta2 = betas
        for i, b in enumerate(betas):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"betas[{i}] must be in [0, 1), got {b}")
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.betas, self.eps = (float(beta1), float(beta2)), float(eps)
        super().__init__(module, lr, weight_decay, no_decay)

    def update(self, p: np.ndarray, g: np.ndarray, state: State, weight_decay: float) -> None:
        beta1, beta2 = self.betas
        t = self.step_count
        if weight_decay:
            p *= 1.0 - self.lr * weight_decay
        m, v = state["exp_avg"], state["exp_avg_sq"]
        scratch = np.multiply(g, 1.0 - beta1)  # two scratch buffers per parameter instead of seven temporaries
        m *= beta1
        m += scratch
        v *= beta2
        np.multiply(g, g, out=scratch)
        scratch *= 1.0 - beta2
        v += scratch
        step_size = self.lr / (1.0 - beta1 ** t)
        denom = np.sqrt(v, out=scratch)
        denom /= math.sqrt(1.0 - beta2 ** t)
        denom += self.eps
        update = np.divide(m, denom, out=denom)
        update *= step_size
        p -= update
