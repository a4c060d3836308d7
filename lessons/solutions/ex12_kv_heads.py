"""Reference answer to exercise 12 — the KV-head-to-rank map and its gradient group (lesson 12_llama_under_tp.py)."""

from __future__ import annotations


def kv_heads_of_rank(heads: int, kv_heads: int, tp: int, rank: int) -> list[int]:
    if kv_heads % tp == 0:  # split: kv_heads / tp of its own, matching its block of query heads
        per = kv_heads // tp
        return list(range(rank * per, (rank + 1) * per))
    return [rank // (tp // kv_heads)]  # replicated: tp / kv_heads neighbouring ranks share one KV head


def kv_gradient_ranks(heads: int, kv_heads: int, tp: int, rank: int) -> list[int]:
    rep = max(tp // kv_heads, 1)  # ranks holding each KV head
    first = rank // rep * rep
    return list(range(first, first + rep))
