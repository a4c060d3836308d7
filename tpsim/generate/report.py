"""What a decode run's trace says: collectives of the prefill vs one decode step, the KV cache per rank, and the
α-β time of one generated token on the link presets. Pure arithmetic on trace records (MPI-free).

Why a decode step's collectives are all latency (in the α-β model, with α *assumed*: 3 µs per ring step on the
NVLink preset): a decode step moves [b, 1, h] per all-reduce — 2·b·h·itemsize·(p−1)/p bytes sent,
a few KiB — but pays 2(p−1) ring steps of latency α for each of its 2·n_layer + 3 collectives. At h = 4096 in
bfloat16 one all-reduce of [1, 1, h] over NVLink (450 GB/s) costs 8 KiB · 2·7/8 / 450 GB/s ≈ 0.03 µs of
bandwidth and 14 · 3 µs = 42 µs of latency: the wire is idle, the clock is spent waiting. (The GPU's own
decode is memory-bound — weights and KV cache read per token, Pope et al. 2022 — which TP divides by t; the α of
its collectives it does not.)
"""

from __future__ import annotations

from collections import Counter

from tpsim.cost import ring_steps
from tpsim.table import RULE, format_table
from tpsim.table import human_bytes
from tpsim.links import PRESETS


def step_events(events, step: int) -> list:
    return [e for e in events if e.step == step]


def collective_counts(events) -> Counter:
    """``Counter`` of ``(op, reduce_op, shape, dtype)`` over ``events`` (CommEvents of one rank)."""
    return Counter((e.op, e.reduce_op, tuple(e.shape), e.dtype) for e in events)


def describe_counts(counts: Counter) -> str:
    return "; ".join(f"{op} {red} {list(shape)} {dtype} × {n}" for (op, red, shape, dtype), n in counts.items())


def predicted_decode(n_layer: int, batch: int, hidden: int, dtype: str) -> Counter:
    """Collectives of one decode step under plain TP: embedding + 2 per block, all [b, 1, h]; the argmax's 2 of [b]."""
    return Counter({("all_reduce", "sum", (batch, 1, hidden), dtype): 2 * n_layer + 1,
                    ("all_reduce", "max", (batch,), dtype): 1, ("all_reduce", "min", (batch,), "int64"): 1})


def alpha_beta_split(events, preset) -> tuple[float, float]:
    """Seconds of latency (Σ steps·α) and of bandwidth (Σ wire·β) of ``events`` on ``preset``."""
    alpha = sum(ring_steps(e.op, e.group_size) for e in events) * preset.alpha
    return alpha, sum(e.wire_bytes for e in events) * preset.beta


def latency_table(events, tp: int) -> str:
    """One decode step's collectives priced on every preset (α-β, nothing overlapped)."""
    rows = [["link", "α part", "β part", "per token", "latency share"], RULE]
    for preset in PRESETS.values():
        a, b = alpha_beta_split(events, preset)
        share = f"{a / (a + b):.1%}" if a + b else "—"
        rows.append([preset.name, f"{a * 1e6:.2f} µs", f"{b * 1e6:.3f} µs", f"{(a + b) * 1e6:.2f} µs", share])
    return format_table(rows, title=f"α-β time of the collectives of one generated token at TP {tp}:")


def kv_heads_local(kv_heads: int, tp: int) -> int | None:
    """KV heads one rank holds: kv_heads / tp, or 1 replicated head when tp is a multiple of kv_heads."""
    if kv_heads % tp == 0:
        return kv_heads // tp
    return 1 if tp % kv_heads == 0 else None


def kv_cache_bytes(n_layer: int, batch: int, positions: int, kv_heads: int, head_dim: int, itemsize: int,
                   tp: int) -> int | None:
    """Bytes of K and V one rank keeps: 2 · n_layer · b · T · (KV heads per rank) · hd · itemsize."""
    local = kv_heads_local(kv_heads, tp)
    return None if local is None else 2 * n_layer * batch * positions * local * head_dim * itemsize


def kv_table(n_layer: int, batch: int, positions: int, heads: int, kv_heads: int, head_dim: int,
             itemsize: int) -> str:
    """KV-cache bytes per rank for TP 1, 2, 4, 8 (columns) and kv_heads = heads, this model's, 1 (rows)."""
    tps = [t for t in (1, 2, 4, 8) if heads % t == 0]
    rows = [["kv_heads"] + [f"TP {t}" for t in tps], RULE]
    for kv in sorted({heads, kv_heads, 1}, reverse=True):
        if heads % kv:
            continue
        cells = [kv_cache_bytes(n_layer, batch, positions, kv, head_dim, itemsize, t) for t in tps]
        rows.append([f"{kv}" + (" (this model)" if kv == kv_heads else "")]
                    + [human_bytes(c) if c is not None else "—" for c in cells])
    return format_table(rows, title=f"KV cache per rank ({n_layer} layers, b {batch}, {positions} positions, "
                                    f"head_dim {head_dim}, {itemsize}-byte numbers):")
