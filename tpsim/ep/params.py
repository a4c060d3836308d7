"""Which parameters are experts': the ones a ``LocalExperts`` holds (their gradients are reduced over expert-DP,
their norm over the expert groups: ``tpsim.train.expert_norm``)."""

from __future__ import annotations

from tpsim.ep.experts import LocalExperts
from tpsim.nn.module import Module


def expert_param_names(module: Module) -> frozenset[str]:
    """The dotted names of every parameter held by a ``LocalExperts`` inside ``module``."""
    names = set()
    for path, mod in module.named_modules():
        if isinstance(mod, LocalExperts):
            names.update(n for n, _ in mod.named_parameters(path))
    return frozenset(names)
