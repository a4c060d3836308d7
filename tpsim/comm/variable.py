"""Collectives whose pieces differ in size from rank to rank: the token dispatch of expert parallelism.

    all_to_all_v(x, send_counts)        x [n, ...], rows grouped by destination: send_counts[j] rows to group
                                         rank j -> (received [m, ...] grouped by source, recv_counts [p])
    all_gather_v(x)                      x [n_r, ...] on rank r  -> [Σ n_r, ...] in rank order, counts [p]
    reduce_scatter_v(x, counts)          x [Σ counts, ...] on every rank -> [counts[r], ...] (summed over ranks)

A mixture of experts sends each token to the ranks of its experts, so how many rows go where is known only
after routing: ``all_to_all_v`` exchanges the counts first (an ``all_to_all`` of one int64 per peer, traced as
such: Megatron's dispatcher exchanges them the same way) and then the rows, one buffer-based ``Alltoallv``.
When the receiver already knows its counts (the combine of a dispatch, or any backward of it) pass
``recv_counts`` and the count exchange is skipped. ``all_gather_v`` exchanges counts by an all-gather the same way.

Records: op ``all_to_all_v`` with bytes = the rows this rank sends and wire bytes = the rows it sends to other
ranks (what it keeps is not on the wire); ``all_gather_v`` with bytes = the gathered output and wire bytes
= its own rows times p − 1 (a ring forwards every other rank's piece once: (Σ n − n_r) sent in all, charged as
the ring charges); ``reduce_scatter_v`` with bytes = its input and wire bytes = its input less its own piece.
16-bit arrays travel as 2 bytes per element (``tpsim.comm.half``).
"""

from __future__ import annotations

import math
import time

import numpy as np

from tpsim.comm.half import reduce_op, wire_buffer
from tpsim.comm.waiting import collective


def _displacements(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def _vector(x: np.ndarray, counts: np.ndarray):
    """``[buffer, (counts, displacements), datatype]`` of rows of ``x`` in elements of the wire type."""
    row = math.prod(x.shape[1:])
    elems = np.asarray(counts, dtype=np.int64) * row
    wire = wire_buffer(x)
    if isinstance(wire, list):  # a 16-bit array: its bit pattern
        return [wire[0], (elems, _displacements(elems)), wire[1]]
    return [x, (elems, _displacements(elems))]


class VariableCollectives:
    """All-to-all, all-gather and reduce-scatter with per-rank sizes, a mixin of ``Group`` (which supplies
    ``comm``, ``size``, ``rank``, ``name``, ``ranks``, ``tracer``, ``all_to_all``, ``all_gather``)."""

    def _record_v(self, op: str, x: np.ndarray, shape: tuple[int, ...], nbytes: int, wire: int, t: float) -> None:
        """A collective of per-rank sizes: its bytes and wire bytes counted by the caller (``tpsim.comm.variable``)."""
        tr = self.tracer
        if tr.enabled:
            tr.record(op=op, reduce_op="sum" if op == "reduce_scatter_v" else "", group=self.name,
                      group_size=self.size, group_ranks=self.ranks, dtype=self._dtype_name(x.dtype),
                      shape=tuple(shape), bytes=int(nbytes), wire_bytes=int(wire), start=t - tr.t0,
                      duration=time.perf_counter() - t, overlap=False)


    def all_to_all_v(self, x: np.ndarray, send_counts, recv_counts=None) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``x`` (grouped by destination, ``send_counts[j]`` for group rank j) to their ranks; the
        received rows grouped by source and the ``recv_counts`` (exchanged first unless given)."""
        send_counts = np.asarray(send_counts, dtype=np.int64)
        if send_counts.shape != (self.size,) or send_counts.sum() != len(x) or (send_counts < 0).any():
            raise ValueError(f"all_to_all_v: send_counts {send_counts.tolist()} must be {self.size} counts "
                             f"summing to the {len(x)} rows of x")
        if recv_counts is None:
            recv_counts = self.all_to_all(send_counts, 0, 0)  # traced: one int64 per peer
        recv_counts = np.asarray(recv_counts, dtype=np.int64)
        x = np.ascontiguousarray(x)
        received = np.empty((int(recv_counts.sum()), *x.shape[1:]), dtype=x.dtype)
        t = time.perf_counter()
        collective(self.comm, "Alltoallv", _vector(x, send_counts), _vector(received, recv_counts))
        row_bytes = math.prod(x.shape[1:]) * x.itemsize
        kept = int(send_counts[self.rank]) * row_bytes
        self._record_v("all_to_all_v", x, x.shape, x.nbytes, x.nbytes - kept, t)
        return received, recv_counts

    def all_gather_v(self, x: np.ndarray, counts=None) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's rows of ``x`` (their number may differ) in group-rank order, and how many each gave
        (exchanged first unless given)."""
        if counts is None:
            counts = self.all_gather(np.array([len(x)], dtype=np.int64), axis=0)  # traced: one int64 per rank
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != (self.size,) or counts[self.rank] != len(x):
            raise ValueError(f"all_gather_v: counts {counts.tolist()} must be {self.size} counts, this rank's "
                             f"the {len(x)} rows of x")
        x = np.ascontiguousarray(x)
        out = np.empty((int(counts.sum()), *x.shape[1:]), dtype=x.dtype)
        t = time.perf_counter()
        collective(self.comm, "Allgatherv", wire_buffer(x), _vector(out, counts))
        self._record_v("all_gather_v", x, out.shape, out.nbytes, x.nbytes * (self.size - 1), t)
        return out, counts

    def reduce_scatter_v(self, x: np.ndarray, counts) -> np.ndarray:
        """``x`` summed over the group, rank r keeping rows [Σ_{j<r} counts_j, +counts_r) (``counts`` known to all,
        e.g. an ``all_gather_v``'s)."""
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != (self.size,) or counts.sum() != len(x):
            raise ValueError(f"reduce_scatter_v: counts {counts.tolist()} must be {self.size} counts summing to "
                             f"the {len(x)} rows of x")
        x = np.ascontiguousarray(x)
        row = math.prod(x.shape[1:])
        out = np.empty((int(counts[self.rank]), *x.shape[1:]), dtype=x.dtype)
        t = time.perf_counter()
        collective(self.comm, "Reduce_scatter", wire_buffer(x), wire_buffer(out),
                   [int(c) * row for c in counts], reduce_op("sum", x.dtype))
        self._record_v("reduce_scatter_v", x, x.shape, x.nbytes, x.nbytes - out.nbytes, t)
        return out
