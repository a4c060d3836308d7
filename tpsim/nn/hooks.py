"""Generic hooks around a layer's calls: how code outside the layers (a DP sync, ZeRO) acts at the right moment.

PyTorch's ``register_forward_pre_hook`` / ``register_forward_hook`` (and FSDP2's ``fully_shard``, which is built
on them) let a feature run before and after a module's call without the module knowing the feature. Here every
``Module`` keeps one list of ``Hook``s; a hook names the *events* it listens to and what runs before and after:

    FORWARD      a layer's ``forward``, run by the wiring that calls it (``tpsim.models.gpt._Wiring._timed``)
    BACKWARD     its ``backward``, the same way
    WEIGHT_GRAD  its weight-gradient work (``Module.weight_grad``): at once in a plain backward, at W when the
                 backward is split (``deferred_weight_grads``, ZB-H1), so a hook sees the W where it really runs

    handle = layer.register_hook(Hook((WEIGHT_GRAD,), after=lambda module, event: ...))
    ...
    handle.remove()                     # off again (ZeRO-1's parameter waits once the all-gathers are done)

Hooks run in registration order, ``before`` of every hook then the call then ``after`` of every hook, each as
``before(module, event)``; an exception in the call skips the ``after``s. The users: ``tpsim.train.grad_ready``
(a gradient bucket's layers are done: after W), ``tpsim.train.zero2`` (materialise the buckets a W writes:
before W), ``tpsim.train.zero_comm`` (wait for the parameters' all-gather: before the forward) and
``tpsim.train.zero3`` (gather a unit's parameters before its forward and backward, free them after).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

FORWARD, BACKWARD, WEIGHT_GRAD = "forward", "backward", "weight_grad"  # the events: the methods' names
EVENTS = (FORWARD, BACKWARD, WEIGHT_GRAD)


@dataclass(frozen=True, eq=False)  # compared by identity: the handle removes this very hook
class Hook:
    """What runs around a layer's ``events``: ``before(module, event)`` and ``after(module, event)``, either None."""

    events: tuple[str, ...]
    before: Callable[..., None] | None = None
    after: Callable[..., None] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.events) - set(EVENTS)
        if unknown or not self.events:
            raise ValueError(f"a hook listens to some of {EVENTS}, got {self.events}")


class HookHandle:
    """What ``Module.register_hook`` returns: ``remove()`` takes the hook off its layer (a second call does
    nothing)."""

    def __init__(self, hooks: list[Hook], hook: Hook) -> None:
        self._hooks, self.hook = hooks, hook

    def remove(self) -> None:
        if self.hook in self._hooks:
            self._hooks.remove(self.hook)


def run_hooks(module, hooks: list[Hook], event: str, when: str) -> None:
    """Call ``when`` ("before" or "after") of every hook in ``hooks`` that listens to ``event``, in order. A
    snapshot of the list: a hook may take itself (or another) off while they run."""
    for hook in list(hooks):
        fn = getattr(hook, when)
        if fn is not None and event in hook.events:
            fn(module, event)
