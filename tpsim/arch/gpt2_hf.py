"""GPT-2 as Hugging Face writes it: the keys of its ``config.json`` and the names its tensors go by in the wild.

    config.json   n_positions (or the older n_ctx), n_embd, n_layer, n_head, vocab_size, layer_norm_epsilon,
                  activation_function gelu_new (= gelu_pytorch_tanh, the same tanh GeLU); n_inner null or 4·n_embd
    tensors       tpsim uses HF's names and GPT-2's ``Conv1D`` layout [in, out] (nothing is transposed); only the
                  spelling varies — with ``transformer.`` (``GPT2LMHeadModel``) or without it (``GPT2Model``, the
                  hub's ``gpt2``) — plus two things that are not parameters: the causal-mask buffers
                  ``h.{i}.attn.bias`` / ``attn.masked_bias`` some files carry (dropped), and ``lm_head.weight``,
                  which a tied GPT-2 may store as a copy of ``wte`` (dropped when it equals wte, refused when it
                  does not: that model is untied)

Dropout probabilities are training settings and are not read (inference and the step-0 checks run without).
"""

from __future__ import annotations

import numpy as np

from tpsim.arch.gpt2 import GPTConfig
from tpsim.arch.hf_keys import HFConfigError, check_flags, first_of, refuse, require
from tpsim.npzfile import CheckpointError

MODEL_TYPE = "gpt2"
GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")  # two names of one function: 0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))
PREFIX = "transformer."
BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers, not parameters


def read_config(cfg: dict, where: str = "config.json") -> GPTConfig:
    """A ``GPTConfig`` from a GPT-2 config.json (``HFConfigError`` for what tpsim does not model)."""
    positions = cfg.get("n_positions", cfg.get("n_ctx"))
    if positions is None:
        raise HFConfigError(f"{where}: config.json lacks n_positions (and n_ctx)")
    require(cfg, where, "vocab_size", "n_embd", "n_layer", "n_head")
    act = cfg.get("activation_function", "gelu_new")
    if act not in GELU_TANH:
        refuse(where, "activation_function", act, "tpsim's GPT-2 MLP uses the tanh GeLU (gelu_new)")
    h = cfg["n_embd"]
    if cfg.get("n_inner") not in (None, 4 * h):
        refuse(where, "n_inner", cfg["n_inner"], f"tpsim's GPT-2 MLP is 4·n_embd = {4 * h} wide")
    check_flags(cfg, where, {"tie_word_embeddings": True, "scale_attn_weights": True,
                             "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
                             "add_cross_attention": False},
                {"tie_word_embeddings": "tpsim's GPT-2 ties the LM head to wte",
                 "scale_attn_weights": "tpsim scales attention scores by 1/sqrt(head_dim)",
                 "scale_attn_by_inverse_layer_idx": "tpsim does not scale scores by layer",
                 "reorder_and_upcast_attn": "not modelled (a mixed-precision detail of HF's attention)",
                 "add_cross_attention": "tpsim's GPT-2 is decoder-only"})
    return GPTConfig(vocab_size=cfg["vocab_size"], n_positions=positions, n_embd=h, n_layer=cfg["n_layer"],
                     n_head=cfg["n_head"], dropout=0.0,
                     layer_norm_epsilon=float(cfg.get("layer_norm_epsilon", 1e-5)),
                     initializer_range=float(cfg.get("initializer_range", 0.02))).check(1)


def planner_sizes(cfg: dict) -> dict:
    """The sizes the planner prices (``tpsim.plan.models.ModelSpec``'s fields), read leniently: a feature tpsim
    cannot run does not change them; ``n_inner`` sets the MLP's width."""
    h = first_of(cfg, "n_embd", "hidden_size")
    vocab, layers = first_of(cfg, "vocab_size"), first_of(cfg, "n_layer", "num_hidden_layers")
    heads = first_of(cfg, "n_head", "num_attention_heads")
    return {"vocab": vocab, "hidden": h, "layers": layers, "heads": heads, "kv_heads": heads,
            "ffn": cfg.get("n_inner") or 4 * h, "positions": first_of(cfg, "n_positions", "n_ctx", default=1024),
            "tied": True}


def transposed(name: str) -> bool:
    """GPT-2's ``Conv1D`` stores [in, out], as tpsim's linears do: nothing is transposed."""
    return False


def canonical_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GPT-2 tensors under ``GPT2LMHeadModel``'s names, buffers and a tied ``lm_head.weight`` dropped."""
    out = {}
    for name, a in tensors.items():
        if name.endswith(BUFFERS) and (a.ndim != 1 or name.endswith("masked_bias")):
            continue  # the [1, 1, n, n] causal mask, not c_attn's bias (which is 1-D)
        out[name if name.startswith(PREFIX) or name == "lm_head.weight" else PREFIX + name] = a
    head = out.pop("lm_head.weight", None)
    wte = out.get(PREFIX + "wte.weight")
    if head is not None and (wte is None or head.shape != wte.shape or not np.array_equal(head, wte)):
        raise CheckpointError("lm_head.weight differs from transformer.wte.weight: an untied GPT-2 "
                              "(tpsim's GPT-2 ties the LM head to the token embedding)")
    return out
