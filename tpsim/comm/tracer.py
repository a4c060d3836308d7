"""The communication tracer: one record per collective call, tagged with the layer and phase that issued it.

Layers do not pass their names to the communication layer by hand. They open a *region*:

    with tracer.region(scope=self.path, phase="forward"):
        y = tp_group.all_reduce(partial)            # recorded as scope=self.path, phase="forward"

Regions nest; an inner region that leaves ``scope`` or ``phase`` as ``None`` inherits the outer one, so a
training loop can say ``with tracer.region(phase="dp_sync")`` around a whole gradient sync. The tracer is an
ordinary object owned by the process grid (one per rank), never module-level state.

Byte accounting (see ``tpsim.comm.cost``): ``bytes`` is the size of the full logical tensor of the collective,
``wire_bytes`` what one rank sends under the bandwidth-optimal (ring) algorithm.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Iterator


@dataclass(slots=True)
class CommEvent:
    """One collective call as seen by one rank."""

    rank: int  # world rank that recorded it
    step: int  # training step (set by the caller with ``tracer.step``)
    phase: str  # "forward", "backward", "dp_sync", "init", "data", ... ; "" outside any region
    scope: str  # dotted module path of the issuing layer, e.g. "transformer.h.0.mlp"; "" at top level
    op: str  # "all_reduce", "all_gather", "reduce_scatter", "broadcast", "gather", "barrier"
    reduce_op: str  # "sum" / "max" / "min" for reductions, "" otherwise
    group: str  # "tp", "dp" or "world"
    group_size: int
    group_ranks: tuple[int, ...]  # world ranks of the group, in group-rank order
    dtype: str
    shape: tuple[int, ...]  # shape of the logical tensor that ``bytes`` measures
    bytes: int
    wire_bytes: int
    start: float  # seconds since the tracer's t0
    duration: float  # seconds

    def as_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["group_ranks"] = list(self.group_ranks)
        return d


class Tracer:
    """Collects ``CommEvent`` records for one rank. Cheap when disabled: ``record`` returns at once."""

    def __init__(self, rank: int = 0, enabled: bool = True) -> None:
        self.rank = rank
        self.enabled = enabled
        self.step = 0
        self.events: list[CommEvent] = []
        self.t0 = time.perf_counter()
        self._scope = ""
        self._phase = ""

    # --- where we are -----------------------------------------------------------------------------------------
    @property
    def scope(self) -> str:
        return self._scope

    @property
    def phase(self) -> str:
        return self._phase

    @contextmanager
    def region(self, scope: str | None = None, phase: str | None = None) -> Iterator["Tracer"]:
        """Tag every collective issued inside with ``scope``/``phase`` (``None`` keeps the outer value)."""
        saved = self._scope, self._phase
        if scope is not None:
            self._scope = scope
        if phase is not None:
            self._phase = phase
        try:
            yield self
        finally:
            self._scope, self._phase = saved

    @contextmanager
    def paused(self) -> Iterator["Tracer"]:
        """Do not record inside this block (e.g. a verification pass that is not part of training)."""
        saved = self.enabled
        self.enabled = False
        try:
            yield self
        finally:
            self.enabled = saved

    # --- records ----------------------------------------------------------------------------------------------
    def record(self, **fields) -> None:
        if not self.enabled:
            return
        self.events.append(CommEvent(rank=self.rank, step=self.step, phase=self._phase, scope=self._scope, **fields))

    def reset(self, t0: float | None = None) -> None:
        """Forget all records (e.g. at the start of a step); optionally restart the clock."""
        self.events.clear()
        if t0 is not None:
            self.t0 = t0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def select(self, **match) -> list[CommEvent]:
        """Records whose fields equal every given value, e.g. ``select(phase="forward", op="all_reduce")``."""
        return [e for e in self.events if all(getattr(e, k) == v for k, v in match.items())]
