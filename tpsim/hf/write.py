"""Write a model's full tensors as a Hugging Face folder: ``config.json`` + ``model.safetensors`` (or shards).

What ``save_pretrained`` would write for the weights, from NumPy alone: the tests build every kind of folder the
reader must accept with it (float32 / float16 / bfloat16, one file or sharded, configs in the 4.x or 5.x
spelling through ``config_overrides``), and a user can turn a tpsim run into a folder ``from_pretrained`` loads.
"""

from __future__ import annotations

import json
import os

import numpy as np

from tpsim.hf.layout import to_hf
from tpsim.hf.weights import INDEX, SINGLE, bfloat16, safetensors_bytes


def as_storage(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` as stored in a checkpoint of ``dtype`` ("float32", "float16", "bfloat16", "float64")."""
    return a.astype(bfloat16() if dtype == "bfloat16" else np.dtype(dtype))


def write_hf_folder(folder, config, tensors: dict[str, np.ndarray], *, dtype: str = "float32", shards: int = 1,
                    config_overrides: dict | None = None, extra_tensors: dict[str, np.ndarray] | None = None) -> str:
    """Write ``tensors`` (tpsim's names and layout) to ``folder`` as HF does; returns the folder.

    ``shards > 1`` splits the tensors over that many ``model-0000i-of-0000n.safetensors`` files and writes
    ``model.safetensors.index.json``. ``config_overrides`` edits config.json (a value ``None`` deletes the key);
    ``extra_tensors`` adds HF-named tensors as they are (buffers, a stray bias: what the reader must handle).
    """
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    cfg = {**config.hf_config(), "torch_dtype": dtype, **(config_overrides or {})}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({k: v for k, v in cfg.items() if v is not None}, f, indent=2)
    stored = {n: as_storage(a, dtype) for n, a in to_hf(tensors, config).items()}
    stored.update(extra_tensors or {})
    names = list(stored)
    if shards <= 1:
        with open(os.path.join(folder, SINGLE), "wb") as f:
            f.write(safetensors_bytes(stored))
        return folder
    weight_map = {}
    for i, part in enumerate(np.array_split(np.arange(len(names)), shards)):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        with open(os.path.join(folder, file), "wb") as f:
            f.write(safetensors_bytes({names[j]: stored[names[j]] for j in part}))
        weight_map.update({names[j]: file for j in part})
    with open(os.path.join(folder, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": sum(a.nbytes for a in stored.values())}, "weight_map": weight_map}, f)
    return folder
