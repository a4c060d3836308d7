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

Sequence parallelism (``Transformer(sp_group=tp_group)``, Korthikanti et al. 2022): after ``wte(ids) + wpe``
the sequence is scattered, so LayerNorms, dropouts and residual adds run on [b, s/p, h]; the blocks' layers
gather/scatter it themselves (f̄/ḡ) and the LM head gathers it after ln_f. The embedding is Megatron's for
learned absolute positions: the vocab-parallel lookup all-reduces as before, wpe is added to the whole
[b, s, h], then ``ScatterToSequenceParallelRegion`` keeps this rank's positions (Megatron reduce-scatters in
the embedding only when there is no learned position embedding). Backward: the scatter's all-gather hands
wte and wpe the whole gradient, so wpe's gradient needs no extra all-reduce.

Given a tracer (``attach_tracer``; the parallel build does it), every sub-layer call runs inside a compute
span named by the sub-layer's path, so a timeline shows the per-layer forward and backward of a step.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np

from tpsim.nn.dropout import dropout_mask_apply
from tpsim.nn.module import Module, Partition
from tpsim.tp.sequence_parallel import ScatterToSequenceParallelRegion, check_sequence_length, sequence_partition


@dataclass(frozen=True)
class DropoutPlan:
    """Where dropout bits come from for one forward: the tracker, the step, the global rows held here."""

    rng: object | None = None  # a tpsim.tp.random.DropoutRNG; None = no dropout (evaluation)
    step: int = 0
    batch_index: np.ndarray | None = None  # global batch positions of the local rows (DP); None = all
    seq_partition: Partition | None = None  # SP: this rank's sequence positions (set by Transformer); None = all


def replicated_dropout(x: np.ndarray, p: float, key: str, plan: DropoutPlan):
    """Dropout on a replicated activation [b, s, h]: every TP rank draws the same bits. Returns (y, keep).

    Under sequence parallelism ``x`` is [b, s/p, h] at the positions ``plan.seq_partition`` names: the mask
    request gives those global positions, so the exact RNG draws the serial model's bits for them, and region
    "partitioned" (Megatron forks its model-parallel RNG for dropout in SP regions).
    """
    if p == 0.0 or plan.rng is None:
        return x, None
    b = x.shape[0]
    rows = np.arange(b) if plan.batch_index is None else np.asarray(plan.batch_index)
    seq = plan.seq_partition
    positions, s = (slice(None), x.shape[1]) if seq is None else (seq.index, seq.full)
    keep = plan.rng.keep_mask(p, key=key, step=plan.step, global_shape=(int(rows.max()) + 1, s, x.shape[2]),
                              index=(rows, positions, slice(None)),
                              region="replicated" if seq is None else "partitioned")
    return dropout_mask_apply(x, keep, p), keep


def _undrop(dy: np.ndarray, keep, p: float) -> np.ndarray:
    return dy if keep is None else dropout_mask_apply(dy, keep, p)


class _Wiring(Module):
    """Base of Block, Transformer and GPT: calls a child layer inside a compute span when a tracer is attached.

    The serial model has no tracer (a plain call), so ``nn`` stays free of any tracing.
    """

    tracer = None  # a tpsim.comm.Tracer or None; a class attribute, so the serial model carries nothing

    def _span(self, scope: str, phase: str):
        return nullcontext() if self.tracer is None else self.tracer.span(scope, phase)

    def _timed(self, child: Module, method: str, *args, **kwargs):
        """``child.forward(...)`` or ``child.backward(...)``, timed as span (child.path, method)."""
        with self._span(child.path, method):
            return getattr(child, method)(*args, **kwargs)


def attach_tracer(model: Module, tracer) -> Module:
    """Give every Block, Transformer and GPT in ``model`` the ``tracer`` that times their sub-layers."""
    for _, module in model.named_modules():
        if isinstance(module, _Wiring):
            module.tracer = tracer
    return model


class Block(_Wiring):
    """Pre-LN transformer block: ``x + drop(attn(ln_1(x)))``, then ``x + drop(mlp(ln_2(x)))``."""

    def __init__(self, ln_1: Module, attn: Module, ln_2: Module, mlp: Module, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = ln_1, attn, ln_2, mlp
        self.dropout = dropout

    def forward(self, x: np.ndarray, plan: DropoutPlan = DropoutPlan()):
        h1, c_ln1 = self._timed(self.ln_1, "forward", x)
        a, c_attn = self._timed(self.attn, "forward", h1, dropout_rng=plan.rng, step=plan.step,
                                batch_index=plan.batch_index)
        a, k_attn = replicated_dropout(a, self.dropout, f"{self.path}.attn.resid_dropout", plan)
        x = x + a
        h2, c_ln2 = self._timed(self.ln_2, "forward", x)
        m, c_mlp = self._timed(self.mlp, "forward", h2)
        m, k_mlp = replicated_dropout(m, self.dropout, f"{self.path}.mlp.dropout", plan)
        return x + m, (c_ln1, c_attn, k_attn, c_ln2, c_mlp, k_mlp)

    def backward(self, dy: np.ndarray, cache) -> np.ndarray:
        c_ln1, c_attn, k_attn, c_ln2, c_mlp, k_mlp = cache
        dm = self._timed(self.mlp, "backward", _undrop(dy, k_mlp, self.dropout), c_mlp)
        dx = dy + self._timed(self.ln_2, "backward", dm, c_ln2)  # the residual passes dy straight through
        da = self._timed(self.attn, "backward", _undrop(dx, k_attn, self.dropout), c_attn)
        return dx + self._timed(self.ln_1, "backward", da, c_ln1)


class Transformer(_Wiring):
    """``transformer.{wte, wpe, h.i, ln_f}``: embeddings, blocks and the final LayerNorm."""

    def __init__(self, wte: Module, wpe: Module, h: list[Block], ln_f: Module, dropout: float = 0.0, *,
                 sp_group=None) -> None:
        super().__init__()
        self.wte, self.wpe, self.h, self.ln_f = wte, wpe, list(h), ln_f
        self.dropout = dropout
        self.sp_group = sp_group  # the TP Group under sequence parallelism (x: [b, s/p, h]); None = off

    def forward(self, ids: np.ndarray, plan: DropoutPlan = DropoutPlan()):
        b, s = ids.shape
        n_pos = self.wpe.params["weight"].shape[0]
        if s > n_pos:
            raise ValueError(f"sequence length {s} exceeds n_positions {n_pos}")
        if self.sp_group is not None:  # on every rank, before the first collective
            check_sequence_length(s, self.sp_group.size)
        tok, c_wte = self._timed(self.wte, "forward", ids)
        pos, c_wpe = self._timed(self.wpe, "forward", np.arange(s))
        x = tok + pos  # [b,s,h] + [s,h]
        if self.sp_group is not None:  # enter the sequence-parallel region: keep this rank's s/p positions
            x = ScatterToSequenceParallelRegion.forward(x, self.sp_group)
            plan = replace(plan, seq_partition=sequence_partition(s, self.sp_group))
        x, keep = replicated_dropout(x, self.dropout, f"{self.path}.drop", plan)
        caches = []
        for block in self.h:
            x, c = self._timed(block, "forward", x, plan)
            caches.append(c)
        y, c_lnf = self._timed(self.ln_f, "forward", x)
        return y, (c_wte, c_wpe, keep, caches, c_lnf)

    def backward(self, dy: np.ndarray, cache) -> None:
        c_wte, c_wpe, keep, caches, c_lnf = cache
        dx = self._timed(self.ln_f, "backward", dy, c_lnf)
        for block, c in zip(reversed(self.h), reversed(caches)):
            dx = self._timed(block, "backward", dx, c)
        dx = _undrop(dx, keep, self.dropout)
        if self.sp_group is not None:  # the scatter's backward: all-gather [b, s/p, h] -> [b, s, h]
            with self.sp_group.tracer.region(scope=self.wte.path):
                dx = ScatterToSequenceParallelRegion.backward(dx, self.sp_group)
        self._timed(self.wpe, "backward", dx.sum(axis=0), c_wpe)  # positions are shared by every sequence
        self._timed(self.wte, "backward", dx, c_wte)


class GPT(_Wiring):
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
        with self._span(self.path, "forward"):  # the whole forward: the outermost span of the timeline
            h, c_tr = self._timed(self.transformer, "forward", ids, plan)
            logits, c_head = self._timed(self.lm_head, "forward", h)
            loss, c_loss = self._timed(self.loss, "forward", logits, labels)
        return loss, (c_tr, c_head, c_loss)

    def backward(self, dloss: float, cache) -> None:
        """Accumulate every parameter's gradient of ``dloss · loss``."""
        c_tr, c_head, c_loss = cache
        with self._span(self.path, "backward"):
            dlogits = self._timed(self.loss, "backward", dloss, c_loss)
            dh = self._timed(self.lm_head, "backward", dlogits, c_head)
            self._timed(self.transformer, "backward", dh, c_tr)

    def loss_and_grads(self, ids: np.ndarray, labels: np.ndarray, plan: DropoutPlan = DropoutPlan()) -> float:
        """Zero the gradients, run forward and backward, return the loss."""
        self.zero_grad()
        loss, cache = self.forward(ids, labels, plan)
        self.backward(1.0, cache)
        return loss
