"""A GPT-2 style model (pre-LN) written once, serial or tensor-parallel depending on the layers it is given.

    x = drop(wte(ids) + wpe(positions))                         [b, s, h]
    for each block:  x = x + drop(attn(ln_1(x)))                 attention: 1 all-reduce fwd, 1 bwd (TP)
                     x = x + drop(mlp(ln_2(x)))                  MLP:       1 all-reduce fwd, 1 bwd (TP)
    logits = ln_f(x) · wteᵀ   (tied)                              vocab-parallel under TP, never gathered
    loss = mean cross-entropy(logits, labels)                    labels[b, t] = target of position t

The serial model (``tpsim.models.build.serial_gpt``) plugs in ``Embedding``, ``CausalSelfAttention``, ``MLP``,
``TiedLMHead`` and ``CrossEntropyLoss``; the parallel one plugs in their TP twins. Because the wiring is this
one file, "TP equals serial" tests exactly the layers, not two hand-copied models.

Module paths are Hugging Face GPT-2's (``transformer.h.0.attn.c_attn``) and serve as trace scopes and
parameter names alike. Dropout masks come from a ``DropoutRNG`` keyed by site, step and global position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpsim.nn.dropout import dropout_mask_apply
from tpsim.nn.module import Module


@dataclass(frozen=True)
class DropoutPlan:
    """Where dropout bits come from for one forward: the tracker, the step, the global rows held here."""

    rng: object | None = None  # a tpsim.tp.random.DropoutRNG; None = no dropout (evaluation)
    step: int = 0
    batch_index: np.ndarray | None = None  # global batch positions of the local rows (DP); None = all


def replicated_dropout(x: np.ndarray, p: float, key: str, plan: DropoutPlan):
    """Dropout on a replicated activation [b, s, h]: every TP rank draws the same bits. Returns (y, keep)."""
    if p == 0.0 or plan.rng is None:
        return x, None
    b = x.shape[0]
    rows = np.arange(b) if plan.batch_index is None else np.asarray(plan.batch_index)
    keep = plan.rng.keep_mask(p, key=key, step=plan.step, global_shape=(int(rows.max()) + 1, *x.shape[1:]),
                              index=(rows, slice(None), slice(None)), region="replicated")
    return dropout_mask_apply(x, keep, p), keep


def _undrop(dy: np.ndarray, keep, p: float) -> np.ndarray:
    return dy if keep is None else dropout_mask_apply(dy, keep, p)


class Block(Module):
    """Pre-LN transformer block: ``x + drop(attn(ln_1(x)))``, then ``x + drop(mlp(ln_2(x)))``."""

    def __init__(self, ln_1: Module, attn: Module, ln_2: Module, mlp: Module, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = ln_1, attn, ln_2, mlp
        self.dropout = dropout

    def forward(self, x: np.ndarray, plan: DropoutPlan = DropoutPlan()):
        h1, c_ln1 = self.ln_1.forward(x)
        a, c_attn = self.attn.forward(h1, dropout_rng=plan.rng, step=plan.step, batch_index=plan.batch_index)
        a, k_attn = replicated_dropout(a, self.dropout, f"{self.path}.attn.resid_dropout", plan)
        x = x + a
        h2, c_ln2 = self.ln_2.forward(x)
        m, c_mlp = self.mlp.forward(h2)
        m, k_mlp = replicated_dropout(m, self.dropout, f"{self.path}.mlp.dropout", plan)
        return x + m, (c_ln1, c_attn, k_attn, c_ln2, c_mlp, k_mlp)

    def backward(self, dy: np.ndarray, cache) -> np.ndarray:
        c_ln1, c_attn, k_attn, c_ln2, c_mlp, k_mlp = cache
        dm = self.mlp.backward(_undrop(dy, k_mlp, self.dropout), c_mlp)
        dx = dy + self.ln_2.backward(dm, c_ln2)  # the residual passes dy straight through
        da = self.attn.backward(_undrop(dx, k_attn, self.dropout), c_attn)
        return dx + self.ln_1.backward(da, c_ln1)


class Transformer(Module):
    """``transformer.{wte, wpe, h.i, ln_f}``: embeddings, blocks and the final LayerNorm."""

    def __init__(self, wte: Module, wpe: Module, h: list[Block], ln_f: Module, dropout: float = 0.0) -> None:
        super().__init__()
        self.wte, self.wpe, self.h, self.ln_f = wte, wpe, list(h), ln_f
        self.dropout = dropout

    def forward(self, ids: np.ndarray, plan: DropoutPlan = DropoutPlan()):
        b, s = ids.shape
        n_pos = self.wpe.params["weight"].shape[0]
        if s > n_pos:
            raise ValueError(f"sequence length {s} exceeds n_positions {n_pos}")
        tok, c_wte = self.wte.forward(ids)
        pos, c_wpe = self.wpe.forward(np.arange(s))
        x, keep = replicated_dropout(tok + pos, self.dropout, f"{self.path}.drop", plan)  # [b,s,h] + [s,h]
        caches = []
        for block in self.h:
            x, c = block.forward(x, plan)
            caches.append(c)
        y, c_lnf = self.ln_f.forward(x)
        return y, (c_wte, c_wpe, keep, caches, c_lnf)

    def backward(self, dy: np.ndarray, cache) -> None:
        c_wte, c_wpe, keep, caches, c_lnf = cache
        dx = self.ln_f.backward(dy, c_lnf)
        for block, c in zip(reversed(self.h), reversed(caches)):
            dx = block.backward(dx, c)
        dx = _undrop(dx, keep, self.dropout)
        self.wpe.backward(dx.sum(axis=0), c_wpe)  # positions are shared by every sequence of the batch
        self.wte.backward(dx, c_wte)


class GPT(Module):
    """``transformer`` + tied ``lm_head`` + ``loss``; ``forward(ids, labels) -> (mean loss, cache)``."""

    def __init__(self, config, transformer: Transformer, lm_head: Module, loss: Module) -> None:
        super().__init__()
        self.config = config
        self.transformer, self.lm_head, self.loss = transformer, lm_head, loss
        self.set_path("")

    def forward(self, ids: np.ndarray, labels: np.ndarray, plan: DropoutPlan = DropoutPlan()):
        """``ids, labels: int [b, s]`` -> ``(loss: float, cache)``; labels equal to ignore_index are skipped."""
        if ids.ndim != 2 or labels.shape != ids.shape:
            raise ValueError(f"ids and labels must both be [batch, seq]; got {ids.shape} and {labels.shape}")
        h, c_tr = self.transformer.forward(ids, plan)
        logits, c_head = self.lm_head.forward(h)
        loss, c_loss = self.loss.forward(logits, labels)
        return loss, (c_tr, c_head, c_loss)

    def backward(self, dloss: float, cache) -> None:
        """Accumulate every parameter's gradient of ``dloss · loss``."""
        c_tr, c_head, c_loss = cache
        dlogits = self.loss.backward(dloss, c_loss)
        dh = self.lm_head.backward(dlogits, c_head)
        self.transformer.backward(dh, c_tr)

    def loss_and_grads(self, ids: np.ndarray, labels: np.ndarray, plan: DropoutPlan = DropoutPlan()) -> float:
        """Zero the gradients, run forward and backward, return the loss."""
        self.zero_grad()
        loss, cache = self.forward(ids, labels, plan)
        self.backward(1.0, cache)
        return loss
