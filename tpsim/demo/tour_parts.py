"""The parts of the guided demo (``tpsim.demo.tour``) that do not depend on how the model is cut:

    task_of, read_batch       the data: the reverse task, TP rank 0 reading its DP slice (its CP tokens) and the
                              broadcast over TP (§3.1 of the SenseParrots article)
    serial_reference          the serial model's loss and gradients at the first step, computed once on rank 0
    check_against_serial      the first step's loss and every gradient shard against them: the MATCH verdict
    header                    the grid, the model's sizes, SP and CP: what rank 0 prints first
    gather_and_write          every rank's records and spans to rank 0, which writes the run's files and figures
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.comm.agree import Agreement
from tpsim.compare import relative_difference, shard_differences
from tpsim.data import ReverseTask
from tpsim.config import RunConfig
from tpsim.demo.report import grid_label, write_outputs
from tpsim.demo.serial_twin import broadcast_arrays
from tpsim.demo.tolerances import TOLERANCE  # step 0's, by dtype
from tpsim.demo.cp_check import cp_lines
from tpsim.demo.resume import serial_start
from tpsim.nn.dropout import DropoutPlan
from tpsim.nn.precision import grad_dtype
from tpsim.tp.random import ExactDropoutRNG
from tpsim.trace.records import gather_records, gather_spans
from tpsim.train import broadcast_batch, dp_slice


def task_of(run: RunConfig) -> ReverseTask:
    """The data: the reverse task over the model's vocabulary, sequences of the run's length."""
    return ReverseTask(run.model.vocab, run.schedule.seq_len)


def read_batch(grid: ProcessGrid, task: ReverseTask, seed: int, step: int, batch_size: int, positions=None):
    """TP rank 0 reads the global batch and keeps its DP slice (under CP: the tokens at ``positions`` of it);
    the TP group gets it by broadcast (the SenseParrots article §3.1)."""
    rows = dp_slice(batch_size, grid.dp, grid.dp_rank)
    positions = np.arange(task.seq_len) if positions is None else positions
    local = (batch_size // grid.dp, len(positions))
    if grid.tp_rank == 0:
        ids, labels = task.batch(seed, step, batch_size)
        ids, labels = ids[rows][:, positions], labels[rows][:, positions]
    else:  # only the shape matters here: the broadcast fills it
        ids, labels = np.zeros(local, np.int64), np.zeros(local, np.int64)
    ids, labels = broadcast_batch(grid, ids, labels)
    return ids, labels, np.arange(batch_size)[rows]


def serial_reference(grid, run: RunConfig, loss_scale=1.0) -> tuple[float, dict[str, np.ndarray]]:
    """The serial model's loss and full gradients at the run's first step (0, or the step ``--resume`` starts
    at, from its parameters) on the global batch, computed on rank 0 only and
    broadcast in one flat buffer (``broadcast_arrays``): every rank gets the same numbers it used to compute
    itself, and a world of 64 ranks on a few cores does the serial model once instead of 64 times."""
    config, seed, dtype = run.model, run.schedule.seed, run.precision.numpy
    shapes = config.param_shapes()

    def step0() -> list:
        serial = run.serial_model()
        start = serial_start(run, serial)[0]
        ids, labels = task_of(run).batch(seed, start, run.schedule.batch_size)
        serial.zero_grad()  # the backward starts from float16's loss scale, as the parallel one did
        loss, cache = serial.forward(ids, labels, DropoutPlan(ExactDropoutRNG(seed), start))
        serial.backward(loss_scale, cache)
        return [loss, *(g for _, g in serial.named_grads())]

    loss, *grads = broadcast_arrays(grid, [(), *shapes.values()], step0)
    return float(loss), {name: g.astype(grad_dtype(dtype), copy=False) for name, g in zip(shapes, grads)}


def check_against_serial(grid, model, run: RunConfig, parallel_loss, loss_scale=1.0,
                         start: int = 0) -> tuple[bool, str]:
    """The first step's (0, or ``start`` when resumed) loss and gradients (already DP-synced in ``model``) vs the
    serial model on the global batch."""
    if run.dropout > 0 and run.schedule.dropout_rng == "megatron":
        return True, "  (skipped: Megatron dropout masks depend on the shard, so they never equal serial's)"
    loss, serial_grads = serial_reference(grid, run, loss_scale)
    diffs = shard_differences(model, serial_grads, floor=1e-30)
    worst_name = max(diffs, key=diffs.get)
    worst = diffs[worst_name]
    both = Agreement(grid.world).reduce([relative_difference(parallel_loss, loss, floor=0.0), worst], op="max")
    tol = TOLERANCE[run.precision.dtype]
    ok = bool(np.all(both <= tol))
    lines = [f"  serial loss {loss:.12f}   max relative |Δloss| over ranks {both[0]:.2e}",
             f"  max relative |Δgrad| over every parameter shard on every rank {both[1]:.2e}"
             + (f" (rank {grid.rank}'s largest: {worst_name})" if worst > 0 else ""),
             f"VERDICT: {'MATCH' if ok else 'MISMATCH'} — {grid_label(grid)} step {start} "
             f"{'equals' if ok else 'differs from'} the serial model "
             f"{'within' if ok else 'by more than'} {tol:g} ({run.precision.dtype}, {len(serial_grads)} parameters)"]
    return ok, "\n".join(lines)


def header(grid: ProcessGrid, run: RunConfig) -> list[str]:
    """The grid, the model's sizes and the sequence-parallel line: what rank 0 prints first."""
    sch = run.schedule
    return [grid.table(), "",
            f"{run.model.describe(grid.tp)}, vocab {run.model.vocab}, seq {sch.seq_len}, "
            f"global batch {sch.batch_size} ({run.local_batch} per DP rank), {run.precision.dtype}, "
            f"dropout {run.dropout} ({sch.dropout_rng} RNG)",
            *(["sequence parallel: on (LayerNorm/dropout regions split along the sequence, "
               f"{sch.seq_len // grid.cp // grid.tp} positions per TP rank"
               + ("; experts under TP need it, so it is on" if grid.experts is not None else "") + ")"]
              if run.parallel.sp else []),
            *cp_lines(grid, run), ""]


def gather_and_write(grid, run: RunConfig, metrics,
                     virtual: dict | None = None) -> tuple[list[dict] | None, list[Path]]:
    """Every rank's records and spans to rank 0, which writes the run's files and figures (silently: the lines
    come with ``final_report``); ``(records, paths)`` on rank 0, ``(None, [])`` elsewhere. ``virtual``: a
    pipeline's virtual-clock tracks for timeline.json (``tpsim.trace.timeline.virtual_clock_events``)."""
    records = gather_records(grid.tracer, grid.world)
    spans = gather_spans(grid.tracer, grid.world, last_steps=run.files.timeline_steps)
    if grid.rank != 0:
        return None, []
    last = metrics[-1]["step"] if metrics else 0
    return records, write_outputs(Path(run.files.out), records, metrics, grid.world_size, last,
                                  title=grid_label(grid).replace("(", " ").replace(")", ""), spans=spans,
                                  virtual=virtual)
