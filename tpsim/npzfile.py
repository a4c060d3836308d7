"""Safe ``.npz`` files: every array tpsim saves carries a manifest, and every file it loads is checked first.

The manifest is JSON stored as the zip archive's *comment*, not as an array, so the archive's keys stay exactly
the parameter names (``np.load``, PyTorch and JAX code that walks ``.files`` see nothing new)::

    {"format": "tpsim-checkpoint", "version": 1,
     "model": {"arch": "gpt2", "vocab_size": 32, "n_positions": 16, "n_embd": 64, "n_layer": 2, "n_head": 4}
              | {"arch": "llama", "vocab_size": ..., "hidden_size": ..., ...} | null,   # config.manifest_keys
     "tp": 4, "dp": 2,               # the grid it was written at (null when unknown); it loads at any other
     "dtype": "float64",             # of the first array (all parameters share it)
     "arrays": {"transformer.wte.weight": {"dtype": "float64", "shape": [32, 64], "crc32": 123456789}, ...}}

``crc32`` is ``zlib.crc32`` of the array's C-ordered bytes. Reading (``read_npz``) names the file and the first
problem in one line, raised as ``CheckpointError`` (a ``ConfigError``: exit status 2) — never a traceback from
NumPy or zipfile: missing / a folder / unreadable; not a zip archive (foreign or truncated: a cut file loses the
zip directory at its end); an array that fails the zip's own CRC-32 or cannot be parsed (corrupted); an array
whose bytes differ from the manifest's checksum, dtype or shape; a manifest of another format or a newer
version; a model whose sizes differ from the manifest's. A file without a manifest (an earlier tpsim, a user's
``np.savez``) is still read: the caller checks its names and shapes and, when they fit, prints one note
(``no_manifest_note``); when they do not, it is a foreign file and refused. MPI-free.
"""

from __future__ import annotations

import json
import os
import zlib

import numpy as np

from tpsim.atomic import atomic_write
from tpsim.errors import ConfigError

FORMAT, VERSION = "tpsim-checkpoint", 1
MAX_COMMENT = 65535  # the zip format's limit on the archive comment


class CheckpointError(ConfigError):
    """A checkpoint that does not fit the model (names, shapes, dtypes) or cannot be read."""


def crc32(a: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


def model_sizes(config) -> dict:
    """The architecture and sizes a manifest records for ``config`` (its ``manifest_keys``, ``tpsim.arch``)."""
    return {"arch": config.arch, **{k: int(getattr(config, k)) for k in config.manifest_keys}}


def manifest(arrays: dict[str, np.ndarray], *, config=None, tp: int | None = None, dp: int | None = None) -> dict:
    """The manifest of ``arrays`` (see the module docstring); ``config`` is a GPTConfig, a LlamaConfig or None."""
    first = next(iter(arrays.values()), None)
    return {"format": FORMAT, "version": VERSION,
            "model": None if config is None else model_sizes(config),
            "tp": tp, "dp": dp, "dtype": None if first is None else str(first.dtype),
            "arrays": {name: {"dtype": str(a.dtype), "shape": list(a.shape), "crc32": crc32(a)}
                       for name, a in arrays.items()}}


def write_npz(path, arrays: dict, **info) -> str:
    """``np.savez`` (uncompressed, no pickles) plus the manifest as the zip comment, written atomically."""
    import zipfile

    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    comment = json.dumps(manifest(arrays, **info), separators=(",", ":")).encode()
    if len(comment) > MAX_COMMENT:  # thousands of arrays: keep the header, the zip's own CRC-32s still guard them
        comment = json.dumps({**manifest({}, **info), "arrays": None}).encode()

    def write(f):
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
            for name, a in arrays.items():
                with zf.open(name + ".npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, a, allow_pickle=False)
            zf.comment = comment
    atomic_write(path, write)
    return os.fspath(path)


def read_npz(path) -> tuple[dict[str, np.ndarray], dict | None]:
    """``(arrays, manifest or None)`` of a file written by ``write_npz`` (or any ``np.savez``), checked against
    its manifest when it has one. Raises ``CheckpointError``."""
    import zipfile

    label = os.fspath(path)
    _check_readable(label)
    try:
        with zipfile.ZipFile(label) as zf:
            comment, names = zf.comment, zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {label}: not an .npz archive, or truncated ({exc})") from None
    arrays = {}
    with np.load(label, allow_pickle=False) as archive:
        for key, member in zip(archive.files, names):
            try:
                arrays[key] = archive[key]
            except zipfile.BadZipFile as exc:
                raise CheckpointError(f"cannot read {label}: array {key} is corrupted ({exc})") from None
            except Exception as exc:  # noqa: BLE001 - a damaged .npy header or a pickled object
                raise CheckpointError(f"cannot read {label}: array {key} ({member}): "
                                      f"{type(exc).__name__}: {exc}") from None
    found = _parse_manifest(comment, label)
    if found is not None:
        _check_against_manifest(arrays, found, label)
    return arrays, found


def no_manifest_note(label: str) -> str:
    return (f"note: {label} has no tpsim manifest (an earlier tpsim or another tool wrote it): its names and "
            f"shapes fit this model; no checksums to check")


def _check_readable(label: str) -> None:
    if not os.path.exists(label):
        raise CheckpointError(f"cannot read {label}: no such file")
    if os.path.isdir(label):
        raise CheckpointError(f"cannot read {label}: it is a directory, not an .npz file")
    if not os.access(label, os.R_OK):
        raise CheckpointError(f"cannot read {label}: permission denied")


def _parse_manifest(comment: bytes, label: str) -> dict | None:
    try:
        found = json.loads(comment.decode()) if comment else None
    except (UnicodeDecodeError, ValueError):
        return None  # someone else's comment: a foreign file, judged by its names and shapes
    if not isinstance(found, dict) or found.get("format") != FORMAT:
        return None
    if not isinstance(found.get("version"), int) or found["version"] > VERSION:
        raise CheckpointError(f"cannot read {label}: manifest version {found.get('version')!r}; this tpsim reads "
                              f"version {VERSION} and older (a newer tpsim wrote it)")
    return found


def _check_against_manifest(arrays: dict, found: dict, label: str) -> None:
    listed = found.get("arrays")
    if listed is None:
        return
    for name in listed:
        if name not in arrays:
            raise CheckpointError(f"{label}: array {name} is listed in the manifest but missing from the file")
    for name, a in arrays.items():
        entry = listed.get(name)
        if entry is None:
            raise CheckpointError(f"{label}: array {name} is not listed in the manifest")
        if str(a.dtype) != entry.get("dtype") or list(a.shape) != entry.get("shape"):
            raise CheckpointError(f"{label}: array {name} is {a.dtype} {list(a.shape)}, the manifest says "
                                  f"{entry.get('dtype')} {entry.get('shape')}")
        if crc32(a) != entry.get("crc32"):
            raise CheckpointError(f"{label}: array {name} fails its checksum (crc32 {crc32(a)}, manifest "
                                  f"{entry.get('crc32')}): the file is corrupted")


def check_model(found: dict | None, config, label: str) -> None:
    """The manifest's architecture and sizes against ``config``; nothing to check without them."""
    model = (found or {}).get("model")
    if not model or config is None:
        return
    model = {"arch": "gpt2", **model}  # version-1 manifests written before Llama carried no "arch"
    mine = model_sizes(config)
    diffs = [f"{k} {model.get(k)} (this model: {v})" for k, v in mine.items() if model.get(k) != v]
    if diffs:
        raise CheckpointError(f"{label}: written for another model: " + ", ".join(diffs))
