"""ZeRO-2's gradients: a bucket exists only while a backward writes into it (Rajbhandari et al. 2019, §5.2, P_os+g).

ZeRO-1 (``tpsim.train.zero``) keeps every gradient bucket whole on every DP rank and reduce-scatters it once,
after the last micro-batch: the model's full gradient stays resident — 8 bytes a parameter in float64, 4 for a
16-bit model's float32 main gradients. ZeRO-2 keeps only this rank's owned slice of each bucket at rest:

    a layer's W is about to run    its buckets are *materialised*: a zeroed buffer, the layer's gradients views into it
    the bucket's layers are done   reduce-scatter it over DP (scope ``zero.bucket{i}``, phase ``dp_sync``), add the
                                   owned range into this rank's owned slice (``owned[i]``), free the buffer
    the backward action ends       whatever is still materialised goes the same way (a held bucket: ``release``)

so every micro-batch reduce-scatters each bucket it wrote once — DeepSpeed's ZeRO-2 and FSDP's SHARD_GRAD_OP — and
the gradient memory at rest is the owned slices, n_pad/d elements a bucket (``grad_bytes``). With one micro-batch
the bytes are ZeRO-1's exactly; with m, m reduce-scatters a bucket. The owned slices hold the DP *sum* until
``finish`` divides them by d (as ZeRO-1 divides after its one reduce-scatter, so at m = 1 the bits are ZeRO-1's).

When a layer's W runs is said by the layers themselves (their ``WEIGHT_GRAD`` hooks, ``tpsim.nn.hooks``: before
it the buckets it writes are materialised; after it ``tpsim.train.grad_ready.BucketReadiness`` tells when a
bucket's layers are done). Between its uses a bucket's gradients are read-only zero placeholders of their shape
(``np.broadcast_to``: no memory), so a write outside a W fails loudly and ``Module.zero_grad`` leaves them be.

    grads = ShardedGrads(model, sync, owned, reduce_scatter)  # sync: the GradSync whose buckets it takes over
    grads.start()            # a step: owned slices zeroed, no bucket materialised
    grads.arm() ... backward ... grads.disarm()   # every backward action (each micro-batch's)
    grads.release(); grads.finish()               # the held bucket (the tied embedding under PP), then ÷ d
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tpsim.nn.hooks import WEIGHT_GRAD, Hook
from tpsim.nn.module import Module, placeholder
from tpsim.train.grad_ready import BucketReadiness


def holders(module: Module, table: str) -> dict[int, list[tuple[Module, str]]]:
    """id(array) -> every (module, key) whose ``table`` ("params" or "grads") holds that array: a tied weight has
    two holders, and ZeRO rebinds both to one new array so that it stays one parameter."""
    out: dict[int, list[tuple[Module, str]]] = {}
    for _, mod in module.named_modules():
        for key, a in getattr(mod, table).items():
            out.setdefault(id(a), []).append((mod, key))
    return out


class ShardedGrads:
    """The gradient buckets of ``sync`` (a ``GradSync`` padded to d), materialised on demand and reduced into
    ``owned`` slices (see the module docstring). ``reduce_scatter(i, buffer)`` returns this rank's range of the
    DP sum of bucket ``i``'s buffer (the owner traces it); ``held``: bucket indices kept until ``release``."""

    def __init__(self, module: Module, sync, owned: list, reduce_scatter: Callable[[int, np.ndarray], np.ndarray],
                 held: tuple[np.ndarray, ...] = ()) -> None:
        self.reduce_scatter = reduce_scatter
        self.sizes = [len(buf) for buf in sync.buffers]
        self.dtypes = [buf.dtype for buf in sync.buffers]
        self.owned = [np.zeros(len(mine), dt) for mine, dt in zip(owned, self.dtypes)]
        # per bucket: (every (module, key) holding the gradient, offset, shape): one view shared by the holders
        self.bindings: list[list[tuple[list[tuple[Module, str]], int, tuple[int, ...]]]] = [[] for _ in sync.buffers]
        self._buckets_of: dict[int, set[int]] = {}  # id(module) -> the buckets its gradients sit in
        for mod_key in holders(module, "grads").values():
            g = mod_key[0][0].grads[mod_key[0][1]]
            i = next(i for i, buf in enumerate(sync.buffers) if np.shares_memory(g, buf))
            at = (g.__array_interface__["data"][0] - sync.buffers[i].__array_interface__["data"][0]) // g.itemsize
            self.bindings[i].append((mod_key, at, g.shape))
            for mod, _ in mod_key:
                self._buckets_of.setdefault(id(mod), set()).add(i)
        for _, mod in module.named_modules():  # a layer's W may write its children's gradients (multi-output)
            below = set().union(*(self._buckets_of.get(id(m), set()) for _, m in mod.named_modules()))
            if below:
                self._buckets_of[id(mod)] = below
        self.readiness = BucketReadiness(module, sync.buffers, self._ready, held)
        self.held = set(self.readiness.held_buckets)
        self.buffers: list[np.ndarray | None] = list(sync.buffers)
        self.reductions = [0] * len(self.sizes)  # reduce-scatters of each bucket this step
        self.peak_bytes = 0  # the most gradient-bucket bytes materialised at once this step
        for i in range(len(self.sizes)):
            self._free(i)
        for _, mod in module.named_modules():
            if id(mod) in self._buckets_of:
                mod.register_hook(Hook((WEIGHT_GRAD,), before=self._needed))

    # --- a bucket's life -------------------------------------------------------------------------------------
    def materialise(self, i: int) -> None:
        """Bucket ``i`` as a zeroed buffer, every gradient in it a view into it (each module that holds one)."""
        if self.buffers[i] is not None:
            return
        buf = self.buffers[i] = np.zeros(self.sizes[i], self.dtypes[i])
        for who, at, shape in self.bindings[i]:
            view = buf[at:at + int(np.prod(shape))].reshape(shape)
            for mod, key in who:
                mod.grads[key] = view
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _free(self, i: int) -> None:
        for who, _, shape in self.bindings[i]:
            empty = placeholder(shape, self.dtypes[i])
            for mod, key in who:
                mod.grads[key] = empty
        self.buffers[i] = None

    @property
    def live_bytes(self) -> int:
        """Bytes of the buckets materialised now."""
        return sum(buf.nbytes for buf in self.buffers if buf is not None)

    def _needed(self, mod: Module, event: str) -> None:
        """Before ``mod``'s W: every bucket its gradients (or its children's) sit in, materialised."""
        for i in self._buckets_of[id(mod)]:
            self.materialise(i)

    def _ready(self, i: int) -> None:
        """Bucket ``i``'s layers are done: reduce-scatter it into the owned slice and free it (if it is live)."""
        buf = self.buffers[i]
        if buf is None:
            return
        self.owned[i] += self.reduce_scatter(i, buf)
        self.reductions[i] += 1
        self._free(i)

    def _flush(self, held: bool) -> None:
        for i in range(len(self.sizes)):
            if held or i not in self.held:
                self._ready(i)

    # --- a step ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """A new step: the owned slices zeroed, every bucket freed, no reduction counted."""
        self.free_all()
        for mine in self.owned:
            mine.fill(0)
        self.reductions = [0] * len(self.sizes)
        self.peak_bytes = 0
        self.readiness.start()

    def arm(self) -> None:
        """A backward action starts: its buckets go as their layers are done."""
        self.readiness.arm()

    def disarm(self) -> None:
        """It ended: every bucket it left materialised (but a held one) is reduced and freed."""
        self.readiness.disarm()
        self._flush(held=False)
        self.readiness.start()  # the next action (micro-batch) counts its layers afresh

    def release(self) -> None:
        """The held buckets' gradients are final (the tied embedding's sum over the embedding group)."""
        self._flush(held=True)

    def finish(self, dp: int) -> None:
        """Anything left (held buckets included) reduced; then the owned slices ÷ d: the DP mean."""
        self._flush(held=True)
        for mine in self.owned:
            mine /= dp

    def materialise_all(self) -> list[np.ndarray]:
        """Every bucket materialised (zeros), for a caller that writes whole gradients (``gather_grads``)."""
        for i in range(len(self.sizes)):
            self.materialise(i)
        return list(self.buffers)

    def free_all(self) -> None:
        """Every bucket freed (after the update: what ``materialise_all`` gathered is no longer needed)."""
        for i in range(len(self.sizes)):
            self._free(i)

    @property
    def nbytes(self) -> int:
        """Bytes of the owned slices: the gradients this rank keeps at rest."""
        return sum(a.nbytes for a in self.owned)
