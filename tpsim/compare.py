"""How far apart two tensors are: the one difference every check in tpsim reports.

    max_abs_diff(got, expected)          max |got − expected|                              (absolute)
    relative_difference(got, expected)   max |got − expected| / max(floor, max |expected|) (relative to the scale)
    shard_differences(parallel, serial)  each shard of a parallel module vs its slice of the serial tensor

The relative form divides by the reference tensor's largest magnitude, not elementwise: an elementwise ratio
blows up on entries that are nearly zero, while the tensor's scale says how large an error can be afforded.
``floor`` keeps a tensor of tiny values from turning a rounding error into a large ratio (1 for the demo's
"relative, but absolute below 1"; a tiny floor for a purely relative measure).

A tensor-parallel shard is compared with the part of the serial (master) tensor it holds, read from its
``Partition`` (``take_shard``), so the same check serves column, row, vocabulary and replicated parameters
(the block-matrix splits of eqs. (1) and (2) of the SenseParrots article). Pure NumPy, no MPI: agreeing on
a verdict across ranks is ``tpsim.comm.agree``'s job.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from tpsim.partition import take_shard


def max_abs_diff(got, expected) -> float:
    """``max |got − expected|`` as a float; ``inf`` when either holds a NaN or the shapes differ, 0 when empty."""
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    diff = np.abs(got - expected)
    return float("inf") if np.isnan(diff).any() else float(diff.max())


def relative_difference(got, expected, *, floor: float = 1.0) -> float:
    """``max |got − expected| / max(floor, max |expected|)``; the absolute difference when that scale is 0.

    ``floor`` is the smallest scale divided by: 1 reads "relative for large tensors, absolute for small ones";
    pass the other tensor's scale (``max |got|``) to measure against the larger of the two.
    """
    diff = max_abs_diff(got, expected)
    expected = np.asarray(expected)
    scale = max(float(floor), float(np.max(np.abs(expected), initial=0.0)))
    return diff / scale if scale > 0 else diff


def shard_differences(parallel, serial: Mapping[str, np.ndarray], *, prefix: str = "",
                      grads: bool = True, floor: float | None = None) -> dict[str, float]:
    """``{name: difference}`` of every gradient (or parameter) of ``parallel`` (a ``tpsim.nn.Module``: only its
    ``named_entries`` are read, so this module needs nothing of ``tpsim.nn``) vs its slice of the serial tensor.

    ``serial``: the serial model's tensors by dotted name (``dict(serial.named_grads(prefix))``), full size;
    ``take_shard`` cuts the slice the shard's ``Partition`` names (a replicated tensor is compared whole).
    ``floor=None`` measures ``max_abs_diff``; a number measures ``relative_difference`` with that floor.
    """
    out = {}
    for e in parallel.named_entries(prefix):
        local, expected = e.grad if grads else e.param, take_shard(serial[e.name], e.partition)
        out[e.name] = (max_abs_diff(local, expected) if floor is None
                       else relative_difference(local, expected, floor=floor))
    return out


def shard_error(parallel, serial: Mapping[str, np.ndarray], *, prefix: str = "", grads: bool = True) -> float:
    """The largest ``|shard − its slice of the serial tensor|`` over every gradient (or parameter) of ``parallel``."""
    return max(shard_differences(parallel, serial, prefix=prefix, grads=grads).values())
