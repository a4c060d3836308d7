"""ZB-H1: 1F1B with the backward split into B (input gradient) and W (weight gradient), W's delayed to fill the tail.

Qi et al. 2023, "Zero Bubble Pipeline Parallelism" (arXiv:2401.10241), §2.1, the handcrafted ZB-H1 schedule.
A stage's B needs only the next stage's B (the gradient of its output), not its W: so the gradients run back
through the pipeline at t_B a stage instead of t_B + t_W, and the W's, which nothing waits for, can move. Stage i
of p keeps 1F1B's order of F's and B's (``min(p − i − 1, m)`` warm-up forwards, then one F and one B at a time,
then the B's left) and after its B of micro-batch k runs one W — the oldest it owes — once k ≥ i, or whenever it
has no forward left; the W's still owed at the end run last. With m ≥ p that is: the W of micro-batch j right
after the B of j + i, the last i W's at the very end, where 1F1B's first stages sit idle waiting for the drain.
Stage i's W's start i micro-batches late as its warm-up is i shorter, so every stage holds min(p, m) micro-batches
in flight (a micro-batch is freed by its W): the first stage's 1F1B peak, the memory of 1F1B.

At t_F = t_B = t_W = 1 and m ≥ p every stage idles p − 1 units (all of it before its first B), a third of 1F1B's
3(p − 1): the bubble is (p − 1)/(3m + p − 1) of the step. With m < p the drain is not long enough to hide: the
last stage alternates F and B, its last B ends at p + 2m − 1, the gradient needs p − 1 more to reach stage 0,
whose last W ends the step at 2m + 2p − 1 (``tpsim.predict.pipeline`` states both; the tests time them).

One model chunk per rank (the interleaved zero-bubble schedules, ZB-V, are not here). MPI-free.
"""

from __future__ import annotations


def zb_h1(pp: int, m: int, vp: int = 1) -> list[list[tuple[str, int, int]]]:
    """Every stage's compute order ``[(op, micro-batch, 0), ...]`` with F, B and W (``build`` refuses vp > 1)."""
    ranks = []
    for i in range(pp):
        warm = min(pp - i - 1, m)
        order = [("F", j, 0) for j in range(warm)]
        w = 0  # the next micro-batch whose W is owed
        for k in range(m):
            if warm + k < m:
                order.append(("F", warm + k, 0))
            order.append(("B", k, 0))
            if k >= i or warm + k >= m:  # i micro-batches late; one a B once no forward is left
                order.append(("W", w, 0))
                w += 1
        ranks.append(order + [("W", j, 0) for j in range(w, m)])
    return ranks
