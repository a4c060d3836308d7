"""The one contract every layer in tpsim follows, serial or parallel, pure function or Module.

**Pure functions** come in pairs, the way llm.c writes its layers:

    out, cache = name_forward(inputs..., parameters..., options...)
    grads      = name_backward(dout, cache)         # exactly the upstream gradient and that cache

``grads`` is the input gradient first, then one gradient per parameter, in the forward's order
(``linear_backward(dy, cache) -> (dx, dw, db)``); a function with several inputs returns one gradient each
(``attention_core_backward -> (dq, dk, dv)``), and one without parameters returns the input gradient alone.
Their tensor-parallel versions (``tpsim.tp``) take the process group and the layer's layout flag after these.

**Modules** own named parameters and a gradient buffer of the same shape for each. ``forward`` returns the
output *and* the cache; ``backward(dout, cache)`` returns the input gradient and **adds** (never assigns)
parameter gradients into ``self.grads``. Accumulation is what makes a tied weight (the GPT's embedding and LM
head) or a layer called twice come out right.

    y, cache = layer.forward(x)
    dx = layer.backward(dy, cache)          # layer.grads["weight"] += ...

**Integer inputs carry no gradient.** A layer whose input is token ids (``Embedding``, its vocab-parallel twin,
the ``Transformer`` and the ``GPT`` they open) returns ``None`` from ``backward``; a loss returns the gradient
of its logits only (the targets are integers too).

**Caches** are what backward needs and nothing more. A cache of several parts is a ``NamedTuple`` whose fields
say what they hold (``LinearCache(x, w, has_bias)``, ``MLPCache(c_fc, gelu, c_proj)``); a composite layer's
cache holds its sub-layers' caches by name, and only the layer that made a cache reads inside it. A field that
points at a *parameter* rather than a saved activation (a ``w`` the backward multiplies by) is named in the
cache type's ``PARAMETERS``, so memory accounting (``tpsim.predict.memory``) never counts a weight as activation.

``path`` is the layer's dotted module path (``transformer.h.0.mlp``). Parallel layers use it as the *scope* of
every collective they issue, so a trace says which layer moved which bytes. ``set_path`` names a whole tree.

An ``inline`` layer names its children as its parent's own and shares its parent's path: the multi-output
linear that runs Llama's q_proj, k_proj and v_proj as one layer sits inside ``self_attn`` without adding a
level, so the parameters keep Hugging Face's names (``self_attn.q_proj.weight``) and its collectives the
attention's scope.

**The backward split in two** (for the zero-bubble pipeline, Qi et al. 2023, arXiv:2401.10241): a layer's
backward is the input gradient (*B*: what the layer below waits for) and its weight gradient (*W*: what only the
optimizer waits for). Every layer with parameters hands its W to ``self.weight_grad(fn, *args)``, after which it
computes and returns the input gradient. Outside a deferral ``fn(*args)`` runs at once, so ``backward`` is the
whole backward, as it always was. Inside ``deferred_weight_grads(module)`` it is queued instead, with exactly
the tensors it needs (a linear's input and its output's gradient), and runs when the queue's ``run`` is called:

    with deferred_weight_grads(chunk) as w:
        dx = chunk.backward(dy, cache)      # B: dx; no parameter gradient has moved yet
    ...
    w.run()                                 # W: every layer's grads[...] += ..., in the backward's order

The pure functions with parameters come split the same way: ``name_backward_input(dout, cache) -> dx`` and
``name_backward_weight(dout, cache) -> (dw, ...)``, bit for bit the two halves of ``name_backward``. The queue a
layer writes to (``deferral``) is part of this contract, not a feature's slot: it decides *whether* W runs now,
which no hook around a call can, and only ``deferred_weight_grads`` sets it, for the length of its ``with``.

**Hooks** (``tpsim.nn.hooks``): every layer keeps one list, ``hooks``, of what runs before and after its forward,
its backward and its W (``register_hook`` returns a handle whose ``remove`` takes it off). A layer knows no
feature: the DP sync's overlap and ZeRO's gathers and reductions are hooks registered from ``tpsim.train``.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Callable, Iterator, NamedTuple

import numpy as np

from tpsim.nn.hooks import WEIGHT_GRAD, Hook, HookHandle, run_hooks
from tpsim.nn.precision import grad_dtype
from tpsim.partition import Partition  # noqa: F401 (where a shard sits; re-exported with the contract)


class Entry(NamedTuple):
    """One parameter of a model as everything downstream needs it: optimizer, clipping, DP sync, checks, export."""

    name: str  # dotted, Hugging Face-style: ``transformer.h.0.mlp.c_fc.weight``
    param: np.ndarray
    grad: np.ndarray  # same shape and dtype (float32 for a 16-bit param); backward adds into it
    partition: Partition | None  # where the shard sits in the master tensor; None = replicated


class WeightGradients:
    """The W of one backward: every layer's weight-gradient work, queued in the backward's order, run once.

    Each entry is ``(fn, args)``; ``args`` are the tensors that W reads (a linear's input and output gradient),
    held here from B until ``run`` — the activation memory a micro-batch keeps between its B and its W.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Callable, tuple]] = []
        self.ran = False

    def add(self, fn: Callable, args: tuple) -> None:
        if self.ran:
            raise RuntimeError("these weight gradients already ran: a backward cannot add to a W that is done")
        self._pending.append((fn, args))

    def __len__(self) -> int:
        """How many layers' weight gradients wait here (0 once run)."""
        return len(self._pending)

    def held(self) -> list[np.ndarray]:
        """The distinct arrays the queue keeps alive for W, each once: the activations and gradients its entries
        read (a cache's ``PARAMETERS`` fields point at weights, not at memory W holds, and are left out)."""
        seen: dict[int, np.ndarray] = {}

        def visit(obj) -> None:
            if isinstance(obj, np.ndarray):
                seen.setdefault(id(obj), obj)
            elif isinstance(obj, tuple):
                skip = getattr(type(obj), "PARAMETERS", ())
                for name, value in zip(getattr(obj, "_fields", ()) or [None] * len(obj), obj):
                    if name not in skip:
                        visit(value)

        for _, args in self._pending:
            visit(args)
        return list(seen.values())

    def run(self) -> None:
        """W: add every queued weight gradient into its layer's ``grads``; a second call raises."""
        if self.ran:
            raise RuntimeError("W ran twice for one backward: its weight gradients would be added twice")
        self.ran = True
        pending, self._pending = self._pending[::-1], []  # each entry's tensors go as soon as it has run
        while pending:
            fn, args = pending.pop()
            fn(*args)


@contextmanager
def deferred_weight_grads(module: "Module") -> Iterator[WeightGradients]:
    """Inside the block, every layer of ``module``'s tree queues its weight gradient (``Module.weight_grad``)
    on the ``WeightGradients`` this yields instead of adding it; outside, each layer adds at once again."""
    queue = WeightGradients()
    modules = list({id(m): m for _, m in module.named_modules()}.values())
    if any(m.deferral is not None for m in modules):
        raise RuntimeError(f"{module.path or type(module).__name__}: already inside a weight-gradient deferral")
    for m in modules:
        m.deferral = queue
    try:
        yield queue
    finally:
        for m in modules:
            m.deferral = None


def placeholder(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A read-only zero array of ``shape`` that holds no memory: a gradient not held (ZeRO-2's, between its
    bucket's uses: ``tpsim.train.zero2``)."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def held_nbytes(a: np.ndarray) -> int:
    """Bytes ``a`` really holds: 0 for a ``placeholder`` (every stride 0), else ``a.nbytes``."""
    return 0 if a.ndim and a.size and not any(a.strides) else a.nbytes


class Module:
    """Base class: parameters, gradients and child modules by name (Hugging Face-style dotted names)."""

    inline = False  # True: this layer's children are named as its parent's, and its path is the parent's

    def __init__(self) -> None:
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.partition: dict[str, Partition] = {}  # only for tensor-parallel shards
        self.path: str = ""
        self.hooks: list[Hook] = []  # run around this layer's calls (``tpsim.nn.hooks``), in this order
        self.deferral: WeightGradients | None = None  # W's queue, only inside ``deferred_weight_grads``

    # --- parameters -------------------------------------------------------------------------------------------
    def add_param(self, name: str, value: np.ndarray, partition: Partition | None = None) -> np.ndarray:
        """Register ``value`` as parameter ``name`` with a zeroed gradient of the same shape and dtype (float32
        for a 16-bit parameter: its main gradient, ``tpsim.nn.precision``).

        ``partition`` marks a tensor-parallel shard (see ``Partition``); leave it out for a replicated one.
        """
        value = np.array(value, order="C")  # always an own copy: a shard never aliases the master
        self.params[name] = value
        self.grads[name] = np.zeros(value.shape, dtype=grad_dtype(value.dtype))  # float32 for 16-bit params
        if partition is not None:
            self.partition[name] = partition
        return value

    def children(self) -> dict[str, "Module"]:
        """Child modules in registration order (attributes holding a Module, or lists of them as ``h.0``)."""
        out: dict[str, Module] = {}
        for key, value in vars(self).items():
            if isinstance(value, Module):
                out[key] = value
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Module) for v in value):
                for i, v in enumerate(value):
                    out[f"{key}.{i}"] = v
        return out

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        yield prefix, self
        for name, child in self.children().items():
            yield from child.named_modules(prefix if child.inline else f"{prefix}.{name}" if prefix else name)

    def _unique(self, prefix: str = "") -> Iterator[tuple[str, "Module", str]]:
        """(dotted name, owning module, key) of every parameter, each array once: a tied weight shared by two
        modules (the GPT's embedding and LM head) is listed under the first module that registered it."""
        seen: set[int] = set()
        for mod_name, mod in self.named_modules(prefix):
            for key, value in mod.params.items():
                if id(value) not in seen:
                    seen.add(id(value))
                    yield (f"{mod_name}.{key}" if mod_name else key), mod, key

    def named_entries(self, prefix: str = "") -> Iterator[Entry]:
        """``Entry(name, param, grad, partition)`` for every parameter, each array once, in registration order."""
        return (Entry(name, mod.params[key], mod.grads[key], mod.partition.get(key))
                for name, mod, key in self._unique(prefix))

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        """(dotted name, array) for every parameter of this module and its children, each array once."""
        return ((name, mod.params[key]) for name, mod, key in self._unique(prefix))

    def named_grads(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        """(dotted name, gradient) in the same order as ``named_parameters``."""
        return ((name, mod.grads[key]) for name, mod, key in self._unique(prefix))

    def named_partitions(self, prefix: str = "") -> Iterator[tuple[str, Partition | None]]:
        """(dotted name, Partition or None) in the same order as ``named_parameters``."""
        return ((name, mod.partition.get(key)) for name, mod, key in self._unique(prefix))

    def zero_grad(self) -> None:
        """Fill every gradient with zeros in place; a read-only one is a gradient not held (ZeRO-2's between
        its bucket's uses, ``tpsim.train.zero2``): zero already, it is left as it is."""
        for _, mod in self.named_modules():
            for g in mod.grads.values():
                if g.flags.writeable:
                    g.fill(0)

    def set_path(self, path: str) -> "Module":
        """Give this module and every descendant its dotted path (used as the trace scope)."""
        for name, mod in self.named_modules(path):
            mod.path = name
        return self

    # --- hooks (tpsim.nn.hooks) --------------------------------------------------------------------------------
    def register_hook(self, hook: Hook) -> HookHandle:
        """Run ``hook`` around this layer's calls from now on, after the hooks already there."""
        self.hooks.append(hook)
        return HookHandle(self.hooks, hook)

    @contextmanager
    def hooked(self, event: str) -> Iterator[None]:
        """Around one call of this layer (``event``: ``tpsim.nn.hooks.FORWARD``, ``BACKWARD`` or ``WEIGHT_GRAD``):
        every hook's ``before``, the block, every hook's ``after`` (skipped when the block raises)."""
        run_hooks(self, self.hooks, event, "before")
        yield
        run_hooks(self, self.hooks, event, "after")

    def weight_grad(self, fn: Callable, *args) -> None:
        """This layer's W: ``fn(*args)`` adds its weight gradients into ``self.grads``. Runs it now, or, inside
        ``deferred_weight_grads``, queues it (with ``args``, the tensors it reads) for the deferral's ``run``;
        either way inside the ``WEIGHT_GRAD`` hooks, when it really runs (the DP sync's overlap is told a layer's
        gradients are written; ZeRO-2 materialises the buckets they go to first)."""
        if self.deferral is None:
            self._weight_grad_now(fn, *args)
        else:
            self.deferral.add(partial(self._weight_grad_now, fn), args)

    def _weight_grad_now(self, fn: Callable, *args) -> None:
        with self.hooked(WEIGHT_GRAD):
            fn(*args)

    # --- the contract -----------------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):  # pragma: no cover - interface
        """Return ``(out, cache)``."""
        raise NotImplementedError

    def backward(self, dout, cache):  # pragma: no cover - interface
        """Return the input gradient; add parameter gradients into ``self.grads`` (through ``weight_grad``)."""
        raise NotImplementedError
