"""``tpsim schedule``: a pipeline schedule built, checked, timed at unit costs, printed and drawn.

    tpsim schedule --pp 4 --microbatches 8 --schedule 1f1b [--vp V] [--zero N] [--out DIR] [--width 100]

prints the time × rank grid (``tpsim.pipeline.grid``), the bubble measured on the virtual clock beside the
formula of ``tpsim.predict.pipeline``, each rank's busy and idle time and peak micro-batches in flight (measured
and formula), and the messages of a step; with ``--zero N`` each rank's list with data parallelism's collectives placed by
``tpsim.pipeline.collectives`` (UNSHARD, RESHARD, REDUCE_GRAD of ZeRO stage N) and how many a chunk runs, beside
the count the stage's rule gives; with ``--out DIR`` it draws the grid to
``DIR/schedule_<name>_pp<P>_m<M>[_vp<V>].png``. A schedule that cannot be built or would not run: one line, exit 2.
Pure arithmetic, no MPI.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tpsim.errors import ConfigError
from tpsim.paths import check_output_dir
from tpsim.pipeline.actions import COLLECTIVES, SENDS
from tpsim.pipeline.collectives import with_collectives
from tpsim.pipeline.clock import Timeline, simulate
from tpsim.pipeline.grid import format_grid, quantum_of
from tpsim.pipeline.schedules import SCHEDULES, build
from tpsim.predict import pipeline as formula
from tpsim.table import RULE, format_table
from tpsim.options import OneLineParser, count, run_command
from tpsim.zero_stage import ZERO_STAGES, zero_stage

BUBBLE = {"afab": "(p - 1)/(m + p - 1)", "1f1b": "(p - 1)/(m + p - 1)", "interleaved": "(p - 1)/(v*m + p - 1)",
          "zb-h1": "(p - 1)/(3m + p - 1)", "zb-h1, m < p": "(2p - 1 - m)/(2m + 2p - 1)"}
IN_FLIGHT = {"afab": "m", "1f1b": "min(p - i, m)", "interleaved": "min(2(p - i - 1) + (v - 1)p + 1, v*m)",
             "zb-h1": "min(p, m)"}


def stage_option(text: str):
    """``--zero N`` read as the stage's data (``tpsim.zero_stage``); anything else one line, exit 2."""
    if text.strip() not in {str(n) for n in ZERO_STAGES}:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(map(str, ZERO_STAGES))})")
    return zero_stage(int(text))


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="tpsim schedule", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pp", type=count, required=True, help="pipeline ranks")
    p.add_argument("--microbatches", type=count, required=True, help="micro-batches a step")
    p.add_argument("--schedule", default="1f1b", choices=list(SCHEDULES), help="default 1f1b")
    p.add_argument("--vp", type=count, default=1, help="model chunks per rank (--schedule interleaved)")
    p.add_argument("--zero", dest="stage", type=stage_option, default=None, metavar="{0,1,2,3}",
                   help="place ZeRO stage N's collectives on the lists and print them (0: plain DP)")
    p.add_argument("--out", help="draw the grid into this folder (PNG)")
    p.add_argument("--width", type=count, default=100, help="wrap the grid at this many characters (default 100)")
    return p


def costs_line(t: Timeline) -> str:
    s = t.schedule
    per = "F 1, B 1, W 1" if s.splits_backward else "F 1, B 2"
    chunk = f" (each of {s.vp} chunks 1/{s.vp} of that)" if s.vp > 1 else ""
    return f"unit costs: {per} a stage{chunk}, messages free; one column = {quantum_of(t):.4g} unit"


def report(t: Timeline, width: int) -> list[str]:
    """Everything ``tpsim schedule`` prints."""
    s = t.schedule
    p, m, v = s.pp, s.microbatches, s.vp
    want = formula.bubble_fraction(s.name, p, m, v)
    written = BUBBLE["zb-h1, m < p" if s.name == "zb-h1" and m < p else s.name]
    peaks = formula.peak_in_flight(s.name, p, m, v)
    rows = [["rank", "busy", "idle", "in flight", "formula"], RULE]
    rows += [[str(r), f"{busy:g}", f"{idle:g}", str(got), str(peak)]
             for r, (busy, idle, got, peak) in enumerate(zip(t.busy, t.idle, t.peak_in_flight, peaks))]
    messages = sum(a.op in SENDS for actions in s.ranks for a in actions)
    unit = "(micro-batch, chunk) pairs" if v > 1 else "micro-batches"
    differ = "" if abs(t.bubble_fraction - want) <= 1e-9 else "  (they differ)"
    lead = f"step {t.step:g} units; bubble = idle / (pp x step): "
    return [f"{s.name}: pp {p}, {m} micro-batches" + (f", vp {v}" if v > 1 else ""), costs_line(t), "",
            *format_grid(t, width=width), "",
            f"{lead}measured {t.bubble_fraction:.6f}",
            f"{' ' * len(lead)}formula {written} = {want:.6f}{differ}",
            f"{unit} in flight per rank, formula {IN_FLIGHT[s.name]}:",
            format_table(rows),
            f"messages a step: {messages}, formula 2m(v*p - 1) = {2 * m * (v * p - 1)}; "
            "p2p bytes = that x b*s*h*e (/ t under SP)"]


RULES = {  # a chunk's collectives a step, as the ZeRO paper states each stage (Rajbhandari et al. 2019, §5)
    0: ("REDUCE_GRAD 1 (the all-reduce after the last micro-batch)", lambda m: {"REDUCE_GRAD": 1}),
    1: ("UNSHARD 1 (the updated parameters, before micro-batch 0's F), REDUCE_GRAD 1 (a reduce-scatter)",
        lambda m: {"UNSHARD": 1, "REDUCE_GRAD": 1}),
    2: ("UNSHARD 1, REDUCE_GRAD m (each micro-batch's reduce-scatter)", lambda m: {"UNSHARD": 1, "REDUCE_GRAD": m}),
    3: ("UNSHARD 2m and RESHARD 2m (around every F and B), REDUCE_GRAD m",
        lambda m: {"UNSHARD": 2 * m, "RESHARD": 2 * m, "REDUCE_GRAD": m}),
}


def collective_lines(schedule, stage, width: int) -> list[str]:
    """Each rank's list with the collectives of ZeRO stage ``stage`` (a ``ZeroStage``), wrapped at ``width``; a
    chunk's count on every rank beside the stage's rule (``RULES``)."""
    placed = with_collectives(schedule, stage)
    lines = [f"ZeRO-{stage.stage}: data parallelism's collectives on the lists (tpsim.pipeline.collectives)"]
    for r, actions in enumerate(placed.ranks):
        line, head = f"rank {r}:", " " * len(f"rank {r}:")
        for a in actions:
            if len(line) + len(str(a)) + 1 > width:
                lines.append(line)
                line = head
            line += f" {a}"
        lines.append(line)
    text, rule = RULES[stage.stage]
    want = rule(schedule.microbatches)
    counts = {(r, c): {op: sum(a.op == op and a.chunk == c for a in actions) for op in COLLECTIVES}
              for r, actions in enumerate(placed.ranks) for c in range(schedule.vp)}
    got = ", ".join(f"{op} {n}" for op, n in counts[0, 0].items() if n)
    same = all({op: n for op, n in count.items() if n} == want for count in counts.values())
    return lines + [f"each chunk's collectives a step: {got}" + ("" if same else "  (chunks differ from the rule)"),
                    f"ZeRO-{stage.stage}'s rule: {text}"]


def run(args) -> int:
    if args.width < 20:
        raise ConfigError(f"--width {args.width}: at least 20 characters")
    if args.out:
        check_output_dir(args.out)  # a file or an unwritable folder: one line before any work
    timeline = simulate(build(args.schedule, args.pp, args.microbatches, args.vp))  # checks it first
    print("\n".join(report(timeline, args.width)))
    if args.stage is not None:
        print("\n".join(["", *collective_lines(timeline.schedule, args.stage, args.width)]))
    if args.out:
        from tpsim.pipeline.figure import draw

        vp = f"_vp{args.vp}" if args.vp > 1 else ""
        path = Path(args.out) / f"schedule_{args.schedule}_pp{args.pp}_m{args.microbatches}{vp}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"wrote {draw(timeline, path)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
