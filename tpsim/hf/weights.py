"""Weights of a Hugging Face folder as NumPy arrays by HF name: safetensors in (single or sharded), and out.

A ``.safetensors`` file is an 8-byte little-endian header length, a JSON header
``{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}`` and the raw
little-endian bytes. The ``safetensors`` package reads it (``safetensors.numpy``); bfloat16 needs ``ml_dtypes``
(NumPy has no bfloat16). Where the package is absent or cannot give a bfloat16 array, ``read_raw`` reads the
documented format itself — a dozen lines, and the same arrays.

A sharded checkpoint has ``model.safetensors.index.json`` = ``{"weight_map": {name: file}}``; every file it
names is read and every name must be in the file the map says.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from tpsim.errors import ConfigError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class HFWeightsError(ConfigError):
    """A weights file that cannot be read, or a sharded index that does not match its files."""


def bfloat16():
    try:
        import ml_dtypes
    except ImportError as exc:
        raise HFWeightsError("bfloat16 weights need the ml_dtypes package (pip install ml_dtypes)") from exc
    return np.dtype(ml_dtypes.bfloat16)


_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
           "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_raw(path) -> dict[str, np.ndarray]:
    """Every tensor of a ``.safetensors`` file, read by hand from the documented format (module docstring)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        code = info["dtype"]
        dtype = bfloat16() if code == "BF16" else np.dtype(_DTYPES[code]).newbyteorder("<")
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(info["shape"]).astype(dtype.newbyteorder("="))
    return out


def read_safetensors(path) -> dict[str, np.ndarray]:
    """Every tensor of one ``.safetensors`` file by name: with the package, else (absent, or an old one without
    bfloat16) ``read_raw``; a file neither can read raises ``HFWeightsError`` naming it."""
    path = os.fspath(path)
    try:
        from safetensors.numpy import load_file
    except ImportError:
        load_file = None
    try:
        if load_file is not None:
            try:
                return dict(load_file(path))
            except Exception:  # noqa: BLE001 - the hand-written reader decides whether the file is readable
                pass
        return read_raw(path)
    except HFWeightsError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read is one kind of error for the caller
        raise HFWeightsError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc


def read_sharded(folder) -> dict[str, np.ndarray]:
    """The tensors of a sharded checkpoint (``model.safetensors.index.json`` and the files it names)."""
    folder = os.fspath(folder)
    index_path = os.path.join(folder, INDEX)
    try:
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HFWeightsError(f"cannot read {index_path}: {type(exc).__name__}: {exc}") from exc
    out: dict[str, np.ndarray] = {}
    for file in sorted(set(weight_map.values())):
        tensors = read_safetensors(os.path.join(folder, file))
        wrong = sorted(n for n in tensors if weight_map.get(n) != file)
        if wrong:
            raise HFWeightsError(f"{index_path}: {file} holds {wrong[0]}, which the weight_map does not put there")
        out.update(tensors)
    missing = sorted(set(weight_map) - set(out))
    if missing:
        raise HFWeightsError(f"{index_path}: {missing[0]} is in the weight_map but in none of its files")
    return out


def to_float(tensors: dict[str, np.ndarray], dtype) -> dict[str, np.ndarray]:
    """Every array as ``dtype`` (float32/16 and bfloat16 in, the model's dtype out); non-floats are refused."""
    out = {}
    for name, a in tensors.items():
        if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
            raise HFWeightsError(f"{name} has dtype {a.dtype}, expected a floating-point tensor")
        out[name] = np.asarray(a.astype(np.float32) if a.dtype.name == "bfloat16" else a, dtype=dtype)
    return out


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    """``tensors`` as the bytes of one ``.safetensors`` file (metadata format "pt", as ``from_pretrained`` wants)."""
    from safetensors.numpy import save

    return save({k: np.ascontiguousarray(v) for k, v in tensors.items()}, metadata={"format": "pt"})
