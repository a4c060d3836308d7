"""Exercise 04b (harder) — the parallel MLP's backward, shards and all (lesson 04_parallel_mlp.py).

Exercise 04 wired the forward: ``z = g(GeLU(f(x)·A_r + a_r)·B_r) + b`` on every rank r, A split by columns,
B by rows. Now go back through it. The forward's caches are given (tpsim's one layer contract: every
``*_forward`` returns ``(out, cache)``, every ``*_backward(dout, cache)`` undoes it), so every local gradient
is one call away; the work is knowing which results are complete on this rank and which are one rank's share
— and so where f's all-reduce goes (Shoeybi et al. 2019, Megatron-LM, arXiv:1909.08053, §3 and Fig. 3a).

For lesson 04 (a paragraph it could point to): c_proj's weight gradient ``aᵀ·dz`` needs only this rank's
columns of a = GeLU(h), and c_fc's ``xᵀ·dh`` only this rank's columns of dh, so both shards' gradients are
complete where they live; c_proj's bias is replicated and its gradient ``Σ_tokens dz`` is the same on every
rank. Only x's gradient is a sum of shares, one per rank's column slice of A.

Check it on real ranks:   tpsim check 04b          (2 ranks; compared with tpsim's ParallelMLP)
Stuck?                    tpsim check 04b --hint   (one hint more each time)
The reference answer: tpsim lesson solution 04b (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn import gelu_backward, linear_backward  # noqa: F401  (the pieces you need)
from tpsim.nn.mlp import MLPCache


def parallel_mlp_backward(dz: np.ndarray, cache: MLPCache, group: Group) -> tuple[np.ndarray, ...]:
    """Gradients of the parallel MLP on this rank, for ``dz: [tokens, h]`` (the same on every rank).

    ``cache.c_fc``:   ``LinearCache(x [tokens, h], A_r [h, ffn/p], has_bias=True)``   — from ``linear_forward``
    ``cache.gelu``:   ``GeluCache(h_r [tokens, ffn/p], "tanh")``                     — from ``gelu_forward``
    ``cache.c_proj``: ``LinearCache(a_r [tokens, ffn/p], B_r [ffn/p, h], has_bias=False)`` (c_proj's bias is
                      added after g's all-reduce, outside the linear)
    Returns ``(dx [tokens, h], d_fc_weight [h, ffn/p], d_fc_bias [ffn/p], d_proj_weight [ffn/p, h],
    d_proj_bias [h])``: dx the same on every rank, each shard's gradient that of the serial MLP's master
    gradient restricted to this rank's shard. Exactly one collective (``group.all_reduce``).
    """
    # TODO: c_proj's backward, GeLU's, c_fc's — then decide which result needs the other ranks.
    raise NotImplementedError
