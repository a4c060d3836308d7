"""Reference answer to exercise 18 — ZB-H1's W's placed, a schedule's bubble and peak (lesson
18_interleaving_and_zero_bubble.py)."""

from __future__ import annotations


def zb_h1_order(p: int, m: int, i: int) -> list[tuple[str, int]]:
    warm = min(p - i - 1, m)  # 1F1B's warm-up: ZB-H1 moves no F and no B
    order = [("F", j) for j in range(warm)]
    owed = 0  # the oldest micro-batch whose W has not run
    for k in range(m):
        if warm + k < m:
            order.append(("F", warm + k))
        order.append(("B", k))
        if k >= i or warm + k >= m:  # stage i's W's lag its B's by i; none left to lag once the forwards are done
            order.append(("W", owed))
            owed += 1
    return order + [("W", j) for j in range(owed, m)]  # the last i W's fill what 1F1B's drain left idle


def bubble_fraction(schedule: str, p: int, m: int, v: int) -> float:
    if schedule == "zb-h1":
        if m >= p:  # p − 1 idle units a rank, all before its first B, out of 3m + p − 1
            return (p - 1) / (3 * m + p - 1)
        return (2 * p - 1 - m) / (2 * m + 2 * p - 1)  # too few W's to hide the drain
    return (p - 1) / (v * m + p - 1)  # the fill and drain, (p − 1)(t_f + t_b)/v, over the step


def peak_in_flight(schedule: str, p: int, m: int, v: int) -> list[int]:
    if schedule == "zb-h1":
        return [min(p, m)] * p
    if schedule == "interleaved" and v > 1:  # Megatron-LM's warm-up and one more, at most the v·m pairs
        return [min(2 * (p - i - 1) + (v - 1) * p + 1, v * m) for i in range(p)]
    return [min(p - i, m) for i in range(p)]  # 1F1B: the warm-up p − i − 1 and one more
