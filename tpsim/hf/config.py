"""``config.json`` as Hugging Face writes it -> a tpsim config; every feature tpsim does not model is refused.

Read as written in the wild:

    GPT-2   n_positions (or the older n_ctx), n_embd, n_layer, n_head, vocab_size, layer_norm_epsilon,
            activation_function gelu_new (= gelu_pytorch_tanh, the same tanh GeLU); n_inner null or 4·n_embd
    Llama   hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads
            (absent = num_attention_heads), max_position_embeddings, rms_norm_eps, hidden_act silu,
            rope_theta at the top level (transformers 4.x) or in rope_parameters {rope_theta, rope_type}
            (transformers 5.x), default 10000
    both    torch_dtype (4.x) or dtype (5.x): the dtype the weights were saved in (informational: tensors are
            converted to the model's dtype when read)

A refused feature raises ``HFConfigError`` (a ``ConfigError``: one line, exit 2 on every rank) naming the key and
its value — a model that would silently compute something else is worse than no model. Dropout probabilities
are training settings and are not read (inference and the step-0 checks run without dropout).
"""

from __future__ import annotations

import json
import os

from tpsim.errors import ConfigError

GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")  # two names of one function: 0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))


class HFConfigError(ConfigError):
    """A config.json tpsim cannot read, or one describing a feature tpsim does not model."""


def read_config_json(folder) -> dict:
    """The parsed ``config.json`` of ``folder`` (an ``HFConfigError`` when missing or not JSON)."""
    path = os.path.join(os.fspath(folder), "config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as exc:
        raise HFConfigError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(cfg, dict):
        raise HFConfigError(f"{path} is not a JSON object")
    return cfg


def storage_dtype(cfg: dict) -> str | None:
    """The dtype the weights were saved in, as the config states it (``dtype`` in 5.x, ``torch_dtype`` in 4.x)."""
    value = cfg.get("dtype", cfg.get("torch_dtype"))
    return None if value is None else str(value).removeprefix("torch.")


def _refuse(where: str, key: str, value, why: str) -> None:
    raise HFConfigError(f"{where}: {key} = {json.dumps(value)} is not supported: {why}")


def _require(cfg: dict, where: str, *keys: str) -> None:
    missing = [k for k in keys if k not in cfg]
    if missing:
        raise HFConfigError(f"{where}: config.json lacks {', '.join(missing)}")


def _check_flags(cfg: dict, where: str, expected: dict[str, object], why: dict[str, str]) -> None:
    """Refuse a key whose value differs from the one tpsim models (absent keys take HF's default = expected)."""
    for key, want in expected.items():
        if key in cfg and cfg[key] is not None and cfg[key] != want:
            _refuse(where, key, cfg[key], why[key])


def gpt2_config(cfg: dict, where: str = "config.json"):
    """A ``GPTConfig`` from a GPT-2 config.json (``HFConfigError`` for what tpsim does not model)."""
    from tpsim.arch.gpt2 import GPTConfig

    positions = cfg.get("n_positions", cfg.get("n_ctx"))
    if positions is None:
        raise HFConfigError(f"{where}: config.json lacks n_positions (and n_ctx)")
    _require(cfg, where, "vocab_size", "n_embd", "n_layer", "n_head")
    act = cfg.get("activation_function", "gelu_new")
    if act not in GELU_TANH:
        _refuse(where, "activation_function", act, "tpsim's GPT-2 MLP uses the tanh GeLU (gelu_new)")
    h = cfg["n_embd"]
    if cfg.get("n_inner") not in (None, 4 * h):
        _refuse(where, "n_inner", cfg["n_inner"], f"tpsim's GPT-2 MLP is 4·n_embd = {4 * h} wide")
    _check_flags(cfg, where, {"tie_word_embeddings": True, "scale_attn_weights": True,
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


def rope_theta(cfg: dict, where: str = "config.json") -> float:
    """θ of RoPE from either spelling; refuses any rope scaling or a rope_type other than default."""
    params = cfg.get("rope_parameters")
    if params is not None:  # transformers 5.x
        if not isinstance(params, dict):
            _refuse(where, "rope_parameters", params, "expected an object {rope_theta, rope_type}")
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            _refuse(where, "rope_parameters.rope_type", kind, "tpsim models plain RoPE (rope_type default) only")
        extra = sorted(set(params) - {"rope_theta", "rope_type", "type"})
        if extra:
            _refuse(where, "rope_parameters." + extra[0], params[extra[0]], "tpsim models no RoPE scaling")
    scaling = cfg.get("rope_scaling")
    if scaling is not None:  # transformers 4.x: null unless scaled
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else scaling
        if kind != "default" or set(scaling) - {"rope_type", "type", "rope_theta"}:
            _refuse(where, "rope_scaling", scaling, "tpsim models plain RoPE, no scaling")
    theta = (params or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    return float(theta)


def llama_fields(cfg: dict, where: str = "config.json") -> dict:
    """The Llama config.json's fields tpsim models, under HF's names (``HFConfigError`` for the rest)."""
    _require(cfg, where, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        _refuse(where, "hidden_act", act, "tpsim's Llama MLP is SwiGLU with SiLU")
    _check_flags(cfg, where, {"tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False},
                 {"tie_word_embeddings": "tpsim's Llama has an untied lm_head",
                  "attention_bias": "tpsim's Llama projections have no bias",
                  "mlp_bias": "tpsim's Llama projections have no bias"})
    heads, h = cfg["num_attention_heads"], cfg["hidden_size"]
    if cfg.get("head_dim") not in (None, h // heads if heads else None):
        _refuse(where, "head_dim", cfg["head_dim"], f"tpsim's head_dim is hidden_size / heads = {h // heads}")
    return {"vocab_size": cfg["vocab_size"], "hidden_size": h, "intermediate_size": cfg["intermediate_size"],
            "num_hidden_layers": cfg["num_hidden_layers"], "num_attention_heads": heads,
            "num_key_value_heads": cfg.get("num_key_value_heads") or heads,
            "max_position_embeddings": cfg.get("max_position_embeddings", 2048),
            "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)), "rope_theta": rope_theta(cfg, where),
            "initializer_range": float(cfg.get("initializer_range", 0.02))}


def model_config(cfg: dict, where: str = "config.json"):
    """The tpsim config of a parsed config.json: ``GPTConfig`` for gpt2, ``LlamaConfig`` for llama."""
    kind = cfg.get("model_type")
    if kind == "gpt2":
        return gpt2_config(cfg, where)
    if kind == "llama":
        fields = llama_fields(cfg, where)
        try:
            from tpsim.arch.llama import LlamaConfig
        except ImportError as exc:
            raise HFConfigError(f"{where}: model_type llama needs tpsim.arch.llama ({exc})") from exc
        return LlamaConfig(**fields).check(1)
    raise HFConfigError(f"{where}: model_type = {json.dumps(kind)} is not supported: tpsim reads gpt2 and llama")
