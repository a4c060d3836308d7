"""The guided demo: a tiny model trained with TP × CP × DP × PP, proven equal to the serial model.

Every layout runs the same way: the model cut into pipeline stages (one stage at ``--pp 1``), each rank's action
list (``tpsim.pipeline``, the DP collectives placed on it by ``with_collectives``) run by the executor
(``tpsim.live_pipeline``), micro-batch by micro-batch. At ``--pp 1`` that list is one stage's F and B (and the
collectives on them): Megatron-LM's "no pipelining" step, through the same executor. The pipeline's own reports
(its stages, the peak in flight, the bubble, the p2p bytes, ``pipeline.json``) are printed where there is a
pipeline or a clock to price it (``--pp > 1`` or ``--clock GPU``):

    1. the rank grid                      TP fastest, then CP, DP, pipeline stages outermost; every group
    2. set-up                             each stage's layers from the serial master (--seed or --init-from), the
                                          broadcasts of §3.1 of the SenseParrots article
    3. step 0 vs the serial model         loss and every gradient of every stage, max difference printed
    4. training                           the schedule's action lists on every rank, micro-batch by micro-batch
    5. replica consistency                per stage: replicated params equal across TP, all equal across DP
    6. the pipeline                       peak micro-batches in flight per stage vs the schedule's formula
                                          (``tpsim.predict.pipeline``; interleaved: (micro-batch, chunk) pairs)
    7. communication table, FORMULA CHECK every collective and every send/recv, per rank, against the formulas
    8. the bubble                         on the live virtual clock (``tpsim.live_pipeline.clock``). ``--clock unit``: F
                                          1, B 2 a stage (zb-h1: B 1, W 1), 1/v of that a chunk, messages free,
                                          vs (p − 1)/(v·m + p − 1) (zb-h1: (p − 1)/(3m + p − 1)) exactly;
                                          ``--clock GPU``: the planner's costs of this layout (``tpsim.plan.of_run``),
                                          the makespan and the step (the collectives around
                                          the schedule included) vs the planner's to 1e-12,
                                          the unit formula beside it with why the two differ;
                                          ``pipeline.json`` and the "virtual clock" tracks of ``timeline.json``
"""

from __future__ import annotations

import json
import time
from pathlib import Path


from tpsim.comm import ProcessGrid
from tpsim.config import RunConfig
from tpsim.demo.cp_check import cp_positions, work_lines
from tpsim.demo.dp_check import dp_check, overlap_words, stream_of, tp_overlap_lines
from tpsim.demo.export_check import check_export
from tpsim.demo import training_loop
from tpsim.demo.tolerances import TOLERANCE
from tpsim.demo.tour_parts import check_against_serial, gather_and_write, header, task_of
from tpsim.demo.optimizer_setup import make_sync
from tpsim.demo.pipeline_checks import activation_check, bubble_check, p2p_formula, p2p_sent, pipeline_check
from tpsim.demo.report import closing_lines, passed, say, step_table, training_line
from tpsim.demo.resume import read_resume, resume_lines, save_training
from tpsim.demo.serial_twin import final_verdict
from tpsim.demo.trained_model import reverse_lines
from tpsim.demo.verify_pass import check_zero_padding
from tpsim.demo.zero_demo import grad_bytes_of, held_of
from tpsim.hf.checkpoint import load_into, to_hf, write_model_folder, write_step0
from tpsim.hf.folder import load_init
from tpsim.pipeline.collectives import with_collectives
from tpsim.pipeline.schedules import build as build_schedule
from tpsim.config.clock_choice import UNIT_CLOCK
from tpsim.plan.of_run import clock_costs, clock_words
from tpsim.live_pipeline.buckets import bucket_specs
from tpsim.config import has_experts
from tpsim.ep.record import collect as collect_routing, routing_lines
from tpsim.live_pipeline.build import build_pipeline
from tpsim.live_pipeline.data import stage_batch
from tpsim.live_pipeline.executor import Executor
from tpsim.live_pipeline.gather import gather_stages
from tpsim.live_pipeline.step import pipeline_grads
from tpsim.table import human_bytes
from tpsim.train import broadcast_params, check_replicas


def staged(run: RunConfig) -> bool:
    """Does the tour report the pipeline (its stages, in flight, bubble, p2p bytes)? Where there is one, or a GPU
    clock to price the one stage's actions; a plain ``--pp 1`` run reports as a data-parallel step does."""
    return run.parallel.pp > 1 or run.pipeline.clock != UNIT_CLOCK


def stage_lines(run: RunConfig, shard) -> list[str]:
    """The pipeline in words: schedule, micro-batches, and which layers each stage holds."""
    pipe, par, names = run.pipeline, run.parallel, run.model.layer_names
    chunks = f" x {pipe.vp} model chunks" if pipe.vp > 1 else ""
    lines = [f"pipeline: {pipe.schedule} schedule over {par.pp} stages{chunks}, {pipe.microbatches} micro-batches "
             f"of {run.micro_batch} sequences per DP rank per step"]
    for i, layers in enumerate(shard.stage_layers):
        ends = (["embedding"] if i == 0 else []) + [f"{names.block}.{layers[0]}..{layers[-1]}"] + \
            (["final norm, LM head, loss"] if i == len(shard.stage_layers) - 1 else [])
        where = f"virtual stage {i} (rank {i % par.pp}'s chunk {i // par.pp})" if pipe.vp > 1 else f"stage {i}"
        lines.append(f"  {where}: " + " + ".join(ends) + f" ({len(layers)} layer{'s' * (len(layers) != 1)})")
    return lines + [""]


def build(grid: ProcessGrid, run: RunConfig, tensors):
    """This rank's stage (replicas made equal, traced as step 0), its DP gradient sync and the executor."""
    shard = build_pipeline(run, grid)
    if tensors is not None:
        load_into(shard, tensors)
    grid.tracer.step = 0
    broadcast_params(shard, grid)
    grad_sync = make_sync(shard, grid, run)
    schedule = with_collectives(build_schedule(run.pipeline.schedule, grid.pp, run.pipeline.microbatches,
                                               run.pipeline.vp), run.parallel.zero_stage)  # DP's, as actions
    s = run.schedule.seq_len // grid.cp  # a CP rank's tokens
    s = s // grid.tp if run.parallel.sp else s
    boundary = (run.micro_batch, s, run.model.hidden)
    executor = Executor(schedule, shard.chunks, grid.pp_group, boundary, run.precision.numpy,
                        costs=clock_costs(run, schedule, boundary, run.precision.numpy))
    where = " on rank 0's stage" if staged(run) else ""
    say(grid, *(stage_lines(run, shard) if staged(run) else []),
        f"DP gradient sync{where}: {len(grad_sync.buckets)} bucket(s), {human_bytes(grad_sync.total_bytes)} of "
        "gradients per rank", "")
    return shard, grad_sync, executor


def first_step(grid, shard, run: RunConfig, loss: float, loss_scale: float = 1.0, start: int = 0) -> bool:
    """Step 0: every stage against the serial model; ``--export``: the stages gathered to rank 0, written, read
    back; the training banner."""
    say(grid, f"Step {start} against the serial model (same seed, same global batch):")
    ok, text = check_against_serial(grid, shard, run, loss, loss_scale, start)
    say(grid, text, "")
    sch = run.schedule
    if run.files.export:
        params, grads = gather_stages(shard, grid, "params"), gather_stages(shard, grid, "grads")
        ids, labels = task_of(run).batch(sch.seed, 0, sch.batch_size)
        if grid.rank == 0:  # the one rank that holds every stage's tensors
            paths = write_step0(run.files.export, run.model, params, grads, input_ids=ids, labels=labels,
                                loss=loss, write=True, tp=grid.tp, dp=grid.dp,
                                extra={"pp": grid.pp} if grid.pp > 1 else None)
            said = " (every stage's tensors, gathered)" if grid.pp > 1 else ""
            names = ", ".join(Path(p).name for p in paths.values())
            say(grid, f"exported step 0 to {run.files.export}/{said}: {names}")
        read_ok, lines = check_export(grid, run, loss, TOLERANCE[run.precision.dtype], loss_scale)
        say(grid, *lines, "")
        ok = ok and read_ok
    if sch.steps > 0:
        say(grid, training_line(run, start, task_of(run).digits))
    return ok


class PipelineWork:
    """One step's gradients through the pipeline (``tpsim.demo.training_loop.StepWork``): this stage's batch, the
    schedule's micro-batches through the executor, the DP sync; it keeps the largest number of micro-batches this
    rank held at once (``peak``), the last step's ``ExecutorResult`` (``last``) and the virtual-clock spans of the
    steps the timeline keeps (``virtual``: ``{step: spans}``)."""

    def __init__(self, grid, shard, grad_sync, executor, run: RunConfig) -> None:
        self.grid, self.shard, self.grad_sync, self.executor, self.run = grid, shard, grad_sync, executor, run
        self.moved = "moved by rank 0" if grid.pp > 1 else "collectives/rank"  # stages differ; without, ranks alike
        self.task, self.mine = task_of(run), cp_positions(shard.chunks[0], run.schedule.seq_len)  # CP: tokens here
        self.peak, self.last, self.virtual = 0, None, {}
        self.experts, self.routing = has_experts(run.model), None  # the step's routing (tpsim.ep.record), rank 0

    def grads(self, step: int, rng, loss_scale: float) -> tuple[float, int, dict]:
        sch, task = self.run.schedule, self.task
        ids, labels, rows = stage_batch(self.grid, lambda: task.batch(sch.seed, step, sch.batch_size), sch.batch_size,
                                        sch.seq_len, self.mine)
        loss, tokens, result = pipeline_grads(self.shard, self.executor, self.grid, self.grad_sync, ids, labels,
                                              rows=rows, rng=rng, step=step, loss_scale=loss_scale)
        self.peak, self.last = max(self.peak, result.peak_in_flight), result
        self.routing = collect_routing(self.shard, self.grid) if self.experts else None  # rank 0's: the world's
        if step >= max(sch.steps, 1) - self.run.files.timeline_steps:  # the compute stream's spans, then the comm's
            self.virtual[step] = [tuple(span) for span in result.clock.spans + result.clock.comm_spans()]
        return loss, tokens, ({"dp_exposed_s": result.clock.dp.exposed} if result.clock.dp is not None else {}) | (
            self.routing.metrics() if self.routing is not None else {})

    def notes(self) -> list[str]:
        """Without a clock to price them: what the overlap flags did (``overlap_words``); with one, the DP
        OVERLAP CHECK says it."""
        opt = self.run.optimizer
        experts = routing_lines(self.routing) if self.routing is not None else []
        if self.run.pipeline.clock != UNIT_CLOCK or not (opt.overlap_grad_reduce or opt.overlap_param_gather):
            return experts
        return [overlap_words(self.run, self.grad_sync, self.grid.tracer), *experts]


def per_stage(grid: ProcessGrid, value) -> list | None:
    """``value`` of every stage's rank in rank 0's pipeline group, on rank 0 (None elsewhere); untraced."""
    with grid.tracer.paused():
        return grid.pp_group.gather_objects(value, root=0)


def final_report(grid, run: RunConfig, metrics, stage_sync, records, paths, t_start: float, routing=None) -> bool:
    """Rank 0: the step table, measured vs predicted with every stage (FORMULA CHECK), the p2p bytes, the files."""
    if grid.rank != 0:
        return True
    from tpsim.predict.pipeline_comm import p2p_bytes_formula, predict_pipeline_step
    from tpsim.trace.formula_check import compare, format_comparison, formula_verdict

    last = metrics[-1]["step"] if metrics else 0
    print(step_table(records, last, grid.world_size) + "\n")
    trained = run.schedule.steps > 0
    predicted = predict_pipeline_step(run, clip=trained, update=trained, buckets=[s[0] for s in stage_sync],
                                      grad_bytes=[s[1] for s in stage_sync], held=[s[2] for s in stage_sync],
                                      routing=routing)
    step_records = [r for r in records if r["step"] == last]
    rows = compare(step_records, predicted)
    formula_ok, verdict = formula_verdict(rows)
    over = f", averaged over the {grid.pp} stages" if grid.pp > 1 else ""
    print(format_comparison(rows, title=f"Measured vs predicted per layer, step {last} (per rank{over}):"), "",
          verdict, "", sep="\n")
    p2p_ok = True
    if staged(run):
        chain = set(grid.pp_group.ranks)
        sent, want = p2p_sent(grid, step_records, last), p2p_bytes_formula(run)
        p2p_ok = sent == want
        print(f"P2P CHECK: {'MATCH' if p2p_ok else 'MISMATCH'} — ranks {sorted(chain)} (one DP replica, one TP rank) "
              f"sent {sent:,} bytes in step {last}; {p2p_formula(run)} = {want:,}", "", sep="\n")
    print("wrote " + ", ".join(str(p) for p in paths))
    print(f"done in {time.perf_counter() - t_start:.1f} s", flush=True)
    return formula_ok and p2p_ok


def pipeline_report(grid, run: RunConfig, stage_reports, timing, dp_streams, records, metrics,
                    paths: list[Path]) -> bool:
    """Rank 0: the peak in flight, the activations held, the bubble and the DP overlap against their formulas, and
    ``pipeline.json`` (appended to ``paths``); True when every check holds."""
    pipe_ok, line = pipeline_check(grid, run, [r[2] for r in stage_reports])
    held_ok, held_line = activation_check(run, [r[4] for r in stage_reports])
    bubble_ok, bubble_line, doc = bubble_check(grid, run, timing, records, metrics[-1]["step"] if metrics else 0,
                                               [r[5] for r in stage_reports])
    dp_ok, dp_lines, doc["dp"] = dp_check(grid, run, dp_streams, [r[5] for r in stage_reports])
    paths.append(Path(run.files.out) / "pipeline.json")
    paths[-1].write_text(json.dumps(doc, indent=1) + "\n")
    say(grid, "", line, held_line, bubble_line, *dp_lines, *tp_overlap_lines(run), "")
    return pipe_ok and held_ok and bubble_ok and dp_ok


def run(demo) -> int:
    """The tour of ``demo.run`` (validated on every rank before this): any layout, ``--pp 1`` included."""
    t_start, run = time.perf_counter(), demo.run
    resume = read_resume(run) if run.files.resume else None  # every rank, before any collective
    tensors = resume.params if resume else load_init(run.files.init_from, run.model) if run.files.init_from else None
    grid = ProcessGrid(tp=run.parallel.tp, dp=run.parallel.dp, pp=run.parallel.pp, cp=run.parallel.cp,
                       ep=run.experts.ep if has_experts(run.model) else None, etp=run.experts.etp)
    say(grid, *header(grid, run), *resume_lines(run, resume))
    shard, grad_sync, executor = build(grid, run, tensors)
    work = PipelineWork(grid, shard, grad_sync, executor, run)  # the one loop, this layout's step (training_loop)
    metrics, ok, optimizer = training_loop.train(grid, shard, grad_sync, run, work, first_step, resume)
    peak, result, virtual = work.peak, work.last, work.virtual
    say(grid, *work_lines(grid, shard.chunks[0], run))  # CP: rank 0's CP group, its stage's layers
    grid.tracer.step = metrics[-1]["step"] + 1 if metrics else 1
    replicas = check_replicas(shard, grid)  # each stage its own parameters
    stage_reports = per_stage(grid, (replicas.ok, replicas.summary(), peak,
                                     (len(grad_sync.buckets), grad_bytes_of(run, grad_sync), held_of(grad_sync)),
                                     result.peak_layer_bytes, bucket_specs(shard, grad_sync, held=True)))
    with grid.tracer.paused():
        timing = grid.world.gather_objects((grid.rank, grid.pp_rank, result.clock.schedule_end, result.clock.busy,
                                            peak, result.peak_layer_bytes, result.clock.time))
        dp_streams = grid.world.gather_objects((grid.rank, grid.pp_rank, stream_of(result.clock, run)))
    chains = per_stage(grid, virtual)  # rank 0's pipeline: one virtual-clock track per pipeline rank
    tracks = None  # the virtual clock's tracks for timeline.json, where the tour reports the pipeline
    if chains is not None and staged(run):
        tracks = {"clock": clock_words(run), "seconds": run.pipeline.clock != UNIT_CLOCK,
                  "ranks": list(grid.pp_group.ranks), "tracks": chains}
    records, paths = gather_and_write(grid, run, metrics, virtual=tracks)
    final_ok = final_verdict(grid, shard, optimizer, run, metrics)
    replicas_ok, pipe_ok = True, True
    if grid.rank == 0:
        replicas_ok = all(r[0] for r in stage_reports)
        stage = [f"stage {i}: " for i in range(grid.pp)] if grid.pp > 1 else [""]
        say(grid, "", *[("OK: " if r[0] else "FAILED: ") + stage[i] + r[1] for i, r in enumerate(stage_reports)],
            *([] if staged(run) else [""]))
        if staged(run):
            pipe_ok = pipeline_report(grid, run, stage_reports, timing, dp_streams, records, metrics, paths)
    padding_ok = True
    if run.parallel.zero_stage.shards_optimizer:
        padding_ok, lines = check_zero_padding(grid, run)
        say(grid, *lines, "")
    trained = gather_stages(shard, grid)  # untraced; --save writes it (rank 0)
    if grid.rank == 0 and run.files.save:
        write_model_folder(run.files.save, run.model, to_hf(trained, run.model))
    if run.files.save:
        save_training(grid, shard, optimizer, run)  # untraced: every stage's optimizer state, the position
    formula_ok = final_report(grid, run, metrics, [r[3] for r in stage_reports] if grid.rank == 0 else None,
                              records, paths, t_start, work.routing)
    if grid.rank == 0:
        say(grid, *reverse_lines(run, trained), "")
    first = metrics[0]["step"] if metrics else 0  # > 0 when resumed
    checks = {f"step {first} = serial": ok, "trained = serial": final_ok, "replicas agree": replicas_ok,
              **({"peak in flight and bubble": pipe_ok} if staged(run) else {}),
              **({f"ZeRO-{run.parallel.zero} padding": padding_ok}
                 if run.parallel.zero_stage.shards_optimizer else {}),
              "formulas": formula_ok}
    say(grid, *closing_lines(grid, run.schedule.steps, metrics, run.files.out, checks))
    return 0 if passed(checks) else 1  # a check that cannot decide fails nothing
