"""ParallelLMHead — the output layer, tied to the vocab-parallel embedding, producing vocab-parallel logits.

GPT ties the output projection to the input embedding E: [V, dim] (logits = h·Eᵀ). With E split by vocabulary
rows, rank r holds E_r: [Vp/p, dim] and computes the logits of *its* vocabulary slice with no communication —
a column-parallel linear whose weight is E_rᵀ:

    forward   h --f--> logits_r = h·E_rᵀ                      [..., dim] -> [..., Vp/p]   (never gathered)
    backward  dE_r += dlogits_rᵀ·h,  dh_r = dlogits_r·E_r      (dh_r is a partial sum over the vocabulary)
              f backward: dh = all_reduce(dh_r)                (h fed every shard, so its grads add up)

Built with ``region=SP_REGION`` (Megatron's output layer under SP) ln_f's output is a shard [b, s/p, dim] and
f̄ replaces f, exactly as in a column-parallel linear — it *is* one (``column_parallel_forward``/``_backward``):

    forward   h = all_gather(h_r)  [b, s/p, dim] -> [b, s, dim];   logits_r = h·E_rᵀ  [b, s, Vp/p]
    backward  h = all_gather(h_r) again;  dE_r += dlogits_rᵀ·h;  dh_r = reduce_scatter(dlogits_r·E_r)

The logits stay split: ``vocab_parallel_cross_entropy`` consumes them as they are, which is the point — a
[tokens, V] tensor is the largest activation of a language model and it never crosses the network.

Tying is done by *sharing*: the head's ``params["weight"]`` and ``grads["weight"]`` are the very arrays of the
embedding, so both backward passes add into one gradient buffer, one optimizer update moves both, and
``Module.named_parameters`` (which deduplicates by ``id``) lists the weight once.
"""

from __future__ import annotations

import numpy as np

from tpsim.nn.linear import LinearCache
from tpsim.nn.module import Module
from tpsim.tp.column_parallel import (column_parallel_backward_input, column_parallel_backward_weight,
                                     column_parallel_forward)
from tpsim.tp.regions import TP_REGION, Region
from tpsim.tp.vocab_embedding import VocabParallelEmbedding


class ParallelLMHead(Module):
    """``logits_local = h · weightᵀ`` with ``weight: [Vp/p, dim]`` shared with ``embedding`` (``tied=True``).

    ``tied=False`` gives the head its own copy of the embedding's shard (and its own gradient) — build it from a
    separately drawn ``VocabParallelEmbedding`` for an untied model.
    """

    def __init__(self, embedding: VocabParallelEmbedding, *, tied: bool = True, region: Region = TP_REGION) -> None:
        super().__init__()
        self.region = region  # input replicated [..., dim] (f) or [b, s/p, dim] (f̄)
        # Not stored as an attribute: a Module attribute would become a child, and set_path would rename the
        # embedding to "<head>.embedding". Only its numbers and the group are kept.
        self.group, self.tied = embedding.group, tied
        self.vocab_size, self.padded_vocab_size = embedding.vocab_size, embedding.padded_vocab_size
        self.vocab_start, self.vocab_end = embedding.vocab_start, embedding.vocab_end
        if tied:  # the same two arrays, not copies: see the module docstring
            self.params["weight"] = embedding.params["weight"]
            self.grads["weight"] = embedding.grads["weight"]
            self.partition["weight"] = embedding.partition["weight"]
        else:
            self.add_param("weight", embedding.params["weight"], embedding.partition["weight"])

    def forward(self, h: np.ndarray) -> tuple[np.ndarray, LinearCache]:
        """``h: [..., dim]`` replicated (SP: ``[b, s/p, dim]``) -> ``(logits_local [..., Vp/p], cache)``."""
        with self.group.tracer.region(scope=self.path):
            return column_parallel_forward(h, self.params["weight"].T, None, self.group, self.region)

    def backward(self, dlogits: np.ndarray, cache: LinearCache) -> np.ndarray:
        """``dlogits: [..., Vp/p]`` (this rank's columns) -> ``dh`` shaped as ``h``, summed over the shards."""
        with self.group.tracer.region(scope=self.path):
            self.weight_grad(self.add_weight_grads, dlogits, cache)  # W first: SP's all-gather, then f̄'s
            return column_parallel_backward_input(dlogits, cache, self.group, self.region)

    def add_weight_grads(self, dlogits: np.ndarray, cache: LinearCache) -> None:
        """W: ``dE_r += dlogits_rᵀ·h`` (h all-gathered again under SP), traced under this layer's path."""
        with self.group.tracer.region(scope=self.path):
            dw_t, _ = column_parallel_backward_weight(dlogits, cache, self.group, self.region)
            self.grads["weight"] += dw_t.T  # [dim, Vp/p]ᵀ; += so a tied embedding's lookup grads are kept

    def __repr__(self) -> str:
        sp = ", sequence_parallel=True" if self.region.splits_sequence else ""
        return (f"ParallelLMHead(vocab {self.vocab_size}, columns [{self.vocab_start}, {self.vocab_end}), "
                f"tied={self.tied}{sp})")
