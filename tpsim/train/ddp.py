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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpsim.comm import Group
from tpsim.nn.module import Module
from tpsim.phases import DP_SYNC
from tpsim.table import human_bytes

DEFAULT_BUCKET_CAP_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb=25


@dataclass(frozen=True)
class Bucket:
    """One flat gradient buffer: the parameters packed in it (in packing order) and its size."""

    names: tuple[str, ...]
    nbytes: int
    dtype: str


def assign_buckets(sizes: list[tuple[str, int, str]], cap: int | None) -> list[list[int]]:
    """Group entries ``(name, nbytes, dtype)`` — already in packing order — into buckets (lists of positions).

    A bucket is closed before an entry that would push it over ``cap`` or that has another dtype (a flat
    buffer has one dtype); an entry larger than ``cap`` thus sits alone. ``cap`` 0 or None: one per entry.
    Pure arithmetic, no MPI.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    used, dtype = 0, None
    for i, (_, nbytes, dt) in enumerate(sizes):
        if current and (not cap or used + nbytes > cap or dt != dtype):
            buckets.append(current)
            current, used = [], 0
        current.append(i)
        used, dtype = used + nbytes, dt
    if current:
        buckets.append(current)
    return buckets


class GradSync:
    """Average gradients over ``dp_group`` in buckets; the gradients of ``module`` become views into them.

    Attributes: ``buckets`` (list of ``Bucket``: names and bytes, for printing), ``buffers`` (the flat arrays,
    ``[nbytes / itemsize]`` each), ``dp_group``. ``pad_to``: each buffer's length is rounded up to a multiple
    of it with zeros after the last gradient (``tpsim.train.zero`` pads to dp so a reduce-scatter splits it).
    """

    def __init__(self, module: Module, dp_group: Group,
                 bucket_cap_bytes: int | None = DEFAULT_BUCKET_CAP_BYTES, *, pad_to: int = 1) -> None:
        if bucket_cap_bytes is not None and bucket_cap_bytes < 0:
            raise ValueError(f"bucket_cap_bytes must be >= 0 or None, got {bucket_cap_bytes}")
        self.module, self.dp_group = module, dp_group
        self.bucket_cap_bytes = bucket_cap_bytes
        # reverse registration order: the last layers' gradients are ready first in backward
        entries = list(module.named_grads())[::-1]
        groups = assign_buckets([(n, g.nbytes, str(g.dtype)) for n, g in entries], bucket_cap_bytes)
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

    def sync(self) -> None:
        """Average every gradient over the DP group in place: one all-reduce (sum) per bucket, then ÷ dp.

        With dp == 1 there is nothing to average: no collective is issued.
        """
        if self.dp == 1:
            return
        self.check_views()
        tracer = self.dp_group.tracer
        for i, buf in enumerate(self.buffers):
            with tracer.region(scope=f"ddp.bucket{i}", phase=DP_SYNC):
                self.dp_group.all_reduce(buf, op="sum", inplace=True)
            buf /= self.dp  # sum then divide (DDP divides first; for dp a power of two both are exact)

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
