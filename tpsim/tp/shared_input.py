"""Several column-parallel linears reading one input, entered once: one f (or f̄) for all of them.

Llama keeps q_proj, k_proj and v_proj (and the MLP's gate_proj and up_proj) as separate weights where GPT-2
fuses them into one c_attn (c_fc). Run as separate ``ColumnParallelLinear`` layers they would each all-reduce
their input gradient — three all-reduces in attention's backward instead of one. Their input is the same
tensor, so its gradient is the *sum* of theirs: add the partial sums locally, then let one f backward
(all-reduce; under SP one f̄ backward, reduce-scatter) finish it. Forward: f̄ gathers the sequence once.

    forward   x --f--> x·W_1, x·W_2, ...                        (SP: x_r --f̄ all-gather--> x, once)
    backward  dx = f_backward(Σ_j dy_j·W_jᵀ)                      one all-reduce (SP: one reduce-scatter)
              dW_j = xᵀ·dy_j                                      (SP: x all-gathered again, once)

Megatron-LM gets the same single collective by fusing the weights into one ``linear_qkv``/``linear_fc1``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tpsim.comm import Group
from tpsim.nn.linear import LinearCache, linear_backward, linear_forward
from tpsim.tp.regions import enter_tp_region, enter_tp_region_backward, regather_input


def shared_input_forward(x: np.ndarray, weights: Sequence[np.ndarray], group: Group,
                         sequence_parallel: bool) -> tuple[list[np.ndarray], list[LinearCache]]:
    """f (or f̄) once, then ``x·W_j`` for each weight: ``x [..., in]`` (SP ``[b, s/p, in]``) -> ``[..., out_j]``.

    The caches keep ``x`` as it arrived (under SP the shard, not f̄'s gathered output).
    """
    full = enter_tp_region(x, group, sequence_parallel)
    outs, caches = [], []
    for w in weights:
        y, cache = linear_forward(full, w, None)
        outs.append(y)
        caches.append(cache._replace(x=x))
    return outs, caches


def shared_input_backward(dys: Sequence[np.ndarray], caches: Sequence[LinearCache], group: Group,
                          sequence_parallel: bool) -> tuple[np.ndarray, list[np.ndarray]]:
    """``dy_j [..., out_j]`` -> ``(dx [..., in] summed over the weights and the ranks, [dW_j])``."""
    full = regather_input(caches[0].x, group, sequence_parallel)  # one all-gather under SP, not one per weight
    dx, dws = None, []
    for dy, cache in zip(dys, caches):
        dx_j, dw, _ = linear_backward(dy, cache._replace(x=full))
        dx = dx_j if dx is None else np.add(dx, dx_j, out=dx)
        dws.append(dw)
    return enter_tp_region_backward(dx, group, sequence_parallel, inplace=True), dws
