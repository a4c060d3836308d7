"""Architectures as data: one registry from a name to everything tpsim needs to know about a model family.

    name     config class              serial / tensor-parallel builders            Hugging Face
    gpt2     ``tpsim.arch.gpt2.GPTConfig``   ``tpsim.models.build``: serial_gpt, parallel_gpt   GPT2LMHeadModel
    llama    ``tpsim.arch.llama.LlamaConfig`` ``tpsim.models.llama``: serial_llama, parallel_llama LlamaForCausalLM

Every config exposes one shape (``hidden, heads, kv_heads, head_dim, ffn, layers, vocab, max_positions`` and
the class constants ``arch, norm, activation, positions, tied, biases``), one constructor from the sizes all
architectures share (``from_sizes``) and one check of what TP needs (``check(tp)``). Code that serves every
architecture asks the config or its ``Architecture`` entry; it never branches on a name.

This package is pure arithmetic (no MPI): the planner and the formulas import it on a laptop. The builders
live in ``tpsim.models`` (they need the parallel layers, hence MPI), so an entry *names* them and
``Architecture.serial`` / ``.parallel`` import them on first use.

Adding an architecture: a module here (its config class with the shape above, its pure terms) and a module in
``tpsim.models`` (its layers wired into blocks), then one entry in ``ARCHITECTURES`` below.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Callable

from tpsim.arch.gpt2 import GPTConfig
from tpsim.arch.llama import LlamaConfig
from tpsim.errors import ConfigError


@dataclass(frozen=True)
class Architecture:
    """One model family: its name (and other accepted spellings), config class and builders."""

    name: str
    aliases: tuple[str, ...]
    config: type
    summary: str  # one line for ``--help``
    serial_builder: str  # "module:function"; function(config, seed=, dtype=) -> the serial model
    parallel_builder: str  # "module:function"; function(serial, group, *, sequence_parallel=) -> this rank's TP model

    def _resolve(self, where: str) -> Callable:
        module, function = where.split(":")
        return getattr(import_module(module), function)

    @property
    def serial(self) -> Callable:
        """The serial model builder: ``serial(config, seed=0, dtype=np.float64)``."""
        return self._resolve(self.serial_builder)

    @property
    def parallel(self) -> Callable:
        """The TP model from the serial master: ``parallel(serial, tp_group, *, sequence_parallel=False)``."""
        return self._resolve(self.parallel_builder)

    def build(self, config, group, seed: int = 0, dtype=None, *, sequence_parallel: bool = False):
        """This rank's TP model straight from a seed: checked at the group's size before anything is drawn (a
        bad config fails fast and the same on every rank), the serial master drawn, sharded and dropped."""
        config.check(group.size)
        serial = self.serial(config, seed=seed) if dtype is None else self.serial(config, seed=seed, dtype=dtype)
        return self.parallel(serial, group, sequence_parallel=sequence_parallel)


ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture("gpt2", ("gpt",), GPTConfig,
                 "GPT-2 blocks: LayerNorm, GeLU MLP, learned positions, tied LM head",
                 "tpsim.models.build:serial_gpt", "tpsim.models.build:parallel_gpt"),
    Architecture("llama", (), LlamaConfig,
                 "Llama blocks: RMSNorm, SwiGLU, RoPE, grouped-query attention, untied LM head",
                 "tpsim.models.llama:serial_llama", "tpsim.models.llama:parallel_llama"),
)}
ARCH_NAMES = tuple(ARCHITECTURES)  # the names printed: the canonical spelling of each
_SPELLINGS = {alias: a for a in ARCHITECTURES.values() for alias in (a.name, *a.aliases)}
ARCH_SPELLINGS = tuple(_SPELLINGS)  # every name accepted as input


def architecture(name: str) -> Architecture:
    """The entry for ``name`` or one of its aliases (``gpt`` is ``gpt2``); ConfigError names the choices."""
    try:
        return _SPELLINGS[name]
    except KeyError:
        raise ConfigError(f"unknown architecture {name!r}: choose from {', '.join(ARCH_NAMES)}") from None


def architecture_of(config) -> Architecture:
    """The entry whose config class ``config`` is an instance of."""
    for arch in ARCHITECTURES.values():
        if isinstance(config, arch.config):
            return arch
    raise TypeError(f"{type(config).__name__} is not the config of a registered architecture ({', '.join(ARCH_NAMES)})")


__all__ = ["ARCHITECTURES", "ARCH_NAMES", "ARCH_SPELLINGS", "Architecture", "GPTConfig", "LlamaConfig",
           "architecture", "architecture_of"]
