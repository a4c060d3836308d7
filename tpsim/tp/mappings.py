"""The conjugate operators of Megatron-LM (Shoeybi et al. 2019, §3 and Fig. 3): f, g, and their scatter/gather cousins.

    f  = copy to TP region       forward: identity            backward: all-reduce (sum)
    g  = reduce from TP region   forward: all-reduce (sum)    backward: identity
    scatter to TP region         forward: split last dim      backward: all-gather last dim
    gather from TP region        forward: all-gather last dim backward: split last dim

f and g are *conjugate*: each one's backward is the other's forward. f sits where a replicated activation
enters a partitioned computation (every rank's input gradient is only a partial sum, so backward must add
them); g sits where partitioned partial results leave it (the forward must add them; the gradient of a sum
is the same for every term, so backward does nothing). Scatter and gather are the same pair for a
*concatenation* instead of a sum.

Each operator is a class with a ``forward`` and a ``backward`` a few lines apart; both take the TP ``Group``.
They tag their collectives with phase ``FORWARD`` or ``BACKWARD`` (``tpsim.phases``); the calling layer
supplies the scope. Names follow Megatron (``copy_to_tensor_model_parallel_region`` ...) so a reader can
move between the two. Which pair a layer uses, (f, g) or the sequence-parallel (f̄, ḡ), is chosen in
``tpsim.tp.regions``.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.errors import ConfigError
from tpsim.phases import BACKWARD, FORWARD


def split_last_dim(x: np.ndarray, group: Group) -> np.ndarray:
    """This rank's contiguous chunk of the last dimension: [..., n] -> [..., n / p] (a view, no copy)."""
    n = x.shape[-1]
    if n % group.size:
        raise ConfigError(f"last dimension {n} is not divisible by the {group.name} group size {group.size}")
    chunk = n // group.size
    return x[..., group.rank * chunk:(group.rank + 1) * chunk]


class CopyToTPRegion:
    """f (Megatron: ``copy_to_tensor_model_parallel_region``): forward identity, backward all-reduce.
    x: [..., h] replicated -> [..., h] replicated."""

    @staticmethod
    def forward(x: np.ndarray, group: Group) -> np.ndarray:
        return x

    @staticmethod
    def backward(dy: np.ndarray, group: Group, *, inplace: bool = False) -> np.ndarray:
        """``inplace``: the caller owns ``dy`` (a fresh partial sum) and lets the all-reduce overwrite it."""
        with group.tracer.region(phase=BACKWARD):
            return group.all_reduce(dy, inplace=inplace)


class ReduceFromTPRegion:
    """g (Megatron: ``reduce_from_tensor_model_parallel_region``): forward all-reduce, backward identity.
    Partial sums [..., h] on each rank -> their sum, replicated."""

    @staticmethod
    def forward(x: np.ndarray, group: Group, *, inplace: bool = False) -> np.ndarray:
        """``inplace``: the caller owns ``x`` (a fresh partial sum) and lets the all-reduce overwrite it."""
        with group.tracer.region(phase=FORWARD):
            return group.all_reduce(x, inplace=inplace)

    @staticmethod
    def backward(dy: np.ndarray, group: Group) -> np.ndarray:
        return dy


class ScatterToTPRegion:
    """Megatron: ``scatter_to_tensor_model_parallel_region``. Forward: keep this rank's slice of the last dim
    [..., h] -> [..., h/p]; backward: all-gather it back."""

    @staticmethod
    def forward(x: np.ndarray, group: Group) -> np.ndarray:
        return split_last_dim(x, group)

    @staticmethod
    def backward(dy: np.ndarray, group: Group) -> np.ndarray:
        with group.tracer.region(phase=BACKWARD):
            return group.all_gather(dy, axis=-1)


class GatherFromTPRegion:
    """Megatron: ``gather_from_tensor_model_parallel_region``. Forward: all-gather the last dim [..., h/p] -> [..., h];
    backward: keep this rank's slice."""

    @staticmethod
    def forward(x: np.ndarray, group: Group) -> np.ndarray:
        with group.tracer.region(phase=FORWARD):
            return group.all_gather(x, axis=-1)

    @staticmethod
    def backward(dy: np.ndarray, group: Group) -> np.ndarray:
        return split_last_dim(dy, group)

