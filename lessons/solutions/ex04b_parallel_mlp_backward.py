"""Reference answer to exercise 04b — the parallel MLP's backward (lesson 04_parallel_mlp.py)."""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.nn import gelu_backward, linear_backward
from tpsim.nn.mlp import MLPCache


def parallel_mlp_backward(dz: np.ndarray, cache: MLPCache, group: Group) -> tuple[np.ndarray, ...]:
    d_proj_bias = dz.sum(axis=0)  # replicated bias, added once after g: its gradient is whole on every rank
    da, d_proj_weight, _ = linear_backward(dz, cache.c_proj)  # g's backward is the identity: dz goes straight in
    dh = gelu_backward(da, cache.gelu)  # element-wise on this rank's columns
    dx_share, d_fc_weight, d_fc_bias = linear_backward(dh, cache.c_fc)  # shards complete; dx is one rank's share
    return group.all_reduce(dx_share), d_fc_weight, d_fc_bias, d_proj_weight, d_proj_bias  # f's backward
