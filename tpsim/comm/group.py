"""Traced collectives on one process group — the only place in tpsim where bytes cross between ranks.

Every method is a buffer-based mpi4py call (``Allreduce``, ``Allgather``, ``Reduce_scatter_block``, ``Bcast``)
on a contiguous NumPy array — no pickling on the hot path — and records exactly one ``CommEvent`` with the
caller's scope and phase. Shapes:

    all_reduce(x)                 x: [...]                       -> [...]            (sum / max / min)
    all_gather(x, axis)           x: [..., n, ...] on each rank  -> [..., p*n, ...]  (rank order)
    reduce_scatter(x, axis)       x: [..., p*n, ...] per rank    -> [..., n, ...]    (sum, chunk = group rank)
    broadcast(x, root)            x: [...] (filled on root)      -> [...]            (in place)
    send(x, peer, tag)            x: [...] to group rank peer    -> posted, never waits (``Isend``)
    recv(shape, dtype, peer, tag) from group rank peer           -> [...]            (waits for it)
    all_to_all(x, split, concat)  chunk j of split to rank j      -> chunks along concat (``tpsim.comm.all_to_all``)
    all_to_all_v / all_gather_v / reduce_scatter_v               pieces of per-rank sizes (``tpsim.comm.variable``)
    iall_reduce(x) / ireduce_scatter(x) / iall_gather(x)         -> Pending; .wait() -> the result (flat buffers)

Non-blocking (``tpsim.comm.pending``): the DP buckets' collectives, posted while the backward goes on
(``--overlap-grad-reduce``) or the next forward comes (``--overlap-param-gather``), traced when issued.

Sequence parallelism's reduce-scatter in a fixed order (``reduce_scatter_in_rank_order``: an all-to-all, then
the chunks added in rank order) and its collectives in chunks for ``--tp-comm-overlap`` (``post_chunk``,
``expect_chunk``, ``take_chunk``: one record per step) are ``Group`` methods too, in ``tpsim.comm.chunked``.

Point-to-point (the pipeline's activations and gradients): ``send`` posts a non-blocking ``Isend`` and keeps the
buffer until the send completes (``wait_sends``, at the end of a step, or found complete by a later send);
``recv`` waits for its message — politely, sleep-polling like a patient collective, because a pipeline rank
waiting in its bubble must not burn the core its neighbour is computing on. A send is recorded by the sender as
op "send" (wire bytes = its bytes) and by the receiver as op "recv" (wire bytes 0: it sends nothing), each a
``P2PEvent`` with the peer's world rank, the micro-batch and the model chunk. Messages are matched by tag.

16-bit arrays travel as 2 bytes per element: bfloat16 as its bit pattern with a user-defined reduction that adds
in float32 and rounds at every step, float16 natively where this MPI has it (``tpsim.comm.half``). The trace
records the array's own dtype and itemsize, so a bfloat16 all-reduce shows ``bfloat16`` and 2 bytes/element.
"""

from __future__ import annotations

import math
import pickle
import time

import numpy as np
from mpi4py import MPI

from tpsim.cost import wire_bytes
from tpsim.comm.half import NATIVE_OPS, reduce_op, wire_buffer
from tpsim.comm.all_to_all import AllToAll
from tpsim.comm.chunked import ChunkedCollectives
from tpsim.comm.pending import Pending
from tpsim.comm.tracer import Tracer
from tpsim.comm.variable import VariableCollectives
from tpsim.comm.waiting import collective, wait_politely

_REDUCE_OPS = NATIVE_OPS  # name -> MPI.Op; 16-bit arrays get theirs from tpsim.comm.half.reduce_op


def _stamped(buf: np.ndarray, stamp: float) -> np.ndarray:
    """``buf``'s bytes followed by ``stamp`` as 8 float64 bytes: one message, payload and piggybacked clock."""
    wire = np.empty(buf.nbytes + 8, dtype=np.uint8)
    wire[:buf.nbytes] = buf.reshape(-1).view(np.uint8)
    wire[buf.nbytes:] = np.array([stamp], dtype=np.float64).view(np.uint8)
    return wire


def _check_inplace(x: np.ndarray, name: str) -> None:
    if not (x.flags.c_contiguous and x.flags.writeable):
        raise ValueError(f"{name} needs a writeable C-contiguous array (MPI reads it until the wait)")


class Group(ChunkedCollectives, AllToAll, VariableCollectives):
    """A named group of ranks ("tp", "dp", "world") with traced collectives (SP's in chunks: ``ChunkedCollectives``)."""

    def __init__(self, comm: MPI.Comm, name: str, ranks: tuple[int, ...], tracer: Tracer) -> None:
        self.comm = comm
        self.name = name
        self.ranks = tuple(ranks)  # world ranks, in group-rank order
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        self.tracer = tracer
        self._dtype_names: dict[np.dtype, str] = {}  # str(dtype) runs Python code in NumPy: ~2 µs per call
        self._outbox: list[tuple[MPI.Request, np.ndarray]] = []  # posted sends and the buffers they read

    def __repr__(self) -> str:
        return f"Group({self.name}, ranks={list(self.ranks)}, me={self.rank})"

    def _dtype_name(self, dtype: np.dtype) -> str:
        name = self._dtype_names.get(dtype)
        if name is None:
            name = self._dtype_names[dtype] = str(dtype)
        return name

    def _record(self, op: str, x: np.ndarray, shape: tuple[int, ...], t: float, reduce_op: str = "",
                overlap: bool = False):
        tr = self.tracer
        if not tr.enabled:
            return None
        nbytes = math.prod(shape) * x.itemsize  # math.prod: np.prod costs ~2 µs on a tuple
        return tr.record(op=op, reduce_op=reduce_op, group=self.name, group_size=self.size, group_ranks=self.ranks,
                         dtype=self._dtype_name(x.dtype), shape=tuple(shape), bytes=nbytes,
                         wire_bytes=wire_bytes(op, nbytes, self.size), start=t - tr.t0,
                         duration=time.perf_counter() - t, overlap=overlap)

    def _record_p2p(self, op: str, x: np.ndarray, peer: int, t: float, microbatch: int, chunk: int) -> None:
        tr = self.tracer
        if not tr.enabled:
            return
        tr.record_p2p(op=op, reduce_op="", group=self.name, group_size=self.size, group_ranks=self.ranks,
                      dtype=self._dtype_name(x.dtype), shape=tuple(x.shape), bytes=x.nbytes,
                      wire_bytes=wire_bytes(op, x.nbytes, self.size), start=t - tr.t0,
                      duration=time.perf_counter() - t, peer=self.ranks[peer], microbatch=microbatch, chunk=chunk)

    def split(self, color: int, name: str) -> "Group":
        """A traced sub-group of this one: the ranks with the same ``color``, in this group's rank order.

        Collective over this group (every rank calls it, each with its own color); communicator creation is
        set-up, not model traffic, so it is not traced. The sub-group shares this group's tracer.
        """
        sub = self.comm.Split(color=color, key=self.rank)
        members = np.empty(self.size, dtype=np.int64)  # set-up: which group ranks chose the same color
        self.comm.Allgather(np.array([color], dtype=np.int64), members)  # a buffer, not a pickled object
        ranks = tuple(self.ranks[r] for r, c in enumerate(members) if c == color)
        return Group(sub, name, ranks, self.tracer)

    # --- the four collectives of tensor parallelism -----------------------------------------------------------
    def all_reduce(self, x: np.ndarray, op: str = "sum", *, inplace: bool = False,
                   out: np.ndarray | None = None, patient: bool = False) -> np.ndarray:
        """Element-wise reduction over the group; every rank gets the result.

        ``inplace`` reuses ``x``; ``out`` writes into a preallocated array (saves a fresh allocation per call);
        ``patient``: wait by sleeping (``tpsim.comm.waiting``), as ``broadcast`` can.
        """
        if op not in _REDUCE_OPS:
            raise ValueError(f"all_reduce op must be one of {sorted(_REDUCE_OPS)}, got {op!r}")
        x = np.ascontiguousarray(x)
        mpi_op = reduce_op(op, x.dtype)
        t = time.perf_counter()
        if inplace:
            out = x
            collective(self.comm, "Allreduce", MPI.IN_PLACE, wire_buffer(out), op=mpi_op, patient=patient)
        else:
            out = np.empty_like(x) if out is None else out
            collective(self.comm, "Allreduce", wire_buffer(x), wire_buffer(out), op=mpi_op, patient=patient)
        self._record("all_reduce", x, x.shape, t, reduce_op=op)
        return out

    def all_gather(self, x: np.ndarray, axis: int = -1) -> np.ndarray:
        """Concatenate every rank's ``x`` along ``axis`` in group-rank order (equal shapes on all ranks)."""
        x = np.ascontiguousarray(x)
        axis = axis % x.ndim
        t = time.perf_counter()
        stacked = np.empty((self.size,) + x.shape, dtype=x.dtype)
        collective(self.comm, "Allgather", wire_buffer(x), wire_buffer(stacked))
        if axis == 0:
            out = stacked.reshape((self.size * x.shape[0],) + x.shape[1:])
        else:  # chunks arrive stacked on a new leading axis; lay them side by side along `axis`
            out = np.concatenate(list(stacked), axis=axis)
        self._record("all_gather", x, out.shape, t)
        return out

    def reduce_scatter(self, x: np.ndarray, axis: int = -1) -> np.ndarray:
        """Sum ``x`` over the group and keep chunk ``rank`` of ``axis`` (its length must divide by the size)."""
        x = np.asarray(x)
        axis = axis % x.ndim
        n = x.shape[axis]
        if n % self.size:
            raise ValueError(f"reduce_scatter: dimension {axis} of shape {x.shape} is {n}, "
                             f"not divisible by the {self.name} group size {self.size}")
        chunk = n // self.size
        t = time.perf_counter()
        if axis == 0:
            send = np.ascontiguousarray(x)
        else:  # make each rank's chunk contiguous: [p, ..., chunk, ...]
            send = np.ascontiguousarray(np.stack(np.split(x, self.size, axis=axis)))
        out_shape = x.shape[:axis] + (chunk,) + x.shape[axis + 1:]
        out = np.empty(out_shape, dtype=x.dtype)
        collective(self.comm, "Reduce_scatter_block", wire_buffer(send), wire_buffer(out),
                   op=reduce_op("sum", x.dtype))
        self._record("reduce_scatter", x, x.shape, t, reduce_op="sum")
        return out

    def broadcast(self, x: np.ndarray, root: int = 0, *, patient: bool = False) -> np.ndarray:
        """Overwrite ``x`` on every rank with the root's (``root`` is a group rank). In place; returns ``x``.
        ``patient``: the others wait by sleeping (``tpsim.comm.waiting``), when the root has long work first."""
        if not (x.flags.c_contiguous and x.flags.writeable):
            raise ValueError("broadcast needs a writeable C-contiguous array (it works in place)")
        t = time.perf_counter()
        collective(self.comm, "Bcast", wire_buffer(x), root=root, patient=patient)
        self._record("broadcast", x, x.shape, t)
        return x

    # --- non-blocking: the DP buckets (tpsim.comm.pending) -------------------------------------------------------
    def iall_reduce(self, x: np.ndarray, op: str = "sum", *, overlap: bool = False) -> Pending:
        """Post an in-place all-reduce of ``x`` (writeable, C-contiguous); ``wait()`` returns ``x``, reduced.
        Traced now as ``all_reduce`` (``overlap``: issued to run beside compute)."""
        if op not in _REDUCE_OPS:
            raise ValueError(f"iall_reduce op must be one of {sorted(_REDUCE_OPS)}, got {op!r}")
        _check_inplace(x, "iall_reduce")
        t = time.perf_counter()
        request = self.comm.Iallreduce(MPI.IN_PLACE, wire_buffer(x), op=reduce_op(op, x.dtype))
        return Pending(request, self._record("all_reduce", x, x.shape, t, reduce_op=op, overlap=overlap), t,
                       lambda: x)

    def ireduce_scatter(self, x: np.ndarray, *, overlap: bool = False) -> Pending:
        """Post the sum of the flat ``x`` over the group, chunk ``rank`` of it kept (its length divides by the
        size); ``wait()`` returns that chunk. ``x`` must not change until then. Traced now as ``reduce_scatter``."""
        if x.ndim != 1 or len(x) % self.size:
            raise ValueError(f"ireduce_scatter: a flat array whose length divides by {self.size}, got {x.shape}")
        _check_inplace(x, "ireduce_scatter")
        out = np.empty(len(x) // self.size, dtype=x.dtype)
        t = time.perf_counter()
        request = self.comm.Ireduce_scatter_block(wire_buffer(x), wire_buffer(out), op=reduce_op("sum", x.dtype))
        return Pending(request, self._record("reduce_scatter", x, x.shape, t, reduce_op="sum", overlap=overlap), t,
                       lambda: out)

    def iall_gather(self, x: np.ndarray, *, overlap: bool = False) -> Pending:
        """Post the concatenation of every rank's flat ``x`` in group-rank order; ``wait()`` returns it
        (``[size · len(x)]``). Traced now as ``all_gather``."""
        if x.ndim != 1:
            raise ValueError(f"iall_gather: a flat array, got {x.shape}")
        x = np.ascontiguousarray(x)
        out = np.empty(self.size * len(x), dtype=x.dtype)
        t = time.perf_counter()
        request = self.comm.Iallgather(wire_buffer(x), wire_buffer(out))
        return Pending(request, self._record("all_gather", x, out.shape, t, overlap=overlap), t, lambda: out)

    # --- point-to-point: the pipeline's activations and gradients -------------------------------------------
    def send(self, x: np.ndarray, peer: int, tag: int, *, microbatch: int = -1, chunk: int = 0,
             stamp: float | None = None) -> None:
        """Post ``x`` to group rank ``peer`` under ``tag`` and return at once (``Isend``); the buffer is kept
        (a copy when ``x`` is not contiguous) until ``wait_sends`` or a later send finds the send complete.
        ``stamp``: a float64 carried after the payload (a virtual clock), not counted in the record's bytes."""
        self._check_peer(peer)
        buf = np.ascontiguousarray(x)
        wire = wire_buffer(buf) if stamp is None else _stamped(buf, stamp)
        t = time.perf_counter()
        self._outbox = [(req, b) for req, b in self._outbox if not req.Test()]  # release what has arrived
        self._outbox.append((self.comm.Isend(wire, dest=peer, tag=tag), wire))
        self._record_p2p("send", buf, peer, t, microbatch, chunk)

    def recv(self, shape: tuple[int, ...], dtype, peer: int, tag: int, *, microbatch: int = -1,
             chunk: int = 0, stamped: bool = False):
        """The array of ``shape`` and ``dtype`` that group rank ``peer`` sent under ``tag``; waits for it.
        ``stamped``: the sender gave a ``stamp``; returns ``(array, stamp)``."""
        self._check_peer(peer)
        out = np.empty(shape, dtype=dtype)
        wire = wire_buffer(out) if not stamped else np.empty(out.nbytes + 8, dtype=np.uint8)
        t = time.perf_counter()
        wait_politely(self.comm.Irecv(wire, source=peer, tag=tag))
        if stamped:
            out = wire[:out.nbytes].view(out.dtype).reshape(shape)
        self._record_p2p("recv", out, peer, t, microbatch, chunk)
        return (out, float(wire[out.nbytes:].view(np.float64)[0])) if stamped else out

    def wait_sends(self) -> None:
        """Complete every posted send (untraced: each was recorded when posted) and drop their buffers."""
        for req, _ in self._outbox:
            wait_politely(req)
        self._outbox = []

    @property
    def pending_sends(self) -> int:
        """Sends posted and not yet known to be complete."""
        return len(self._outbox)

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"{self.name} group rank {self.rank}: peer {peer} is not another rank of the group "
                             f"(size {self.size})")

    # --- bookkeeping collectives (not on the hot path) --------------------------------------------------------
    def barrier(self) -> None:
        t = time.perf_counter()
        collective(self.comm, "Barrier")
        self._record("barrier", np.empty(0, np.uint8), (0,), t)

    def gather_objects(self, obj, root: int = 0) -> list | None:
        """Gather any picklable object to ``root`` (a list in group-rank order there, ``None`` elsewhere).

        Two buffer-based steps — the sizes, then the pickled bytes with ``Gatherv`` — recorded as one
        ``gather`` whose ``bytes`` is the total pickled size.
        """
        t = time.perf_counter()
        payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        sizes = np.zeros(self.size, dtype=np.int64)
        collective(self.comm, "Allgather", np.array([payload.size], dtype=np.int64), sizes)
        total = int(sizes.sum())
        recv = np.empty(total, dtype=np.uint8) if self.rank == root else None
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        collective(self.comm, "Gatherv", payload,
                   [recv, sizes, offsets, MPI.BYTE] if self.rank == root else None, root=root)
        self._record("gather", payload, (total,), t)
        if self.rank != root:
            return None
        return [pickle.loads(recv[o:o + s].tobytes()) for o, s in zip(offsets, sizes)]

    def all_true(self, ok: bool) -> bool:
        """True on every rank iff ``ok`` is true on every rank (a traced 1-byte MIN all-reduce)."""
        flag = np.array([1 if ok else 0], dtype=np.int8)
        return bool(self.all_reduce(flag, op="min")[0])
