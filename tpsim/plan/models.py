"""The models the planner knows: published presets, and any Hugging Face GPT-2 or Llama ``config.json``.

A ``ModelSpec`` holds only what the formulas need, in one vocabulary for both architectures:

    arch        "gpt" (GPT-2/GPT-3: learned positions, LayerNorm, GeLU MLP of 4h, tied head)
                or "llama" (RoPE, RMSNorm, SwiGLU MLP of ``ffn`` columns, grouped-query attention, untied head)
    vocab, hidden, layers, heads, kv_heads, ffn, positions (max sequence), tied (LM head = embedding)

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
from dataclasses import asdict, dataclass, replace
from pathlib import Path

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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def as_dict(self) -> dict:
        return asdict(self)


def gpt(name: str, vocab: int, hidden: int, layers: int, heads: int, positions: int, published=None) -> ModelSpec:
    return ModelSpec(name, "gpt", vocab, hidden, layers, heads, heads, 4 * hidden, positions, True, published)


def llama(name: str, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, published: int,
          vocab: int = 128256, positions: int = 8192) -> ModelSpec:
    return ModelSpec(name, "llama", vocab, hidden, layers, heads, kv_heads, ffn, positions, False, published)


PRESETS = {m.name: m for m in [
    gpt("gpt2", 50257, 768, 12, 12, 1024, 124_000_000),
    gpt("gpt2-medium", 50257, 1024, 24, 16, 1024, 355_000_000),
    gpt("gpt2-xl", 50257, 1600, 48, 25, 1024, 1_558_000_000),
    gpt("gpt3-175b", 50257, 12288, 96, 96, 2048, 175_000_000_000),
    llama("llama3-8b", 4096, 32, 32, 8, 14336, 8_030_261_248),
    llama("llama3-70b", 8192, 80, 64, 8, 28672, 70_553_706_496),
    llama("llama3-405b", 16384, 126, 128, 8, 53248, 405_853_388_800, positions=131072),
]}


def _field(cfg: dict, *names, default=None):
    for n in names:
        if n in cfg:
            return cfg[n]
    if default is None:
        raise ConfigError(f"config.json has none of {', '.join(names)}")
    return default


def from_hf_config(path: str | Path) -> ModelSpec:
    """A ``ModelSpec`` from a Hugging Face ``config.json`` (``model_type`` "gpt2" or "llama").

    Not ``tpsim.hf.config``: that one refuses every feature tpsim cannot *run* (rope_scaling, as in Llama-3.1's
    config, biases, ...); the planner only needs the sizes, which such features do not change."""
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    kind, name = cfg.get("model_type"), Path(path).parent.name or Path(path).stem
    if kind == "gpt2":
        h = _field(cfg, "n_embd", "hidden_size")
        spec = gpt(name, _field(cfg, "vocab_size"), h, _field(cfg, "n_layer", "num_hidden_layers"),
                   _field(cfg, "n_head", "num_attention_heads"), _field(cfg, "n_positions", "n_ctx", default=1024))
        return replace(spec, ffn=cfg.get("n_inner") or 4 * h)
    if kind == "llama":
        heads = _field(cfg, "num_attention_heads")
        return ModelSpec(name, "llama", _field(cfg, "vocab_size"), _field(cfg, "hidden_size"),
                         _field(cfg, "num_hidden_layers"), heads, _field(cfg, "num_key_value_heads", default=heads),
                         _field(cfg, "intermediate_size"), _field(cfg, "max_position_embeddings", default=4096),
                         bool(cfg.get("tie_word_embeddings", False)))
    raise ConfigError(f"{path}: model_type {kind!r} is not one the planner reads (gpt2, llama)")


def resolve(name: str | None = None, config: str | None = None) -> ModelSpec:
    """``--model NAME`` or ``--config config.json``."""
    if config:
        return from_hf_config(config)
    if name not in PRESETS:
        raise ConfigError(f"unknown model {name!r}; presets: {', '.join(PRESETS)} (or --config config.json)")
    return PRESETS[name]
