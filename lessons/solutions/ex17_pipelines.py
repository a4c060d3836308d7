"""Reference answer to exercise 17 — stage i's 1F1B order and its peak in flight (lesson 17_pipelines.py)."""

from __future__ import annotations


def one_f_one_b_order(p: int, m: int, i: int) -> list[tuple[str, int]]:
    warm = min(p - i - 1, m)  # the stages after i: the first gradient needs them all, forward and back
    order = [("F", j) for j in range(warm)]
    for k in range(m - warm):  # steady state: the next forward, then the oldest backward
        order += [("F", warm + k), ("B", k)]
    return order + [("B", j) for j in range(m - warm, m)]  # drain


def peak_in_flight(order: list[tuple[str, int]]) -> int:
    held = peak = 0
    for op, _ in order:
        held += 1 if op == "F" else -1  # a forward keeps its activations, its backward frees them
        peak = max(peak, held)
    return peak
