"""A lookup table: token ids in, rows of ``weight`` out, and a scatter-add on the way back.

    y[..., :] = W[ids[...], :]          dW[v, :] = Σ_{positions with ids == v} dy[position, :]

The backward must *accumulate*: a token that appears twice in a batch gets both rows of ``dy``. A fancy-index
assignment ``dW[ids] += dy`` would silently keep only one of them; ``np.add.at`` is the unbuffered scatter that
adds every one. Ids carry no gradient. Megatron's vocab-parallel embedding splits ``W`` by rows; each rank
looks up the ids it owns and the partial outputs are summed across ranks.
"""

from __future__ import annotations

import numpy as np

from tpsim.nn.module import Module


def check_ids(ids: np.ndarray, num_embeddings: int) -> np.ndarray:
    """Return ``ids`` as an integer array, or raise if any falls outside ``[0, num_embeddings)``."""
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"ids must be an integer array, got dtype {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= num_embeddings):
        # NumPy would wrap negative ids round to the end of the table; for token ids that is always a bug
        raise IndexError(
            f"ids must be in [0, {num_embeddings}), got values in [{ids.min()}, {ids.max()}]"
        )
    return ids


class Embedding(Module):
    """``weight: [num_embeddings, dim]``; forward maps ``ids: [...]`` (ints) to ``[..., dim]``."""

    def __init__(
        self,
        num_embeddings: int,
        dim: int,
        *,
        rng: np.random.Generator | None = None,
        dtype=np.float64,
        std: float = 0.02,
        weight: np.ndarray | None = None,
    ) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.dim = dim
        if weight is None:
            rng = np.random.default_rng(0) if rng is None else rng
            weight = rng.normal(0.0, std, size=(num_embeddings, dim))
        elif np.shape(weight) != (num_embeddings, dim):
            raise ValueError(f"weight must have shape {(num_embeddings, dim)}, got {np.shape(weight)}")
        self.add_param("weight", np.array(weight, dtype=dtype))  # a copy: never alias master weights

    def forward(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``ids: [...]`` ints in ``[0, num_embeddings)`` -> ``(weight[ids]: [..., dim], cache = ids)``."""
        ids = check_ids(ids, self.num_embeddings)
        return self.params["weight"][ids], ids

    def backward(self, dout: np.ndarray, cache: np.ndarray) -> None:
        """``dout: [..., dim]``: scatter-adds into ``grads["weight"]``; returns None: ids carry no gradient
        (the contract for integer inputs, ``tpsim.nn.module``). The scatter-add is all of it, so all of it is W
        (``Module.weight_grad``: the ids and ``dout`` are kept for it)."""
        self.weight_grad(self.add_weight_grads, dout, cache)
        return None

    def add_weight_grads(self, dout: np.ndarray, ids: np.ndarray) -> None:
        """W: ``dW[v] += Σ_{ids == v} dout`` (``np.add.at``: a repeated id adds every row)."""
        np.add.at(self.grads["weight"], ids, dout)

    def __repr__(self) -> str:
        return f"Embedding({self.num_embeddings}, {self.dim})"
