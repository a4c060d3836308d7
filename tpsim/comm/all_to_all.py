"""``Group.all_to_all``: the collective of DeepSpeed-Ulysses (``tpsim.cp.ulysses``), a mixin of every ``Group``.

    all_to_all(x, split_axis, concat_axis)   x cut into p chunks along split_axis, chunk j sent to group rank j;
                                             the p chunks received laid side by side along concat_axis, in
                                             group-rank order

One buffer-based ``Alltoall``; one record (op "all_to_all", bytes = x's, wire bytes (p − 1)/p of them: a rank
keeps its own chunk). 16-bit arrays travel as 2 bytes per element (``tpsim.comm.half``).
"""

from __future__ import annotations

import time

import numpy as np

from tpsim.comm.half import wire_buffer
from tpsim.comm.waiting import collective


class AllToAll:
    """The all-to-all of a ``Group`` (which supplies ``comm``, ``size``, ``name`` and ``_record``)."""

    def all_to_all(self, x: np.ndarray, split_axis: int, concat_axis: int) -> np.ndarray:
        """``x`` with ``split_axis`` cut over the group and ``concat_axis`` gathered from it (see the module)."""
        x = np.asarray(x)
        split_axis, concat_axis = split_axis % x.ndim, concat_axis % x.ndim
        if x.shape[split_axis] % self.size:
            raise ValueError(f"all_to_all: dimension {split_axis} of shape {x.shape} is not divisible by the "
                             f"{self.name} group size {self.size}")
        t = time.perf_counter()
        send = np.ascontiguousarray(np.stack(np.split(x, self.size, axis=split_axis)))  # [p, ...chunk...]
        received = np.empty_like(send)
        collective(self.comm, "Alltoall", wire_buffer(send), wire_buffer(received))
        out = np.concatenate(list(received), axis=concat_axis)
        self._record("all_to_all", x, x.shape, t)
        return out
