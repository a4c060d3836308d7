"""Reference answer to exercise 21 — the bytes per parameter of ZeRO's stages, an owned slice and its padding,
a ZeRO-3 step's wire bytes (lesson 21_zero_stages.py)."""

from __future__ import annotations


def bytes_per_param(stage, d):
    param, grad, optimizer = 2, 2, 12  # the paper's 2 + 2 + K, K = 12
    return ((param / d if stage >= 3 else param) + (grad / d if stage >= 2 else grad)
            + (optimizer / d if stage >= 1 else optimizer))


def owned_slice(n, d, rank):
    shard = -(-n // d)  # ⌈n/d⌉: the bucket padded to shard·d
    start, stop = rank * shard, (rank + 1) * shard
    return start, stop, max(0, stop - max(start, n))  # the padded positions [n, shard·d) in [start, stop)


def zero3_step_bytes(params, d, e):
    shard = -(-params // d)
    # all-gather before the forward, again before the backward, reduce-scatter after it: d − 1 shards each
    return 3 * (d - 1) * shard * e
