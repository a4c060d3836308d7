"""Exercise 18 — ZB-H1's W's placed, and a schedule's bubble and peak predicted (lesson 18_interleaving_and_zero_bubble.py).

All three functions are arithmetic: no collective, no group. The check compares them with ``tpsim.pipeline``
(the schedules' own lists, timed on the virtual clock at unit costs) for many pipelines — one stage, fewer
micro-batches than stages, more — then runs interleaved 1F1B (v = 2, m = 8) on a live 4-stage pipeline and
holds your predictions to its clocks and to the caches its executors held.
Check it:   tpsim check 18           (4 ranks)
The reference answer: tpsim lesson solution 18 (prints where it is) — try first.
"""

from __future__ import annotations


def zb_h1_order(p: int, m: int, i: int) -> list[tuple[str, int]]:
    """The compute actions stage ``i`` of a ``p``-stage pipeline runs under ZB-H1 with ``m`` micro-batches, in
    order: ``("F", j)`` the forward of micro-batch j, ``("B", j)`` its input gradient, ``("W", j)`` its weight
    gradient (no sends or receives).

    ZB-H1 keeps 1F1B's forwards and backwards in 1F1B's order; place the W's (lesson 18, "ZB-H1, as data").
    """
    # TODO: start from lesson 17's 1F1B order; where does each W go?
    raise NotImplementedError


def bubble_fraction(schedule: str, p: int, m: int, v: int) -> float:
    """The idle share of the step, Σ idle / (p · step), of ``schedule`` ("1f1b", "interleaved" or "zb-h1") with
    p ranks, m micro-batches and v model chunks per rank (v = 1 but for "interleaved"), at unit costs: a stage's
    F = 1 and B = 2, split B = W = 1, a chunk 1/v of a stage, messages free."""
    # TODO: lesson 18, "The bubble" and "The ZB-H1 bubble" (and what happens when m < p)
    raise NotImplementedError


def peak_in_flight(schedule: str, p: int, m: int, v: int) -> list[int]:
    """For every rank 0 .. p − 1, the most (micro-batch, chunk) pairs it holds at once: a pair is held from its F
    until its backward has run (its W, when the backward is split)."""
    # TODO: what has each rank run just before its first backward?
    raise NotImplementedError
