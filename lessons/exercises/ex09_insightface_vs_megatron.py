"""Exercise 09 — hand every rank the gradient of its own embeddings (lesson 09_insightface_vs_megatron.py).

Check it on real ranks:   tpsim check 09           (4 ranks; values and bytes on the wire)
The reference answer: tpsim lesson solution 09 (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group


def embedding_grad_reduce_scatter(d_emb_partial: np.ndarray, group: Group) -> np.ndarray:
    """The backward of partial FC's all-gather of the embeddings.

    ``d_emb_partial: [N, E]``: on rank r, ``dlogits_r · W_rᵀ`` — the gradient of all N embeddings, but only
    the part that flowed through rank r's classes. The true gradient is the sum over the ranks, and rank r
    needs only the rows of its own samples, ``r·N/p … (r+1)·N/p − 1``. Returns ``[N/p, E]``, moving as few
    bytes as possible (``group.reduce_scatter(x, axis)``, ``group.all_reduce(x)`` and friends are traced).
    """
    # TODO: the sum over the ranks, each rank keeping its own block of rows.
    raise NotImplementedError
