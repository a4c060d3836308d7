"""Hugging Face folders in: the folders tests build themselves (random weights written with safetensors), every
spelling the reader must accept, and every feature it must refuse — in one line that names it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tpsim.errors import ConfigError
from tpsim.arch.llama_hf import llama_fields, rope_theta
from tpsim.hf.config import HFConfigError, model_config
from tpsim.hf.folder import load_init, read_folder, read_hf_tensors
from tpsim.hf.weights import read_raw, read_safetensors
from tpsim.hf.write import as_storage, write_hf_folder
from tpsim.models.build import serial_gpt
from tpsim.arch.gpt2 import GPTConfig

CFG = GPTConfig(vocab_size=13, n_positions=11, n_embd=16, n_layer=2, n_head=2)


def gpt2_tensors(cfg=CFG, seed=3) -> dict[str, np.ndarray]:
    return {name: p.copy() for name, p in serial_gpt(cfg, seed).named_parameters()}


def stored(a: np.ndarray, dtype: str) -> np.ndarray:
    """What reading a ``dtype`` checkpoint back to float64 gives: the value rounded to ``dtype``."""
    return as_storage(a, dtype).astype(np.float64)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shards", [1, 3])
def test_gpt2_folder_round_trip(tmp_path, dtype, shards):
    tensors = gpt2_tensors()
    write_hf_folder(tmp_path, CFG, tensors, dtype=dtype, shards=shards)
    config, read = read_folder(tmp_path)
    assert config == CFG
    assert list(read) == list(CFG.param_shapes())
    for name, a in tensors.items():
        assert read[name].dtype == np.float64
        np.testing.assert_array_equal(read[name], stored(a, dtype), err_msg=name)


def test_gpt2_names_without_prefix_with_buffers_and_tied_head(tmp_path):
    """The hub's gpt2 file: GPT2Model names (no ``transformer.``), [1,1,n,n] mask buffers, a tied lm_head copy."""
    tensors = gpt2_tensors()
    short = {n.removeprefix("transformer."): a.astype(np.float32) for n, a in tensors.items()}
    mask = np.tril(np.ones((1, 1, 11, 11), np.float32))
    extra = {"h.0.attn.bias": mask, "h.1.attn.bias": mask, "h.0.attn.masked_bias": np.array(-1e4, np.float32),
             "lm_head.weight": tensors["transformer.wte.weight"].astype(np.float32)}
    write_hf_folder(tmp_path, CFG, {}, dtype="float32", extra_tensors={**short, **extra})
    _, read = read_folder(tmp_path)
    for name, a in tensors.items():
        np.testing.assert_array_equal(read[name], stored(a, "float32"), err_msg=name)


def test_gpt2_untied_head_and_unexpected_tensors_are_refused(tmp_path):
    tensors = gpt2_tensors()
    head = tensors["transformer.wte.weight"] + 1.0
    write_hf_folder(tmp_path / "a", CFG, tensors, extra_tensors={"lm_head.weight": head.astype(np.float32)})
    with pytest.raises(ConfigError, match="lm_head.weight differs from transformer.wte.weight"):
        read_folder(tmp_path / "a")
    write_hf_folder(tmp_path / "b", CFG, tensors, extra_tensors={"transformer.h.0.attn.q_bias": np.zeros(16)})
    with pytest.raises(ConfigError, match="unexpected transformer.h.0.attn.q_bias"):
        read_folder(tmp_path / "b")
    del tensors["transformer.ln_f.bias"]
    write_hf_folder(tmp_path / "c", CFG, tensors)
    with pytest.raises(ConfigError, match=r"missing transformer.ln_f.bias \(expected shape \(16,\)\)"):
        read_folder(tmp_path / "c")


def test_sharded_index_must_match_its_files(tmp_path):
    write_hf_folder(tmp_path, CFG, gpt2_tensors(), shards=2)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = "model-00002-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=f"holds {name}, which the weight_map does not put there"):
        read_folder(tmp_path)


def test_raw_reader_equals_the_package_for_bfloat16(tmp_path):
    """The hand-written reader of the documented format gives the package's arrays, bfloat16 included."""
    write_hf_folder(tmp_path, CFG, gpt2_tensors(), dtype="bfloat16")
    ours, theirs = read_raw(tmp_path / "model.safetensors"), read_safetensors(tmp_path / "model.safetensors")
    assert set(ours) == set(theirs)
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype and ours[name].dtype.name == "bfloat16"
        np.testing.assert_array_equal(ours[name].astype(np.float32), theirs[name].astype(np.float32))


def test_n_ctx_and_real_gpt2_keys_are_read(tmp_path):
    """A config as the hub's gpt2 has it: n_ctx beside n_positions, dropouts, summary_* keys, no n_inner."""
    cfg = {"model_type": "gpt2", "vocab_size": 13, "n_ctx": 11, "n_embd": 16, "n_layer": 2, "n_head": 2,
           "activation_function": "gelu_new", "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1,
           "layer_norm_epsilon": 1e-5, "summary_type": "cls_index", "n_inner": None, "torch_dtype": "float32"}
    assert model_config(cfg) == CFG
    assert model_config({**cfg, "activation_function": "gelu_pytorch_tanh", "n_positions": 11}) == CFG


GPT2_REFUSED = [("activation_function", "relu"), ("n_inner", 17), ("tie_word_embeddings", False),
                ("scale_attn_by_inverse_layer_idx", True), ("reorder_and_upcast_attn", True),
                ("add_cross_attention", True), ("scale_attn_weights", False)]


@pytest.mark.parametrize("key,value", GPT2_REFUSED)
def test_gpt2_features_tpsim_does_not_model_are_refused(key, value):
    cfg = {**CFG.hf_config(), key: value}
    with pytest.raises(HFConfigError, match=f"{key} = {json.dumps(value)} is not supported") as err:
        model_config(cfg)
    assert "\n" not in str(err.value)


LLAMA = {"model_type": "llama", "vocab_size": 13, "hidden_size": 16, "intermediate_size": 24,
         "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 32, "rms_norm_eps": 1e-6,
         "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}


def test_llama_configs_of_transformers_4_and_5():
    v4 = {**LLAMA, "rope_theta": 500000.0, "rope_scaling": None, "num_key_value_heads": 2, "torch_dtype": "bfloat16"}
    v5 = {**LLAMA, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "num_key_value_heads": 2,
          "dtype": "bfloat16"}
    assert llama_fields(v4) == llama_fields(v5)
    assert llama_fields(v4)["rope_theta"] == 500000.0 and llama_fields(v4)["num_key_value_heads"] == 2
    assert llama_fields(LLAMA)["num_key_value_heads"] == 4, "absent num_key_value_heads = num_attention_heads"
    assert rope_theta(LLAMA) == 10000.0


LLAMA_REFUSED = [({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
                 ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn"}}, "rope_parameters.rope_type"),
                 ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "default", "factor": 2.0}},
                  "rope_parameters.factor"),
                 ({"attention_bias": True}, "attention_bias"), ({"mlp_bias": True}, "mlp_bias"),
                 ({"tie_word_embeddings": True}, "tie_word_embeddings"), ({"hidden_act": "gelu"}, "hidden_act"),
                 ({"head_dim": 8}, "head_dim")]


@pytest.mark.parametrize("change,key", LLAMA_REFUSED)
def test_llama_features_tpsim_does_not_model_are_refused(change, key):
    with pytest.raises(HFConfigError, match=f"{key} = .* is not supported") as err:
        llama_fields({**LLAMA, **change})
    assert "\n" not in str(err.value)


def test_unknown_model_type_and_missing_config(tmp_path):
    with pytest.raises(HFConfigError, match='model_type = "mistral" is not supported'):
        model_config({**LLAMA, "model_type": "mistral"})
    with pytest.raises(HFConfigError, match="cannot read .*config.json"):
        read_folder(tmp_path)


def test_load_init_checks_the_run_sizes_and_cuts_positions(tmp_path):
    """--init-from DIR: the folder must be the model the flags describe; a longer wpe serves a shorter run."""
    write_hf_folder(tmp_path, CFG, gpt2_tensors(), dtype="float32")
    shorter = GPTConfig(vocab_size=13, n_positions=7, n_embd=16, n_layer=2, n_head=2)
    tensors = load_init(tmp_path, shorter)
    assert tensors["transformer.wpe.weight"].shape == (7, 16)
    with pytest.raises(ConfigError, match="holds gpt2 --layers 2 --hidden 16 --heads 2 --vocab 13.*--hidden 32"):
        load_init(tmp_path, GPTConfig(vocab_size=13, n_positions=7, n_embd=32, n_layer=2, n_head=2))
    with pytest.raises(ConfigError, match="n_positions 11, fewer than the run's sequence length 12"):
        load_init(tmp_path, GPTConfig(vocab_size=13, n_positions=12, n_embd=16, n_layer=2, n_head=2))


def llama_model_config():
    from tpsim.arch.llama import LlamaConfig

    return LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, rope_theta=5e5)


V5_SPELLING = {"rope_theta": None, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"},
               "torch_dtype": None, "dtype": "bfloat16"}


@pytest.mark.parametrize("dtype,shards,spelling", [("float32", 1, {}), ("float16", 2, V5_SPELLING),
                                                   ("bfloat16", 3, V5_SPELLING)])
def test_llama_folder_round_trip(tmp_path, dtype, shards, spelling):
    """Linears stored as nn.Linear's [out, in], read back in tpsim's [in, out]; 4.x and 5.x configs alike."""
    from tpsim.models.llama import serial_llama

    cfg = llama_model_config()
    tensors = {n: p.copy() for n, p in serial_llama(cfg, 4).named_parameters()}
    write_hf_folder(tmp_path, cfg, tensors, dtype=dtype, shards=shards, config_overrides=spelling)
    hf = read_hf_tensors(tmp_path)
    assert hf["model.layers.0.self_attn.k_proj.weight"].shape == (8, 16), "[out = kv_heads·hd, in = h]"
    assert hf["model.layers.0.mlp.down_proj.weight"].shape == (16, 24)
    config, read = read_folder(tmp_path)
    assert config == cfg
    for name, a in tensors.items():
        np.testing.assert_array_equal(read[name], stored(a, dtype), err_msg=name)
    assert load_init(tmp_path, cfg)["model.norm.weight"].shape == (16,)


def test_llama_biases_and_shape_errors_are_refused(tmp_path):
    from tpsim.models.llama import serial_llama

    cfg = llama_model_config()
    tensors = dict(serial_llama(cfg, 4).named_parameters())
    write_hf_folder(tmp_path / "a", cfg, tensors, extra_tensors={"model.layers.0.self_attn.q_proj.bias": np.zeros(16)})
    with pytest.raises(ConfigError, match="unexpected model.layers.0.self_attn.q_proj.bias"):
        read_folder(tmp_path / "a")
    write_hf_folder(tmp_path / "b", cfg, tensors, config_overrides={"num_key_value_heads": 4})
    with pytest.raises(ConfigError, match=r"k_proj.weight has shape \(8, 16\), expected \(16, 16\)"):
        read_folder(tmp_path / "b")


def test_nemotron_folder_round_trip(tmp_path):
    """Nemotron's names: each LayerNorm1P's stored weight and its bias, up_proj and down_proj (no gate), the
    linears as nn.Linear's [out, in]; bfloat16 in two shards, read back as the same config and tensors."""
    from tpsim.arch.nemotron import NemotronConfig
    from tpsim.models.nemotron import serial_nemotron

    cfg = NemotronConfig(vocab_size=13, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    tensors = {n: p.copy() for n, p in serial_nemotron(cfg, 4).named_parameters()}
    write_hf_folder(tmp_path, cfg, tensors, dtype="bfloat16", shards=2)
    hf = read_hf_tensors(tmp_path)
    assert hf["model.layers.0.mlp.up_proj.weight"].shape == (24, 16) and "model.norm.bias" in hf
    config, read = read_folder(tmp_path)
    assert config == cfg and set(read) == set(tensors)
    for name, a in tensors.items():
        np.testing.assert_array_equal(read[name], stored(a, "bfloat16"), err_msg=name)


def test_a_truncated_weights_file_is_one_error_naming_it(tmp_path):
    write_hf_folder(tmp_path, CFG, gpt2_tensors())
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(ConfigError, match="cannot read .*model.safetensors"):
        read_folder(tmp_path)
