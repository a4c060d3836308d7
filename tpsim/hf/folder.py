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
from tpsim.hf.layout import file_shapes
from tpsim.hf.names import to_internal
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
    """A learned position table has the run's length (the demo's GPT-2: n_positions = --seq-len): keep the first
    rows of a longer checkpoint's."""
    name = config.position_table
    if name is None or name not in tensors or folder_config.max_positions <= config.max_positions:
        return tensors
    return {**tensors, name: tensors[name][:config.max_positions]}


def load_init(path, config, dtype=np.float64, **load_kwargs) -> dict[str, np.ndarray]:
    """Full tensors for ``config`` from a tpsim ``.npz`` or a model folder (``--init-from``).

    A folder's model must have the sizes ``config`` has (the error names the flags that would match); only a
    learned position table (GPT-2's wpe) may be longer than the run's sequence (its first rows are used).
    ``load_kwargs`` go to ``load_tensors`` for a ``.npz`` (e.g. ``note=None``: no note about a missing manifest).
    """
    path = os.fspath(path)
    if not os.path.isdir(path):  # a tpsim .npz holds HF's names and layouts, as an export folder does
        return to_internal(load_tensors(path, file_shapes(config), config=config, **load_kwargs), config, label=path)
    folder_config, tensors = read_folder(path, dtype)
    if describe(folder_config) != describe(config) or folder_config.norm_eps != config.norm_eps:
        raise CheckpointError(f"{path} holds {describe(folder_config)} (norm eps {folder_config.norm_eps:g}), but "
                              f"the run asks for {describe(config)} (norm eps {config.norm_eps:g})")
    if config.position_table and folder_config.max_positions < config.max_positions:
        raise CheckpointError(f"{path} has n_positions {folder_config.max_positions}, fewer than the run's "
                              f"sequence length {config.max_positions}")
    return _fit_positions(config, folder_config, tensors)


def describe(config) -> str:
    """The model's sizes as the demo's flags spell them: the shared ones and the architecture's own choices."""
    own = [f"--{size.replace('_', '-')} {getattr(config, size)}"
           for size in (*config.size_choices, *getattr(config, "flag_sizes", ()))]  # flag_sizes: a MoE's experts
    return " ".join([config.arch, f"--layers {config.layers}", f"--hidden {config.hidden}",
                     f"--heads {config.heads}", *own, f"--vocab {config.vocab}"])
