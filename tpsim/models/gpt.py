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
parameter names alike. Dropout masks come from a ``DropoutRNG`` keyed by site, step and global position;
a forward carries it in a ``DropoutPlan`` (``tpsim.nn.dropout``) that every block and attention layer takes.

Sequence parallelism (``Transformer(region=SP_REGION, group=tp_group)``, Korthikanti et al. 2022; the region is
chosen once, at build time, ``tpsim.tp.regions``): after ``wte(ids) + wpe``
the sequence is scattered, so LayerNorms, dropouts and residual adds run on [b, s/p, h]; the blocks' layers
gather/scatter it themselves (f̄/ḡ) and the LM head gathers it after ln_f. The embedding is Megatron's for
learned absolute positions: the vocab-parallel lookup all-reduces as before, wpe is added to the whole
[b, s, h], then ``ScatterToSequenceParallelRegion`` keeps this rank's positions (Megatron reduce-scatters in
the embedding only when there is no learned position embedding). Backward: the scatter's all-gather hands
wte and wpe the whole gradient, so wpe's gradient needs no extra all-reduce.

Context parallelism (``Transformer(core=...)`` and every attention layer built with the same attention core,
``tpsim.cp``): ``ids`` hold this rank's s/C tokens of every sequence; the learned positions and the dropout
masks are taken at the absolute positions the core names (``core.positions``, ``core.sequence_plan``; serially
0..s-1 and the plan as is), and every attention layer attends across the CP group; every other layer is per
token and unchanged.

Given a tracer (``attach_tracer``; the parallel build does it), every sub-layer call runs inside a compute
span named by the sub-layer's path, so a timeline shows the per-layer forward and backward of a step.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

import numpy as np

from tpsim.kinds import ELEMENTWISE, marked
from tpsim.nn.attention import SERIAL_CORE, AttentionCore
from tpsim.nn.dropout import DropoutCache, DropoutPlan, dropout_backward, replicated_dropout
from tpsim.nn.module import Module
from tpsim.tp.regions import TP_REGION, Region


residual_add = marked(ELEMENTWISE)(np.add)  # x + a, timed as elementwise work when traced


class BlockCache(NamedTuple):
    ln_1: tuple  # the caches of the block's layers, by their GPT-2 names
    attn: tuple
    attn_dropout: DropoutCache  # the residual dropout after attention (``attn.resid_dropout``)
    ln_2: tuple
    mlp: tuple
    mlp_dropout: DropoutCache  # the residual dropout after the MLP (``mlp.dropout``)


class TransformerCache(NamedTuple):
    wte: tuple
    wpe: tuple
    drop: DropoutCache  # the embedding dropout
    h: list[BlockCache]  # one per block
    ln_f: tuple


class GPTCache(NamedTuple):
    transformer: TransformerCache
    lm_head: tuple
    loss: tuple


class _Wiring(Module):
    """Base of Block, Transformer and GPT: calls a child layer inside a compute span when a tracer is attached.

    The serial model has no tracer (a plain call), so ``nn`` stays free of any tracing.
    """

    tracer = None  # a tpsim.comm.Tracer or None; a class attribute, so the serial model carries nothing

    def _span(self, scope: str, phase: str):
        return nullcontext() if self.tracer is None else self.tracer.span(scope, phase)

    def _timed(self, child: Module, method: str, *args, **kwargs):
        """``child.forward(...)`` or ``child.backward(...)``, timed as span (child.path, method), inside the
        child's hooks for that call (``Module.hooked``, outside the span): a forward may first wait for its
        parameters' posted all-gather (ZeRO-1's ``--overlap-param-gather``), and under ZeRO-3 the child's
        parameters are gathered for the call and freed after it."""
        with child.hooked(method), self._span(child.path, method):
            return getattr(child, method)(*args, **kwargs)


def attach_tracer(model: Module, tracer) -> Module:
    """Give every Block, Transformer and GPT in ``model`` the ``tracer`` that times their sub-layers."""
    for _, module in model.named_modules():
        if isinstance(module, _Wiring):
            module.tracer = tracer
    return model


class Block(_Wiring):
    """Pre-LN transformer block: ``x + drop(attn(ln_1(x)))``, then ``x + drop(mlp(ln_2(x)))``."""

    NAMES = ("ln_1", "attn", "ln_2", "mlp")  # the attributes (and module paths) of the parts; a subclass renames

    def __init__(self, ln_1: Module, attn: Module, ln_2: Module, mlp: Module, dropout: float = 0.0) -> None:
        super().__init__()
        for name, part in zip(self.NAMES, (ln_1, attn, ln_2, mlp)):
            setattr(self, name, part)
        self.dropout = dropout

    def parts(self) -> tuple[Module, Module, Module, Module]:
        """(norm before attention, attention, norm before the MLP, MLP), under whatever names ``NAMES`` gives."""
        return tuple(getattr(self, name) for name in self.NAMES)

    def forward(self, x: np.ndarray, plan: DropoutPlan = DropoutPlan()) -> tuple[np.ndarray, BlockCache]:
        """``x: [b, s, h]`` (SP: ``[b, s/p, h]``) -> ``(y, BlockCache)``, ``y`` shaped as ``x``."""
        ln_1, attn, ln_2, mlp = self.parts()
        h1, c_ln1 = self._timed(ln_1, "forward", x)
        a, c_attn = self._timed(attn, "forward", h1, plan)
        a, d_attn = replicated_dropout(a, self.dropout, f"{self.path}.attn.resid_dropout", plan)
        x = residual_add(x, a)
        h2, c_ln2 = self._timed(ln_2, "forward", x)
        m, c_mlp = self._timed(mlp, "forward", h2)
        m, d_mlp = replicated_dropout(m, self.dropout, f"{self.path}.mlp.dropout", plan)
        return residual_add(x, m), BlockCache(c_ln1, c_attn, d_attn, c_ln2, c_mlp, d_mlp)

    def backward(self, dy: np.ndarray, cache: BlockCache) -> np.ndarray:
        """``dy`` shaped as the output -> ``dx`` shaped as the input; adds into every sub-layer's grads."""
        ln_1, attn, ln_2, mlp = self.parts()
        dm = self._timed(mlp, "backward", dropout_backward(dy, cache.mlp_dropout), cache.mlp)
        dx = residual_add(dy, self._timed(ln_2, "backward", dm, cache.ln_2))  # dy passes the residual as is
        da = self._timed(attn, "backward", dropout_backward(dx, cache.attn_dropout), cache.attn)
        return residual_add(dx, self._timed(ln_1, "backward", da, cache.ln_1))


class Transformer(_Wiring):
    """``transformer.{wte, wpe, h.i, ln_f}``: embeddings, blocks and the final LayerNorm."""

    NAMES = ("wte", "wpe", "h", "ln_f")  # a subclass renames them; "" for a part it does not have

    def __init__(self, wte: Module, wpe: Module | None, h: list[Block], ln_f: Module, dropout: float = 0.0, *,
                 region: Region = TP_REGION, group=None, core: AttentionCore = SERIAL_CORE) -> None:
        super().__init__()
        for name, part in zip(self.NAMES, (wte, wpe, list(h), ln_f)):
            if name:
                setattr(self, name, part)
        self.dropout = dropout
        self.region, self.group = region, group  # SP_REGION: the blocks see [b, s/p, h] of the TP group
        self.core = core  # the blocks' attention core: which positions ids hold (CP: this rank's tokens)

    def forward(self, ids: np.ndarray, plan: DropoutPlan = DropoutPlan()) -> tuple[np.ndarray, TransformerCache]:
        """``ids: int [b, s]`` -> ``(ln_f's output [b, s, h] (SP: [b, s/p, h]), TransformerCache)``."""
        _, _, blocks, ln_f = self.parts()
        x, plan, (c_wte, c_wpe, drop) = self.embed(ids, plan)
        caches = []
        for block in blocks:
            x, c = self._timed(block, "forward", x, plan)
            caches.append(c)
        y, c_lnf = self._timed(ln_f, "forward", x)
        return y, TransformerCache(c_wte, c_wpe, drop, caches, c_lnf)

    def embed(self, ids: np.ndarray, plan: DropoutPlan = DropoutPlan()) -> tuple[np.ndarray, DropoutPlan, tuple]:
        """The model's edge: ``ids: int [b, s]`` -> ``(x [b, s, h] (SP: [b, s/p, h]), the plan the blocks take,
        (wte, wpe, drop) caches)``; a pipeline's first stage calls it alone (``tpsim.live_pipeline.chunk``)."""
        wte, wpe, _, _ = self.parts()
        b, s = ids.shape
        cp = self.core.size  # CP: ids are this rank's s/C tokens of every sequence
        if wpe is not None and s * cp > wpe.params["weight"].shape[0]:
            raise ValueError(f"sequence length {s * cp} exceeds n_positions {wpe.params['weight'].shape[0]}")
        self.region.check_sequence(s, self.group)  # on every rank, before the first collective
        x, c_wte = self._timed(wte, "forward", ids)
        c_wpe = None  # no learned positions (RoPE models rotate q and k inside attention instead)
        plan = self.core.sequence_plan(plan, s)  # CP: dropout masks name the absolute places of this rank's tokens
        if wpe is not None:
            pos, c_wpe = self._timed(wpe, "forward", self.core.positions(s))  # serially arange(s)
            x = residual_add(x, pos)  # [b,s,h] + [s,h]
        x, plan = self.region.split_sequence(x, plan, self.group)  # SP: this rank's s/p positions
        x, drop = replicated_dropout(x, self.dropout, f"{self.path}.drop", plan)
        return x, plan, (c_wte, c_wpe, drop)

    def backward(self, dy: np.ndarray, cache: TransformerCache) -> None:
        """``dy`` shaped as the output -> None (ids carry no gradient); adds into every parameter's grad."""
        _, _, blocks, ln_f = self.parts()
        dx = self._timed(ln_f, "backward", dy, cache.ln_f)
        for block, c in zip(reversed(blocks), reversed(cache.h)):
            dx = self._timed(block, "backward", dx, c)
        self.embed_backward(dx, (cache.wte, cache.wpe, cache.drop))

    def embed_backward(self, dx: np.ndarray, caches: tuple) -> None:
        """``embed``'s backward: ``dx`` shaped as its output -> None; adds into wte's (and wpe's) gradient."""
        wte, wpe, _, _ = self.parts()
        c_wte, c_wpe, drop = caches
        dx = dropout_backward(dx, drop)
        dx = self.region.split_sequence_backward(dx, self.group, wte.path)  # SP: all-gather to [b, s, h]
        if wpe is not None:
            self._timed(wpe, "backward", dx.sum(axis=0), c_wpe)  # positions are shared by every sequence
        self._timed(wte, "backward", dx, c_wte)

    def parts(self) -> tuple[Module, Module | None, list, Module]:
        """(token embedding, position embedding or None, blocks, final norm), under the names of ``NAMES``."""
        return tuple(getattr(self, name) if name else None for name in self.NAMES)


class GPT(_Wiring):
    """``transformer`` + tied ``lm_head`` + ``loss``; ``forward(ids, labels) -> (mean loss, cache)``."""

    BODY = "transformer"  # the attribute (and module path) of the body; a Llama's is "model"

    def __init__(self, config, transformer: Transformer, lm_head: Module, loss: Module) -> None:
        super().__init__()
        self.config = config
        setattr(self, self.BODY, transformer)
        self.lm_head, self.loss = lm_head, loss
        self.set_path("")

    def forward(self, ids: np.ndarray, labels: np.ndarray, plan: DropoutPlan = DropoutPlan()):
        """``ids, labels: int [b, s]`` -> ``(loss: float, cache)``; labels equal to ignore_index are skipped."""
        if ids.ndim != 2 or labels.shape != ids.shape:
            raise ValueError(f"ids and labels must both be [batch, seq]; got {ids.shape} and {labels.shape}")
        with self._span(self.path, "forward"):  # the whole forward: the outermost span of the timeline
            h, c_tr = self._timed(self.body(), "forward", ids, plan)
            logits, c_head = self._timed(self.lm_head, "forward", h)
            loss, c_loss = self._timed(self.loss, "forward", logits, labels)
        return loss, GPTCache(c_tr, c_head, c_loss)

    def backward(self, dloss: float, cache: GPTCache) -> None:
        """Accumulate every parameter's gradient of ``dloss · loss``; returns None (ids carry no gradient)."""
        with self._span(self.path, "backward"):
            dlogits = self._timed(self.loss, "backward", dloss, cache.loss)
            dh = self._timed(self.lm_head, "backward", dlogits, cache.lm_head)
            self._timed(self.body(), "backward", dh, cache.transformer)

    def body(self) -> Module:
        """The embeddings, blocks and final norm (``transformer``; a Llama's ``model``)."""
        return getattr(self, self.BODY)

    def loss_and_grads(self, ids: np.ndarray, labels: np.ndarray, plan: DropoutPlan = DropoutPlan()) -> float:
        """Zero the gradients, run forward and backward, return the loss."""
        self.zero_grad()
        loss, cache = self.forward(ids, labels, plan)
        self.backward(1.0, cache)
        return loss
