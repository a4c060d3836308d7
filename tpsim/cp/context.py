"""``ContextParallel``: one layer's attention across the CP group, by ring, all-gather or Ulysses (``--cp-comm``).

It is an attention core (``tpsim.nn.attention.AttentionCore``): the model builders hand it to every attention
layer and to the model's body at construction (``core_for``, as a TP layer is handed its ``Region``), so the
serial layers call it exactly where they would call ``tpsim.nn.attention.SERIAL_CORE`` and never ask which.

A context-parallel rank holds s/C tokens of every sequence (which ones: ``--cp-layout``, ``tpsim.cp.layout``).
Every layer but attention works token by token and needs nothing from the other shards; attention's queries need
every earlier key. ``ContextParallel.forward(q, k, v)`` takes this rank's Q ``[b, h, s/C, d]`` and K, V ``[b, kv,
s/C, d]`` (RoPE already applied at the tokens' absolute positions) and returns the causal attention of its
queries over the whole sequence, ``[b, h, s/C, d]``, equal to serial attention's rows for those positions;
``backward(dout, cache)`` returns dQ, dK, dV of the shard, the serial gradients' rows. Three ways:

    ring        ``tpsim.cp.ring``       K/V around the ring, partial results merged by log-sum-exp
    allgather   ``tpsim.cp.gathered``   K/V all-gathered, their gradients reduce-scattered
    ulysses     ``tpsim.cp.ulysses``    all-to-all to head shards and back

In a 16-bit run the arithmetic is float32 (the exponentials, the merge, the accumulated dK/dV) and what travels
is the activations' dtype, 2 bytes an element; float64 runs stay float64. ``head_pairs`` counts the attention
work done here: (query, key) pairs under the causal mask, times the heads computed — the FLOPs up to 4·d a pair —
so a balanced layout shows equal work on every rank (``tpsim.cp.layout.causal_pairs``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tpsim.cp import choice
from tpsim.cp.blocks import block_backward, block_forward
from tpsim.cp.gathered import gathered_backward, gathered_forward
from tpsim.cp.layout import positions
from tpsim.cp.ring import ring_backward, ring_forward
from tpsim.cp.ulysses import ulysses_backward, ulysses_forward
from tpsim.nn.attention import SERIAL_CORE, AttentionCore
from tpsim.nn.dropout import DropoutPlan
from tpsim.partition import Partition
from tpsim.phases import BACKWARD, FORWARD


def _alone_forward(ctx, q, k, v, keep=None, p: float = 0.0):
    """CP 1: the rank holds the whole sequence, nothing to exchange."""
    pos = np.arange(q.shape[2])
    ctx.count(pos, pos, q.shape[1])
    out, lse = block_forward(q, k, v, pos, pos, keep(pos, pos, None) if keep is not None else None, p)
    return out, (q, k, v, out, lse)


def _alone_backward(ctx, dout, cache, keep=None, p: float = 0.0):
    q, k, v, out, lse = cache
    pos = np.arange(q.shape[2])
    return block_backward(dout, out, lse, q, k, v, pos, pos, keep(pos, pos, None) if keep is not None else None, p)


_ALONE = (_alone_forward, _alone_backward)
_WAYS = {"ring": (ring_forward, ring_backward), "allgather": (gathered_forward, gathered_backward),
         "ulysses": (ulysses_forward, ulysses_backward)}


class ContextParallel:
    """Attention of a CP ``group`` (a traced ``tpsim.comm.Group``) by ``comm``, tokens laid out by ``layout``: the
    attention core of every layer of a context-parallel model (one per model: ``head_pairs`` sums their work)."""

    def __init__(self, group, comm: str = "ring", layout: str = "zigzag") -> None:
        choice.check_names(comm, layout)
        self.group, self.comm, self.layout = group, comm, layout
        self.dtype = np.dtype(np.float64)  # what travels; set per call from the activations
        self.head_pairs = 0

    @property
    def size(self) -> int:
        return self.group.size

    def rank_positions(self, rank: int, local: int) -> np.ndarray:
        """The absolute positions CP rank ``rank`` holds when each rank holds ``local`` tokens."""
        if self.group.size == 1:
            return np.arange(local)
        return positions(self.layout, rank, self.group.size, local * self.group.size)

    def positions(self, local: int) -> np.ndarray:
        """The absolute positions of this rank's ``local`` tokens (the learned-position rows, RoPE's angles)."""
        return self.rank_positions(self.group.rank, local)

    def sequence_plan(self, plan: DropoutPlan, local: int) -> DropoutPlan:
        """``plan`` for rows holding this rank's ``local`` tokens: dropout masks drawn at their absolute positions."""
        return replace(plan, seq_partition=Partition(dim=1, index=self.positions(local), full=local * self.size))

    def count(self, q_pos: np.ndarray, k_pos: np.ndarray, heads: int, *, heads_here: int | None = None,
              backward: bool = False) -> int:
        """(query, key) pairs of one block under the causal mask; the forward's are added to ``head_pairs``."""
        pairs = int(np.searchsorted(np.sort(k_pos), q_pos, side="right").sum())
        if not backward:
            self.head_pairs += pairs * (heads if heads_here is None else heads_here)
        return pairs

    def _way(self):
        return _ALONE if self.group.size == 1 else _WAYS[self.comm]

    def _work(self, x: np.ndarray):
        self.dtype = x.dtype
        return np.float32 if x.dtype.itemsize < 4 else x.dtype

    def forward(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, keep=None, p: float = 0.0, *,
                scope: str | None = None):
        """``(O [b, h, s/C, d], cache)``; ``keep(q_pos, k_pos, heads)``: attention dropout's mask ``bool [b, h', |q|,
        |k|]`` for local heads ``heads`` (a slice; None: all), or None; ``p`` its drop probability. The messages
        are traced under ``scope`` (the attention layer's path; None: the caller's), phase forward."""
        work = self._work(q)  # astype copies on purpose: the cache keeps Q, K, V, not the whole qkv they view
        with self.group.tracer.region(scope=scope, phase=FORWARD):
            out, cache = self._way()[0](self, q.astype(work), k.astype(work), v.astype(work), keep, p)
        return out.astype(q.dtype, copy=False), (cache, keep, p, q.dtype, scope)

    def backward(self, dout: np.ndarray, cache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(dQ, dK, dV)`` of this rank's shard, in the activations' dtype (traced as the forward, phase
        backward)."""
        inner, keep, p, dtype, scope = cache
        self.dtype = np.dtype(dtype)
        work = np.float32 if self.dtype.itemsize < 4 else self.dtype
        with self.group.tracer.region(scope=scope, phase=BACKWARD):
            grads = self._way()[1](self, dout.astype(work, copy=False), inner, keep, p)
        return tuple(g.astype(dtype, copy=False) for g in grads)

    def __repr__(self) -> str:
        return f"ContextParallel(cp={self.group.size}, comm={self.comm}, layout={self.layout})"


def core_for(group, comm: str = "ring", layout: str = "zigzag") -> AttentionCore:
    """The attention core a model is built with: ``ContextParallel`` over the CP ``group`` by ``comm`` and
    ``layout``, or the serial core when there is none or it holds one rank (CP 1 is the serial model)."""
    if group is None or group.size == 1:
        return SERIAL_CORE
    return ContextParallel(group, comm, layout)
