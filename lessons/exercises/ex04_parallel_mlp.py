"""Exercise 04 — wire the forward of the parallel MLP (lesson 04_parallel_mlp.py).

Check it on real ranks:   tpsim check 04           (2 ranks; compared with the serial MLP)
The reference answer: tpsim lesson solution 04 (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn import gelu_forward, linear_forward  # noqa: F401  (the pieces you need)


def parallel_mlp_forward(x: np.ndarray, fc_weight: np.ndarray, fc_bias: np.ndarray, proj_weight: np.ndarray,
                         proj_bias: np.ndarray, group: Group) -> np.ndarray:
    """``z = GeLU(x·A + a)·B + b`` with A split by columns and B by rows over ``group``.

    ``x: [tokens, h]``                  replicated (every rank holds all of it)
    ``fc_weight: [h, ffn/p]``, ``fc_bias: [ffn/p]``     this rank's columns of c_fc (A, a)
    ``proj_weight: [ffn/p, h]``                        this rank's rows of c_proj (B)
    ``proj_bias: [h]``                                  replicated
    Returns ``z: [tokens, h]`` on every rank, with exactly one collective.
    Tools: ``linear_forward(x, w, b)`` (``b`` may be None), ``gelu_forward(h)`` (GPT-2's tanh GeLU) — each
    returns ``(out, cache)``, so take ``[0]`` or unpack — and ``group.all_reduce(x)``.
    """
    # TODO: column-parallel c_fc, GeLU on the shard, row-parallel c_proj, one all-reduce, the bias.
    raise NotImplementedError
