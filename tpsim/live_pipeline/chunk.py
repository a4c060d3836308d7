"""One pipeline stage's share of the model: a ``ModelChunk`` per virtual stage, a ``PipelineShard`` per rank.

A chunk is a piece of the GPT's (or Llama's) own wiring (``tpsim.models.gpt``), cut at block boundaries:

    virtual stage 0       ids -> embed (wte + wpe, SP split, dropout)      -> blocks a..b-1 -> x [b, s, h]
    a middle stage        x [b, s, h]                                    -> blocks a..b-1 -> x [b, s, h]
    the last stage        x [b, s, h] -> blocks -> ln_f -> LM head (vocab-parallel) -> cross-entropy -> loss
                          (under sequence parallelism every boundary x is this TP rank's [b, s/t, h])

``forward(x, labels, plan) -> (out, cache)`` (out: the boundary activation, or the micro-batch's mean loss on
the last stage) and ``backward(dout, cache) -> dx`` (dout: the gradient of the boundary activation, or the loss
seed; dx None on stage 0, whose input is token ids) keep the layers' contract (``tpsim.nn.module``): parameter
gradients are *added*, so micro-batches accumulate. Run under ``deferred_weight_grads(chunk)`` the backward is
the zero-bubble B, and ``backward_weights`` its W.

Every parameter keeps its serial name (``transformer.h.3.mlp.c_fc.weight``): a chunk names its children by
their full paths, so DP buckets, clipping, the optimizer, ``--init-from`` and the serial twin's comparison read a
stage exactly as they read the whole model, and the trace scopes are the serial model's layers. A tied word
embedding lives on the first stage *and* on the last one (the LM head's weight, listed there as
``transformer.wte``), marked there as copy 1 of the shard (``Partition.replica``): its gradient is summed over
the embedding group (``tpsim.live_pipeline.step``), and the gradient norm counts copy 0 only, as Megatron skips shared
parameters on the last stage.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from tpsim.models.gpt import _Wiring
from tpsim.nn.attention import SERIAL_CORE, AttentionCore
from tpsim.nn.dropout import DropoutPlan
from tpsim.nn.module import Module, WeightGradients
from tpsim.partition import within
from tpsim.tp.sequence_parallel import sequence_partition


class ChunkCache(NamedTuple):
    embed: tuple | None  # (wte, wpe, drop) caches on virtual stage 0
    h: list  # one BlockCache per block of the chunk
    ln_f: tuple | None  # the last stage's final norm, LM head and loss caches
    lm_head: tuple | None
    loss: tuple | None


class ModelChunk(_Wiring):
    """The layers of one virtual stage (see the module docstring). ``edge``: the model's body without its blocks
    (the embedding's wiring, stage 0 only); ``head``: ``(final norm, LM head, loss)`` on the last stage;
    ``core``: the attention core the blocks were built with (which positions a boundary activation holds)."""

    def __init__(self, stage: int, stages: int, blocks: list[Module], *, edge=None, head: tuple | None = None,
                 region=None, group=None, core: AttentionCore = SERIAL_CORE, named: dict[str, Module]) -> None:
        super().__init__()
        self.stage, self.stages = stage, stages
        self.first, self.last = stage == 0, stage == stages - 1
        if self.first != (edge is not None) or self.last != (head is not None):
            raise ValueError(f"virtual stage {stage} of {stages}: the embedding goes with stage 0, the head with "
                             "the last")
        self.edge, self.blocks, self.head = edge, list(blocks), head
        self.region, self.group = region, group
        self.core = core  # context parallelism: tpsim.cp.context.ContextParallel, the attention of every layer here
        self._named = dict(named)  # full serial path -> module: what ``children`` lists

    def boundary_plan(self, x: np.ndarray, plan: DropoutPlan) -> DropoutPlan:
        """The dropout plan for a boundary activation ``x`` arriving from the previous stage: masks are keyed by
        global position, so it names the positions ``x``'s rows hold — a CP rank's tokens (``core``), then
        under SP this TP rank's part of them."""
        sp = self.region is not None and self.region.splits_sequence
        s = self.region.sequence_length(x.shape[1], self.group) if sp else x.shape[1]
        plan = self.core.sequence_plan(plan, s)
        if sp:
            plan = replace(plan, seq_partition=within(sequence_partition(s, self.group), plan.seq_partition))
        return plan

    def children(self) -> dict[str, Module]:
        """The chunk's layers under their full serial paths (``transformer.h.3``), not its attribute names."""
        return dict(self._named)

    def forward(self, x: np.ndarray, labels: np.ndarray | None = None,
                plan: DropoutPlan = DropoutPlan()) -> tuple[np.ndarray | float, ChunkCache]:
        """``x``: ids ``int [b, s]`` on stage 0, else the boundary activation; -> ``(out, ChunkCache)``."""
        with self._span("", "forward"):  # the chunk's forward: the outermost span, as the whole model's is
            if self.first:
                x, plan, c_embed = self.edge.embed(x, plan)
            else:
                x, c_embed = x, None
                plan = self.boundary_plan(x, plan)
            caches = []
            for block in self.blocks:
                x, c = self._timed(block, "forward", x, plan)
                caches.append(c)
            if not self.last:
                return x, ChunkCache(c_embed, caches, None, None, None)
            ln_f, lm_head, loss = self.head
            y, c_lnf = self._timed(ln_f, "forward", x)
            logits, c_head = self._timed(lm_head, "forward", y)
            value, c_loss = self._timed(loss, "forward", logits, labels)
        return value, ChunkCache(c_embed, caches, c_lnf, c_head, c_loss)

    def backward(self, dout, cache: ChunkCache) -> np.ndarray | None:
        """``dout``: the loss seed on the last stage, else the gradient of the output -> the input's gradient
        (None on stage 0); adds into every parameter gradient of the chunk."""
        with self._span("", "backward"):
            dx = dout
            if self.last:
                ln_f, lm_head, loss = self.head
                dlogits = self._timed(loss, "backward", dout, cache.loss)
                dh = self._timed(lm_head, "backward", dlogits, cache.lm_head)
                dx = self._timed(ln_f, "backward", dh, cache.ln_f)
            for block, c in zip(reversed(self.blocks), reversed(cache.h)):
                dx = self._timed(block, "backward", dx, c)
            if self.first:
                self.edge.embed_backward(dx, cache.embed)
                return None
        return dx

    def backward_weights(self, weights: WeightGradients) -> None:
        """The W of a split backward: run the weight gradients that ``backward`` queued under
        ``deferred_weight_grads(self)`` (every layer's ``grads[...] +=``, and the collectives they need)."""
        with self._span("", "backward"):
            weights.run()

    @property
    def loss(self) -> Module | None:
        """The cross-entropy (its ``ignore_index`` marks padding) on the last stage, else None."""
        return self.head[2] if self.last else None

    def __repr__(self) -> str:
        layers = [b.path for b in self.blocks]
        return f"ModelChunk(stage {self.stage} of {self.stages}: {layers[0]} .. {layers[-1]})"


class PipelineShard(Module):
    """This pipeline rank's chunks as one Module (chunk c = virtual stage c·pp + pp_rank): what the optimizer, DP
    buckets, clipping and checks see; its parameters carry their serial names. ``config``: the model's;
    ``shared_embedding``: the tied word embedding when the first and the last stage both hold it and this rank is
    one of them (its gradient is summed over the embedding group), else None."""

    def __init__(self, config, chunks: list[ModelChunk], stage_layers: tuple[range, ...],
                 shared_embedding: Module | None = None) -> None:
        super().__init__()
        self.config, self.chunks, self.stage_layers = config, list(chunks), tuple(stage_layers)
        self.shared_embedding = shared_embedding

    def children(self) -> dict[str, Module]:
        out: dict[str, Module] = {}
        for chunk in self.chunks:
            out.update(chunk.children())
        return out


def mark_shared_copy(embedding: Module, head: Module) -> None:
    """The last stage's copy of a tied embedding shard: copy 1 (``Partition.replica``), so a norm counts it once."""
    part = replace(embedding.partition["weight"], replica=1)
    embedding.partition["weight"] = head.partition["weight"] = part
