"""``Group``'s collectives for sequence parallelism in chunks (``tpsim.tp.collective_matmul``, ``--tp-comm-overlap``):
methods of every ``tpsim.comm.Group`` (a mixin, kept apart so the group's file stays one screen of collectives).

    reduce_scatter_in_rank_order(chunks [p, ...], shape)   one Alltoall, then the p chunks a rank received added
                                                           in group-rank order (``tpsim.comm.ordered``): one record
    post_chunk(x, peer, tag)                               Isend a chunk (the caller keeps x until finish_chunks)
    expect_chunk(shape, dtype, peer, tag)                  Irecv a chunk: (request, buffer)
    take_chunk(pending, op, step, steps, gemms)            wait for it (sleep-polling) and record step ``step`` of
                                                           ``steps`` of collective ``op`` (an ``OverlapEvent``)
    finish_chunks(requests)                                complete the posted sends (untraced: the steps were)

Like every collective of the group, these touch the group's communicator and record into its tracer; 16-bit
chunks travel as 2 bytes per element (``tpsim.comm.half.wire_buffer``).
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from tpsim.comm.half import wire_buffer
from tpsim.comm.ordered import sum_in_rank_order
from tpsim.comm.waiting import collective, wait_politely


class ChunkedCollectives:
    """The chunked collectives of a ``Group`` (which supplies ``comm``, ``size``, ``rank``, ``name``, ``ranks``,
    ``tracer``, ``_record``, ``_dtype_name`` and ``_check_peer``)."""

    def reduce_scatter_in_rank_order(self, chunks: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """``chunks [p, ...]``: chunk j for group rank j; one ``Alltoall``, then the p chunks this rank received
        added in group-rank order (``tpsim.comm.ordered``) -> ``[...]``. Recorded as one reduce_scatter of the
        logical tensor ``shape`` (the bytes and wire bytes of ``reduce_scatter``)."""
        chunks = np.ascontiguousarray(chunks)
        if chunks.shape[0] != self.size:
            raise ValueError(f"reduce_scatter_in_rank_order: {chunks.shape[0]} chunks for {self.size} ranks")
        t = time.perf_counter()
        received = np.empty_like(chunks)
        collective(self.comm, "Alltoall", wire_buffer(chunks), wire_buffer(received))
        out = sum_in_rank_order(list(received))
        self._record("reduce_scatter", chunks, tuple(shape), t, reduce_op="sum")
        return out

    def post_chunk(self, x: np.ndarray, peer: int, tag: int) -> MPI.Request:
        """Post contiguous ``x`` to group rank ``peer`` (``Isend``); the caller keeps ``x`` until ``finish_chunks``.
        Recorded by the step that receives its twin (``take_chunk``): one record per step of the collective."""
        self._check_peer(peer)
        return self.comm.Isend(wire_buffer(x), dest=peer, tag=tag)

    def expect_chunk(self, shape: tuple[int, ...], dtype, peer: int, tag: int) -> tuple[MPI.Request, np.ndarray]:
        """Post the receive of a chunk of ``shape`` from group rank ``peer`` (``Irecv``): ``(request, buffer)``."""
        self._check_peer(peer)
        out = np.empty(shape, dtype=dtype)
        return self.comm.Irecv(wire_buffer(out), source=peer, tag=tag), out

    def take_chunk(self, pending: tuple[MPI.Request, np.ndarray], op: str, step: int, steps: int,
                   gemms: tuple[tuple[int, int, int], ...]) -> np.ndarray:
        """Wait (sleep-polling, ``wait_politely``) for a chunk ``expect_chunk`` posted and record step ``step`` of
        ``steps`` of collective ``op`` (an ``OverlapEvent``: this rank sent a chunk of the same size in the step)."""
        request, out = pending
        t = time.perf_counter()
        wait_politely(request)
        tr = self.tracer
        if tr.enabled:
            tr.record_overlap(op=op, reduce_op="sum" if op == "reduce_scatter" else "", group=self.name,
                              group_size=self.size, group_ranks=self.ranks, dtype=self._dtype_name(out.dtype),
                              shape=tuple(out.shape), bytes=out.nbytes, wire_bytes=out.nbytes, start=t - tr.t0,
                              duration=time.perf_counter() - t, gemms=tuple(gemms), overlap_step=step,
                              overlap_steps=steps)
        return out

    def finish_chunks(self, requests: list[MPI.Request]) -> None:
        """Complete the sends ``post_chunk`` posted (untraced: each step was recorded by ``take_chunk``)."""
        for request in requests:
            wait_politely(request)
