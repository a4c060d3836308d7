"""The router of a mixture of experts: which k of E experts each token goes to, and with what weight.

    logits = x · W                         x [T, h], W [h, E] (no bias; Hugging Face's ``gate``)
    softmax, renormalised (Mixtral)        p = softmax(logits); the top-k of p; w = p_top / Σ p_top
    softmax (Qwen2-MoE, norm_topk_prob False)                    w = p_top
    sigmoid with a selection bias          s = sigmoid(logits); the top-k of s + b; w = s_top / Σ s_top
    (DeepSeek-V3, §2.1.2: the bias b chooses the experts and never weighs them; it is not trained by the
    gradient but moved between steps, ``update_bias``: b_i += γ · sign(mean load − load_i))

**Ties** (one rule, so every rank and the serial model choose the same experts bit for bit): among equal scores
the lower expert index wins — a stable sort of the negated scores (``top_k``).

**Auxiliary losses** (softmax routers), added to the training loss by the model, per sequence and averaged
over the B sequences (a sequence's tokens are the same whatever the batch is cut into, so every data-parallel
layout and micro-batch count sees the same loss; Megatron-LM's ``seq_aux_loss``, DeepSeek-V3's sequence-wise
balance loss):

    load balancing (Switch, GShard; on one sequence Hugging Face's ``load_balancing_loss_func`` on one layer)
        L_aux = α · E · mean_b Σ_i f_bi · P_bi   f_bi: the share of sequence b's s tokens whose k choices
                                                  include i, P_bi = mean_t∈b p_ti: i's mean router probability
    router z-loss (Zoph et al. 2022, ST-MoE)
        L_z = β · mean_t (log Σ_i exp logits_ti)²

f is a count and carries no gradient; the gradients are dL_aux/dp_ti = α·E·f_bi/T through the softmax, and
dL_z/dlogits_ti = β · 2·lse_t · p_ti / T. ``SequenceStats`` says how this layer's T tokens are cut into
sequences; under expert parallelism a sequence's tokens lie on several ranks (sequence and context
parallelism), and its ``reduce`` sums their counts there, its ``norm`` replaces T by the loss normaliser of the
rank's share (``tpsim.ep.router``). ``backward`` adds both to the router's weight gradient beside the
gradient of the expert weights w, as if the model's loss held them (Megatron-LM attaches them the same way).

The backward of the weights w, for the selected experts S of a token (other experts' entries of dw are 0):

    renormalised softmax    dp_i = (dw_i − Σ_{j∈S} dw_j·w_j) / Σ_{j∈S} p_j  for i ∈ S, then the softmax's
    plain softmax           dp_i = dw_i for i ∈ S, then the softmax's backward
    sigmoid                 ds_i = (dw_i − Σ_{j∈S} dw_j·w_j) / Σ_{j∈S} s_j, dlogits_i = ds_i · s_i · (1 − s_i)
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from tpsim.errors import ConfigError
from tpsim.nn.linear import Linear, LinearCache
from tpsim.nn.module import Module
from tpsim.nn.softmax import SoftmaxCache, softmax_backward, softmax_forward

ROUTERS = ("softmax", "softmax_plain", "sigmoid")  # Mixtral's, Qwen2-MoE's, DeepSeek-V3's


class SequenceStats(NamedTuple):
    """How the auxiliary losses see T token rows: ``sequences`` B of them (row-major, T/B rows each here),
    ``length`` s tokens a whole sequence, ``norm`` the gradients' normaliser, ``reduce`` the sum of a [B, ·]
    array over the ranks holding the rest of these sequences (serial: none of them)."""

    sequences: int
    length: int
    norm: float
    reduce: Callable[[np.ndarray], np.ndarray] = lambda a: a

    @classmethod
    def serial(cls, shape: tuple[int, ...]) -> "SequenceStats":
        """x of ``shape`` [b, s, h]: b sequences of s; [T, h]: one sequence of T."""
        b, s = (1, shape[0]) if len(shape) == 2 else (int(np.prod(shape[:-2])), shape[-2])
        return cls(b, s, float(b * s))


class RouterCache(NamedTuple):
    gate: LinearCache  # holds x
    logits: np.ndarray  # [T, E]
    scores: np.ndarray  # [T, E]: softmax probabilities, or sigmoids
    index: np.ndarray  # int [T, k]: the chosen experts, best first
    weights: np.ndarray  # [T, k]
    aux_loss: float  # α · E · Σ f·P (0 without α)
    z_loss: float  # β · mean lse² (0 without β)
    load: np.ndarray  # int [E]: tokens routed to each expert (each of a token's k choices counted)
    aux_grad: np.ndarray | None  # [T, E]: dL_aux/dp (None without α)
    norm: float  # the gradients' normaliser (T serially)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """``int [T, k]``: each row's k largest entries, best first; among equals the lower index first."""
    return np.argsort(-scores, axis=-1, kind="stable")[:, :k]


class Router(Module):
    """``gate: Linear(h, E)`` without bias, and the choice of ``kind`` (``ROUTERS``); ``aux_coef`` α and
    ``z_coef`` β weigh the auxiliary losses (module docstring); ``bias`` [E] is the sigmoid router's selection
    bias, a buffer outside the parameters. Inline: its ``gate`` is named as the layer's (Hugging Face's
    ``block_sparse_moe.gate``, ``mlp.gate``)."""

    inline = True

    def __init__(self, hidden: int, experts: int, top: int, *, kind: str = "softmax", aux_coef: float = 0.0,
                 z_coef: float = 0.0, rng: np.random.Generator | None = None, dtype=np.float64,
                 std: float = 0.02) -> None:
        super().__init__()
        if kind not in ROUTERS:
            raise ConfigError(f"router {kind!r}: one of {', '.join(ROUTERS)}")
        if not 0 < top <= experts:
            raise ConfigError(f"top-k {top} must be in 1 .. experts ({experts})")
        if kind == "sigmoid" and aux_coef:
            raise ConfigError("the sigmoid router balances by its selection bias (update_bias), not an aux loss: "
                              "set the aux-loss coefficient to 0")
        self.experts, self.top, self.kind = experts, top, kind
        self.aux_coef, self.z_coef = float(aux_coef), float(z_coef)
        self.gate = Linear(hidden, experts, bias=False, rng=np.random.default_rng(0) if rng is None else rng,
                           dtype=dtype, std=std)
        self.bias = np.zeros(experts)

    def forward(self, x: np.ndarray, stats: SequenceStats | None = None
                ) -> tuple[tuple[np.ndarray, np.ndarray], RouterCache]:
        """``x: [T, h]`` -> ``((index int [T, k], weights [T, k]), RouterCache)``; ``stats``: how the T rows fall
        into sequences (default: one sequence)."""
        logits, c_gate = self.gate.forward(x)
        if self.kind == "sigmoid":
            scores = 1.0 / (1.0 + np.exp(-logits))
            index = top_k(scores + self.bias, self.top)
        else:
            scores = softmax_forward(logits)[0]
            index = top_k(scores, self.top)
        picked = np.take_along_axis(scores, index, axis=-1)
        weights = picked if self.kind == "softmax_plain" else picked / picked.sum(axis=-1, keepdims=True)
        stats = SequenceStats(1, len(x), float(len(x))) if stats is None else stats
        (aux, z, aux_grad), load = self._auxiliary(logits, scores, index, stats), np.bincount(
            index.ravel(), minlength=self.experts)
        return (index, weights), RouterCache(c_gate, logits, scores, index, weights, aux, z, load, aux_grad,
                                             stats.norm)

    def _auxiliary(self, logits: np.ndarray, scores: np.ndarray, index: np.ndarray, stats: SequenceStats):
        """``(L_aux, L_z, dL_aux/dp [T, E] or None)`` per sequence (module docstring), one ``reduce`` of the
        counts, probability sums and Σ lse² of this rank's part of each sequence."""
        if not (self.aux_coef or self.z_coef):
            return 0.0, 0.0, None
        B, E = stats.sequences, self.experts
        rows = len(logits) // B  # this rank's tokens of each sequence
        seq = np.repeat(np.arange(B), rows)[:, None]
        counts = np.bincount((seq * E + index).ravel(), minlength=B * E).reshape(B, E)
        packed = np.zeros((B, 2 * E + 1))
        packed[:, :E], packed[:, E:2 * E] = counts, scores.reshape(B, rows, E).sum(axis=1)
        packed[:, -1] = (lse(logits) ** 2).reshape(B, rows).sum(axis=1)
        packed = stats.reduce(packed)  # whole sequences
        f, P = packed[:, :E] / stats.length, packed[:, E:2 * E] / stats.length
        aux = self.aux_coef * E * float(np.mean(np.sum(f * P, axis=-1))) if self.aux_coef else 0.0
        z = self.z_coef * float(packed[:, -1].sum()) / (B * stats.length) if self.z_coef else 0.0
        aux_grad = np.repeat(self.aux_coef * E * f / stats.norm, rows, axis=0) if self.aux_coef else None
        return aux, z, aux_grad

    def backward(self, dweights: np.ndarray, cache: RouterCache) -> np.ndarray:
        """``dweights [T, k]`` -> ``dx [T, h]``, the auxiliary losses' gradients added (module docstring)."""
        picked = np.take_along_axis(cache.scores, cache.index, axis=-1)
        if self.kind == "softmax_plain":
            dpicked = dweights
        else:  # w = picked / Σ picked: the quotient rule
            dpicked = (dweights - (dweights * cache.weights).sum(axis=-1, keepdims=True)) / picked.sum(
                axis=-1, keepdims=True)
        dscores = np.zeros_like(cache.scores)
        np.put_along_axis(dscores, cache.index, dpicked, axis=-1)
        if cache.aux_grad is not None:
            dscores += cache.aux_grad
        if self.kind == "sigmoid":
            dlogits = dscores * cache.scores * (1.0 - cache.scores)
        else:
            dlogits = softmax_backward(dscores, SoftmaxCache(cache.scores, -1))
        if self.z_coef:
            dlogits += self.z_coef * 2.0 * lse(cache.logits)[:, None] * softmax_forward(cache.logits)[0] / cache.norm
        return self.gate.backward(dlogits, cache.gate)

    def update_bias(self, load: np.ndarray, rate: float) -> None:
        """DeepSeek-V3's balancing between steps: ``b_i += rate · sign(mean load − load_i)`` (an overloaded
        expert is chosen less next step). ``load``: tokens per expert over the step (every rank's, summed)."""
        self.bias += rate * np.sign(np.mean(load) - np.asarray(load, dtype=float))

    def __repr__(self) -> str:
        return f"Router({self.gate.in_features} -> {self.experts}, top {self.top}, {self.kind})"


def lse(logits: np.ndarray) -> np.ndarray:
    """``[T]``: log Σ_i exp logits_ti, shifted by each row's maximum."""
    m = logits.max(axis=-1)
    return m + np.log(np.exp(logits - m[:, None]).sum(axis=-1))

