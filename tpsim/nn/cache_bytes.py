"""The bytes a forward's cache really holds: every distinct buffer counted once, views followed to their owner.

What a layer keeps for its backward (``tpsim.nn``'s caches) is a tree of named tuples, lists and dicts of arrays;
``measure_activations`` sums it by kind (float activations, boolean masks, integer indices), leaving out the
fields a cache type names in ``PARAMETERS`` (weights, not activations) and any buffer shared with ``exclude``.
``tpsim.trace.measure`` adds the model's and the optimizer's bytes; ``tpsim.live_pipeline.in_flight`` the micro-batches
a pipeline stage holds. Pure NumPy, no MPI.
"""

from __future__ import annotations

import numpy as np


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
