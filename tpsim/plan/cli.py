"""``tpsim plan``: memory, communication and time of a real-size layout, from the formulas the live runs check.

    tpsim plan --model NAME | --config config.json --tp T --pp P --dp D [--sp] [--zero 0|1|2|3]
               [--cp C] [--cp-comm ring|allgather|ulysses] [--cp-layout zigzag|contiguous]
               [--recompute none|selective|full] --seq-len S --micro-batch b --global-batch B
               [--schedule afab|1f1b|interleaved|zb-h1] [--vp V] [--pp-layers a,b,...]
               [--dtype bfloat16|float16|float32|fp8] [--attention unfused|fused] [--gpu h100-80gb|...]
               [--gpus-per-node N] [--mfu F | --gemm-efficiency F --hbm-efficiency F]
               [--overlap-grad-reduce] [--overlap-param-gather] [--tp-comm-overlap] [--bucket-mb MB] [--json]
               [--figure step.png]   where the step goes, and the error to expect (``tpsim.plan.step_figure``)
    tpsim plan --model NAME --gpus N --search [...] [--top 10] [--json]
    tpsim plan --validate          live runs check every per-layer term (``tpsim.plan.validate``)
    tpsim plan --published         18 published runs' step times beside the planner's (``tpsim.plan.published``),
                                   then NeMo's 10 FP8 runs apart (``tpsim.plan.published_fp8``)
    tpsim plan --zero-example      the ZeRO paper's 7.5 B on 64 GPUs, stages 0-3, beside the planner's bytes

Pure arithmetic, no MPI (``--validate`` launches ``mpiexec`` in a subprocess). ``--json`` prints one JSON object
as the last line (README, "Planning a real run", documents every field). A bad layout: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tpsim.config import dtype_alias
from tpsim.cp.choice import CP_COMMS, CP_LAYOUTS
from tpsim.errors import ConfigError
from tpsim.pipeline.schedules import SCHEDULES
from tpsim.gpus import GPUS
from tpsim.plan.kernel_time import FP8_GEMM_SPEEDUP, GEMM_EFFICIENCY, HBM_EFFICIENCY
from tpsim.plan.layout import ATTENTION, DTYPE_CHOICES, DTYPES, FP8_RECIPES, PLANNED_ZERO_STAGES, RECOMPUTE, Layout
from tpsim.plan.models import PRESETS, resolve
from tpsim.options import OneLineParser, count, fraction, non_negative, run_command, speedup


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="tpsim plan", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(PRESETS), help="a published model")
    p.add_argument("--config", help="a Hugging Face GPT-2 or Llama config.json instead of --model")
    for name, default in (("tp", 1), ("pp", 1), ("dp", 1)):
        p.add_argument(f"--{name}", type=count, default=default, help=f"{name.upper()} size (default {default})")
    p.add_argument("--sp", action="store_true", help="sequence parallelism (Korthikanti et al. 2022)")
    p.add_argument("--cp", type=count, default=1, help="context parallelism: every sequence cut over CP ranks "
                   "(default 1)")
    p.add_argument("--cp-comm", default="ring", choices=CP_COMMS,
                   help="how attention reaches the other shards: ring (K/V passed around, overlapped with the "
                        "blocks; default), allgather (K/V gathered first, Llama 3's), ulysses (all-to-all to heads)")
    p.add_argument("--cp-layout", default="zigzag", choices=CP_LAYOUTS,
                   help="zigzag (2 x cp chunks, causal work balanced; default) or contiguous (the last rank busiest)")
    p.add_argument("--zero", type=int, default=0, choices=PLANNED_ZERO_STAGES, help="ZeRO stage: 1 the optimizer "
                   "sharded over dp x cp, 2 the gradients too, 3 the parameters too (gathered piece by piece)")
    p.add_argument("--recompute", default="none", choices=RECOMPUTE)
    p.add_argument("--seq-len", type=count, default=None,
                   help="tokens per sequence (default: the model's maximum, at most 8192)")
    p.add_argument("--micro-batch", type=count, default=1, help="sequences per micro-batch (default 1)")
    p.add_argument("--global-batch", type=count, default=512, help="sequences per step (default 512)")
    p.add_argument("--schedule", default="1f1b", choices=list(SCHEDULES),
                   help="pipeline schedule, run on the virtual clock (default 1f1b)")
    p.add_argument("--vp", type=count, default=1, help="model chunks per pipeline rank (--schedule interleaved)")
    p.add_argument("--pp-layers", metavar="a,b,...",
                   help="layers of each (virtual) stage, in model order (default: equal stages)")
    p.add_argument("--dtype", default="bfloat16", choices=[*DTYPE_CHOICES, "fp8"],
                   metavar="{" + ",".join(DTYPES) + ",fp8}",
                   help="bfloat16 (default; bf16), float16 (fp16) or float32 (fp32): Megatron's bytes per parameter; "
                        "fp8: bfloat16 with the layers' matmuls in FP8 and their casts (Hopper, Blackwell)")
    p.add_argument("--fp8-recipe", default="delayed", choices=FP8_RECIPES,
                   help="--dtype fp8: how the scales are found, which sets what each cast moves: delayed (amax "
                        "history; default), current (this tensor's amax, one more read), blockwise (1x128 tiles, "
                        "DeepSeek-V3's), mxfp8 (32-element E8M0 blocks; Blackwell)")
    p.add_argument("--fp8-gemm-speedup", type=speedup, default=None,
                   help="--dtype fp8: an FP8 GEMM's rate over the 16-bit GEMM's, 1 to 2 (default: the fitted "
                        f"{FP8_GEMM_SPEEDUP:.2f}, tpsim.plan.kernel_time)")
    p.add_argument("--attention", default="unfused", choices=ATTENTION,
                   help="fused: a flash-style attention kernel, no s x s scores kept (default unfused)")
    p.add_argument("--gpu", default="h100-80gb", choices=list(GPUS))
    p.add_argument("--gpus-per-node", "--nvlink-domain", type=count, default=None, dest="gpus_per_node",
                   help="GPUs one NVLink domain joins (default: the GPU's, 8, or 72 for gb200/gb300)")
    p.add_argument("--mfu", type=fraction, default=None,
                   help="every matmul at this fraction of peak, other kernels free (default: each kernel from its "
                        "shape, tpsim.plan.kernel_time)")
    p.add_argument("--gemm-efficiency", type=fraction, default=None, help="the kernel model's matmul efficiency "
                   f"(default: the fitted {GEMM_EFFICIENCY:.2f})")
    p.add_argument("--hbm-efficiency", type=fraction, default=None, help="its memory-bandwidth efficiency "
                   f"(default: the fitted {HBM_EFFICIENCY:.2f})")
    _overlap_and_modes(p)
    return p


def _overlap_and_modes(p: argparse.ArgumentParser) -> None:
    """The overlap flags (Megatron-LM's), the search and the modes that print something else."""
    o = p.add_argument_group("overlap (Megatron-LM's flags)")
    o.add_argument("--overlap-grad-reduce", action="store_true",
                   help="DP gradient buckets reduced during the last micro-batch's backward")
    o.add_argument("--overlap-param-gather", action="store_true",
                   help="ZeRO-1/2's parameter all-gather hidden under the next forward (needs --zero 1 or 2)")
    o.add_argument("--tp-comm-overlap", action="store_true",
                   help="SP's all-gather / reduce-scatter pipelined with the GEMMs beside them (needs --sp)")
    o.add_argument("--bucket-mb", type=non_negative, default=None,
                   help="DP gradient bucket cap in MiB (default: Megatron-LM's, max(40M, 1M x dp x cp) parameters)")
    p.add_argument("--gpus", type=count, help="with --search: the number of GPUs to lay out (else tp x cp x pp x dp)")
    p.add_argument("--search", action="store_true", help="rank every tp x pp x dp = --gpus layout that fits")
    p.add_argument("--top", type=count, default=10, help="--search: rows to print (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--figure", metavar="PATH", help="draw where the step goes, with the expected error, to PATH (.png)")
    p.add_argument("--validate", action="store_true", help="check the planner's terms against live runs")
    p.add_argument("--published", action="store_true",
                   help="step time vs 18 published runs (Narayanan et al. 2021, Korthikanti et al. 2022), and "
                        "NeMo's 10 FP8 runs apart")
    p.add_argument("--zero-example", action="store_true",
                   help="the ZeRO paper's 7.5 B parameters on 64 GPUs, stages 0-3 (Rajbhandari et al. 2019, Fig. 1)")


def stage_layers(text: str | None) -> tuple[int, ...] | None:
    """``--pp-layers 7,8,8,7`` → (7, 8, 8, 7); ``ConfigError`` (one line) for anything else."""
    if text is None:
        return None
    try:
        return tuple(int(n) for n in text.split(","))
    except ValueError:
        raise ConfigError(f"--pp-layers {text}: whole numbers separated by commas, e.g. 7,8,8,7") from None


def layout_of(args, model) -> Layout:
    seq = args.seq_len or min(model.positions, 8192)
    fp8 = args.dtype == "fp8"
    return Layout(tp=args.tp, pp=args.pp, dp=args.dp, sp=args.sp, cp=args.cp, cp_comm=args.cp_comm,
                  cp_layout=args.cp_layout, zero=args.zero, recompute=args.recompute,
                  seq_len=seq, micro_batch=args.micro_batch, global_batch=args.global_batch,
                  dtype="bfloat16" if fp8 else args.dtype, fp8=fp8, fp8_recipe=args.fp8_recipe,
                  fp8_gemm_speedup=args.fp8_gemm_speedup, attention=args.attention,
                  gpu=args.gpu, gpus_per_node=args.gpus_per_node, mfu=args.mfu, schedule=args.schedule,
                  vp=args.vp, stage_layers=stage_layers(args.pp_layers), gemm_efficiency=args.gemm_efficiency,
                  hbm_efficiency=args.hbm_efficiency, overlap_grad_reduce=args.overlap_grad_reduce,
                  overlap_param_gather=args.overlap_param_gather, tp_comm_overlap=args.tp_comm_overlap,
                  bucket_mb=args.bucket_mb)


def run(args) -> int:
    from tpsim.plan.planner import plan
    from tpsim.plan.report import format_plan, format_search
    from tpsim.plan.search import search

    if args.validate:
        from tpsim.plan.validate import main as validate_main
        return validate_main()
    if args.published:
        from tpsim.plan.published import format_published
        from tpsim.plan.published_fp8 import development_summary, format_fp8
        print(format_published())
        print("\n" + format_fp8())
        print("\n" + development_summary())
        return 0
    if args.zero_example:
        from tpsim.plan.published import format_zero_example
        print(format_zero_example(dtype="bfloat16" if args.dtype == "fp8" else dtype_alias(args.dtype)))
        return 0
    if not (args.model or args.config):
        raise ConfigError("give --model NAME or --config config.json")
    model = resolve(args.model, args.config)
    base = layout_of(args, model)
    if args.figure and (args.search or not os.path.isdir(os.path.dirname(os.path.abspath(args.figure)))):
        raise ConfigError(f"--figure {args.figure}: " + ("draws one layout's step; drop --search and give the layout"
                                                          if args.search else "its folder does not exist"))
    if args.search:
        if not args.gpus:
            raise ConfigError("--search needs --gpus N")
        if args.pp_layers:
            raise ConfigError("--search lays out equal stages: drop --pp-layers")
        plans = search(model, base, args.gpus)
        print(format_search(plans, args.gpus, args.top))
        if args.json:
            print(json.dumps({"gpus": args.gpus, "layouts": [q.as_dict() for q in plans[:args.top]]}))
        return 0 if plans else 1
    if args.gpus and args.gpus != base.gpus:
        raise ConfigError(f"--gpus {args.gpus}: this layout is tp x cp x pp x dp = {base.tp} x {base.cp} x {base.pp} "
                          f"x {base.dp} = {base.gpus} GPUs; add --search to rank every layout of {args.gpus} GPUs, "
                          f"or give --tp, --cp, --pp and --dp whose product is {args.gpus}")
    p = plan(model, base)
    print(format_plan(p))
    if args.figure:
        from tpsim.plan.step_figure import plot_step
        print(f"wrote {plot_step(p, args.figure)}")
    if args.json:
        print(json.dumps(p.as_dict()))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
