"""The demo's training checkpoints: ``--save DIR`` writes one, ``--resume DIR`` continues it on any layout.

A ``--save`` folder holds the trained model (config.json + model.safetensors, ``tpsim.demo.trained_model``) and,
written after it, what training needs to go on as if it had never stopped:

    optimizer.safetensors   the full, unsharded optimizer state by Hugging Face parameter name and layout:
                            exp_avg.<name>, exp_avg_sq.<name> (AdamW's m and v) and, for a 16-bit run,
                            main_param.<name> (the float32 main parameters); the state's dtype (float32 for
                            16 bits); gathered over DP (ZeRO-1), TP and the stages (``tpsim.train.checkpoint``)
    training_state.json     the position: the step reached (the next one to run), AdamW's settings and step
                            count, the loss scaler's state, the seed, the batch, the model config and dtype,
                            the layout that wrote it, the size and crc32 of the two .safetensors files

Each file is written atomically, the JSON last: a folder whose JSON reads is complete, and the checksums catch
files of two different saves. Each step's batch and dropout masks are drawn from (seed, step) alone, so a run
that restores the parameters, the state and the step draws exactly what the uninterrupted run would have.

``check_resume`` refuses, on every rank before any work (one line, exit 2), a folder this run cannot continue:
no optimizer state, another model or dtype, ``--steps`` not beyond the step reached. Training settings that
differ from the saved ones (``SETTINGS``: seed, batch, lr, clip, ...) are allowed and named (``resume_lines``):
such a run continues, but not as the saved one would have (without ``--batch-size`` the demo's command line
takes the saved batch where it splits over the new layout). The layout may be anything. Not saved: the count of
consecutive skipped steps (``--max-skipped-steps``), which restarts at 0.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import asdict, dataclass

import numpy as np

from tpsim.atomic import atomic_write, write_text
from tpsim.config import RunConfig
from tpsim.errors import ConfigError

TRAINING_STATE = "training_state.json"
OPTIMIZER_STATE = "optimizer.safetensors"
MODEL = "model.safetensors"
FORMAT, VERSION = "tpsim training state", 1
SETTINGS = ("seed", "batch_size", "dropout_rng", "lr", "clip", "weight_decay", "loss_scale_interval")


@dataclass(frozen=True)
class Resume:
    """A checkpoint read back: ``step`` the first step to run, ``step_count`` AdamW's updates so far (fewer than
    ``step`` when steps were skipped), full ``params`` (tpsim's names and layout) and ``state`` by
    ``tpsim.train.checkpoint.state_key``, ``loss_scaler`` float16's state (else None), ``position`` the JSON."""

    folder: str
    step: int
    step_count: int
    loss_scaler: dict | None
    params: dict
    state: dict
    position: dict


def _settings(run: RunConfig) -> dict:
    sch, opt = run.schedule, run.optimizer
    return {"seed": sch.seed, "batch_size": sch.batch_size, "dropout_rng": sch.dropout_rng, "lr": opt.lr,
            "clip": opt.clip, "weight_decay": opt.weight_decay,
            "loss_scale_interval": run.precision.loss_scale_interval}


def _crc(path) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    return {"bytes": len(data), "crc32": zlib.crc32(data)}


# --- --save ---------------------------------------------------------------------------------------------------------
def save_training(grid, model, optimizer, run: RunConfig) -> None:
    """Collective (untraced): the optimizer state gathered to rank 0, which writes optimizer.safetensors and then
    training_state.json into ``run.files.save`` (where the model folder was just written)."""
    from tpsim.hf.layout import to_hf
    from tpsim.hf.weights import safetensors_bytes
    from tpsim.train.checkpoint import gather_state, state_slots

    state = gather_state(model, optimizer, grid)
    if grid.rank != 0:
        return
    folder, rule, slots = run.files.save, optimizer.rule, state_slots(optimizer, model)
    names = list(run.model.param_shapes())
    hf = {f"{slot}.{name}": a for slot in slots
          for name, a in to_hf({n: state[f"{slot}.{n}"] for n in names}, run.model).items()}
    atomic_write(os.path.join(folder, OPTIMIZER_STATE), lambda f: f.write(safetensors_bytes(hf)))
    par, pipe = run.parallel, run.pipeline
    position = {
        "format": FORMAT, "version": VERSION, "step": run.schedule.steps,
        "arch": run.model.arch, "dtype": run.precision.dtype, "model": asdict(run.model),
        "seq_len": run.schedule.seq_len, **_settings(run),
        "optimizer": {"rule": type(rule).__name__, "lr": rule.lr, "betas": list(rule.betas), "eps": rule.eps,
                      "weight_decay": rule.weight_decay, "step_count": optimizer.step_count, "slots": slots},
        "loss_scaler": None if optimizer.loss_scaler is None else optimizer.loss_scaler.state_dict(),
        "written_by": {"tp": par.tp, "dp": par.dp, "pp": par.pp, "cp": par.cp, "zero": par.zero,
                       "sequence_parallel": par.sp,
                       "schedule": pipe.schedule if par.pp > 1 else None, "vp": pipe.vp,
                       "microbatches": pipe.microbatches if par.pp > 1 else None},
        "files": {MODEL: _crc(os.path.join(folder, MODEL)),
                  OPTIMIZER_STATE: _crc(os.path.join(folder, OPTIMIZER_STATE))}}
    write_text(os.path.join(folder, TRAINING_STATE), json.dumps(position, indent=1) + "\n")


# --- --resume: the checks before any work ---------------------------------------------------------------------------
def read_position(folder: str) -> dict:
    """training_state.json of ``folder``, checked for its format; ``ConfigError`` (one line) otherwise."""
    path = os.path.join(folder, TRAINING_STATE)
    if not os.path.isfile(path) or not os.path.isfile(os.path.join(folder, OPTIMIZER_STATE)):
        raise ConfigError(f"--resume {folder}: no optimizer state ({TRAINING_STATE} and {OPTIMIZER_STATE}, "
                          f"written by --save); a folder of parameters alone can start a run (--init-from "
                          f"{folder}), not continue one")
    try:
        with open(path, encoding="utf-8") as f:
            position = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--resume {folder}: {TRAINING_STATE} cannot be read ({exc})") from None
    if not isinstance(position, dict) or position.get("format") != FORMAT or position.get("version") != VERSION:
        raise ConfigError(f"--resume {folder}: {TRAINING_STATE} is not a tpsim training state of version {VERSION}")
    return position


def check_resume(run: RunConfig) -> dict:
    """Every refusal of ``--resume`` (one ``ConfigError`` line, the same on every rank); the position if none."""
    folder, sch = run.files.resume, run.schedule
    if run.files.init_from:
        raise ConfigError("--resume and --init-from both say where the parameters come from: give one "
                          "(--resume DIR restores the optimizer and the step too)")
    if run.files.export:
        raise ConfigError("--export writes step 0's tensors, and a resumed run has no step 0: drop --export")
    position = read_position(folder)
    model = run.model
    if position["arch"] != model.arch:
        raise ConfigError(f"--resume {folder}: the checkpoint is --arch {position['arch']}, this run --arch "
                          f"{model.arch}")
    if position["dtype"] != run.precision.dtype:
        raise ConfigError(f"--resume {folder}: the checkpoint trained in --dtype {position['dtype']}, this run asks "
                          f"for {run.precision.dtype} (its optimizer state and loss scaler belong to that dtype)")
    mine = asdict(model)
    differ = [f"{k} {position['model'].get(k)} (this run: {v})" for k, v in mine.items()
              if position["model"].get(k) != v]
    if differ:
        raise ConfigError(f"--resume {folder}: another model — the checkpoint has " + ", ".join(differ))
    if sch.steps <= position["step"]:
        raise ConfigError(f"--resume {folder}: the checkpoint reached step {position['step']} and --steps "
                          f"{sch.steps} is the total to reach, so nothing is left to train (e.g. --steps "
                          f"{position['step'] + sch.steps})")
    return position


def read_resume(run: RunConfig) -> Resume:
    """Every rank: the checkpoint's parameters and optimizer state, checked against this run (before any work)."""
    from tpsim.hf.folder import load_init
    from tpsim.hf.names import to_internal
    from tpsim.hf.weights import read_safetensors
    from tpsim.nn.precision import grad_dtype
    from tpsim.train.checkpoint import check_state

    folder = run.files.resume
    position = check_resume(run)
    for name, want in position["files"].items():
        if _crc(os.path.join(folder, name)) != want:
            raise ConfigError(f"--resume {folder}: {name} is not the file {TRAINING_STATE} was written with (size or "
                              "crc32 differ): the folder mixes two saves")
    params = load_init(folder, run.model)
    raw, slots = read_safetensors(os.path.join(folder, OPTIMIZER_STATE)), position["optimizer"]["slots"]
    state = {}
    for slot in slots:
        mine = {k[len(slot) + 1:]: a for k, a in raw.items() if k.startswith(slot + ".")}
        label = f"--resume {folder}: {OPTIMIZER_STATE} ({slot})"
        state.update({f"{slot}.{n}": a for n, a in to_internal(mine, run.model, label=label).items()})
    label = f"--resume {folder}: {OPTIMIZER_STATE}"
    check_state(state, slots, run.model.param_shapes(), grad_dtype(run.precision.numpy), label)
    return Resume(folder, int(position["step"]), int(position["optimizer"]["step_count"]), position["loss_scaler"],
                  params, state, position)


def restore(model, optimizer, resume: Resume | None) -> int:
    """This rank's optimizer state from ``resume`` (no communication); the first step to run (0 without one)."""
    if resume is None:
        return 0
    from tpsim.train.checkpoint import load_state, state_slots

    if state_slots(optimizer, model) != resume.position["optimizer"]["slots"]:
        raise ConfigError(f"--resume {resume.folder}: the checkpoint's optimizer state "
                          f"{resume.position['optimizer']['slots']} does not fit this run's "
                          f"{state_slots(optimizer, model)}")
    load_state(model, optimizer, resume.state, step_count=resume.step_count, loss_scaler=resume.loss_scaler)
    return resume.step


def resume_lines(run: RunConfig, resume: Resume | None) -> list[str]:
    """What rank 0 says of the checkpoint: where it comes from, and every training setting that differs."""
    if resume is None:
        return []
    p, w = resume.position, resume.position["written_by"]
    cp = w.get("cp", 1)  # folders written before context parallelism have no "cp"
    layout = (f"TP {w['tp']}" + (f" x CP {cp}" if cp > 1 else "") + f" x DP {w['dp']}"
              + (f" x PP {w['pp']}" if w["pp"] > 1 else "")
              + (f" (vp {w['vp']})" if w["vp"] > 1 else "") + (f" ZeRO-{w['zero']}" if w["zero"] else ""))
    lines = [f"resumed from {resume.folder}/ at step {resume.step} (written by {layout}; AdamW step count "
             f"{resume.step_count}" + (f", loss scale {p['loss_scaler']['scale']:g}" if p["loss_scaler"] else "")
             + f"): training continues to step {run.schedule.steps}"]
    changed = [f"--{k.replace('_', '-')} {v} (saved: {p[k]})" for k, v in _settings(run).items() if p[k] != v]
    if changed:
        lines.append("  changed since the save: " + ", ".join(changed) + " — the run goes on, but not as the "
                     "saved one would have")
    return lines + [""]


# --- the serial twins start where the run starts -------------------------------------------------------------------
def serial_start(run: RunConfig, serial) -> tuple[int, int, list[np.ndarray] | None, list[np.ndarray] | None]:
    """Load the run's starting parameters into the serial model (``--init-from`` or ``--resume``); ``(first step,
    AdamW step count, exp_avg, exp_avg_sq)`` in ``serial.named_parameters()`` order (None, None: zeros)."""
    from tpsim.hf.checkpoint import load_into
    from tpsim.hf.folder import load_init

    if run.files.init_from:
        load_into(serial, load_init(run.files.init_from, run.model, note=None))
    if not run.files.resume:
        return 0, 0, None, None
    resume = read_resume(run)
    load_into(serial, resume.params)
    names = [name for name, _ in serial.named_parameters()]
    m = [resume.state[f"exp_avg.{n}"].copy() for n in names]
    v = [resume.state[f"exp_avg_sq.{n}"].copy() for n in names]
    return resume.step, resume.step_count, m, v
