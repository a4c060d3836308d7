"""Pipeline benchmark (not a test): what the simulator's pipeline costs, PP 4 × TP 2 against DP 4 × TP 2.

    python bench/bench_pipeline.py                 (one process launching the two layouts in turn, 8 ranks each)

The same model (the demo's at its defaults, but 4 layers so four stages each hold one) and the same global batch
(16 sequences of 16 tokens, float64) trained the same number of steps, once as a pipeline (PP 4 × TP 2, the
default 1F1B with m = 4 micro-batches of 4 sequences) and once without (DP 4 × TP 2, 4 sequences per replica).
Both do the same arithmetic — every rank runs four layer-passes of 4 sequences a step — so on a machine with
fewer cores than ranks the pipeline can only be slower by what its waiting costs: a rank in its bubble must
sleep, not spin, or it takes the core a working stage needs. Target: pipeline ≤ 1.25 × DP wall time.

Each round launches both demos, one after the other in alternating order (so drift in the machine's load falls
on both), from this one process; a run's time is the wall time of its training steps 1..N−1 from the run's
``metrics.jsonl`` (rank 0's clock; step 0 also checks against the serial model, and start-up, the serial twin and
the plots are not the simulator's step). The CPU seconds the whole process tree used (``getrusage`` of the
children) are printed beside it: spinning shows as CPU without progress. Min and median over the rounds, and
their ratios. ``--json FILE`` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's tpsim, here and (run from ROOT with -m) on every rank
from tpsim.launcher import launch  # noqa: E402

LAYOUTS = {"PP 4 x TP 2": ["--pp", "4", "--tp", "2"], "DP 4 x TP 2": ["--dp", "4", "--tp", "2"]}
TARGET = 1.25


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(flags: list[str], common: list[str], folder: Path) -> tuple[float, float, int]:
    """``(seconds of training steps 1..N-1, CPU seconds of the process tree, exit status)`` of one demo run."""
    cpu = children_cpu()
    r = launch(8, ["-m", "tpsim.demo", *flags, *common, "--out", str(folder)], timeout=900, cwd=ROOT)
    if r.timed_out:
        raise SystemExit(f"bench_pipeline: {' '.join(flags)} did not finish within 900 s")
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return sum(m["seconds"] for m in metrics[1:]), children_cpu() - cpu, r.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="rounds, each running both layouts (default 5)")
    ap.add_argument("--steps", type=int, default=21, help="training steps a run (default 21: 20 timed)")
    ap.add_argument("--layers", type=int, default=4, help="transformer layers, divisible by 4 (default 4)")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the numbers here as well")
    args = ap.parse_args()
    common = ["--layers", str(args.layers), "--steps", str(args.steps), "--timeline-steps", "0"]
    times: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    cpus: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    statuses: dict[str, set[int]] = {name: set() for name in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix="bench_pipeline_") as tmp:
        for i in range(args.repeats):
            names = list(LAYOUTS) if i % 2 == 0 else list(reversed(LAYOUTS))
            for name in names:
                seconds, cpu, status = one_run(LAYOUTS[name], common, Path(tmp) / f"{i}-{name.split()[0]}")
                times[name].append(seconds)
                cpus[name].append(cpu)
                statuses[name].add(status)
                print(f"  round {i + 1}: {name}  {seconds:7.3f} s training, {cpu:7.1f} CPU-s", flush=True)
    pp, dp = LAYOUTS
    summary = {name: {"min_s": min(times[name]), "median_s": statistics.median(times[name]),
                      "median_cpu_s": statistics.median(cpus[name]), "runs_s": times[name],
                      "exit_statuses": sorted(statuses[name])} for name in LAYOUTS}
    ratio_median = summary[pp]["median_s"] / summary[dp]["median_s"]
    ratio_min = summary[pp]["min_s"] / summary[dp]["min_s"]
    steps = args.steps - 1
    print(f"\nthe demo model ({args.layers} layers, h 64, batch 16 x seq 16, float64), {steps} timed training steps "
          f"a run, {args.repeats} rounds, 8 ranks each:")
    print(f"  {'layout':12} {'min s':>8} {'median s':>9} {'median ms/step':>15} {'median CPU-s':>13}")
    for name in LAYOUTS:
        s = summary[name]
        print(f"  {name:12} {s['min_s']:8.3f} {s['median_s']:9.3f} {s['median_s'] / steps * 1e3:15.1f} "
              f"{s['median_cpu_s']:13.1f}")
    verdict = "met" if ratio_median <= TARGET else "MISSED"
    print(f"  ratio PP/DP: median {ratio_median:.3f}, min {ratio_min:.3f}   (target <= {TARGET}: {verdict})")
    if any(statuses[name] - {0} for name in LAYOUTS):  # timing still holds; say that a check failed
        print(f"  note: exit statuses {dict((n, sorted(s)) for n, s in statuses.items())} (1: a demo check failed)")
    if args.json:
        Path(args.json).write_text(json.dumps({"steps_timed": steps, "layers": args.layers, "rounds": args.repeats,
                                               "layouts": summary, "ratio_median": ratio_median,
                                               "ratio_min": ratio_min, "target": TARGET}, indent=1) + "\n")


if __name__ == "__main__":
    main()
