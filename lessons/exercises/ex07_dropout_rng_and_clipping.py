"""Exercise 07 — combine the gradient norm over the TP group (lesson 07_dropout_rng_and_clipping.py).

Check it on real ranks:   tpsim check 07           (4 ranks; compared with the serial model's norm)
The reference answer: tpsim lesson solution 07 (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn.module import Partition


def tp_grad_norm(entries: list[tuple[str, np.ndarray, Partition | None]], group: Group) -> float:
    """The serial model's gradient 2-norm ``sqrt(Σ_params Σ_elements g²)``, from this rank's gradients.

    ``entries``: ``(name, grad, partition)`` for every parameter this rank holds. ``partition`` is a
    ``Partition`` for a tensor-parallel shard (every rank holds a different slice of the full gradient) and
    ``None`` for a replicated parameter (every rank holds the same full gradient). ``group.rank`` is this rank's
    place in the TP group. Returns the same float on every rank, with one ``group.all_reduce``.
    """
    # TODO: each rank's share of Σ g², one all-reduce, the square root. Count every element exactly once.
    raise NotImplementedError
