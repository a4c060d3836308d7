"""Data-parallel gradient sync — what PyTorch's ``DistributedDataParallel(process_group=dp_group)`` does.

Each DP replica runs forward and backward on its own rows of the global batch; afterwards every replica must
hold the *average* of the replicas' gradients, so the optimizers (which see identical gradients) keep the
replicas identical. Under TP × DP a rank's DP group is the ranks holding the same shards (same ``tp_rank``)
in the other replicas, so each shard is averaged only with its twins:

    grad  <-  (1/dp) · Σ_{dp ranks} grad                 one all-reduce (sum) per bucket, then ÷ dp in place

Like DDP, gradients are packed into **buckets**: parameters in *reverse* registration order (roughly the order
backward produces them, which is what lets DDP overlap the all-reduce with the rest of backward), each bucket a
contiguous flat buffer of at most ``bucket_cap_bytes`` (25 MiB, DDP's default), except that a single tensor
larger than the cap gets a bucket of its own. Fewer, larger messages pay the per-message latency fewer times.
``bucket_cap_bytes=0`` (or ``None``) gives one bucket per parameter: the "unbucketed" sync.

Zero-copy, as in DDP's ``gradient_as_bucket_view=True``: at construction each gradient is *replaced* by a view
into its bucket's buffer, in every module that holds that array (a tied LM head shares the embedding's
gradient), so backward's ``+=`` already writes into the bucket and ``sync()`` never copies. ``Module.zero_grad``
keeps working because it fills in place. Replacing a gradient array after construction breaks the link;
``sync()`` checks for that and raises instead of silently averaging a stale buffer.

    sync = GradSync(model, grid.dp_group)      # after the model is built, before training
    model.backward(...); sync.sync()           # traced: scope "ddp.bucket{i}", phase "dp_sync"

``overlap=True`` (``--overlap-grad-reduce``): each bucket's all-reduce is issued during the backward, as soon as
its last gradient is final on the last micro-batch (``tpsim.train.grad_ready``: ``start_step``, ``arm`` /
``disarm`` around that backward, ``release`` for ``held`` buckets), and ``sync()`` only waits for them. Both
ways every bucket goes through ``Group.iall_reduce``, so the sums are bit for bit the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from tpsim.comm import Group
from tpsim.nn.module import Module
from tpsim.partition import assign_buckets  # pure arithmetic: the planner cuts its buckets the same way
from tpsim.phases import DP_SYNC
from tpsim.table import human_bytes
from tpsim.train.grad_ready import BucketReadiness

DEFAULT_BUCKET_CAP_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb=25


@dataclass(frozen=True)
class Bucket:
    """One flat gradient buffer: the parameters packed in it (in packing order) and its size."""

    names: tuple[str, ...]
    nbytes: int
    dtype: str


class Reduction(NamedTuple):
    """How a ``GradSync`` reduces bucket i over DP: ``launch(i)`` issues its collective (during the backward with
    the overlap), ``finish(i)`` waits for it and leaves the DP mean where the optimizer reads it. GradSync's own
    is all-reduce (sum) then ÷ dp; ZeRO's (``tpsim.train.zero_comm``) reduce-scatters into the owned range."""

    launch: Callable[[int], None]
    finish: Callable[[int], None]


class GradSync:
    """Average gradients over ``dp_group`` in buckets; the gradients of ``module`` become views into them.

    Attributes: ``buckets`` (list of ``Bucket``: names and bytes, for printing), ``buffers`` (the flat arrays,
    ``[nbytes / itemsize]`` each), ``dp_group``. ``pad_to``: each buffer's length is rounded up to a multiple
    of it with zeros after the last gradient (``tpsim.train.zero`` pads to dp so a reduce-scatter splits it).
    ``groups(names)``, when given, cuts the buckets instead of the cap: lists of positions in ``names`` (the
    gradients in packing order), each list one bucket. ``reduction``: how each bucket is reduced (default: the
    all-reduce mean; ``Reduction``).
    """

    zero_stage = 0  # plain DP: every rank keeps the whole optimizer state (ZeRO-1's sync says 1)

    def __init__(self, module: Module, dp_group: Group,
                 bucket_cap_bytes: int | None = DEFAULT_BUCKET_CAP_BYTES, *, pad_to: int = 1,
                 overlap: bool = False, held: tuple[np.ndarray, ...] = (), groups=None,
                 reduction: Reduction | None = None) -> None:
        if bucket_cap_bytes is not None and bucket_cap_bytes < 0:
            raise ValueError(f"bucket_cap_bytes must be >= 0 or None, got {bucket_cap_bytes}")
        self.module, self.dp_group = module, dp_group
        self.bucket_cap_bytes = bucket_cap_bytes
        # reverse registration order: the last layers' gradients are ready first in backward
        entries = list(module.named_grads())[::-1]
        groups = (assign_buckets([(n, g.nbytes, str(g.dtype)) for n, g in entries], bucket_cap_bytes) if groups is None
                  else groups([n for n, _ in entries]))  # ZeRO-3: one bucket per unit (tpsim.train.zero3)
        self.buckets: list[Bucket] = []
        self.buffers: list[np.ndarray] = []
        self._views: list[tuple[str, np.ndarray]] = []  # (name, view) in packing order, to detect replacement
        replace: dict[int, np.ndarray] = {}  # id(old grad array) -> its view in a bucket
        for positions in groups:
            members = [entries[i] for i in positions]
            size = sum(g.size for _, g in members)
            buf = np.zeros(-(-size // pad_to) * pad_to, dtype=members[0][1].dtype)  # zero tail: see pad_to
            offset = 0
            for name, g in members:
                view = buf[offset:offset + g.size].reshape(g.shape)  # contiguous slice: a view, never a copy
                view[...] = g  # keep whatever the gradient already held
                replace[id(g)] = view
                self._views.append((name, view))
                offset += g.size
            self.buffers.append(buf)
            self.buckets.append(Bucket(tuple(n for n, _ in members), int(buf.nbytes), str(buf.dtype)))
        # every module holding the old array gets the view (a tied head and its embedding share one gradient)
        for _, mod in module.named_modules():
            for key, g in mod.grads.items():
                if id(g) in replace:
                    mod.grads[key] = replace[id(g)]
        self.overlap = overlap and self.dp > 1
        self.reduction = Reduction(self._all_reduce, self._average) if reduction is None else reduction
        self._pending: dict[int, object] = {}  # bucket -> its posted collective (tpsim.comm.pending.Pending)
        self.bucket_events: dict[int, object] = {}  # bucket -> the trace record of its last collective (or None)
        self.held = tuple(replace.get(id(g), g) for g in held)  # the held gradients, now views into their buckets
        self.ready = (BucketReadiness(module, self.buffers, self.reduction.launch, self.held) if self.overlap
                      else None)

    @property
    def dp(self) -> int:
        return self.dp_group.size

    @property
    def total_bytes(self) -> int:
        """Gradient bytes this rank holds (its local shards) = bytes all-reduced per sync."""
        return sum(b.nbytes for b in self.buckets)

    def check_views(self) -> None:
        """Raise if a gradient array was replaced after construction (its bucket would be stale); a sync that
        reads the buckets (this one's, ZeRO-1's reduce-scatter) calls it first."""
        names = {name: id(g) for name, g in self.module.named_grads()}
        for name, view in self._views:
            if names.get(name) != id(view):
                raise RuntimeError(f"gradient of {name} is no longer a view into its DDP bucket (was the array "
                                   "replaced after GradSync was built?); build GradSync after the model is final")

    def hand_over(self, buffers: list) -> None:
        """ZeRO-2 (``tpsim.train.zero2``) materialises the buckets itself: ``buffers`` (its live list) replaces
        this sync's, and the views kept to detect a replaced gradient are dropped (they would keep the memory)."""
        self.buffers, self._views = buffers, []

    # --- the overlap (tpsim.train.grad_ready): issue during the last backward, wait in sync() ---------------------
    def start_step(self) -> None:
        """Before a step's backward: no bucket issued yet (a no-op without the overlap)."""
        if self.ready is not None:
            self.check_views()
            self.ready.start()

    def arm(self) -> None:
        """The next backward action is one a REDUCE_GRAD sits on: the last micro-batch's final one on its chunk
        (``tpsim.pipeline.collectives``), or the whole backward without a pipeline."""
        if self.ready is not None:
            self.ready.arm()

    def disarm(self) -> None:
        if self.ready is not None:
            self.ready.disarm()

    def release(self) -> None:
        """The held buckets (the tied embedding's, summed over the embedding group first) may go."""
        if self.ready is not None:
            self.ready.release()

    @property
    def issue_order(self) -> list[int]:
        """The buckets in the order this step issued them (bucket order without the overlap)."""
        return list(self.ready.issued) if self.ready is not None else list(range(len(self.buffers)))

    def _all_reduce(self, i: int) -> None:
        with self.dp_group.tracer.region(scope=f"ddp.bucket{i}", phase=DP_SYNC):
            self._pending[i] = self.dp_group.iall_reduce(self.buffers[i], op="sum", overlap=self.overlap)
        self.bucket_events[i] = self._pending[i].event

    def _average(self, i: int) -> None:
        self._pending.pop(i).wait()
        self.buffers[i] /= self.dp  # sum then divide (DDP divides first; for dp a power of two both are exact)

    def sync(self) -> None:
        """Average every gradient over the DP group in place: one all-reduce (sum) per bucket, then ÷ dp.

        Every bucket goes through the same non-blocking call (``Group.iall_reduce``), issued here and waited at
        once — or, with the overlap, issued during the backward and only waited here (the rest issued first),
        so both sum in one order and give the same bits. With dp == 1 nothing is issued.
        """
        if self.dp == 1:
            return
        self.check_views()
        if self.ready is None:
            for i in range(len(self.buffers)):
                self.reduction.launch(i)
                self.reduction.finish(i)
            return
        self.ready.flush()
        for i in list(self.ready.issued):
            self.reduction.finish(i)

    def finish_param_gather(self) -> None:
        """Nothing posted: plain DP gathers no parameters (ZeRO-1's ``DistributedOptimizer`` does)."""

    def gather_grads(self) -> None:
        """Nothing to gather: after ``sync()`` every rank holds the whole DP-mean gradients. (ZeRO-1's
        ``DistributedOptimizer``, the other gradient sync, reduces only owned slices and gathers them here.)"""

    def describe(self) -> str:
        """The buckets as text, one line each: index, bytes, parameter count, first and last parameter."""
        cap = "unbucketed" if not self.bucket_cap_bytes else f"cap {human_bytes(self.bucket_cap_bytes)}"
        lines = [f"DDP gradient sync over DP({self.dp}): {len(self.buckets)} bucket(s), {cap}, "
                 f"{self.total_bytes} bytes per rank"]
        for i, b in enumerate(self.buckets):
            span = b.names[0] if len(b.names) == 1 else f"{b.names[0]} .. {b.names[-1]}"
            lines.append(f"  bucket {i}: {b.nbytes:>10} bytes  {len(b.names):>3} params  {span}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"GradSync(dp={self.dp}, buckets={len(self.buckets)}, bytes={self.total_bytes})"
