"""``tpsim plot`` and ``tpsim report``: a finished run, read back from the files in its folder (no MPI).

    tpsim plot RUN_DIR [--step N]            redraw loss.png, comm_bytes.png, timeline.png (and a MoE run's experts.png)
    tpsim report RUN_DIR [--step N] [--by module|layer|op] [--rank R]   communication per module, one step
    tpsim report RUN_DIR --by kind [--step N] [--rank R]    where each layer's time goes: matmul, elementwise,
                                                            softmax/norm, waiting, moving bytes, other
    tpsim report RUN_DIR --exposed                          exposed vs hidden DP communication per rank, on the
                                                            virtual clock (a --clock GPU run at dp > 1)

``--step`` defaults to the run's last training step. A folder or file that is missing or malformed is one line
on stderr (``tpsim report: error: ...``) and exit status 2, like a usage error.
"""

from __future__ import annotations

import argparse
import sys

from tpsim.trace.exposed import PIPELINE_JSON, exposed_table, read_dp
from tpsim.trace.kind_split import format_kind_table, kind_split
from tpsim.trace.module_table import BY, module_table
from tpsim.options import OneLineParser, whole
from tpsim.trace.run_folder import (FILES, RunFolderError, check_step, default_step, load_run, run_title,
                                    write_figures)


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def _parser(prog: str, description: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description=description)
    p.add_argument("run_dir", metavar="RUN_DIR", help="output folder of a run (the demo's --out)")
    p.add_argument("--step", type=whole, default=None, help="training step (default: the last one)")
    return p


def _load(args: argparse.Namespace):
    run = load_run(args.run_dir)
    step = default_step(run) if args.step is None else args.step
    check_step(run, step)
    return run, step


def plot_main(argv: list[str]) -> int:
    prog = "tpsim plot"
    args = _parser(prog, "Redraw a run's figures (loss.png, comm_bytes.png, timeline.png) from its "
                         "comm.jsonl, metrics.jsonl and spans.jsonl.").parse_args(argv)
    try:
        run, step = _load(args)
    except RunFolderError as err:
        return _fail(prog, str(err))
    # A figure whose input is absent is skipped with a note: an MLP-scenario run has no metrics or spans.
    if run.metrics is None:
        print(f"{prog}: note: no {FILES['metrics']} in {run.path}: loss.png not drawn", file=sys.stderr)
    span_steps = sorted({s["step"] for s in run.spans or []})
    if step not in span_steps:
        have = f"covers steps {span_steps}" if span_steps else "is missing"
        print(f"{prog}: note: {FILES['spans']} {have}: timeline.png not drawn for step {step}", file=sys.stderr)
    try:
        paths = write_figures(run.path, run.comm, run.metrics, run.spans, step, run.ranks, run_title(run.comm))
    except OSError as err:
        return _fail(prog, f"cannot write into {run.path}: {err.strerror or err}")
    print(f"step {step}: wrote " + ", ".join(str(p) for p in paths))
    return 0


def report_main(argv: list[str]) -> int:
    prog = "tpsim report"
    p = _parser(prog, "Per-module communication of one training step: calls, logical bytes, wire bytes and time "
                      "per rank, forward and backward side by side (like PyTorch's CommDebugMode, with bytes).")
    p.add_argument("--by", choices=(*BY, "kind"), default="module",
                   help="module: the module tree (default); layer: one row per layer; op: one row per collective; "
                        "kind: each layer's time split into matmul, elementwise, softmax/norm, communication "
                        "(waiting vs moving bytes) and other, from spans.jsonl")
    p.add_argument("--rank", type=whole, default=None, help="show one rank instead of the per-rank average")
    p.add_argument("--exposed", action="store_true",
                   help="exposed vs hidden DP communication per rank on the virtual clock (pipeline.json of a "
                        "--clock GPU run at dp > 1; --overlap-grad-reduce hides part of it)")
    args = p.parse_args(argv)
    if args.exposed:
        dp = read_dp(args.run_dir)
        if dp is None:
            return _fail(prog, f"no DP buckets on a virtual clock in {args.run_dir}/{PIPELINE_JSON} (run the demo "
                               "with --clock GPU at dp > 1)")
        print(exposed_table(dp, title=f"Exposed DP communication of {args.run_dir}, last step:"), flush=True)
        return 0
    try:
        run, step = _load(args)
    except RunFolderError as err:
        return _fail(prog, str(err))
    records = [r for r in run.comm if r["step"] == step]
    ranks = sorted({r["rank"] for r in records})
    if args.rank is not None and args.rank not in ranks:
        return _fail(prog, f"rank {args.rank} has no records in step {step} (ranks: {ranks[0]}..{ranks[-1]})")
    if args.by == "kind":
        spans = [s for s in run.spans or [] if s["step"] == step]
        if not spans:
            return _fail(prog, f"no compute spans of step {step} in {run.path} ({FILES['spans']} keeps the last "
                               f"--timeline-steps steps)")
        rows, ranks = kind_split(spans, run.comm, step, rank=args.rank)
        who = f"rank {args.rank}" if args.rank is not None else f"average of {ranks} ranks"
        text = format_kind_table(rows, title=f"Where the time goes in step {step} of {run.path} "
                                             f"({run_title(run.comm)}), {who}:")
        dp = read_dp(run.path)  # a GPU virtual clock at dp > 1: what the modelled step exposes, beside the wall time
        if dp is not None:
            text += "\n\n" + exposed_table(dp, title="On the virtual clock (modelled GPU seconds, last step):")
    else:
        title = f"Communication in step {step} of {run.path} ({run_title(run.comm)}), by {args.by}:"
        text = module_table(records, by=args.by, rank=args.rank, title=title)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `tpsim report DIR | head` is fine
        sys.stderr.close()
    return 0

