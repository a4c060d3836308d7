"""The check of exercise 12: which KV heads a TP rank holds, and with which ranks it sums their gradients.

Against ``tpsim.tp.gqa_attention.kv_head_layout`` for (heads, kv_heads, tp) layouts that work, every TP rank,
with the typical slips as symptoms (strided or round-robin heads, one head where a rank holds several, dividing
by kv_heads, the whole TP group or nobody for the gradient sum). The functions are pure arithmetic: every
process makes every call (a call is collective), and the process ``rank % world`` compares the answer for TP
rank ``rank``, so a finding is reported once, by the process whose number is that TP rank whenever tp ≤ world."""

from __future__ import annotations

import numpy as np

from tpsim.teach.checks.registry import exercise
from tpsim.teach.verdict import Report
from tpsim.tp.gqa_attention import kv_head_layout

LAYOUTS = [(8, 8, 4), (8, 4, 4), (8, 2, 4), (8, 1, 4), (16, 4, 2), (16, 2, 8), (12, 6, 3), (6, 2, 6), (4, 4, 1)]


def sharing(heads: int, kv_heads: int, tp: int, rank: int) -> list[int]:
    """The TP ranks holding the same KV heads as ``rank`` (itself included)."""
    mine = kv_head_layout(heads, kv_heads, tp, rank)[0].tolist()
    return [q for q in range(tp) if kv_head_layout(heads, kv_heads, tp, q)[0].tolist() == mine]


def head_symptoms(kv_heads: int, tp: int, rank: int) -> dict:
    per = max(kv_heads // tp, 1)
    return {"strided: KV heads rank, rank + tp, rank + 2·tp, …, but a rank's query heads are one contiguous "
            "block, so the KV heads they read are contiguous too": list(range(rank, kv_heads, tp))
            if kv_heads > tp else None,
            "round-robin: KV head rank % kv_heads, but rank r's query heads are a contiguous block "
            "(query head j reads KV head j // (heads / kv_heads))": [rank % kv_heads] * per if kv_heads < tp else None,
            "KV head rank // kv_heads: that divides by the number of KV heads, not by the number of ranks that "
            "share each one": [rank // kv_heads] if kv_heads < tp else None,
            "one KV head per rank, but when kv_heads ≥ tp each rank's query heads read kv_heads / tp of them":
            [rank * kv_heads // tp],
            "KV head number = rank number: with fewer KV heads than ranks, the last ranks name heads that do not "
            "exist": [rank] if kv_heads < tp else None}


def group_symptoms(tp: int, rank: int, kv_heads: int) -> dict:
    return {"the whole TP group: only the ranks holding the same KV head computed partial sums of its gradient":
            list(range(tp)),
            "this rank alone: a replicated KV head's gradient is split over the ranks whose query heads read it":
            [rank],
            "ranks with the same rank % kv_heads: the replicas of a KV head are neighbours, not a stride apart":
            [q for q in range(tp) if q % kv_heads == rank % kv_heads] if kv_heads < tp else None}


def in_any_order(got):
    """A set of ranks may come in any order: sorted when it can be (floats and text left as they are, so that
    the diagnosis names them), else the value itself."""
    try:
        return sorted(got)
    except Exception:  # noqa: BLE001 — whatever it is, the diagnosis says what was returned
        return got


@exercise("12", "kv_heads_of_rank", "kv_gradient_ranks",
          kv_heads_of_rank=("rank r holds query heads r·(heads/tp) … (r+1)·(heads/tp) − 1; which KV heads do they "
                            "read? (query head j reads KV head j // (heads / kv_heads))",
                            "two cases: kv_heads a multiple of tp (each rank gets kv_heads / tp of its own) and tp a "
                            "multiple of kv_heads (each KV head is copied to tp / kv_heads neighbouring ranks)",
                            "kv_heads ≥ tp: list(range(r·kv/tp, (r+1)·kv/tp)); else [r // (tp / kv_heads)]"),
          kv_gradient_ranks=("each rank's dW_k is a partial sum over its own query heads only; which ranks hold "
                             "the other query heads that read the same KV head?",
                             "the ranks holding the same KV heads as this one: tp / kv_heads neighbours when KV "
                             "heads are replicated, this rank alone when they are split",
                             "rep = max(tp // kv_heads, 1); list(range(r // rep · rep, r // rep · rep + rep))"))
def check_12(r: Report) -> None:
    for heads, kv, tp in LAYOUTS:
        for rank in range(tp):  # every process makes every call (a call is collective) ...
            mine = rank % r.world_size == r.rank  # ... and one compares it: each finding is reported once
            about = f"(heads={heads}, kv_heads={kv}, tp={tp}, rank={rank}), asked about TP rank {rank} of {tp}"
            got = r.call("kv_heads_of_rank", heads, kv, tp, rank)
            if mine:
                r.compare(f"kv_heads_of_rank{about}", got, kv_head_layout(heads, kv, tp, rank)[0].astype(np.int64),
                          symptoms=head_symptoms(kv, tp, rank), layout="set")
            got = r.call("kv_gradient_ranks", heads, kv, tp, rank)
            if mine:
                r.compare(f"kv_gradient_ranks{about}", in_any_order(got),
                          np.asarray(sharing(heads, kv, tp, rank), dtype=np.int64),
                          symptoms=group_symptoms(tp, rank, kv), layout="set")
