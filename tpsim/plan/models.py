"""The models the planner knows: published presets, and any Hugging Face GPT-2 or Llama ``config.json``.

A ``ModelSpec`` holds only what the formulas need, in one vocabulary for every architecture:

    arch        a name of the registry (``tpsim.arch``; other spellings such as "gpt" are accepted and stored
                as the registry's): "gpt2" (GPT-2/GPT-3: learned positions, LayerNorm, GeLU MLP of 4h, tied
                head) or "llama" (RoPE, RMSNorm, SwiGLU MLP of ``ffn`` columns, grouped-query attention, untied)
    vocab, hidden, layers, heads, kv_heads, ffn, positions (max sequence), tied (LM head = embedding)

The architecture's own terms (what a layer holds and caches, how its config.json spells the sizes) are reached
through ``ModelSpec.architecture``, the registry's entry.

Presets (published configurations):

    gpt2, gpt2-medium, gpt2-xl   Hugging Face's openai-community/gpt2* config.json (Radford et al. 2019)
    gpt3-175b                    Brown et al. 2020, arXiv:2005.14165, Table 2.1 (h 12288, 96 layers, 96 heads),
                                 GPT-2's vocabulary 50257, sequence 2048
    llama3-8b/70b/405b           Meta's config.json of Llama-3 8B / 70B and Llama-3.1 405B (Dubey et al. 2024,
                                 arXiv:2407.21783, Table 3): vocabulary 128256, 8 KV heads

``published_params``: the size the model is known by — GPT-2 124M / 355M / 1.56B (Hugging Face model cards),
GPT-3 175.0 B (Brown et al., Table 2.1) and, for Llama,
the exact count of Meta's released safetensors (8,030,261,248; 70,553,706,496; 405,853,388,800).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tpsim.arch import ARCHITECTURES, Architecture, architecture, hf_architecture
from tpsim.arch.hf_keys import HFConfigError
from tpsim.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    arch: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    positions: int
    tied: bool
    published_params: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "arch", architecture(self.arch).name)  # "gpt" -> "gpt2": one spelling printed

    @property
    def architecture(self) -> Architecture:
        return architecture(self.arch)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def config(self, **sizes):
        """This model as its architecture's config (``from_sizes``), ``sizes`` overriding its own — e.g.
        ``layers=1, max_positions=seq`` for the one-layer model the planner's TP rows come from."""
        config = self.architecture.config
        own = {"vocab": self.vocab, "hidden": self.hidden, "layers": self.layers, "heads": self.heads,
               "max_positions": self.positions, **{k: getattr(self, k) for k in config.size_choices}}
        return config.from_sizes(**{**own, **sizes})

    def as_dict(self) -> dict:
        return asdict(self)


def gpt(name: str, vocab: int, hidden: int, layers: int, heads: int, positions: int, published=None) -> ModelSpec:
    return ModelSpec(name, "gpt2", vocab, hidden, layers, heads, heads, 4 * hidden, positions, True, published)


def llama(name: str, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, published: int,
          vocab: int = 128256, positions: int = 8192) -> ModelSpec:
    return ModelSpec(name, "llama", vocab, hidden, layers, heads, kv_heads, ffn, positions, False, published)


def nemotron(name: str, hidden: int, layers: int, heads: int, kv_heads: int, published=None) -> ModelSpec:
    """Nemotron-4 (Parmar et al. 2024, Adler et al. 2024): 256,000 tokens, 4,096 positions, F = 4h, untied."""
    return ModelSpec(name, "nemotron", 256000, hidden, layers, heads, kv_heads, 4 * hidden, 4096, False, published)


PRESETS = {m.name: m for m in [
    gpt("gpt2", 50257, 768, 12, 12, 1024, 124_000_000),
    gpt("gpt2-medium", 50257, 1024, 24, 16, 1024, 355_000_000),
    gpt("gpt2-xl", 50257, 1600, 48, 25, 1024, 1_558_000_000),
    gpt("gpt3-175b", 50257, 12288, 96, 96, 2048, 175_000_000_000),
    llama("llama3-8b", 4096, 32, 32, 8, 14336, 8_030_261_248),
    llama("llama3-70b", 8192, 80, 64, 8, 28672, 70_553_706_496),
    llama("llama3-405b", 16384, 126, 128, 8, 53248, 405_853_388_800, positions=131072),
    nemotron("nemotron4-15b", 6144, 32, 48, 8),
    nemotron("nemotron4-340b", 18432, 96, 96, 8),
]}


def from_hf_config(path: str | Path) -> ModelSpec:
    """A ``ModelSpec`` from a Hugging Face ``config.json`` (a ``model_type`` of the registry: gpt2, llama).

    Not ``tpsim.hf.config``: that one refuses every feature tpsim cannot *run* (rope_scaling, as in Llama-3.1's
    config, biases, ...); the planner only needs the sizes (``planner_sizes`` of ``tpsim.arch.*_hf``), which
    such features do not change."""
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    return from_hf_dict(cfg, Path(path).parent.name or Path(path).stem, str(path))


def from_hf_dict(cfg: dict, name: str, where: str | None = None) -> ModelSpec:
    """``from_hf_config`` on a config already read (``where``: what an error names; default ``name``)."""
    kind = cfg.get("model_type")
    try:
        arch = hf_architecture(kind)
    except HFConfigError:
        readable = ", ".join(a.hf.MODEL_TYPE for a in ARCHITECTURES.values())
        raise ConfigError(f"{where or name}: model_type {kind!r} is not one the planner reads ({readable})") from None
    return ModelSpec(name, arch.name, **arch.hf.planner_sizes(cfg))


def resolve(name: str | None = None, config: str | None = None) -> ModelSpec:
    """``--model NAME`` or ``--config config.json``."""
    if config:
        return from_hf_config(config)
    if name not in PRESETS:
        raise ConfigError(f"unknown model {name!r}; presets: {', '.join(PRESETS)} (or --config config.json)")
    return PRESETS[name]
