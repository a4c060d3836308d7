"""VocabParallelEmbedding — the embedding table split by vocabulary rows (Shoeybi et al. 2019, "Megatron-LM", §3).

The master table E: [V, dim] is padded with zero rows to Vp (see ``tpsim.partition``) and rank r keeps the rows
[start, end). A token id lives on exactly one rank, so a lookup is a sum of p partial lookups in which every
rank but the owner contributes a zero row:

    forward   y_r[i] = E_r[ids[i] − start]  if start ≤ ids[i] < end  else 0     [...] -> [..., dim]
              y = g(y_r) = Σ_r y_r     (one all-reduce of [..., dim])
    backward  g backward is the identity: dy reaches every rank whole
              dE_r[v − start] += Σ_{i: ids[i] = v} dy[i]   for the ids this rank owns (no communication)

Built from the serial ``Embedding``'s master weights, the output equals the serial lookup at any TP size.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.comm import Group
from tpsim.nn.embedding import Embedding, check_ids
from tpsim.nn.module import Module, Partition
from tpsim.tp.mappings import ReduceFromTPRegion
from tpsim.partition import padded_vocab_size, take_shard, vocab_range


class VocabEmbeddingCache(NamedTuple):
    mine: np.ndarray  # bool [...]: which positions hold an id this rank owns
    local_ids: np.ndarray  # int [n_mine]: those ids, as rows of this rank's shard


class VocabParallelEmbedding(Module):
    """``weight: [Vp / tp, dim]`` (this rank's rows of the padded master); forward ``ids [...] -> [..., dim]``."""

    def __init__(self, vocab_size: int, dim: int, group: Group, *, rng: np.random.Generator | None = None,
                 dtype=np.float64, std: float = 0.02, weight: np.ndarray | None = None) -> None:
        """The keywords are the serial ``Embedding``'s: it draws (or, given ``weight``, checks) the master table,
        so every rank holds rows of the same master."""
        super().__init__()
        master_weight = Embedding(vocab_size, dim, rng=rng, dtype=dtype, std=std, weight=weight).params["weight"]
        self.group = group
        self.vocab_size, self.dim = vocab_size, dim
        self.padded_vocab_size = padded_vocab_size(vocab_size, group.size)
        self.vocab_start, self.vocab_end = vocab_range(self.padded_vocab_size, group.size, group.rank)
        # rows past the real vocabulary stay zero: they are padding, never looked up, never in the softmax
        part = Partition(0, np.arange(self.vocab_start, self.vocab_end), self.padded_vocab_size)
        self.add_param("weight", take_shard(master_weight, part), part)  # [Vp/p, dim]

    @classmethod
    def from_serial(cls, embedding: Embedding, group: Group) -> "VocabParallelEmbedding":
        """This rank's rows of the serial table (zero rows past the real vocabulary)."""
        w = embedding.params["weight"]
        return cls(w.shape[0], w.shape[1], group, dtype=w.dtype, weight=w)

    def forward(self, ids: np.ndarray):
        """``ids: [...]`` ints in ``[0, vocab_size)`` -> ``(out [..., dim] replicated, cache)``."""
        # checked on every rank before the collective: ids are replicated, so all ranks raise alike
        ids = check_ids(ids, self.vocab_size)
        local = ids - self.vocab_start
        mine = (local >= 0) & (local < self.vocab_end - self.vocab_start)
        local = np.where(mine, local, 0)  # a safe index for the others; their rows are zeroed next
        partial = self.params["weight"][local]  # fancy indexing: a fresh array, safe to write into
        partial[~mine] = 0.0
        with self.group.tracer.region(scope=self.path):
            out = ReduceFromTPRegion.forward(partial, self.group)
        return out, VocabEmbeddingCache(mine, local[mine])

    def backward(self, dout: np.ndarray, cache: VocabEmbeddingCache) -> None:
        """``dout: [..., dim]`` (whole on every rank: g's backward is the identity) -> None: ids carry no gradient.

        Scatter-adds the rows of ``dout`` whose id this rank owns; ``np.add.at`` keeps repeated ids.
        """
        dout = ReduceFromTPRegion.backward(dout, self.group)
        self.weight_grad(self.add_weight_grads, dout, cache)  # all of it is W (``Module.weight_grad``)
        return None

    def add_weight_grads(self, dout: np.ndarray, cache: VocabEmbeddingCache) -> None:
        """W: the rows of ``dout`` whose id this rank owns, scatter-added into its shard's gradient."""
        mine, local_ids = cache
        np.add.at(self.grads["weight"], local_ids, dout[mine])

    def __repr__(self) -> str:
        return (f"VocabParallelEmbedding({self.vocab_size}, {self.dim}, rows [{self.vocab_start}, "
                f"{self.vocab_end}) of {self.padded_vocab_size})")
