"""A mixture-of-experts MLP, serial (Shazeer et al. 2017; Fedus et al. 2022, Switch; Jiang et al. 2024, Mixtral):

    x [b, s, h] -> X [T, h]                               T = b·s tokens
    (index, w) = router(X)                                each token's k experts and their weights
    y_t = Σ_{j<k} w_tj · expert_{index_tj}(X_t)           each expert a SwiGLU FFN on the tokens sent to it
        + shared(X_t)                                     shared experts, always on (DeepSeek's, plain), or
          · σ(X_t · g)                                    Qwen2-MoE's one, gated by a sigmoid of a linear

**Grouped**: an expert runs once, one matmul per projection over all the tokens it was sent (rows in token
order), and its outputs are scattered back, weighted. **Capacity** (``capacity_factor`` c; None: dropless): an
expert keeps at most C = ⌈c · T·k / E⌉ tokens, the first ones in token order; the rest of its assignments are
dropped — they add nothing, so a token with every choice dropped passes through the block's residual alone.
``cache.dropped`` counts them. Capacity is a property of a *group* of tokens (GShard's groups): under expert
parallelism each rank drops among its own tokens (Megatron-LM's ``drop_and_pad`` counts them per rank), so the
serial twin of a parallel run is told those groups (``groups``: a function of x's shape giving each group's
token rows in its order) and drops within each the same way; by default all T tokens are one group.

Backward: for expert e and its rows R, d(out_e) = dy_R · w_R, dx_R += expert_e.backward(...), and the weight's
gradient dw_R = Σ_h dy_R · out_e (a dropped assignment's is 0); the router turns dw (and its auxiliary losses) into
its part of dx (``tpsim.nn.router``); the shared experts add theirs. The auxiliary losses of this layer are
``cache.router.aux_loss + cache.router.z_loss``: the model adds them to its loss; their gradients are already in
the router's backward.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from tpsim.errors import ConfigError
from tpsim.nn.linear import Linear
from tpsim.nn.module import Module
from tpsim.nn.router import Router, RouterCache, SequenceStats
from tpsim.nn.swiglu import SwiGLU


class MoECache(NamedTuple):
    router: RouterCache
    rows: list  # per expert: int [n_e] the tokens it ran, in token order
    slots: list  # per expert: int [n_e] which of the token's k choices each row is
    experts: list  # per expert: its SwiGLU cache (None when it got no token)
    outputs: list  # per expert: [n_e, h] its output, before the weights
    shared: tuple  # the shared experts' caches
    shared_out: np.ndarray | None  # [T, h] the shared experts' sum, before the gate
    gate: tuple | None  # (LinearCache, σ [T, 1]) of Qwen2-MoE's shared-expert gate
    dropped: int  # assignments beyond an expert's capacity
    shape: tuple


def assignments(index: np.ndarray, experts: int, capacity: int | None) -> tuple[list, list, int]:
    """``(rows, slots, dropped)``: per expert the tokens sent to it in token order (and which of their k choices
    it was), at most ``capacity`` of them (None: all)."""
    rows, slots, dropped = [], [], 0
    for e in range(experts):
        t, j = np.nonzero(index == e)  # row-major: token order, one choice per token at most
        if capacity is not None and len(t) > capacity:
            dropped += len(t) - capacity
            t, j = t[:capacity], j[:capacity]
        rows.append(t)
        slots.append(j)
    return rows, slots, dropped


def grouped_assignments(index: np.ndarray, experts: int, capacity, groups: list) -> tuple[list, list, int]:
    """``assignments`` with the capacity applied within each group of token rows (``groups``: int arrays, each
    in its own order; ``capacity(n)``: the capacity of a group of n), then every expert's rows in token order."""
    parts = [assignments(index[g], experts, capacity(len(g))) for g in groups]
    rows, slots = [], []
    for e in range(experts):
        t = np.concatenate([g[p[0][e]] for g, p in zip(groups, parts)])
        j = np.concatenate([p[1][e] for p in parts])
        order = np.argsort(t, kind="stable")
        rows.append(t[order])
        slots.append(j[order])
    return rows, slots, sum(p[2] for p in parts)


def shared_forward(experts: list, gate: Linear | None, X: np.ndarray, y: np.ndarray):
    """``y += Σ shared experts(X)`` (times σ(X·g) with Qwen2-MoE's ``gate``) -> (caches, the sum, gate cache)."""
    if not experts:
        return (), None, None
    outs = [expert.forward(X) for expert in experts]
    total = sum(out for out, _ in outs)
    c_gate = None
    if gate is not None:
        g, c_g = gate.forward(X)
        sig = 1.0 / (1.0 + np.exp(-g))
        y += sig * total
        c_gate = (c_g, sig)
    else:
        y += total
    return tuple(c for _, c in outs), total, c_gate


def shared_backward(experts: list, gate: Linear | None, dY: np.ndarray, dX: np.ndarray, cache) -> None:
    """``dX += `` the shared experts' (and their gate's) input gradients; adds into their weight gradients."""
    if not experts:
        return
    d_shared = dY
    if cache.gate is not None:
        c_g, sig = cache.gate
        d_shared = dY * sig
        dg = (dY * cache.shared_out).sum(axis=-1, keepdims=True) * sig * (1.0 - sig)
        dX += gate.backward(dg, c_g)
    for expert, c in zip(experts, cache.shared):
        dX += expert.backward(d_shared, c)


class MoE(Module):
    """``router`` (``tpsim.nn.router.Router``), ``experts`` (E SwiGLU FFNs of width ``ffn``), ``shared_experts``
    (SwiGLUs of width ``shared_ffn``, always on) and, with ``shared_gate``, Qwen2-MoE's sigmoid gate on them."""

    def __init__(self, hidden: int, ffn: int, experts: int, top: int, *, router: str = "softmax",
                 shared_experts: int = 0, shared_ffn: int | None = None, shared_gate: bool = False,
                 capacity_factor: float | None = None, aux_coef: float = 0.0, z_coef: float = 0.0,
                 rng: np.random.Generator | None = None, dtype=np.float64, std: float = 0.02) -> None:
        super().__init__()
        if capacity_factor is not None and not capacity_factor > 0:
            raise ConfigError(f"capacity factor {capacity_factor} must be > 0 (or None: dropless)")
        if shared_gate and not shared_experts:
            raise ConfigError("a shared-expert gate needs shared experts")
        rng = np.random.default_rng(0) if rng is None else rng
        self.router = Router(hidden, experts, top, kind=router, aux_coef=aux_coef, z_coef=z_coef, rng=rng,
                             dtype=dtype, std=std)
        self.experts = [SwiGLU(hidden, ffn, rng=rng, dtype=dtype, std=std) for _ in range(experts)]
        width = ffn if shared_ffn is None else shared_ffn
        self.shared_experts = [SwiGLU(hidden, width, rng=rng, dtype=dtype, std=std) for _ in range(shared_experts)]
        self.shared_expert_gate = Linear(hidden, 1, bias=False, rng=rng, dtype=dtype, std=std) if shared_gate \
            else None
        self.capacity_factor = capacity_factor
        self.groups = None  # capacity groups: shape -> [int rows of each group] (module docstring); None: one

    def capacity(self, tokens: int) -> int | None:
        """C = ⌈c · T·k / E⌉ tokens an expert keeps (None: dropless)."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * tokens * self.router.top / len(self.experts))

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, MoECache]:
        """``x: [b, s, h]`` (or ``[T, h]``) -> ``(y shaped as x, MoECache)``."""
        X = x.reshape(-1, x.shape[-1])
        (index, weights), c_router = self.router.forward(X, SequenceStats.serial(x.shape))
        if self.groups is None or self.capacity_factor is None:
            rows, slots, dropped = assignments(index, len(self.experts), self.capacity(len(X)))
        else:
            rows, slots, dropped = grouped_assignments(index, len(self.experts), self.capacity, self.groups(x.shape))
        y = np.zeros_like(X)
        caches, outputs = [], []
        for expert, r, j in zip(self.experts, rows, slots):
            if len(r) == 0:
                caches.append(None)
                outputs.append(np.zeros((0, X.shape[1]), dtype=X.dtype))
                continue
            out, cache = expert.forward(X[r])  # grouped: one pass over every token the expert got
            y[r] += weights[r, j][:, None] * out  # r holds each token once: a plain scatter-add
            caches.append(cache)
            outputs.append(out)
        shared, shared_out, gate = shared_forward(self.shared_experts, self.shared_expert_gate, X, y)
        return y.reshape(x.shape), MoECache(c_router, rows, slots, caches, outputs, shared, shared_out, gate,
                                            dropped, x.shape)

    def backward(self, dy: np.ndarray, cache: MoECache) -> np.ndarray:
        """``dy`` shaped as the output -> ``dx`` shaped as the input; adds into every expert's, the router's and
        the shared experts' gradients (the auxiliary losses' included)."""
        dY = dy.reshape(-1, dy.shape[-1])
        dX = np.zeros_like(dY)
        weights = cache.router.weights
        dweights = np.zeros_like(weights)
        for expert, r, j, c, out in zip(self.experts, cache.rows, cache.slots, cache.experts, cache.outputs):
            if c is None:
                continue
            dweights[r, j] = (dY[r] * out).sum(axis=-1)
            dX[r] += expert.backward(dY[r] * weights[r, j][:, None], c)
        dX += self.router.backward(dweights, cache.router)
        shared_backward(self.shared_experts, self.shared_expert_gate, dY, dX, cache)
        return dX.reshape(cache.shape)

    def __repr__(self) -> str:
        return (f"MoE({len(self.experts)} experts, top {self.router.top}, {self.router.kind}, "
                f"{len(self.shared_experts)} shared, capacity {self.capacity_factor})")
