"""When a DP gradient bucket is final, so its reduction can start during the backward (``--overlap-grad-reduce``).

Megatron-LM's ``--overlap-grad-reduce`` (and PyTorch DDP's hooks) issue a bucket's all-reduce — ZeRO-1: its
reduce-scatter — as soon as the last gradient in it is produced during the **last** micro-batch's backward,
and wait for all of them before the optimizer. Here the layers say when a gradient is produced: every layer
with parameters adds its weight gradient through ``Module.weight_grad`` (``tpsim.nn.module``), which runs the
layer's ``WEIGHT_GRAD`` hooks around it (``tpsim.nn.hooks``) — at once in a plain backward, at W in a split one
(ZB-H1); this one's ``after`` counts the layer.

A layer is *done* when another layer's weight gradient runs after it, or when the armed action ends (a layer
may add in two steps, as the multi-output linear does: its replicas' sum is the second; nothing else runs
between them). A bucket is *ready* when every layer holding one of its gradients is done — a tied word
embedding counts both the embedding and the LM head that share its gradient. Ready buckets are issued as they
become ready (in bucket order when several do at once), each exactly once; a *held* bucket (the tied embedding's with pp > 1, whose gradient is first
summed over the embedding group: ``tpsim.live_pipeline.step``) waits for ``release``; ``flush`` issues whatever is left
(without the overlap, ``sync`` flushes all of them). Armed only around the last micro-batch's final backward
action of each chunk (``arm``/``disarm``), so earlier micro-batches' hooks count nothing. MPI-free: ``launch``
(the owner's) issues the collective.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tpsim.nn.hooks import WEIGHT_GRAD, Hook
from tpsim.nn.module import Module


class BucketReadiness:
    """Tracks the buckets' readiness over ``module``'s layers (module docstring); ``buffers``: the flat bucket
    arrays whose views the gradients are; ``launch(i)`` issues bucket i; ``held``: gradients whose buckets
    wait for ``release``. ``issued``: bucket indices in the order they were issued this step."""

    def __init__(self, module: Module, buffers: list[np.ndarray], launch: Callable[[int], None],
                 held: tuple[np.ndarray, ...] = ()) -> None:
        self.launch, self.n = launch, len(buffers)
        self._owners: dict[int, set[int]] = {}  # id(module) -> bucket indices its gradients sit in
        self._layers: list[set[int]] = [set() for _ in buffers]  # bucket -> id(module) of every layer adding to it
        self._modules: dict[int, Module] = {}
        for _, mod in module.named_modules():
            for g in mod.grads.values():
                b = _bucket_of(g, buffers)
                if b is not None:
                    self._owners.setdefault(id(mod), set()).add(b)
                    self._layers[b].add(id(mod))
                    self._modules[id(mod)] = mod
        self.held_buckets = {b for g in held for b in [_bucket_of(g, buffers)] if b is not None}
        for mod in self._modules.values():
            mod.register_hook(Hook((WEIGHT_GRAD,), after=self._fired))
        self.armed = False
        self.start()

    def start(self) -> None:
        """A new step: no layer done, no bucket issued, the held buckets held."""
        self._waiting = [set(layers) for layers in self._layers]
        self._held = set(self.held_buckets)
        self._last: Module | None = None
        self.issued: list[int] = []

    def arm(self) -> None:
        """The backward action that runs next is the last micro-batch's final one on its chunk."""
        self.armed, self._last = True, None

    def disarm(self) -> None:
        """That action ended: its last layer is done too."""
        if self._last is not None:
            self._done(self._last)
        self.armed, self._last = False, None

    def _fired(self, mod: Module, event: str) -> None:
        """After ``mod``'s W: the layer before it (another one) is done."""
        if not self.armed:
            return
        if self._last is not None and self._last is not mod:
            self._done(self._last)
        self._last = mod

    def _done(self, mod: Module) -> None:
        for b in self._owners.get(id(mod), ()):
            self._waiting[b].discard(id(mod))
        self._issue(lambda b: not self._waiting[b] and b not in self._held)

    def release(self) -> None:
        """The held buckets' gradients are final (the tied embedding's sum is done): issue what is ready."""
        self._held.clear()
        self._issue(lambda b: not self._waiting[b])

    def flush(self) -> None:
        """Issue every bucket not issued yet, in bucket order."""
        self._held.clear()
        self._issue(lambda b: True)

    def _issue(self, ready: Callable[[int], bool]) -> None:
        done = set(self.issued)
        for b in range(self.n):
            if b not in done and ready(b):
                self.launch(b)
                self.issued.append(b)


def _bucket_of(g: np.ndarray, buffers: list[np.ndarray]) -> int | None:
    """The index of the bucket ``g`` is a view into (None: not a bucket's)."""
    for i, buf in enumerate(buffers):
        if np.shares_memory(g, buf):
            return i
    return None
