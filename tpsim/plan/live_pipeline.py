"""The pipeline side of ``tpsim plan --validate``: one rank of a small live pipeline (run under ``mpiexec``).

    mpiexec -n N python -m tpsim.plan.live_pipeline --tp T --dp D --pp P --schedule S [--vp V] --microbatches M
                                                    --layers L [--sp [--tp-comm-overlap]] [--arch gpt2|llama]
                                                    --clock GPU --json PATH

Builds the toy GPT (or Llama) of ``tpsim.plan.live`` with L layers (float64; the GPT's dropout 0.1), cut into pp ×
vp stages (``tpsim.live_pipeline``), and runs one traced training step of m micro-batches of 2 sequences per DP replica,
the live virtual clock charging the planner's costs of the run's layout on GPU, its collectives included
(``tpsim.plan.of_run.clock_costs``); ``--zero 1``, ``--bucket-mb`` and ``--overlap grad|both``
(``--overlap-grad-reduce``, and ``--overlap-param-gather``) set its DP sync. Every rank measures: its clock at the
end of its schedule and at the end of the step (after the DP sync), its busy time and the collectives' part of it,
the most micro-batches (interleaved: (micro-batch, chunk) pairs) it held at once and the most bytes of layer
activations they kept (``tpsim.live_pipeline.in_flight``), the bytes it sent point to point and the bytes of the tied
embedding's gradient all-reduce (scope the embedding's path, phase dp_sync), both from the step's trace; at dp > 1 its
DP buckets (``tpsim.live_pipeline.buckets.bucket_specs``), the exposed DP seconds of its comm stream and (ZeRO-1) of the
parameter all-gather. Rank 0 writes every rank's numbers to PATH.
"""

from __future__ import annotations

import json
from pathlib import Path

from tpsim.config import OptimizerSettings, Parallelism, Pipeline, Precision, RunConfig, Schedule
from tpsim.phases import DP_SYNC
from tpsim.plan.live import ROWS_PER_REPLICA, SEED, toy_config
from tpsim.options import OneLineParser, count, non_negative


def pipeline_run(tp: int, dp: int, pp: int, schedule: str, vp: int, microbatches: int, layers: int,
                 clock: str, sp: bool = False, arch: str = "gpt2", tp_comm_overlap: bool = False, *, zero: int = 0,
                 overlap: str = "", bucket_mb: float = 25.0) -> RunConfig:
    """The live run of one pipeline case: what the worker runs and what the planner prices (``run_layout``).
    ``ConfigError`` for a pipeline the live ranks cannot run (e.g. a schedule that splits the backward)."""
    from tpsim.plan.of_run import model_spec

    toy = toy_config(arch)
    model = model_spec(toy).config(layers=layers, dropout=getattr(toy, "dropout", 0.0))
    rows = ROWS_PER_REPLICA * microbatches * dp
    if overlap not in ("", "grad", "both"):
        raise ValueError(f"overlap {overlap!r}: '', 'grad' or 'both'")
    optimizer = OptimizerSettings(bucket_mb=bucket_mb, overlap_grad_reduce=bool(overlap),
                                  overlap_param_gather=overlap == "both")
    return RunConfig(model, Parallelism(tp=tp, dp=dp, pp=pp, sp=sp, zero=zero, tp_comm_overlap=tp_comm_overlap),
                     Precision("float64"), optimizer=optimizer,
                     schedule=Schedule(batch_size=rows, seq_len=model.max_positions, steps=1, seed=SEED),
                     pipeline=Pipeline(schedule, microbatches, vp, clock=clock))


def dp_sync(shard, grid, run: RunConfig):
    """The run's DP gradient sync over ``shard``: DDP's ``GradSync``, or ZeRO's optimizer (AdamW) at the run's
    stage, at its bucket cap and overlap flags, the tied embedding's bucket held for the embedding group's sum."""
    from tpsim.train import AdamW, GradSync
    from tpsim.train.zero import DistributedOptimizer

    opt = run.optimizer
    held = (shard.shared_embedding.grads["weight"],) if shard.shared_embedding is not None else ()
    if run.parallel.zero_stage.shards_optimizer:
        return DistributedOptimizer(AdamW(shard), grid, opt.bucket_cap_bytes,
                                    overlap_grad_reduce=opt.overlap_grad_reduce,
                                    overlap_param_gather=opt.overlap_param_gather, held=held,
                                    stage=run.parallel.zero)
    return GradSync(shard, grid.dp_group, opt.bucket_cap_bytes, overlap=opt.overlap_grad_reduce, held=held)


def one_step(run: RunConfig, grid):
    """One traced training step of ``run`` on ``grid`` (its ``ProcessGrid``), from a fresh build: this rank's
    ``ExecutorResult`` (its virtual clock included), its shard and its DP sync (None at dp 1)."""
    import numpy as np

    from tpsim.pipeline.schedules import build
    from tpsim.plan.of_run import clock_costs
    from tpsim.live_pipeline.build import build_pipeline
    from tpsim.live_pipeline.data import stage_batch
    from tpsim.live_pipeline.executor import Executor
    from tpsim.live_pipeline.step import pipeline_grads
    from tpsim.tp.random import make_dropout_rng

    par, pipe, sch = run.parallel, run.pipeline, run.schedule
    shard = build_pipeline(run, grid)
    schedule = build(pipe.schedule, par.pp, pipe.microbatches, pipe.vp)
    seq = sch.seq_len // par.tp if par.sp else sch.seq_len  # SP: the boundary is this TP rank's [b, s/t, h]
    boundary, dtype = (run.micro_batch, seq, run.model.hidden), run.precision.numpy
    executor = Executor(schedule, shard.chunks, grid.pp_group, boundary, dtype,
                        costs=clock_costs(run, schedule, boundary, dtype))
    sync = dp_sync(shard, grid, run) if par.dp > 1 or par.zero_stage.shards_optimizer else None
    ids = np.random.default_rng(SEED).integers(0, run.model.vocab, (sch.batch_size, sch.seq_len))
    rng = make_dropout_rng(sch.dropout_rng, sch.seed, grid.tp_rank)
    grid.tracer.reset()
    mine, labels, rows = stage_batch(grid, lambda: (ids, np.roll(ids, -1, axis=1)), sch.batch_size, sch.seq_len)
    result = pipeline_grads(shard, executor, grid, sync, mine, labels, rows=rows, rng=rng, step=0)[2]
    return result, shard, sync


def worker(run: RunConfig, path: str) -> int:
    from tpsim.comm import ProcessGrid

    par = run.parallel
    grid = ProcessGrid(tp=par.tp, dp=par.dp, pp=par.pp)
    from tpsim.live_pipeline.buckets import bucket_specs

    result, shard, sync = one_step(run, grid)
    events = list(grid.tracer.events)
    embedding = run.model.layer_names.embed
    tied = [e for e in events if e.scope == embedding and e.phase == DP_SYNC and e.group == "embedding"]
    measured = {"rank": grid.rank, "pp_rank": grid.pp_rank, "dp_rank": grid.dp_rank, "tp_rank": grid.tp_rank,
                "clock_end": result.clock.time, "schedule_end": result.clock.schedule_end,
                "clock_busy": result.clock.busy, "clock_collectives": result.clock.comm,
                "peak_in_flight": result.peak_in_flight, "peak_layer_bytes": result.peak_layer_bytes,
                "p2p_sent": sum(e.bytes for e in events if e.op == "send"),
                "embedding_bytes": sum(e.bytes for e in tied), "embedding_wire": sum(e.wire_bytes for e in tied)}
    if sync is not None:  # the run's own DP buckets and how much of their time the clock exposes
        measured["buckets"] = [list(b) for b in bucket_specs(shard, sync, held=True)]
        measured["dp_exposed"] = result.clock.dp.exposed if result.clock.dp is not None else 0.0
        measured["gather_exposed"] = result.clock.gather_exposed
        measured["sharded_exposed"] = result.clock.sharded_exposed  # ZeRO-3's collectives inside the actions
    everyone = grid.world.gather_objects(measured)
    if grid.rank == 0:
        Path(path).write_text(json.dumps(everyone))
    return 0


if __name__ == "__main__":
    parser = OneLineParser(prog="python -m tpsim.plan.live_pipeline", description=__doc__.splitlines()[0])
    for name, default in (("tp", 1), ("dp", 1), ("pp", 2), ("vp", 1), ("microbatches", 4), ("layers", 4)):
        parser.add_argument(f"--{name}", type=count, default=default)
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--sp", action="store_true")
    parser.add_argument("--tp-comm-overlap", action="store_true")
    parser.add_argument("--arch", default="gpt2")
    parser.add_argument("--clock", default="h100-80gb")
    parser.add_argument("--json", required=True)
    parser.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3))
    parser.add_argument("--overlap", default="", choices=["", "grad", "both"])
    parser.add_argument("--bucket-mb", type=non_negative, default=25.0)
    args = parser.parse_args()
    from tpsim.comm.launch import run_main

    live = pipeline_run(args.tp, args.dp, args.pp, args.schedule, args.vp, args.microbatches, args.layers, args.clock,
                        args.sp, args.arch, args.tp_comm_overlap, zero=args.zero, overlap=args.overlap,
                        bucket_mb=args.bucket_mb)
    run_main(lambda: worker(live, args.json), prog="tpsim.plan.live_pipeline")
