"""Measuring memory on live arrays: the bytes a model, its optimizer and a forward's cache really hold.

The other half of ``tpsim.predict.memory``: the formulas there say how many bytes each category should take on
one rank; ``measure_memory`` walks the live arrays (every distinct buffer counted once, views followed to their
owner) and ``format_memory`` prints the two side by side. Pure NumPy, no MPI.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from tpsim.nn.module import held_nbytes
from tpsim.table import format_table


def owner(a: np.ndarray) -> np.ndarray:
    """The array that owns ``a``'s memory: ``a.base`` followed while it is an ndarray."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def cache_arrays(tree, exclude=()) -> list[np.ndarray]:
    """Distinct owning buffers of every ndarray in a nested tuple/list/dict ``tree`` (first-seen order).

    Buffers sharing memory with an array of ``exclude`` (the inputs, say) are left out, and so are the fields a
    cache type names in ``PARAMETERS`` (a weight the backward multiplies by: a parameter, not an activation).
    """
    seen: dict[int, np.ndarray] = {}
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, np.ndarray):
            root = owner(node)
            seen.setdefault(id(root), root)
        elif isinstance(node, (tuple, list)):
            parameters = getattr(type(node), "PARAMETERS", ())  # only named tuples (tpsim.nn caches) have it
            stack.extend(reversed([value for name, value in zip(node._fields, node) if name not in parameters]
                                  if parameters else node))
        elif isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
    return [a for a in seen.values() if not any(np.shares_memory(a, x) for x in exclude)]


def measure_activations(cache, exclude=()) -> dict[str, int]:
    """``{"activations", "masks", "indices"}`` bytes held by the cache tree: float, bool, other arrays."""
    out = {"activations": 0, "masks": 0, "indices": 0}
    for a in cache_arrays(cache, exclude):
        kind = "activations" if a.dtype.kind in "fc" else "masks" if a.dtype.kind == "b" else "indices"
        out[kind] += a.nbytes
    return out


@dataclass(frozen=True)
class MemoryReport:
    """Bytes on one rank. ``indices`` depend on the data (which ids this rank owns); the rest do not."""

    params: int
    grads: int
    optimizer: int
    activations: int
    masks: int
    indices: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.masks + self.indices

    def as_dict(self) -> dict[str, int]:
        return dict(asdict(self), total=self.total)


def measure_memory(model, optimizer, cache, exclude=()) -> MemoryReport:
    """Bytes of ``model``'s parameters and gradients, ``optimizer``'s state (None: 0) and the forward ``cache``."""
    params = sum(p.nbytes for _, p in model.named_parameters())
    grads = sum(held_nbytes(g) for _, g in model.named_grads())
    grads += optimizer.grad_bytes() if optimizer is not None else 0  # ZeRO-2's owned slices
    state = optimizer.state_bytes() if optimizer is not None else 0
    return MemoryReport(params, grads, state, **measure_activations(cache, exclude))


def format_memory(measured: MemoryReport, predicted: dict[str, int], title: str = "") -> str:
    """Measured vs formula per category, one line each; the Korthikanti line is the caller's to add."""

    rows = [["", "measured", "formula", ""]]
    for key, value in measured.as_dict().items():
        pred = predicted.get(key)
        rows.append([key, f"{value:,}", "" if pred is None else f"{pred:,}",
                     "" if pred is None else ("ok" if pred == value else "DIFFERS")])
    return format_table(rows, right=(1, 2), title=title)
