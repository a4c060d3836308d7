"""Reference answer to exercise 11 — wire bytes from the ring formulas (lesson 11_reading_a_trace.py)."""

from __future__ import annotations


def ring_wire_bytes(op: str, nbytes: int, p: int) -> int:
    if p == 1:
        return 0
    if op == "all_reduce":  # a reduce-scatter then an all-gather: (p−1) chunks of B/p each, twice
        return 2 * (p - 1) * nbytes // p
    if op in ("all_gather", "reduce_scatter"):  # p−1 steps, one chunk of B/p each
        return (p - 1) * nbytes // p
    if op == "broadcast":  # a pipelined chain: every rank but the last forwards the whole buffer
        return nbytes
    raise ValueError(f"unknown collective {op!r}")


def block_forward_wire_bytes(b: int, s: int, h: int, itemsize: int, p: int, sequence_parallel: bool) -> int:
    act = b * s * h * itemsize  # one [b, s, h] activation: what every collective of a block carries
    if sequence_parallel:  # f̄ (all-gather) before c_attn and c_fc, ḡ (reduce-scatter) after each c_proj
        return 2 * (ring_wire_bytes("all_gather", act, p) + ring_wire_bytes("reduce_scatter", act, p))
    return 2 * ring_wire_bytes("all_reduce", act, p)  # g after attention's c_proj and the MLP's c_proj
