"""Measuring memory on live arrays: the bytes a model, its optimizer and a forward's cache really hold.

The other half of ``tpsim.predict.memory``: the formulas there say how many bytes each category should take on
one rank; ``measure_memory`` walks the live arrays (every distinct buffer counted once, views followed to their
owner: ``tpsim.nn.cache_bytes``) and ``format_memory`` prints the two side by side. Pure NumPy, no MPI.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tpsim.nn.cache_bytes import measure_activations  # the cache's bytes; its callers read it here too
from tpsim.nn.module import held_nbytes
from tpsim.table import format_table


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
    params = sum(held_nbytes(p) for _, p in model.named_parameters())
    params += optimizer.param_bytes() if optimizer is not None else 0  # ZeRO-3's owned slices
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
