"""The guided demo: a tiny GPT trained with data × tensor parallelism, proven equal to the serial model.

    1. the rank grid                      which ranks form each TP and DP group
    2. set-up                             master weights from --seed (or --init-from), the broadcasts of §3.1
                                          of the SenseParrots article
    3. step 0 vs the serial model         loss and every gradient, max difference printed
    4. training                           loss, tokens/s and collective bytes per step
    5. replica consistency                replicated params equal across TP, everything equal across DP
    6. communication table, figures       per layer, phase, op and group; loss.png, comm_bytes.png, comm.jsonl
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.comm.agree import Agreement
from tpsim.compare import relative_difference, shard_differences
from tpsim.data import ReverseTask
from tpsim.config import RunConfig
from tpsim.demo.export_check import check_export
from tpsim.demo.report import closing_lines, grid_label, passed, say, step_table, training_line, write_outputs
from tpsim.demo.serial_twin import broadcast_arrays, final_verdict
from tpsim.demo.tolerances import TOLERANCE  # step 0's, by dtype (pipeline_tour imports it from here too)
from tpsim.demo.trained_model import gather_trained, reverse_lines
from tpsim.demo.cp_check import cp_lines, cp_positions, work_lines
from tpsim.demo.dp_check import overlap_words
from tpsim.demo import training_loop
from tpsim.demo.optimizer_setup import make_sync
from tpsim.demo.resume import read_resume, resume_lines, save_training, serial_start
from tpsim.demo.verify_pass import check_zero_padding
from tpsim.demo.zero_demo import grad_bytes_of
from tpsim.hf.folder import load_init
from tpsim.nn.dropout import DropoutPlan
from tpsim.nn.precision import grad_dtype
from tpsim.tp.random import ExactDropoutRNG
from tpsim.table import human_bytes
from tpsim.trace.records import gather_records, gather_spans
from tpsim.train import broadcast_batch, broadcast_params, check_replicas, compute_grads, dp_slice
from tpsim.hf.checkpoint import export_step0, load_into


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
               f"{sch.seq_len // grid.cp // grid.tp} positions per TP rank)"] if run.parallel.sp else []),
            *cp_lines(grid, run), ""]


def build(grid: ProcessGrid, run: RunConfig, tensors) -> tuple:
    """This rank's shard of the model, replicas made equal (traced as step 0), and its DP gradient sync."""
    model = run.build_model(grid.tp_group, grid.cp_group)
    if tensors is not None:
        load_into(model, tensors)
    grid.tracer.step = 0
    broadcast_params(model, grid)
    grad_sync = make_sync(model, grid, run)  # GradSync, or ZeRO's DistributedOptimizer (--zero 1|2)
    say(grid, f"DP gradient sync: {len(grad_sync.buckets)} bucket(s), "
              f"{human_bytes(grad_sync.total_bytes)} of gradients per rank", "")
    return model, grad_sync


def first_step(grid, model, run: RunConfig, loss, loss_scale=1.0, start: int = 0) -> bool:
    """The first step (0, or ``start`` when resumed): the check against the serial model, the export
    (``--export``), the training banner."""
    say(grid, f"Step {start} against the serial model (same seed, same global batch):")
    ok, text = check_against_serial(grid, model, run, loss, loss_scale, start)
    say(grid, text, "")
    sch, task = run.schedule, task_of(run)
    if run.files.export:
        ids_g, labels_g = task.batch(sch.seed, 0, sch.batch_size)
        paths = export_step0(run.files.export, model, grid.tp_group, config=run.model, input_ids=ids_g,
                             labels=labels_g, loss=loss, write=grid.rank == 0, dp=grid.dp)
        say(grid, f"exported step 0 to {run.files.export}/: {', '.join(Path(p).name for p in paths.values())}")
        read_ok, lines = check_export(grid, run, loss, TOLERANCE[run.precision.dtype], loss_scale)
        say(grid, *lines, "")
        ok = ok and read_ok
    if sch.steps > 0:
        say(grid, training_line(run, start, task.digits))
    return ok


class DataParallelWork:
    """One step's gradients without pipeline stages (``tpsim.demo.training_loop.StepWork``): TP rank 0 reads the
    DP replica's batch (under CP: this rank's tokens of it), one forward and backward, the DP sync."""

    moved = "collectives/rank"

    def __init__(self, grid, model, grad_sync, run: RunConfig) -> None:
        self.grid, self.model, self.grad_sync, self.run = grid, model, grad_sync, run
        self.task, self.positions = task_of(run), cp_positions(model, run.schedule.seq_len)

    def grads(self, step: int, rng, loss_scale: float) -> tuple[float, int, dict]:
        sch = self.run.schedule
        ids, labels, rows = read_batch(self.grid, self.task, sch.seed, step, sch.batch_size, self.positions)
        loss, tokens = compute_grads(self.model, self.grid, self.grad_sync, ids, labels,
                                     plan=DropoutPlan(rng, step, rows), loss_scale=loss_scale)
        return loss, tokens, {}

    def notes(self) -> list[str]:
        opt = self.run.optimizer
        return [overlap_words(self.run, self.grad_sync, self.grid.tracer)] if opt.overlap_grad_reduce or \
            opt.overlap_param_gather else []


def train(grid, model, grad_sync, run: RunConfig, resume=None) -> tuple[list[dict], bool, object]:
    """``--steps`` steps of AdamW (the first checked against serial) by the one loop of
    ``tpsim.demo.training_loop``: each step's metrics, the first step's verdict, the optimizer."""
    return training_loop.train(grid, model, grad_sync, run, DataParallelWork(grid, model, grad_sync, run),
                               first_step, resume)


def gather_and_write(grid, run: RunConfig, metrics, virtual: dict | None = None) -> tuple[list[dict] | None, list[Path]]:
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


def final_report(grid, run: RunConfig, metrics, grad_sync, records, paths, t_start: float) -> bool:
    """Rank 0: the step table, measured vs predicted (FORMULA CHECK), the files; True unless a formula failed."""
    if grid.rank != 0:  # decided on rank 0, which holds every rank's records
        return True
    last = metrics[-1]["step"] if metrics else 0
    print(step_table(records, last, grid.world_size) + "\n")
    from tpsim.predict.formulas import predict_step
    from tpsim.trace.formula_check import compare, format_comparison, formula_verdict

    trained = run.schedule.steps > 0  # the guard measures the norm at every update, clipping or not
    predicted = predict_step(run, clip=trained, update=trained, ddp_buckets=len(grad_sync.buckets),
                             grad_bytes_local=grad_bytes_of(run, grad_sync))
    rows = compare([r for r in records if r["step"] == last], predicted)
    formula_ok, verdict = formula_verdict(rows)
    print(format_comparison(rows, title=f"Measured vs predicted per layer, step {last} (per rank):"), "",
          verdict, "", sep="\n")
    print("wrote " + ", ".join(str(p) for p in paths))
    print(f"done in {time.perf_counter() - t_start:.1f} s", flush=True)
    return formula_ok


def run(demo) -> int:
    """The tour of ``demo.run`` (a ``tpsim.demo.cli.DemoConfig``, validated on every rank before this)."""
    t_start = time.perf_counter()
    run = demo.run
    resume = read_resume(run) if run.files.resume else None  # every rank, before any collective
    tensors = resume.params if resume else load_init(run.files.init_from, run.model) if run.files.init_from else None
    grid = ProcessGrid(tp=run.parallel.tp, dp=run.parallel.dp, cp=run.parallel.cp)
    say(grid, *header(grid, run), *resume_lines(run, resume))
    model, grad_sync = build(grid, run, tensors)
    metrics, ok, optimizer = train(grid, model, grad_sync, run, resume)
    say(grid, *work_lines(grid, model, run))
    grid.tracer.step = metrics[-1]["step"] + 1 if metrics else 1
    replicas = check_replicas(model, grid)  # printed after the final verdict, as it reads best
    # Rank 0 writes the files and figures while the last rank trains the serial twin: two cores busy, not one.
    records, paths = gather_and_write(grid, run, metrics)
    final_ok = final_verdict(grid, model, optimizer, run, metrics)
    say(grid, "", ("OK: " if replicas.ok else "FAILED: ") + replicas.summary(), "")
    padding_ok = True
    if run.parallel.zero_stage.shards_optimizer:  # the run's buckets never pad at these sizes: check one that pads
        padding_ok, lines = check_zero_padding(grid, run)
        say(grid, *lines, "")
    trained = gather_trained(grid, model, run)  # untraced; --save writes it (rank 0)
    if run.files.save:
        save_training(grid, model, optimizer, run)  # untraced: the optimizer state and the position
    formula_ok = final_report(grid, run, metrics, grad_sync, records, paths, t_start)
    if grid.rank == 0:
        say(grid, *reverse_lines(run, trained), "")
    first = metrics[0]["step"] if metrics else 0  # > 0 when resumed
    checks = {f"step {first} = serial": ok, "trained = serial": final_ok, "replicas agree": replicas.ok,
              **({f"ZeRO-{run.parallel.zero} padding": padding_ok}
                 if run.parallel.zero_stage.shards_optimizer else {}), "formulas": formula_ok}
    say(grid, *closing_lines(grid, run.schedule.steps, metrics, run.files.out, checks))
    return 0 if passed(checks) else 1  # a check that cannot decide fails nothing
