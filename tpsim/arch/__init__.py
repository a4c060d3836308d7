"""Architectures as data: one registry from a name to everything tpsim needs to know about a model family.

    name   config class (shape, check)   HF config.json and names   memory terms               builders
    gpt2   tpsim.arch.gpt2.GPTConfig     tpsim.arch.gpt2_hf         tpsim.predict.gpt_memory   tpsim.models.build
    llama  tpsim.arch.llama.LlamaConfig  tpsim.arch.llama_hf        tpsim.predict.llama_memory tpsim.models.llama
    nemotron  tpsim.arch.nemotron.NemotronConfig  tpsim.arch.nemotron_hf  tpsim.predict.nemotron_memory
           tpsim.models.nemotron
    mixtral   tpsim.arch.mixtral.MixtralConfig    tpsim.arch.mixtral_hf   tpsim.predict.mixtral_memory
           tpsim.models.mixtral (its parallel builder also takes the grid: ``experts=True``)

Every config exposes one shape (``tpsim.arch.shape``: ``hidden, heads, kv_heads, head_dim, ffn, layers, vocab,
max_positions`` and the class constants ``arch, norm, activation, positions, tied, biases, norm_params,
layer_names``), one constructor from the sizes all architectures share (``from_sizes``) and one check of what TP
needs (``check(tp)``). Code that serves every architecture asks the config or its ``Architecture`` entry; it
never branches on a name (``tests/test_structure.py`` pins it).

This package is pure arithmetic (no MPI): the planner and the formulas import it on a laptop. What builds on
it is *named* by an entry and imported on first use, so no arrow points up: the builders live in
``tpsim.models`` (they need the parallel layers, hence MPI), the memory formulas in ``tpsim.predict`` beside the
derivations and papers they are checked against.

Adding an architecture: a module here (its config class with the shape above) and one for its Hugging Face
keys and names (like ``gpt2_hf``), a module of memory terms in ``tpsim.predict`` (like ``llama_memory``), a
module in ``tpsim.models`` (its layers wired into blocks), then one entry in ``ARCHITECTURES`` below.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import import_module
from types import ModuleType
from typing import Callable

from tpsim.arch import gpt2_hf, llama_hf, mixtral_hf, nemotron_hf
from tpsim.arch.gpt2 import GPTConfig
from tpsim.arch.hf_keys import HFConfigError
from tpsim.arch.llama import LlamaConfig
from tpsim.arch.mixtral import MixtralConfig
from tpsim.arch.nemotron import NemotronConfig
from tpsim.errors import ConfigError


@dataclass(frozen=True)
class Architecture:
    """One model family: its name (and other accepted spellings), config class, Hugging Face terms, memory
    terms and builders."""

    name: str
    aliases: tuple[str, ...]
    config: type
    summary: str  # one line for ``--help``
    hf: ModuleType  # MODEL_TYPE, read_config(cfg, where), transposed(name), canonical_names(tensors)
    memory_terms: str  # module: layer_param_elements, layer_vector_elements, activation_elements, paper_layer_elements
    serial_builder: str  # "module:function"; function(config, seed=, dtype=) -> the serial model
    parallel_builder: str  # "module:function"; function(serial, group, *, sequence_parallel=, tp_comm_overlap=,
    #                        core=) -> this rank's TP model
    experts: bool = False  # a mixture of experts: the parallel builder also takes grid=, dispatcher=, microbatches=

    def _resolve(self, where: str) -> Callable:
        module, function = where.split(":")
        return getattr(import_module(module), function)

    @property
    def memory(self) -> ModuleType:
        """The memory formulas of this architecture (``tpsim.predict``), in the terms every one provides."""
        return import_module(self.memory_terms)

    @property
    def serial(self) -> Callable:
        """The serial model builder: ``serial(config, seed=0, dtype=np.float64)``."""
        return self._resolve(self.serial_builder)

    @property
    def parallel(self) -> Callable:
        """The TP model from the serial master: ``parallel(serial, tp_group, *, sequence_parallel=False,
        tp_comm_overlap=False, core=SERIAL_CORE)`` (``core``: the attention core, ``tpsim.nn.attention``)."""
        return self._resolve(self.parallel_builder)

    def build(self, config, group, seed: int = 0, dtype=None, **parallel):
        """This rank's TP model straight from a seed: checked at the group's size before anything is drawn (a
        bad config fails fast and the same on every rank), the serial master drawn, sharded and dropped;
        ``parallel``: the parallel builder's keywords (``sequence_parallel``, ``tp_comm_overlap``, ``core``)."""
        config.check(group.size)
        serial = self.serial(config, seed=seed) if dtype is None else self.serial(config, seed=seed, dtype=dtype)
        return self.parallel(serial, group, **parallel)


ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture("gpt2", ("gpt",), GPTConfig,
                 "GPT-2 blocks: LayerNorm, GeLU MLP, learned positions, tied LM head",
                 gpt2_hf, "tpsim.predict.gpt_memory",
                 "tpsim.models.build:serial_gpt", "tpsim.models.build:parallel_gpt"),
    Architecture("llama", (), LlamaConfig,
                 "Llama blocks: RMSNorm, SwiGLU, RoPE, grouped-query attention, untied LM head",
                 llama_hf, "tpsim.predict.llama_memory",
                 "tpsim.models.llama:serial_llama", "tpsim.models.llama:parallel_llama"),
    Architecture("nemotron", (), NemotronConfig,
                 "Nemotron-4 blocks: LayerNorm1P, squared-ReLU MLP (no gate), partial RoPE, GQA, untied LM head",
                 nemotron_hf, "tpsim.predict.nemotron_memory",
                 "tpsim.models.nemotron:serial_nemotron", "tpsim.models.nemotron:parallel_nemotron"),
    Architecture("mixtral", (), MixtralConfig,
                 "Mixtral blocks: the Llama's with a mixture of SwiGLU experts, top-k routed, for every MLP",
                 mixtral_hf, "tpsim.predict.mixtral_memory",
                 "tpsim.models.mixtral:serial_mixtral", "tpsim.models.mixtral:parallel_mixtral", experts=True),
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
    """The entry whose config class ``config`` is an instance of (its own class first: a MixtralConfig is a
    LlamaConfig too)."""
    for arch in ARCHITECTURES.values():
        if type(config) is arch.config:
            return arch
    for arch in ARCHITECTURES.values():
        if isinstance(config, arch.config):
            return arch
    raise TypeError(f"{type(config).__name__} is not the config of a registered architecture ({', '.join(ARCH_NAMES)})")


def hf_architecture(model_type, where: str = "config.json") -> Architecture:
    """The entry that reads a Hugging Face ``config.json`` of this ``model_type``; HFConfigError otherwise."""
    for arch in ARCHITECTURES.values():
        if arch.hf.MODEL_TYPE == model_type:
            return arch
    types = [a.hf.MODEL_TYPE for a in ARCHITECTURES.values()]
    raise HFConfigError(f"{where}: model_type = {json.dumps(model_type)} is not supported: tpsim reads "
                        + ", ".join(types[:-1]) + " and " + types[-1])


__all__ = ["ARCHITECTURES", "ARCH_NAMES", "ARCH_SPELLINGS", "Architecture", "GPTConfig", "LlamaConfig",
           "MixtralConfig", "NemotronConfig", "architecture", "architecture_of", "hf_architecture"]
