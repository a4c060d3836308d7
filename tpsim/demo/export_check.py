"""The demo's ``--export`` read back: the folder it wrote, loaded as a user would load it, must be the same model.

Writing a checkpoint proves nothing about reading it: a projection stored transposed in the Hugging Face layout
(square for GPT-2's c_proj, so every shape still fits) is written, loaded and trained without a complaint. So
after ``export_step0`` the writing rank loads the folder back the way ``--init-from DIR`` does (config.json +
model.safetensors, ``tpsim.hf.folder.load_init``), builds the serial model from it, and runs step 0's forward and
backward on the same global batch and dropout masks:

    loss(reloaded)  vs  step0.json's loss (the parallel run's)     relative, the step-0 tolerance of the dtype
    ∇(reloaded)     vs  grads.npz (the parallel run's, gathered)   relative to each tensor's largest value

Under float16 the exported gradients carry the loss scale S (the backward started from S·dloss), so the
reloaded model's backward starts from the same S. The result reaches every rank in one untraced broadcast,
so every rank agrees on the verdict.
"""

from __future__ import annotations

import os

from tpsim.compare import relative_difference
from tpsim.config import RunConfig
from tpsim.data import ReverseTask
from tpsim.demo.serial_twin import broadcast_arrays
from tpsim.hf.checkpoint import load_into
from tpsim.hf.folder import load_init
from tpsim.nn.dropout import DropoutPlan
from tpsim.tp.random import ExactDropoutRNG


def reload_step0(run: RunConfig, loss_scale: float) -> list:
    """On the writing rank: ``[loss, worst gradient difference]`` of the model read back from ``--export``."""
    config, sch, folder = run.model, run.schedule, run.files.export
    serial = run.serial_model()
    load_into(serial, load_init(folder, config))
    ids, labels = ReverseTask(config.vocab, sch.seq_len).batch(sch.seed, 0, sch.batch_size)
    serial.zero_grad()
    loss, cache = serial.forward(ids, labels, DropoutPlan(ExactDropoutRNG(sch.seed), 0))
    serial.backward(loss_scale, cache)
    written = load_init(os.path.join(folder, "grads.npz"), config, note=None)
    worst = max(relative_difference(g, written[name], floor=1e-30) for name, g in serial.named_grads())
    return [loss, worst]


def check_export(grid, run: RunConfig, parallel_loss: float, tolerance: float, loss_scale: float = 1.0):
    """``(ok, lines)``: the export read back against step 0 (see the module docstring), agreed on every rank."""
    if run.dropout > 0 and run.schedule.dropout_rng == "megatron":
        return True, ["  read back: not checked — Megatron dropout masks depend on the shard, so no serial "
                      "model draws step 0's masks"]
    loss, worst = broadcast_arrays(grid, [(), ()], lambda: reload_step0(run, loss_scale), root=0)
    d_loss = relative_difference(float(loss), parallel_loss, floor=0.0)
    ok = bool(d_loss <= tolerance and worst <= tolerance)
    return ok, [f"  read back from {run.files.export}/ as a serial model: loss {float(loss):.12f} (relative "
                f"|Δ| {d_loss:.2e} from step 0's), gradients vs grads.npz within {float(worst):.2e}",
                f"VERDICT: {'MATCH' if ok else 'MISMATCH'} — the export "
                f"{'reloads to' if ok else 'does not reload to'} the model that was trained "
                f"(tolerance {tolerance:g}, {run.precision.dtype})"]
