"""ZeRO's DP collectives, the communication half of ``tpsim.train.zero.DistributedOptimizer``:

    gradients   reduce-scatter each bucket over DP (phase dp_sync), as the ``Reduction`` of the ``GradSync`` it
                owns — so ``--overlap-grad-reduce`` issues each during the last backward
                (``tpsim.train.grad_ready``) — the owned range of the bucket becoming this rank's summed slice, ÷ d
    parameters  all-gather every bucket's owned ranges back into the model's arrays (phase optimizer): at once,
                or with ``--overlap-param-gather`` posted (``Group.iall_gather``), each layer of the next forward
                waiting for its own buckets when it starts (a ``FORWARD`` hook), ``finish_param_gather``
                completing whatever is left before anything else reads the parameters

Both reductions go through the non-blocking ``Group.ireduce_scatter`` whichever way they are issued: MPICH's
blocking ``Reduce_scatter_block`` sums large buffers in another order than ``Ireduce_scatter_block`` at dp ≥ 3,
so one call for both paths keeps an overlapped run bit for bit the plain one.

ZeRO-2 and 3 (``sharded``: ``tpsim.train.zero2``) reduce-scatter each bucket inside the backward instead, as its
layers finish it, through the same call (``_reduce_into_owned``); ZeRO-3 (``sharded_params``: ``tpsim.train.zero3``)
gathers no parameters after the step — ``finish_param_gather`` and ``gather_grads`` gather the whole model for a
reader.
"""

from __future__ import annotations

import numpy as np

from tpsim.nn.hooks import FORWARD, Hook
from tpsim.phases import DP_SYNC, OPTIMIZER, VERIFY
from tpsim.pipeline.overlap import forward_order


def flat_view(a: np.ndarray) -> np.ndarray:
    flat = a.reshape(-1)
    if not np.shares_memory(flat, a):
        raise ValueError("ZeRO-1 updates parameters through flat views: parameters must be contiguous")
    return flat


class ZeroCommunication:
    """The DP collectives of a ``DistributedOptimizer`` (its attributes: ``grad_sync``, ``dp_group``, ``dp``,
    ``buckets``, ``buffers``, ``bucket_sizes``, ``owned``, ``slices``, ``optimizer``, ``overlap_param_gather``,
    ``sharded`` (ZeRO-2/3's ``ShardedGrads``, else None), ``sharded_params`` (ZeRO-3's ``ShardedParams``, else None),
    ``_reduced``, ``_gathering``, ``_hooked``)."""

    def start_step(self) -> None:
        if self.sharded_params is not None:
            self.sharded_params.start()  # ZeRO-3: every unit gathers around its calls again
        if self.sharded is not None:
            self.sharded.start()  # the owned slices zeroed, every bucket freed
        else:
            self.grad_sync.start_step()

    def arm(self) -> None:
        """The next backward action is one a REDUCE_GRAD sits on (``tpsim.pipeline.collectives``): the last
        micro-batch's, or under ZeRO-2/3 every one (each micro-batch reduce-scatters the buckets it wrote)."""
        self._grads.arm()

    def disarm(self) -> None:
        self._grads.disarm()

    def release(self) -> None:
        self._grads.release()

    def release_params(self) -> None:
        """RESHARD (``tpsim.pipeline.collectives``): ZeRO-3's gathered parameters freed (a no-op below ZeRO-3)."""
        if self.sharded_params is not None:
            self.sharded_params.release()

    @property
    def _grads(self):
        """Who tracks the backward: ZeRO-2's ``ShardedGrads``, or the ``GradSync`` (its overlap)."""
        return self.grad_sync if self.sharded is None else self.sharded

    @property
    def issue_order(self) -> list[int]:
        return self.grad_sync.issue_order

    @property
    def overlap(self) -> bool:
        """``--overlap-grad-reduce`` (at dp > 1): the reduce-scatters are issued during the backward."""
        return self.grad_sync.overlap

    @property
    def bucket_events(self) -> dict:
        return self.grad_sync.bucket_events

    def sync(self) -> None:
        """Reduce-scatter each bucket over DP: this rank's owned range becomes the DP mean of the gradients.
        Through ``GradSync.sync`` (its overlap included), each bucket by ``Group.ireduce_scatter``: MPICH's
        blocking ``Reduce_scatter_block`` sums large buffers in another order at dp >= 3, so the overlapped
        and the plain sync use the one non-blocking call and give the same bits. ZeRO-2: the buckets were
        reduce-scattered during the backward; what is left goes now, then the owned slices are ÷ d."""
        if self.sharded is not None:
            self.sharded.finish(self.dp)
            return
        self.grad_sync.sync()

    def _reduce_into_owned(self, i: int, buffer) -> np.ndarray:
        """ZeRO-2: bucket ``i``'s ``buffer`` reduce-scattered over DP; this rank's range of the sum."""
        mine = self.owned[i]
        if self.dp == 1:
            return buffer[mine.start:mine.stop]
        with self.dp_group.tracer.region(scope=f"zero.bucket{i}", phase=DP_SYNC):
            pending = self.dp_group.ireduce_scatter(buffer)
        self.grad_sync.bucket_events[i] = pending.event
        return pending.wait()

    def _reduce_scatter(self, i: int) -> None:
        with self.dp_group.tracer.region(scope=f"zero.bucket{i}", phase=DP_SYNC):
            self._reduced[i] = self.dp_group.ireduce_scatter(self.buffers[i], overlap=self.grad_sync.overlap)
        self.grad_sync.bucket_events[i] = self._reduced[i].event

    def _keep_owned(self, i: int) -> None:
        mine, buf = self.owned[i], self.buffers[i]
        buf[mine.start:mine.stop] = self._reduced.pop(i).wait()
        buf[mine.start:mine.stop] /= self.dp  # sum then divide, as GradSync does

    def gather_params(self) -> None:
        """All-gather every bucket's owned ranges of the model's parameters into its arrays (phase
        ``optimizer``), in the parameters' dtype: 2 bytes per element for a 16-bit model. With
        ``overlap_param_gather`` (``--overlap-param-gather``) they are only posted here, and
        ``finish_param_gather`` (before the next forward, or anything reading the parameters) completes them."""
        targets = dict(self.optimizer.module.named_parameters())
        if not self.overlap_param_gather:
            self._gather("model", targets, "zero.bucket", OPTIMIZER)
            return
        self.finish_param_gather()
        tracer = self.dp_group.tracer
        for i in forward_order(len(self.buckets)):  # the next forward reads the last-packed bucket first
            send = self._owned_values(i, "model", targets)
            with tracer.region(scope=f"zero.bucket{i}", phase=OPTIMIZER):
                self._gathering.append((i, self.dp_group.iall_gather(send, overlap=True)))
        self._hook_param_waits()

    def _hook_param_waits(self) -> None:
        """Each layer the forward calls (a block, the embeddings, the final norm, the LM head) waits, at its first
        forward, for the all-gathers of the buckets its parameters sit in (a ``FORWARD`` hook before it,
        ``tpsim.nn.hooks``); a tied weight makes both its users wait. Taken off once every all-gather is done."""
        model = self.optimizer.module
        params = dict(model.named_parameters())
        bucket_of = {id(params[name]): i for i, b in enumerate(self.buckets) for name in b.names}
        block = model.config.layer_names.block
        self._unhook_param_waits()
        for path, mod in model.named_modules():
            inside = path.startswith(block + ".")
            if (inside and path.count(".") != block.count(".") + 1) or (not inside and not mod.params):
                continue  # not a block itself, nor a layer outside the blocks with parameters of its own
            mine = {bucket_of[id(p)] for _, p in mod.named_parameters() if id(p) in bucket_of}
            if mine:
                wait = Hook((FORWARD,), before=lambda _, __, mine=frozenset(mine): self.finish_param_gather(mine))
                self._hooked.append(mod.register_hook(wait))

    def gather_bytes(self) -> list[int]:
        """Bytes each bucket's parameter all-gather moves: its padded length in the parameters' dtype."""
        itemsize = next(p for _, p in self.optimizer.module.named_parameters()).itemsize
        return [n * itemsize for n in self.bucket_sizes]

    @property
    def gathers_pending(self) -> int:
        """Parameter all-gathers posted and not yet completed (``--overlap-param-gather``)."""
        return len(self._gathering)

    def finish_param_gather(self, buckets=None) -> None:
        """Complete the posted parameter all-gathers (of ``buckets``, default all) into the model's arrays.
        ZeRO-3: gather the whole model (phase ``verify``) for whoever reads it next (until the next step)."""
        if self.sharded_params is not None:
            self.sharded_params.gather_all()
            return
        targets = None
        keep = []
        for i, pending in self._gathering:
            if buckets is not None and i not in buckets:
                keep.append((i, pending))
                continue
            targets = targets or dict(self.optimizer.module.named_parameters())
            self._scatter_into(i, pending.wait(), targets)
        self._gathering = keep
        if not keep:  # every parameter is whole again: no layer needs to wait
            self._unhook_param_waits()

    def _unhook_param_waits(self) -> None:
        for handle in self._hooked:
            handle.remove()
        self._hooked = []

    def gather_grads(self) -> None:
        """All-gather the reduced gradients so the model's whole gradients are the DP mean again (to check them
        against a serial model: scope ``zero.grads{i}``, phase ``verify``). ZeRO-2 materialises its buckets for
        them first (freed again at the next step's start)."""
        if self.sharded_params is not None:  # ZeRO-3: the whole parameters too, for whoever reads the model now
            self.sharded_params.gather_all()
        if self.sharded is not None:
            self.sharded.materialise_all()
            if self.dp == 1:  # nothing to gather: the owned slice is the whole bucket
                for i, buf in enumerate(self.buffers):
                    buf[self.owned[i].start:self.owned[i].stop] = self.sharded.owned[i]
                return
        self._gather("grad", dict(self.optimizer.module.named_grads()), "zero.grads", VERIFY)

    def _gather(self, what: str, targets: dict[str, np.ndarray], scope: str, phase: str) -> None:
        """All-gather each bucket's owned slices of ``what`` ("model" or "grad") into the arrays ``targets``."""
        if self.dp == 1:
            return  # every range is mine: the update was already in place
        tracer = self.dp_group.tracer
        for i in range(len(self.buckets)):
            send = self._owned_values(i, what, targets)
            with tracer.region(scope=f"{scope}{i}", phase=phase):
                full = self.dp_group.all_gather(send, axis=0)
            self._scatter_into(i, full, targets)

    def _owned_values(self, i: int, what: str, targets: dict[str, np.ndarray]) -> np.ndarray:
        """Bucket ``i``'s owned range of ``what`` ("model" or "grad") as one flat array (padding zeros)."""
        send = np.zeros(len(self.owned[i]), targets[self.buckets[i].names[0]].dtype)  # padding travels as zeros
        for part in self.slices[i]:
            send[part.at:part.at + part.grad.size] = getattr(part, what)
        return send

    def _scatter_into(self, i: int, full: np.ndarray, targets: dict[str, np.ndarray]) -> None:
        """Bucket ``i`` gathered (``full``, padding included) back into the arrays ``targets``."""
        offset = 0
        for name in self.buckets[i].names:
            flat = flat_view(targets[name])
            flat[...] = full[offset:offset + flat.size]
            offset += flat.size
