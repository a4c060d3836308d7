"""Command line of the demo: flags, validation on every rank, and the choice of TP × DP.

Invalid values raise ``ConfigError`` on every rank before any collective; ``run_main`` prints it once and
exits 2 on all ranks (one line, no traceback, no hang). Flags are stable: later features add, never rename.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from math import gcd

from tpsim.arch import architecture
from tpsim.comm.launch import world_size
from tpsim.config import (Experts, Files, OptimizerSettings, Parallelism, Pipeline, Precision, RunConfig, Schedule,
                          has_experts)
from tpsim.zero_stage import ZERO_STAGES
from tpsim.errors import ConfigError
from tpsim.paths import check_input_file, check_output_dir
from tpsim.live_pipeline.split import parse_stage_layers
from tpsim.demo.arguments import cp_arguments, clock_arguments, file_arguments, model_arguments, overlap_arguments
from tpsim.demo.expert_arguments import expert_arguments, with_experts
from tpsim.options import RankZeroParser, count, non_negative, positive, whole


DEFAULT_BATCH = 16
DESCRIPTION = ("Tensor parallelism on real MPI ranks: the rank grid, a check against the serial model, training, "
               "and where every byte of communication goes.")
DEFAULT_DROPOUT = 0.1  # gpt2: the verdicts against the serial model cover dropout (exact RNG)


def build_parser() -> RankZeroParser:
    p = RankZeroParser(prog="python -m tpsim.demo", description=DESCRIPTION)
    p.add_argument("--scenario", choices=["gpt", "mlp", "partial-fc"], default="gpt",
                   help="gpt: train a tiny GPT with DP x TP (default); mlp: one parallel MLP step; "
                        "partial-fc: the InsightFace way vs the Megatron way")
    g = p.add_argument_group("grid")
    g.add_argument("--tp", type=count, default=None, help="tensor-parallel size (default: gcd(world, 4))")
    g.add_argument("--dp", type=count, default=None, help="data-parallel size (default: world / tp)")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron-SP: LayerNorm/dropout/residual regions split along the sequence over the TP "
                        "group (--seq-len must divide by tp)")
    g.add_argument("--tp-comm-overlap", action="store_true",
                   help="with --sequence-parallel and --tp > 1: SP's all-gather / reduce-scatter split into "
                        "chunks pipelined with the GEMMs beside them (bit-identical to the run without it; on the "
                        "virtual clock only the exposed part is charged)")
    g.add_argument("--pp", type=count, default=1,
                   help="pipeline stages (default 1); the ranks are TP fastest, then DP, stages outermost")
    g.add_argument("--microbatches", type=count, default=None,
                   help="micro-batches per DP rank per step with --pp > 1 (default: pp)")
    g.add_argument("--schedule", default="1f1b",
                   help="pipeline schedule: afab (GPipe: all forwards, then all backwards), 1f1b (default), "
                        "interleaved (1F1B over --vp model chunks per rank) or zb-h1 (1F1B with every backward "
                        "split into B, the input gradient, and W, the weight gradient, run later)")
    g.add_argument("--vp", type=count, default=1,
                   help="model chunks per pipeline rank, --schedule interleaved (default 1): chunk c of rank r is "
                        "virtual stage c*pp + r; --microbatches must be a multiple of --pp when vp > 1")
    g.add_argument("--pp-layers", default=None, metavar="A,B,...",
                   help="layers of every pipeline stage (pp x vp sizes in virtual-stage order), summing to "
                        "--layers (default: an even split)")
    cp_arguments(g)
    clock_arguments(g)
    model_arguments(p.add_argument_group("model"))
    expert_arguments(p.add_argument_group("experts (--arch mixtral)"))
    t = p.add_argument_group("training")
    t.add_argument("--batch-size", type=count, default=None,
                   help="global batch, sequences per step (default: 16, rounded up to a multiple of dp)")
    t.add_argument("--steps", type=whole, default=100,
                   help="training steps in total (default 100); with --resume, the run goes on from the saved step "
                        "to this one")
    t.add_argument("--lr", type=positive, default=3e-3, help="AdamW learning rate (default 3e-3)")
    t.add_argument("--clip", type=non_negative, default=1.0, help="max global grad norm, 0 = off (default 1.0)")
    t.add_argument("--max-skipped-steps", type=whole, default=3,
                   help="stop (exit 1) after this many consecutive steps skipped for a non-finite loss or "
                        "gradient norm (default 3)")
    t.add_argument("--bucket-mb", type=non_negative, default=25.0,
                   help="DP gradient bucket size in MiB (0 = per tensor)")
    t.add_argument("--zero", type=int, choices=ZERO_STAGES, default=0,
                   help="1: ZeRO-1, Megatron's distributed optimizer: gradients reduce-scattered over DP, AdamW "
                        "state for this rank's 1/dp slice only, parameters all-gathered; 2: ZeRO-2, only that "
                        "slice of the gradients kept too, each bucket reduce-scattered as the backward finishes it "
                        "(default 0: plain DP)")
    overlap_arguments(t)
    t.add_argument("--loss-scale-interval", type=count, default=1000,
                   help="float16: clean steps before the loss scale doubles (default 1000)")
    t.add_argument("--seed", type=whole, default=1234, help="seed of the master weights, data and dropout")
    t.add_argument("--tokens", type=count, default=32, help="tokens per TP group (mlp scenario)")
    t.add_argument("--classes", type=count, default=1003, help="classes of the classifier (partial-fc scenario)")
    file_arguments(p.add_argument_group("input / output"))
    return p


def choose_grid(world: int, tp: int | None, dp: int | None, pp: int = 1, cp: int = 1) -> tuple[int, int]:
    """Fill in whichever of tp/dp is missing; default TP is gcd(world, 4): 8 ranks → TP 4 × DP 2. With ``pp``
    stages, tp × dp fills each stage's world / pp ranks; with ``cp``, tp × dp fills world / cp."""
    for name, v in (("--tp", tp), ("--dp", dp), ("--pp", pp), ("--cp", cp)):
        if v is not None and v < 1:
            raise ConfigError(f"{name} must be >= 1, got {v}")
    if cp > 1:
        if world % cp:
            raise ConfigError(f"world size {world} is not divisible by --cp {cp}")
        try:
            return choose_grid(world // cp, tp, dp, pp)
        except ConfigError as err:
            raise ConfigError(f"{err} (with --cp {cp}: world {world} = tp x cp x dp x pp)") from None
    if pp > 1:
        if world % pp:
            raise ConfigError(f"world size {world} is not divisible by --pp {pp}")
        try:
            return choose_grid(world // pp, tp, dp)
        except ConfigError as err:
            raise ConfigError(f"{err} in each of the {pp} pipeline stages (world {world} = tp x dp x pp)") from None
    if tp is None and dp is None:
        tp = gcd(world, 4)
    if tp is None:
        if world % dp:
            raise ConfigError(f"world size {world} is not divisible by --dp {dp}")
        tp = world // dp
    if dp is None:
        if world % tp:
            raise ConfigError(f"world size {world} is not divisible by --tp {tp} (world must equal tp x dp)")
        dp = world // tp
    if tp * dp != world:
        raise ConfigError(f"--tp {tp} x --dp {dp} = {tp * dp} does not match the world size {world} "
                          f"(launch with mpirun -n {tp * dp})")
    return tp, dp


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs: the scenario and its ``RunConfig`` (grid, model, precision, optimizer, schedule, files);
    ``tokens`` and ``classes`` size the mlp and partial-fc scenarios."""

    scenario: str
    run: RunConfig
    tokens: int = 32
    classes: int = 1003


def _default_batch(args: argparse.Namespace, dp: int) -> int:
    """16 sequences, rounded up so every DP rank (every rank for partial-fc) gets some; with ``--resume``, the
    checkpoint's global batch where it splits over this layout (the batch an uninterrupted run goes on with;
    otherwise the run names the change)."""
    if args.batch_size is not None:
        return args.batch_size
    unit = world_size() if args.scenario == "partial-fc" else dp * _microbatches(args)
    if args.resume and args.scenario not in ("mlp", "partial-fc") and os.path.isdir(args.resume):
        from tpsim.demo.resume import read_position
        saved = int(read_position(args.resume)["batch_size"])
        if saved % unit == 0:
            return saved
    return unit * -(-DEFAULT_BATCH // unit)


def _microbatches(args: argparse.Namespace) -> int:
    """``--microbatches``, default pp (one per stage: the smallest m that fills a 1F1B pipeline)."""
    return args.microbatches if args.microbatches is not None else args.pp


def _model(args: argparse.Namespace):
    """The chosen architecture's config from the shared size flags (its own defaults for what is not given)."""
    config_class = architecture(args.arch).config
    dropout = (DEFAULT_DROPOUT if config_class.has_dropout else 0.0) if args.dropout is None else args.dropout
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"--dropout must be in [0, 1), got {dropout}")
    return with_experts(config_class.from_sizes(
        vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads, max_positions=args.seq_len,
        dropout=dropout, kv_heads=args.kv_heads, ffn=args.ffn if args.ffn is not None else args.moe_ffn), args)


def config_from(args: argparse.Namespace) -> DemoConfig:
    """Validate every flag (on every rank, before any collective) into one frozen ``DemoConfig``."""
    tp, dp = choose_grid(world_size(), args.tp, args.dp, args.pp, args.cp)
    if args.pp > 1 and args.scenario in ("mlp", "partial-fc"):  # the scenarios without a model to cut
        raise ConfigError(f"--pp {args.pp}: only --scenario gpt runs a pipeline, not {args.scenario}")
    batch_size = _default_batch(args, dp)
    for name in ("layers", "hidden", "heads", "vocab", "seq_len", "tokens", "classes"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    precision = Precision(args.dtype, loss_scale_interval=args.loss_scale_interval)
    schedule = Schedule(batch_size=batch_size, seq_len=args.seq_len, steps=args.steps, seed=args.seed,
                        dropout_rng=args.dropout_rng)
    files = Files(out=args.out, export=args.export, init_from=args.init_from, timeline_steps=args.timeline_steps,
                  save=args.save, resume=args.resume)
    if args.cp > 1 and args.scenario in ("mlp", "partial-fc"):
        raise ConfigError(f"--cp {args.cp} cuts a GPT's sequences: it needs --scenario gpt, not {args.scenario}")
    if args.tp_comm_overlap and args.scenario in ("mlp", "partial-fc"):
        raise ConfigError(f"--tp-comm-overlap pipelines a GPT's sequence-parallel collectives: it needs --scenario "
                          f"gpt, not {args.scenario}")
    if args.save and args.scenario in ("mlp", "partial-fc"):  # only the gpt scenario trains a model
        raise ConfigError(f"--save writes the trained GPT: it needs --scenario gpt, not {args.scenario}")
    if args.resume and args.scenario in ("mlp", "partial-fc"):
        raise ConfigError(f"--resume continues a trained GPT: it needs --scenario gpt, not {args.scenario}")
    optimizer = OptimizerSettings(lr=args.lr, clip=args.clip, bucket_mb=args.bucket_mb,
                                  max_skipped_steps=args.max_skipped_steps,
                                  overlap_grad_reduce=args.overlap_grad_reduce,
                                  overlap_param_gather=args.overlap_param_gather)
    model = _model(args)
    pipeline = Pipeline(schedule=args.schedule, microbatches=_microbatches(args), vp=args.vp,
                        stage_layers=parse_stage_layers(args.pp_layers), clock=args.clock, mfu=args.mfu)
    sp = args.sequence_parallel or (tp > 1 and has_experts(model))  # experts need it under TP: said in the header
    run = RunConfig(model, Parallelism(tp=tp, dp=dp, pp=args.pp, sp=sp, zero=args.zero,
                                       tp_comm_overlap=args.tp_comm_overlap, cp=args.cp, cp_comm=args.cp_comm,
                                       cp_layout=args.cp_layout),
                    precision, optimizer, schedule, files, pipeline,
                    Experts(ep=args.ep, etp=args.etp, dispatcher=args.dispatcher))
    check_paths(files)
    if files.resume:
        from tpsim.demo.resume import check_resume
        check_resume(run)  # every refusal of --resume, before any work
    return DemoConfig(args.scenario, run, tokens=args.tokens, classes=args.classes)


def parse(argv: list[str] | None = None) -> DemoConfig:
    return config_from(build_parser().parse_args(sys.argv[1:] if argv is None else argv))


def check_paths(files: Files) -> None:
    """Every file the run will write or read, checked on every rank before the first collective."""
    check_output_dir(files.out, "--out")
    if files.export:
        check_output_dir(files.export, "--export")
    if files.save:
        check_output_dir(files.save, "--save")
    if files.init_from:
        check_input_file(files.init_from, "--init-from", folder_with="config.json")
    if files.resume:
        if not os.path.isdir(files.resume):
            raise ConfigError(f"--resume {files.resume}: not a folder (a --save folder is expected)")
        check_input_file(files.resume, "--resume", folder_with="config.json")


def main(argv: list[str] | None = None) -> int:
    demo = parse(argv)
    # imported after parsing so --help and flag errors stay fast
    if demo.scenario == "mlp":
        from tpsim.demo.mlp_tour import run
    elif demo.scenario == "partial-fc":
        from tpsim.demo.partial_fc import run
    else:  # every layout, pp 1 too: one stage's schedule through the executor
        from tpsim.demo.tour import run
    return run(demo)
