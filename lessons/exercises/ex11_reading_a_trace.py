"""Exercise 11 — the numbers behind a trace's wire_bytes column (lesson 11_reading_a_trace.py).

Both functions are arithmetic: no collective, no group. The check compares them with the records of real
traced training steps on 8 ranks (plain TP and TP + SP, float64 and float32).
Check it:   tpsim check 11           (8 ranks)
The reference answer: tpsim lesson solution 11 (prints where it is) — try first.
"""

from __future__ import annotations


def ring_wire_bytes(op: str, nbytes: int, p: int) -> int:
    """Bytes one rank sends for collective ``op`` under the bandwidth-optimal ring, in a group of ``p`` ranks.

    ``op``: "all_reduce", "all_gather", "reduce_scatter" or "broadcast". ``nbytes``: the logical tensor, as a
    record's ``bytes`` field measures it — all_reduce and broadcast the buffer, all_gather the gathered output,
    reduce_scatter the unreduced input. A group of one rank sends nothing. Whole bytes: ``nbytes`` divides by
    ``p`` in every call the check makes, so integer arithmetic (``//``) is exact.
    """
    # TODO: one formula per op (lesson 11 derives them from the ring's steps).
    raise NotImplementedError


def block_forward_wire_bytes(b: int, s: int, h: int, itemsize: int, p: int, sequence_parallel: bool) -> int:
    """Bytes one rank sends in the *forward* of one transformer block, tensor-parallel over ``p`` ranks.

    ``b`` sequences of ``s`` tokens, hidden size ``h``, ``itemsize`` bytes per element (8 for float64).
    Plain TP: the collectives of lesson 02 at the end of attention and of the MLP. ``sequence_parallel``:
    lesson 10's f̄ and ḡ around both. Use your ``ring_wire_bytes``.
    """
    # TODO: which collectives, of which logical size, how many of each.
    raise NotImplementedError
