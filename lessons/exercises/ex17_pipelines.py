"""Exercise 17 — stage i's 1F1B order, and the micro-batches it holds (lesson 17_pipelines.py).

Both functions are arithmetic: no collective, no group. The check compares them with ``tpsim.pipeline`` for many
pipelines (one stage, fewer micro-batches than stages, more), then runs your orders on a live 4-stage pipeline
and compares your peak with the one its executor recorded.
Check it:   tpsim check 17           (4 ranks)
The reference answer: tpsim lesson solution 17 (prints where it is) — try first.
"""

from __future__ import annotations


def one_f_one_b_order(p: int, m: int, i: int) -> list[tuple[str, int]]:
    """The compute actions stage ``i`` of a ``p``-stage pipeline runs under 1F1B with ``m`` micro-batches, in
    order: ``("F", j)`` for the forward of micro-batch j, ``("B", j)`` for its backward (no sends or receives).

    Stage i first runs its warm-up forwards, then alternates one forward and one backward, then runs the
    backwards left; micro-batches go through a stage in the order 0, 1, ..., m − 1, forwards and backwards alike.
    """
    # TODO: how many warm-up forwards does stage i run? (lesson 17, "Two schedules, as data")
    raise NotImplementedError


def peak_in_flight(order: list[tuple[str, int]]) -> int:
    """The most micro-batches a stage holds at once when it runs ``order`` (a list as above, any legal order):
    a micro-batch is held from its forward until its backward has run."""
    # TODO: walk the order.
    raise NotImplementedError
