"""A whole model folder -> (tpsim config, full tensors in tpsim's layout): what ``--init-from DIR`` reads.

The folder is either a Hugging Face checkpoint (``config.json`` + ``model.safetensors`` or a sharded
``model.safetensors.index.json``) or a tpsim export (``config.json`` + ``params.npz``, HF names and layouts);
weights stored as float32, float16 or bfloat16 become the model's dtype. ``load_init`` is the demo's door:
a ``.npz`` file or a folder, checked against the model the flags describe.
"""

from __future__ import annotations

import os
import numpy as np

from tpsim.hf.config import model_config, read_config_json
from tpsim.hf.names import hf_shapes, is_llama, to_internal
from tpsim.hf.weights import INDEX, SINGLE, HFWeightsError, read_safetensors, read_sharded, to_float
from tpsim.hf.checkpoint import CheckpointError, load_tensors

PARAMS = "params.npz"


def read_hf_tensors(folder) -> dict[str, np.ndarray]:
    """The folder's tensors by HF name, as stored (sharded index first, then one file, then params.npz)."""
    folder = os.fspath(folder)
    if os.path.exists(os.path.join(folder, INDEX)):
        return read_sharded(folder)
    if os.path.exists(os.path.join(folder, SINGLE)):
        return read_safetensors(os.path.join(folder, SINGLE))
    if os.path.exists(os.path.join(folder, PARAMS)):
        with np.load(os.path.join(folder, PARAMS), allow_pickle=False) as archive:
            return {k: archive[k] for k in archive.files}
    raise HFWeightsError(f"{folder}: no {INDEX}, {SINGLE} or {PARAMS} in the folder")


def read_folder(folder, dtype=np.float64):
    """``(config, tensors)``: the folder's tpsim config and its full tensors in tpsim's layout, as ``dtype``."""
    config = model_config(read_config_json(folder), where=f"{os.fspath(folder)}/config.json")
    tensors = to_float(read_hf_tensors(folder), dtype)
    return config, to_internal(tensors, config, label=os.fspath(folder))


def _fit_positions(config, folder_config, tensors: dict) -> dict:
    """The demo's GPT-2 has n_positions = --seq-len: keep the first rows of a longer checkpoint's wpe."""
    name = "transformer.wpe.weight"
    if is_llama(config) or name not in tensors or folder_config.n_positions <= config.n_positions:
        return tensors
    return {**tensors, name: tensors[name][:config.n_positions]}


def load_init(path, config, dtype=np.float64, **load_kwargs) -> dict[str, np.ndarray]:
    """Full tensors for ``config`` from a tpsim ``.npz`` or a model folder (``--init-from``).

    A folder's model must have the sizes ``config`` has (the error names the flags that would match); only a
    GPT-2's position table may be longer than the run's sequence (its first rows are used). ``load_kwargs``
    go to ``load_tensors`` for a ``.npz`` (e.g. ``note=None``: no note about a missing manifest).
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        if not is_llama(config):
            return load_tensors(path, config.param_shapes(), config=config, **load_kwargs)
        return to_internal(load_tensors(path, hf_shapes(config), config=config, **load_kwargs), config, label=path)
    folder_config, tensors = read_folder(path, dtype)
    if describe(folder_config) != describe(config) or _eps(folder_config) != _eps(config):
        raise CheckpointError(f"{path} holds {describe(folder_config)} (norm eps {_eps(folder_config):g}), but the "
                              f"run asks for {describe(config)} (norm eps {_eps(config):g})")
    if not is_llama(config) and folder_config.n_positions < config.n_positions:
        raise CheckpointError(f"{path} has n_positions {folder_config.n_positions}, fewer than the run's "
                              f"sequence length {config.n_positions}")
    return _fit_positions(config, folder_config, tensors)


def describe(config) -> str:
    """The model's sizes as the demo's flags spell them."""
    if is_llama(config):
        return (f"llama --layers {config.num_hidden_layers} --hidden {config.hidden_size} "
                f"--heads {config.num_attention_heads} --kv-heads {config.num_key_value_heads} "
                f"--ffn {config.intermediate_size} --vocab {config.vocab_size}")
    return (f"gpt2 --layers {config.n_layer} --hidden {config.n_embd} --heads {config.n_head} "
            f"--vocab {config.vocab_size}")


def _eps(config) -> float:
    return config.rms_norm_eps if is_llama(config) else config.layer_norm_epsilon
