"""Checkpoints of the whole (unsharded) GPT with Hugging Face GPT-2 names: save at one TP size, load at any other.

A checkpoint never stores shards. Before writing, every sharded parameter is put back together over the TP group
(``full_tensors``); after reading, every rank cuts out its own shard again (``load_into``). Because the file
holds the serial model's master tensors, a TP 4 run can be resumed at TP 2 or TP 1 and exported again to a
bit-identical file, and the file can be read by anything that knows GPT-2 (PyTorch, JAX, plain NumPy).

Format — one ``.npz`` (``numpy.savez``, uncompressed, no pickles), one array per parameter, keys = GPT-2 names:

    transformer.wte.weight              [V, h]      token embedding = the tied LM head (no lm_head.weight key)
    transformer.wpe.weight              [n_positions, h]
    transformer.h.{i}.ln_1.weight/bias  [h]
    transformer.h.{i}.attn.c_attn.weight [h, 3h]    Conv1D layout [in, out]; columns q | k | v, head j of q at
    transformer.h.{i}.attn.c_attn.bias   [3h]       columns j·hd:(j+1)·hd — exactly as GPT-2 stores them
    transformer.h.{i}.attn.c_proj.weight [h, h]     and .bias [h]
    transformer.h.{i}.ln_2.weight/bias  [h]
    transformer.h.{i}.mlp.c_fc.weight    [h, 4h]    and .bias [4h]
    transformer.h.{i}.mlp.c_proj.weight  [4h, h]    and .bias [h]
    transformer.ln_f.weight/bias        [h]

Every file also carries a manifest in the zip comment (``tpsim.npzfile``: format version, model sizes, the
TP/DP it was written at, dtype, a crc32 per array), checked on load before any array is used.

``V`` is the true vocabulary: the zero rows that pad it to a multiple of tp are cut on export and re-created on
load. The dtype is the model's (float64 by default). ``GPTConfig.param_shapes()`` lists exactly these keys and
shapes; a file with a missing, extra, misshapen or non-float array is refused with a ``CheckpointError`` that
names the parameter and the expected shape — on every rank alike, before any collective.

The step-0 export folder (``export_step0``), for checking tpsim against an independent GPT-2 implementation:

    config.json   Hugging Face GPT2Config keys (``GPTConfig.hf_config()``)
    params.npz    the parameters, format above
    grads.npz     the gradients of the mean loss over the global batch, same names and shapes
    batch.npz     input_ids, labels: int64 [global_batch, seq]; labels[b, t] is the target of position t
                  (already shifted: the loss does no shifting; -100 = ignored)
    step0.json    {"loss": float, "tp": ..., "dp": ..., "dtype": ..., "global_batch": ..., "seq": ...}
    model.safetensors  params.npz's tensors again, so ``from_pretrained(DIR)`` loads the folder unchanged

A Llama export (``LlamaConfig``) has the same files, with HF Llama's names and ``nn.Linear``'s [out, in] layout
for every ``*_proj.weight`` (``tpsim.hf.names``); its ``params.npz`` is read back by ``tpsim.hf.folder``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from tpsim.atomic import atomic_write, write_text
from tpsim.comm import Group
from tpsim.comm.launch import world_rank
from tpsim.errors import ConfigError
from tpsim.hf.layout import to_hf  # HF layouts: Llama's linears [out, in]
from tpsim.hf.weights import safetensors_bytes
from tpsim.nn.module import Module
from tpsim.npzfile import CheckpointError, check_model, no_manifest_note, read_npz, write_npz
from tpsim.partition import take_shard
from tpsim.phases import EXPORT

MAX_LISTED = 5  # problems named in one error message; the rest are counted


# --- validation (pure, deterministic: every rank reaches the same verdict) ------------------------------------------
def check_tensors(tensors: dict, shapes: dict[str, tuple[int, ...]], label: str = "tensors") -> None:
    """Raise ``CheckpointError`` unless ``tensors`` has exactly the keys of ``shapes``, those shapes, float dtypes."""
    problems = [f"missing {name} (expected shape {tuple(shape)})" for name, shape in shapes.items()
                if name not in tensors]
    problems += [f"unexpected {name} (not a parameter of this model)" for name in tensors if name not in shapes]
    for name, shape in shapes.items():
        if name not in tensors:
            continue
        a = np.asarray(tensors[name])
        if a.shape != tuple(shape):
            problems.append(f"{name} has shape {a.shape}, expected {tuple(shape)}")
        elif a.dtype.kind != "f":
            problems.append(f"{name} has dtype {a.dtype}, expected a floating-point array")
    _raise_if(problems, label)


def _raise_if(problems: list[str], label: str) -> None:
    if problems:
        more = len(problems) - MAX_LISTED
        listed = "; ".join(problems[:MAX_LISTED]) + (f"; and {more} more" if more > 0 else "")
        raise CheckpointError(f"{label}: {listed}")


# --- gather: shards -> full tensors ---------------------------------------------------------------------------------
def full_tensors(model: Module, tp_group: Group, which: str = "params",
                 shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
    """Every parameter (or gradient) of ``model`` as its full serial tensor, on every TP rank.

    Collective over ``tp_group``: all its ranks must call it. A sharded tensor is all-gathered along its
    Partition dim together with the Partition index (c_attn's columns are not contiguous per rank), placed at
    those master positions, and cut to the true shape of ``shapes`` (default ``model.config.param_shapes()``),
    which drops the vocabulary padding. Replicated tensors are copied. Keys in ``named_parameters`` order;
    collectives are traced as ``scope=<parameter name>, phase="export"``.
    """
    if which not in ("params", "grads"):
        raise ValueError(f"which must be 'params' or 'grads', got {which!r}")
    shapes = model.config.param_shapes() if shapes is None else shapes
    local = dict(model.named_parameters() if which == "params" else model.named_grads())
    return gather_full(local, dict(model.named_partitions()), shapes, tp_group)


def gather_full(local: dict[str, np.ndarray], parts: dict, shapes: dict[str, tuple[int, ...]],
                tp_group: Group) -> dict[str, np.ndarray]:
    """``full_tensors`` for any shard-shaped arrays by parameter name (parameters, gradients, optimizer state):
    ``parts`` the parameters' Partitions, ``shapes`` their true shapes. Collective over ``tp_group``."""
    _check_fits(local, parts, shapes)  # before the first collective, so every rank fails alike
    out = {}
    for name, shard in local.items():
        part = parts[name]
        if part is None:
            out[name] = shard.copy()
            continue
        with tp_group.tracer.region(scope=name, phase=EXPORT):
            gathered = tp_group.all_gather(shard, axis=part.dim)
            index = tp_group.all_gather(np.asarray(part.index, dtype=np.int64), axis=0)
        master = np.zeros(_master_shape(shard.shape, part), dtype=shard.dtype)
        np.moveaxis(master, part.dim, 0)[index] = np.moveaxis(gathered, part.dim, 0)
        out[name] = np.ascontiguousarray(master[tuple(slice(0, n) for n in shapes[name])])
    return out


def _check_fits(local: dict, parts: dict, shapes: dict) -> None:
    """The model's parameters against ``shapes``: same names, and each shard's master covers the true shape."""
    problems = [f"model parameter {name} has no expected shape" for name in local if name not in shapes]
    problems += [f"{name} (expected shape {tuple(s)}) is not a parameter of the model"
                 for name, s in shapes.items() if name not in local]
    for name, a in local.items():
        if name not in shapes:
            continue
        part, expected = parts[name], tuple(shapes[name])
        master = _master_shape(a.shape, part)
        if not _fits(master, expected, None if part is None else part.dim):
            problems.append(f"{name} has master shape {master}, expected {expected}")
    _raise_if(problems, "model does not match the expected shapes")


def _master_shape(shard_shape: tuple, part) -> tuple:
    """The (padded) master's shape: the shard's, with ``part.full`` along the partitioned dim."""
    return shard_shape if part is None else shard_shape[:part.dim] + (part.full,) + shard_shape[part.dim + 1:]


def _fits(master: tuple, expected: tuple, padded_dim: int | None) -> bool:
    """``master == expected``, except that it may be longer (padding) along ``padded_dim``."""
    return len(master) == len(expected) and all(m == e or (d == padded_dim and m > e)
                                                for d, (m, e) in enumerate(zip(master, expected)))


# --- files ----------------------------------------------------------------------------------------------------------
def save_tensors(path, tensors: dict[str, np.ndarray], *, config=None, tp: int | None = None,
                 dp: int | None = None) -> str:
    """Write ``tensors`` to ``path`` as an uncompressed ``.npz`` (keys as given) with its manifest
    (``tpsim.npzfile``: model sizes from ``config``, the ``tp``/``dp`` it was written at, a crc32 per array),
    atomically. Returns the path."""
    return write_npz(path, tensors, config=config, tp=tp, dp=dp)


def _save_json(path, obj) -> str:
    return os.fspath(write_text(path, json.dumps(obj, indent=2) + "\n"))


def _note_on_rank0(text: str) -> None:
    if world_rank() == 0:
        print(text, file=sys.stderr, flush=True)


def load_tensors(path, shapes: dict[str, tuple[int, ...]], *, config=None, note=_note_on_rank0) -> dict[str, np.ndarray]:
    """Read a ``.npz`` written by ``save_tensors`` and check it: readable, its manifest's checksums, the model
    sizes against ``config`` (a GPTConfig, when given), then names/shapes/dtypes against ``shapes``.

    Every rank may read the same file; a bad file raises the same ``CheckpointError`` on every rank, one line
    naming the file and what is wrong. A file without a manifest is loaded when its names and shapes fit, after
    one ``note`` (rank 0 prints it). Returns the arrays in ``shapes`` order.
    """
    label = os.fspath(path)
    tensors, found = read_npz(path)
    check_model(found, config, label)
    check_tensors(tensors, shapes, label if found else f"{label} is not a tpsim checkpoint of this model (no "
                                                       f"manifest, and its arrays do not fit)")
    if found is None and note is not None:
        note(no_manifest_note(label))
    return {name: tensors[name] for name in shapes}


# --- scatter: full tensors -> this rank's shards --------------------------------------------------------------------
def load_into(model: Module, tensors: dict[str, np.ndarray]) -> None:
    """Copy this rank's shard of every full tensor into the model's parameter arrays, in place.

    In place (``param[...] = shard``) keeps every reference valid: the tied LM head still shares the embedding's
    array, an optimizer still holds the arrays it steps. Padded vocabulary rows become zeros; gradients are not
    touched. No communication: each rank reads its master positions from its Partitions.
    """
    check_tensors(tensors, model.config.param_shapes(), "tensors")
    for e in model.named_entries():
        e.param[...] = take_shard(np.asarray(tensors[e.name]), e.partition)


# --- model folders ---------------------------------------------------------------------------------------------
def write_model_folder(out_dir, config, hf_params: dict[str, np.ndarray]) -> dict[str, str]:
    """``config.json`` + ``model.safetensors`` of ``hf_params`` (HF names and layouts, ``to_hf``) in ``out_dir``,
    each file written atomically: what ``from_pretrained``, ``--init-from DIR`` and ``tpsim.generate`` read.
    The step-0 export folder and the demo's ``--save`` both write it; returns the two paths by role."""
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    paths = {"config": os.path.join(out_dir, "config.json"), "safetensors": os.path.join(out_dir, "model.safetensors")}
    _save_json(paths["config"], config.hf_config())
    atomic_write(paths["safetensors"], lambda f: f.write(safetensors_bytes(hf_params)))
    return paths


def save_trained(out_dir, model: Module, tp_group: Group, *, config, write: bool) -> dict[str, np.ndarray]:
    """The demo's ``--save``: the model's full parameters gathered over ``tp_group`` (collective, tracer paused:
    saving is not training traffic), written as a model folder when ``write``; returns the full tensors in tpsim's
    layout (every TP rank has them)."""
    with tp_group.tracer.paused():
        params = full_tensors(model, tp_group, "params", config.param_shapes())
    if write and out_dir:
        write_model_folder(out_dir, config, to_hf(params, config))
    return params


# --- the step-0 export folder ---------------------------------------------------------------------------------------
def export_step0(out_dir, model: Module, tp_group: Group, *, config, input_ids: np.ndarray, labels: np.ndarray,
                 loss: float, write: bool, dp: int = 1, extra: dict | None = None) -> dict[str, str]:
    """Write the Hugging Face-style export folder described in the module docstring; return its paths by role.

    Collective over ``tp_group`` (parameters and gradients are gathered on every TP rank); only a caller with
    ``write=True`` creates files. The model's gradients must be those of the mean ``loss`` over the whole
    ``input_ids``/``labels`` batch. ``extra`` adds keys to ``step0.json``.
    """
    input_ids, labels = np.asarray(input_ids), np.asarray(labels)
    if input_ids.ndim != 2 or labels.shape != input_ids.shape:
        raise ConfigError(f"input_ids and labels must both be [batch, seq]; got {input_ids.shape} and {labels.shape}")
    if input_ids.dtype.kind not in "iu" or labels.dtype.kind not in "iu":
        raise ConfigError(f"input_ids and labels must be integers; got {input_ids.dtype} and {labels.dtype}")
    shapes = config.param_shapes()
    params = full_tensors(model, tp_group, "params", shapes)
    grads = full_tensors(model, tp_group, "grads", shapes)
    return write_step0(out_dir, config, params, grads, input_ids=input_ids, labels=labels, loss=loss,
                       write=write, tp=tp_group.size, dp=dp, extra=extra)


def write_step0(out_dir, config, params: dict[str, np.ndarray], grads: dict[str, np.ndarray], *,
                input_ids: np.ndarray, labels: np.ndarray, loss: float, write: bool, tp: int, dp: int = 1,
                extra: dict | None = None) -> dict[str, str]:
    """The export folder from full tensors in tpsim's layout (however they were gathered: ``export_step0`` over
    TP, ``tpsim.live_pipeline.gather`` over the pipeline too); returns its paths by role, writes only when ``write``."""
    params, grads = to_hf(params, config), to_hf(grads, config)
    input_ids, labels = np.asarray(input_ids), np.asarray(labels)
    out_dir = os.fspath(out_dir)
    paths = {role: os.path.join(out_dir, name) for role, name in
             (("config", "config.json"), ("params", "params.npz"), ("grads", "grads.npz"),
              ("batch", "batch.npz"), ("step0", "step0.json"), ("safetensors", "model.safetensors"))}
    if not write:
        return paths
    write_model_folder(out_dir, config, params)  # config.json + model.safetensors, for from_pretrained
    info = dict(config=config, tp=tp, dp=dp)
    save_tensors(paths["params"], params, **info)
    save_tensors(paths["grads"], grads, **info)
    save_tensors(paths["batch"], {"input_ids": input_ids.astype(np.int64), "labels": labels.astype(np.int64)}, **info)
    dtype = str(next(iter(params.values())).dtype)
    _save_json(paths["step0"], {"loss": float(loss), "tp": tp, "dp": dp, "dtype": dtype,
                                "global_batch": int(input_ids.shape[0]), "seq": int(input_ids.shape[1]),
                                **(extra or {})})
    return paths
