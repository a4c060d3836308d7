"""Exercise 12 — grouped-query attention under TP: the KV-head-to-rank map and its gradient reduction
(lesson 12_llama_under_tp.py).

``heads`` query heads share ``kv_heads`` key/value heads: query head j reads KV head j // (heads / kv_heads).
Tensor parallelism gives rank r the query heads r·(heads/tp) … (r+1)·(heads/tp) − 1. Either kv_heads is a
multiple of tp (KV heads are split) or tp is a multiple of kv_heads (each KV head is replicated).
Check it on real ranks:   tpsim check 12           (4 ranks)
The reference answer: tpsim lesson solution 12 (prints where it is) — try first.
"""

from __future__ import annotations


def kv_heads_of_rank(heads: int, kv_heads: int, tp: int, rank: int) -> list[int]:
    """The KV heads (global numbers, ascending) whose k_proj/v_proj columns TP rank ``rank`` must hold."""
    # TODO: the KV heads read by this rank's query heads.
    raise NotImplementedError


def kv_gradient_ranks(heads: int, kv_heads: int, tp: int, rank: int) -> list[int]:
    """The TP ranks (ascending, ``rank`` included) whose k_proj/v_proj weight gradients must be summed with this
    rank's to give the serial gradient of its KV heads — ``[rank]`` when no other rank holds them."""
    # TODO: which ranks computed partial sums of the same KV head's gradient?
    raise NotImplementedError
