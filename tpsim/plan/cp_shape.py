"""What one context-parallel rank's attention works on: its query rows against the keys, its share of the work.

The planner prices attention as Narayanan et al. 2021 count it — every query against every key of the sequence,
4·s·h FLOPs a token forward, a causal kernel's masked half not subtracted — so at cp 1 one GPU's attention is
(a/t) heads × [s, s] per sequence. Cut over cp ranks (``--cp-comm``, ``--cp-layout``; ``tpsim.cp``):

    ring, allgather   this rank's s/cp queries against all s keys (the ring block by block, one [s/cp, s/cp] block
                      a step; the all-gather with the whole K, V at once). Under a causal mask the work of a
                      rank is its (query, key) pairs, ``tpsim.cp.layout.causal_pairs``: zigzag gives every rank
                      the same, 1/cp of the whole; the contiguous layout gives the last rank the most,
                      (2cp − 1)/cp² of it for s ≫ cp — (2cp − 1)/cp times the mean — and every ring step (and
                      the layer after the all-gather) waits for that busiest rank, so it prices the critical path:
                      query rows s · pairs(cp − 1) / Σ_r pairs(r) instead of s/cp
    ulysses           whole sequences, s queries against s keys, for (a/t)/cp heads after the all-to-all:
                      balanced whatever the layout

``attention_rows`` gives (heads, query rows, key rows) of one sequence on one GPU, the attention kernels' shapes
(``tpsim.plan.kernels``) and the score count the memory keeps (``tpsim.plan.memory``). Pure arithmetic, no MPI.
"""

from __future__ import annotations

from tpsim.cp.layout import causal_pairs
from tpsim.plan.layout import Layout
from tpsim.plan.models import ModelSpec


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads one TP rank holds: g/t, or 1 when t > g and they are replicated (``tpsim.cp.choice`` counts so)."""
    return max(model.kv_heads // tp, 1)


def flash(lay: Layout) -> bool:
    """Whether attention runs flash-style, keeping no scores and recomputing them in the backward (Dao et al.
    2022): ``--attention fused``, or the CP ring, whose blocks merge by log-sum-exp and whose backward needs only
    the output and the lse (``tpsim.cp.blocks``), whatever ``--attention`` says."""
    return lay.attention == "fused" or lay.cp > 1 and lay.cp_comm == "ring"


def busiest_share(lay: Layout) -> float:
    """The busiest CP rank's fraction of a sequence's causal attention work (module docstring): 1 at cp 1, 1/cp
    under zigzag or Ulysses, pairs(cp − 1) / Σ pairs under the contiguous layout."""
    if lay.cp == 1 or lay.cp_comm == "ulysses" or lay.cp_layout == "zigzag":
        return 1 / lay.cp
    s = lay.seq_len
    return causal_pairs("contiguous", lay.cp - 1, lay.cp, s) / (s * (s + 1) // 2)


def attention_rows(model: ModelSpec, lay: Layout) -> tuple[int, float, int]:
    """``(heads, query rows, key rows)`` of one sequence's attention on one GPU (module docstring): (a/t, s, s)
    at cp 1; ring and allgather (a/t, s/cp, s) balanced, s · busiest share queries under the contiguous
    layout; ulysses (a/t/cp, s, s)."""
    heads, s = model.heads // lay.tp, lay.seq_len
    if lay.cp == 1:
        return heads, s, s
    if lay.cp_comm == "ulysses":
        return heads // lay.cp, s, s
    return heads, (s // lay.cp if lay.cp_layout == "zigzag" else s * busiest_share(lay)), s
