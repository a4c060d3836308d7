"""Llama as Hugging Face writes it: the keys of its ``config.json`` and the layout of its tensors.

    config.json   hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads
                  (absent = num_attention_heads), max_position_embeddings, rms_norm_eps, hidden_act silu,
                  rope_theta at the top level (transformers 4.x) or in rope_parameters {rope_theta, rope_type}
                  (transformers 5.x), default 10000
    tensors       HF's names, as tpsim's; but ``nn.Linear`` stores ``[out, in]`` and tpsim's linears hold
                  ``[in, out]``, so every ``*_proj.weight`` is transposed on the way in and back on the way out.
                  The embedding and ``lm_head`` are ``[vocab, hidden]`` on both sides.
"""

from __future__ import annotations

import numpy as np

from tpsim.arch.hf_keys import check_flags, first_of, refuse, require
from tpsim.arch.llama import LlamaConfig

MODEL_TYPE = "llama"


def rope_theta(cfg: dict, where: str = "config.json") -> float:
    """θ of RoPE from either spelling; refuses any rope scaling or a rope_type other than default."""
    params = cfg.get("rope_parameters")
    if params is not None:  # transformers 5.x
        if not isinstance(params, dict):
            refuse(where, "rope_parameters", params, "expected an object {rope_theta, rope_type}")
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            refuse(where, "rope_parameters.rope_type", kind, "tpsim models plain RoPE (rope_type default) only")
        extra = sorted(set(params) - {"rope_theta", "rope_type", "type"})
        if extra:
            refuse(where, "rope_parameters." + extra[0], params[extra[0]], "tpsim models no RoPE scaling")
    scaling = cfg.get("rope_scaling")
    if scaling is not None:  # transformers 4.x: null unless scaled
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else scaling
        if kind != "default" or set(scaling) - {"rope_type", "type", "rope_theta"}:
            refuse(where, "rope_scaling", scaling, "tpsim models plain RoPE, no scaling")
    theta = (params or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    return float(theta)


def llama_fields(cfg: dict, where: str = "config.json") -> dict:
    """The Llama config.json's fields tpsim models, under HF's names (``HFConfigError`` for the rest)."""
    require(cfg, where, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        refuse(where, "hidden_act", act, "tpsim's Llama MLP is SwiGLU with SiLU")
    check_flags(cfg, where, {"tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False},
                {"tie_word_embeddings": "tpsim's Llama has an untied lm_head",
                 "attention_bias": "tpsim's Llama projections have no bias",
                 "mlp_bias": "tpsim's Llama projections have no bias"})
    heads, h = cfg["num_attention_heads"], cfg["hidden_size"]
    if cfg.get("head_dim") not in (None, h // heads if heads else None):
        refuse(where, "head_dim", cfg["head_dim"], f"tpsim's head_dim is hidden_size / heads = {h // heads}")
    return {"vocab_size": cfg["vocab_size"], "hidden_size": h, "intermediate_size": cfg["intermediate_size"],
            "num_hidden_layers": cfg["num_hidden_layers"], "num_attention_heads": heads,
            "num_key_value_heads": cfg.get("num_key_value_heads") or heads,
            "max_position_embeddings": cfg.get("max_position_embeddings", 2048),
            "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)), "rope_theta": rope_theta(cfg, where),
            "initializer_range": float(cfg.get("initializer_range", 0.02))}


def read_config(cfg: dict, where: str = "config.json") -> LlamaConfig:
    """A ``LlamaConfig`` from a Llama config.json (``HFConfigError`` for what tpsim does not model)."""
    return LlamaConfig(**llama_fields(cfg, where)).check(1)


def planner_sizes(cfg: dict) -> dict:
    """The sizes the planner prices (``tpsim.plan.models.ModelSpec``'s fields), read leniently: rope_scaling
    (as in Llama-3.1's config), biases and the like do not change them."""
    heads = first_of(cfg, "num_attention_heads")
    return {"vocab": first_of(cfg, "vocab_size"), "hidden": first_of(cfg, "hidden_size"),
            "layers": first_of(cfg, "num_hidden_layers"), "heads": heads,
            "kv_heads": first_of(cfg, "num_key_value_heads", default=heads), "ffn": first_of(cfg, "intermediate_size"),
            "positions": first_of(cfg, "max_position_embeddings", default=4096),
            "tied": bool(cfg.get("tie_word_embeddings", False))}


def transposed(name: str) -> bool:
    """Whether HF stores this parameter as the transpose of tpsim's layout: every linear (``*_proj.weight``)."""
    return name.endswith("_proj.weight")


def canonical_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Llama files use ``LlamaForCausalLM``'s names already."""
    return tensors
