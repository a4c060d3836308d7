"""ZeRO-3's parameters: each rank keeps its owned slice of every bucket; a layer's bucket is all-gathered just
before its forward and again before its backward, and freed after each (Rajbhandari et al. 2019, §5.3, P_os+g+p;
PyTorch FSDP's FULL_SHARD, one flat parameter per wrapped unit).

The *units* are the layers the model's wiring calls one after another (``tpsim.models.gpt._Wiring._timed``): every
transformer block, and each layer outside the blocks that has parameters (the embeddings, the final norm, the LM
head). ZeRO-3's buckets are cut at the units (``unit_groups``: one bucket a unit, no size cap), so a unit gathers
exactly its own parameters, padded to a multiple of d:

    before unit U's forward     all-gather U's bucket over DP (scope ``zero.params{i}``, phase ``forward``)
                                and bind every parameter of U (each module holding it) to a view into it
    after it                    free it: the parameters become read-only zero placeholders again
    before / after its backward the same (phase ``backward``); the gradients go as ZeRO-2's (``tpsim.train.zero2``)

so every micro-batch all-gathers every parameter twice and reduce-scatters every gradient once — 1.5× DDP's
bytes in one dtype (§7) — and a rank holds 1/d of the parameters at rest, plus one gathered unit at a time
(``peak_bytes``). A tied LM head gathers the embedding's bucket for its own forward and backward (the weight is
one parameter used by two units: 4 all-gathers of it a micro-batch).

The optimizer updates the owned slices in place (``owned``: the slices' parameters, or under mixed precision the
16-bit slices its float32 main slices are rounded into), so nothing is gathered after the step. Whoever reads the
whole model (the checks against the serial model, ``--export``, a checkpoint, generation) calls ``gather_all``
(phase ``verify``), which also unhooks the units until the next step's ``hook``.
"""

from __future__ import annotations

import numpy as np

from tpsim.nn.hooks import BACKWARD, FORWARD, Hook
from tpsim.nn.module import Module, placeholder
from tpsim.phases import VERIFY
from tpsim.train.zero2 import holders


def units(model: Module) -> list[Module]:
    """The modules ZeRO-3 gathers for: each block, and each layer outside the blocks with parameters of its own."""
    block = model.config.layer_names.block
    out = []
    for path, mod in model.named_modules():
        inside = path.startswith(block + ".")
        if (inside and path.count(".") == block.count(".") + 1) or (not inside and mod.params):
            out.append(mod)
    return out


def unit_groups(model: Module, names: list[str]) -> list[list[int]]:
    """Positions in ``names`` (the gradients in packing order) grouped by the unit that registered each
    parameter: consecutive runs, one bucket each (``GradSync(groups=...)``)."""
    owner: dict[int, int] = {}
    for u, mod in enumerate(units(model)):
        for _, p in mod.named_parameters():
            owner.setdefault(id(p), u)
    params = dict(model.named_parameters())
    groups: list[list[int]] = []
    last = None
    for i, name in enumerate(names):
        u = owner.get(id(params[name]), -1)
        if u != last or not groups:
            groups.append([])
            last = u
        groups[-1].append(i)
    return groups


class ShardedParams:
    """The owned slices of the parameters of ``buckets`` (``tpsim.train.ddp.Bucket``, padded lengths ``sizes``,
    this rank's ``ranges``) over ``dp_group``, gathered unit by unit (module docstring)."""

    def __init__(self, model: Module, buckets, sizes: list[int], ranges: list, dp_group) -> None:
        self.dp_group, self.sizes = dp_group, sizes
        params = dict(model.named_parameters())
        self.dtypes = [params[b.names[0]].dtype for b in buckets]
        held_by = holders(model, "params")
        # per bucket: (every (module, key) holding the parameter, offset, shape): one view shared by the holders
        self.bindings: list[list[tuple[list[tuple[Module, str]], int, tuple[int, ...]]]] = []
        self.owned: list[np.ndarray] = []
        bucket_of: dict[int, int] = {}
        for i, b in enumerate(buckets):
            full, at, binds = np.zeros(sizes[i], self.dtypes[i]), 0, []
            for name in b.names:
                p = params[name]
                full[at:at + p.size] = p.reshape(-1)
                binds.append((held_by[id(p)], at, p.shape))
                bucket_of[id(p)] = i
                at += p.size
            self.bindings.append(binds)
            self.owned.append(full[ranges[i].start:ranges[i].stop].copy())
        self.unit_buckets = {id(u): sorted({bucket_of[id(p)] for _, p in u.named_parameters()}) for u in units(model)}
        self.units = [u for u in units(model) if self.unit_buckets[id(u)]]
        self.live: dict[int, np.ndarray] = {}
        self._hook = Hook((FORWARD, BACKWARD), before=self._gather_unit, after=self._free_unit)
        self._handles: list = []  # the units' registrations of ``_hook`` while hooked
        for i in range(len(buckets)):
            self._free(i)
        self.start()  # gathers: each bucket's all-gathers this step (not gather_all's); peak_bytes: most at once

    # --- one bucket ------------------------------------------------------------------------------------------
    def gather(self, i: int, phase: str) -> None:
        """All-gather bucket ``i``'s owned slices over DP and bind its parameters to views into the result."""
        if i in self.live:
            return
        tracer = self.dp_group.tracer
        if self.dp_group.size == 1:
            full = self.owned[i].copy()
        else:
            with tracer.region(scope=f"zero.params{i}", phase=phase):
                full = self.dp_group.all_gather(self.owned[i], axis=0)
        self.live[i] = full
        for who, at, shape in self.bindings[i]:
            _bind(who, full[at:at + int(np.prod(shape))].reshape(shape))
        if phase != VERIFY:  # the step's own gathers, not a reader's
            self.gathers[i] += 1
            self.peak_bytes = max(self.peak_bytes, sum(a.nbytes for a in self.live.values()))

    def _free(self, i: int) -> None:
        for who, _, shape in self.bindings[i]:
            _bind(who, placeholder(shape, self.dtypes[i]))
        self.live.pop(i, None)

    # --- the units' hooks ------------------------------------------------------------------------------------
    def _gather_unit(self, mod: Module, event: str) -> None:
        """Before a unit's forward or backward: its buckets gathered, traced in that phase."""
        for i in self.unit_buckets[id(mod)]:
            self.gather(i, event)

    def _free_unit(self, mod: Module, event: str) -> None:
        for i in self.unit_buckets[id(mod)]:
            self._free(i)

    def release(self) -> None:
        """Every gathered bucket freed (a RESHARD: ``tpsim.pipeline.collectives``; the units' hooks free each
        one after its call already, so this frees what a caller gathered outside them)."""
        for i in list(self.live):
            self._free(i)

    def hook(self) -> None:
        """Every unit gathers its bucket around its forward and its backward (a ``Hook`` on each unit,
        ``tpsim.nn.hooks``; once, however often this is called), every gathered bucket freed (after the step:
        the whole parameters are stale)."""
        self.release()
        self.unhook()
        self._handles = [u.register_hook(self._hook) for u in self.units]

    def unhook(self) -> None:
        """The units' hooks taken off: their calls gather nothing."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def start(self) -> None:
        """A new step: ``hook``, the gathers and the peak counted afresh."""
        self.hook()
        self.gathers, self.peak_bytes = [0] * len(self.sizes), 0

    def gather_all(self) -> None:
        """The whole model's parameters gathered (phase ``verify``) for a reader of the whole model, the units
        unhooked until the next ``hook`` (the next step's start)."""
        self.unhook()
        for i in range(len(self.sizes)):
            self.gather(i, VERIFY)

    @property
    def nbytes(self) -> int:
        """Bytes of the owned slices: the parameters this rank keeps at rest."""
        return sum(a.nbytes for a in self.owned)


def _bind(who: list[tuple[Module, str]], array: np.ndarray) -> None:
    """``array`` as the parameter of every module holding it: one object, so a tied weight stays one parameter."""
    for mod, key in who:
        mod.params[key] = array
