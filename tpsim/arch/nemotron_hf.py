"""Nemotron as Hugging Face writes it (``NemotronConfig``, ``NemotronForCausalLM``): its config.json keys and
its tensors.

    config.json   hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads
                  (absent = num_attention_heads), head_dim (absent = hidden / heads), max_position_embeddings,
                  norm_eps (1e-5), rope_theta (as the Llama's, ``tpsim.arch.llama_hf.rope_theta``),
                  partial_rotary_factor (0.5), hidden_act relu2, no biases in the linears, untied
    tensors       the Llama's names but mlp.{up_proj, down_proj} and each norm's ``bias`` beside its ``weight``
                  (the stored weight of LayerNorm1P: the layer applies 1 + weight); every ``*_proj.weight``
                  transposed between ``nn.Linear``'s [out, in] and tpsim's [in, out]

The sizes the planner reads, which parameters are transposed and the names are the Llama's
(``tpsim.arch.llama_hf``: ``planner_sizes``, ``transposed``, ``canonical_names``).
"""

from __future__ import annotations

from tpsim.arch.hf_keys import check_flags, refuse, require
from tpsim.arch.llama_hf import canonical_names, planner_sizes, rope_theta, transposed  # noqa: F401  (the same)
from tpsim.arch.nemotron import NemotronConfig

MODEL_TYPE = "nemotron"


def read_config(cfg: dict, where: str = "config.json") -> NemotronConfig:
    """A ``NemotronConfig`` from a Nemotron config.json (``HFConfigError`` for what tpsim does not model)."""
    require(cfg, where, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads")
    act = cfg.get("hidden_act", "relu2")
    if act != "relu2":
        refuse(where, "hidden_act", act, "tpsim's Nemotron MLP is squared ReLU (relu2)")
    check_flags(cfg, where, {"tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False},
                {"tie_word_embeddings": "tpsim's Nemotron has an untied lm_head",
                 "attention_bias": "tpsim's Nemotron projections have no bias",
                 "mlp_bias": "tpsim's Nemotron projections have no bias"})
    heads, h = cfg["num_attention_heads"], cfg["hidden_size"]
    if cfg.get("head_dim") not in (None, h // heads if heads else None):
        refuse(where, "head_dim", cfg["head_dim"], f"tpsim's head_dim is hidden_size / heads = {h // heads}")
    return NemotronConfig(
        vocab_size=cfg["vocab_size"], hidden_size=h, intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        max_position_embeddings=cfg.get("max_position_embeddings", 4096), norm_eps=float(cfg.get("norm_eps", 1e-5)),
        rope_theta=rope_theta(cfg, where), partial_rotary_factor=float(cfg.get("partial_rotary_factor", 0.5)),
        initializer_range=float(cfg.get("initializer_range", 0.0134))).check(1)
