"""The architecture registry (``tpsim.arch``): names and aliases, the entry of a config, what every entry
provides — a serial model whose parameters are its config's ``param_shapes``, Hugging Face terms, memory terms —
and the errors of ``from_sizes``."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.arch import (ARCH_NAMES, ARCH_SPELLINGS, ARCHITECTURES, GPTConfig, LlamaConfig, MixtralConfig,
                        NemotronConfig, architecture, architecture_of, hf_architecture)
from tpsim.arch.hf_keys import HFConfigError
from tpsim.errors import ConfigError
from tpsim.hf.layout import hf_shapes
from tpsim.predict.memory import param_elements

# awkward sizes: vocab 13 (padded under TP), 3 layers; a Llama with grouped KV heads
CONFIGS = {"gpt2": GPTConfig(vocab_size=13, n_positions=9, n_embd=12, n_layer=3, n_head=3),
           "llama": LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=24, num_hidden_layers=3,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=9),
           "nemotron": NemotronConfig(vocab_size=13, hidden_size=16, intermediate_size=24, num_hidden_layers=3,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=9),
           "mixtral": MixtralConfig(vocab_size=13, hidden_size=16, intermediate_size=6, num_hidden_layers=3,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=9,
                                    num_local_experts=3, num_experts_per_tok=2, router_aux_loss_coef=0.02)}


def test_names_and_aliases():
    assert ARCH_NAMES == ("gpt2", "llama", "nemotron", "mixtral")
    assert set(ARCH_SPELLINGS) == {"gpt2", "gpt", "llama", "nemotron", "mixtral"}
    assert architecture("gpt") is architecture("gpt2") is ARCHITECTURES["gpt2"]
    assert all(architecture(a).name == a for a in ARCH_NAMES)


def test_an_unknown_name_lists_the_choices():
    with pytest.raises(ConfigError, match="unknown architecture 'mistral': choose from gpt2, llama"):
        architecture("mistral")


def test_the_entry_of_a_config():
    for name, config in CONFIGS.items():
        assert architecture_of(config).name == name == config.arch
    with pytest.raises(TypeError, match="dict is not the config of a registered architecture"):
        architecture_of({})


@pytest.mark.parametrize("name", ARCH_NAMES)
def test_every_entry_builds_a_serial_model_holding_its_param_shapes(name):
    config = CONFIGS[name]
    model = architecture(name).serial(config, seed=0, dtype=np.float32)
    got = {n: p.shape for n, p in model.named_parameters()}
    assert got == config.param_shapes(), f"{name}: the model's parameters differ from param_shapes()"
    assert {p.dtype for _, p in model.named_parameters()} == {np.dtype(np.float32)}
    assert model.config is config
    # the memory formula at tp 1 (vocabulary unpadded) counts every parameter once
    assert param_elements(config, 1) == sum(int(np.prod(s)) for s in config.param_shapes().values())


def test_a_mixtral_with_dense_layers_and_shared_experts_holds_its_param_shapes():
    """tpsim's knobs beyond Mixtral's file: a dense first layer, shared experts; the memory terms count them, and
    an export would refuse them (``tpsim_only``)."""
    config = MixtralConfig(vocab_size=13, hidden_size=16, intermediate_size=6, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=9, num_local_experts=3,
                           shared_experts=2, shared_expert_intermediate_size=4, first_dense_layers=1, router="sigmoid",
                           router_aux_loss_coef=0.0)
    model = architecture("mixtral").serial(config, seed=0)
    assert {n: p.shape for n, p in model.named_parameters()} == config.param_shapes()
    assert param_elements(config, 1) == sum(int(np.prod(s)) for s in config.param_shapes().values())
    assert config.tpsim_only() == ["router sigmoid", "shared_experts 2", "first_dense_layers 1"]
    assert "model.layers.0.mlp.gate_proj.weight" in config.param_shapes()  # dense
    assert "model.layers.1.mlp.experts.2.down_proj.weight" in config.param_shapes()


@pytest.mark.parametrize("name", ARCH_NAMES)
def test_every_entry_has_the_shared_shape_and_terms(name):
    entry, config = architecture(name), CONFIGS[name]
    for size in ("hidden", "heads", "kv_heads", "head_dim", "ffn", "layers", "vocab", "max_positions", "norm_eps"):
        assert isinstance(getattr(config, size), (int, float)), size
    assert config.hidden == config.heads * config.head_dim
    assert all(k in config.__dataclass_fields__ for k in config.manifest_keys)
    assert any(n.startswith(config.layer_names.block + ".0.") for n in config.param_shapes())
    assert (config.position_table in config.param_shapes()) == (config.positions == "learned")
    memory = entry.memory
    for term in ("layer_param_elements", "layer_vector_elements", "activation_elements", "paper_layer_elements",
                 "ACTIVATION_SOURCE"):
        assert hasattr(memory, term), f"{entry.memory_terms} lacks {term}"
    assert entry.hf.read_config(config.hf_config()) == config  # config.json written, then read back
    assert hf_architecture(config.hf_config()["model_type"]) is entry
    assert set(hf_shapes(config)) == set(config.param_shapes())


def test_hf_architecture_refuses_an_unknown_model_type():
    message = 'model_type = "mistral" is not supported: tpsim reads gpt2, llama, nemotron and mixtral'
    with pytest.raises(HFConfigError, match=message):
        hf_architecture("mistral")


def test_from_sizes_fills_the_architectures_own_choices():
    shared = dict(vocab=13, hidden=64, layers=2, heads=4, max_positions=8)
    gpt = GPTConfig.from_sizes(**shared, dropout=0.1)
    assert (gpt.kv_heads, gpt.ffn, gpt.dropout, GPTConfig.size_choices) == (4, 256, 0.1, ())
    llama = LlamaConfig.from_sizes(**shared)
    assert (llama.kv_heads, llama.ffn) == (2, 192)  # 2 KV heads, 8h/3 rounded up to a multiple of 32
    assert LlamaConfig.from_sizes(**{**shared, "heads": 3, "hidden": 48}).kv_heads == 3  # odd heads: one each
    assert all(getattr(llama, s) is not None for s in LlamaConfig.size_choices)


@pytest.mark.parametrize("config, sizes, message", [
    (GPTConfig, {"kv_heads": 2}, "--kv-heads is for --arch llama"),
    (GPTConfig, {"ffn": 96}, "--ffn is for --arch llama"),
    (LlamaConfig, {"dropout": 0.1}, "--arch llama has no dropout"),
    (LlamaConfig, {"kv_heads": 0}, "--kv-heads must be >= 1, got 0"),
    (LlamaConfig, {"ffn": -1}, "--ffn must be >= 1, got -1"),
])
def test_from_sizes_refuses_what_the_architecture_cannot_do(config, sizes, message):
    with pytest.raises(ConfigError, match=message):
        config.from_sizes(vocab=13, hidden=64, layers=2, heads=4, max_positions=8, **sizes)


@pytest.mark.parametrize("config, tp, message", [
    (CONFIGS["gpt2"], 2, "heads 3 is not divisible by tp 2"),
    (CONFIGS["llama"], 8, "num_attention_heads 4 is not divisible by tp 8"),
    (LlamaConfig(num_attention_heads=6, num_key_value_heads=3, hidden_size=48, intermediate_size=96), 2,
     "num_key_value_heads 3 and tp 2: neither divides the other"),
])
def test_check_is_the_one_place_of_the_tp_rules(config, tp, message):
    with pytest.raises(ConfigError, match=message):
        config.check(tp)
