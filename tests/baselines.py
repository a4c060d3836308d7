"""The demo's numbers on the layouts a redesign touches, recorded once and held bit for bit: a refactor changes no
number.

    python tests/baselines.py            run every layout, compare with tests/baselines.json (exit 1 on a difference)
    python tests/baselines.py --record   run every layout and write tests/baselines.json
    python tests/baselines.py -k zero    only the layouts whose name holds "zero"

Each layout is a short demo run (``mpirun -n N python -m tpsim.demo ARGS --steps 3``). Its digest holds, per step,
the loss, the gradient norm and the collective bytes per rank (``metrics.jsonl``); per rank and step the traced
collectives' count, bytes and wire bytes, and per rank the bytes of each (phase, group, op) over the run
(``comm.jsonl``); under a pipeline, ``pipeline.json``'s measured bubble, point-to-point bytes, makespan and step
time. Floats are kept as ``float.hex``: equal means bit for bit.

The same bits need the same arithmetic: OpenBLAS picks its kernels, and so its summation order, by CPU, so every
run is pinned to ``OPENBLAS_CORETYPE=Haswell`` (AVX2, present on any x86-64 machine CI runs on); the digest also
records the numpy version, and a difference report names both when they differ from the recording's. ``make
baselines`` runs the check; CI runs it before ``make test``.

A layout on a GPU's clock (``pp2-clock-h100``) also holds the modelled time, which is the planner's prices: a
change to the planner's model is not a refactor and moves it. Issue 37's refit (HBM efficiency 0.75 → 0.85)
re-recorded that layout's three clock numbers alone (``-k pp2-clock-h100 --record``); its losses, gradient norms
and bytes held bit for bit. Issue "One step"'s last part, ``--pp 1`` run as a one-stage schedule through the
executor, moved one kind of number on the eight pp-1 layouts with dp·cp > 1, deliberately: each rank's count of
collective calls a step, by one (the loss normaliser is the pipeline's, its counts before the schedule and its
losses after, 8 + 8 bytes, where the no-pipeline step sent one 16-byte call after the forward); their losses,
norms, bytes and wire bytes held bit for bit, and were re-recorded with them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_program import run_mpi  # noqa: E402

FILE = Path(__file__).resolve().parent / "baselines.json"
CORETYPE = "Haswell"
STEPS = ["--steps", "3"]
# name -> (ranks, demo arguments): the layouts issue "One step" names
LAYOUTS = {
    "interleaved-pp4-tp2-vp2": (8, ["--pp", "4", "--tp", "2", "--schedule", "interleaved", "--vp", "2",
                                    "--layers", "8", "--microbatches", "4"]),
    "llama-zb-h1-pp2-sp": (4, ["--arch", "llama", "--pp", "2", "--tp", "2", "--schedule", "zb-h1",
                               "--sequence-parallel", "--microbatches", "4"]),
    "cp2-ring": (4, ["--cp", "2", "--tp", "2", "--cp-comm", "ring"]),
    "cp2-allgather": (4, ["--cp", "2", "--tp", "2", "--cp-comm", "allgather"]),
    "cp2-ulysses": (4, ["--cp", "2", "--tp", "2", "--cp-comm", "ulysses"]),
    "llama-cp2-ring": (4, ["--arch", "llama", "--cp", "2", "--tp", "2", "--cp-comm", "ring"]),
    "llama-cp2-ulysses-fp16": (4, ["--arch", "llama", "--cp", "2", "--tp", "2", "--cp-comm", "ulysses",
                                   "--kv-heads", "4", "--dtype", "float16"]),
    "cp2-allgather-fp16": (4, ["--cp", "2", "--tp", "2", "--cp-comm", "allgather", "--dtype", "float16"]),
    "zero2-pp2": (4, ["--zero", "2", "--pp", "2", "--dp", "2", "--microbatches", "4"]),
    "zero3-bf16": (4, ["--zero", "3", "--tp", "2", "--dp", "2", "--dtype", "bfloat16"]),
    "zero1-both-overlaps": (4, ["--zero", "1", "--tp", "2", "--dp", "2", "--overlap-grad-reduce",
                                "--overlap-param-gather", "--bucket-mb", "0.05"]),
    "pp2-clock-h100": (4, ["--pp", "2", "--tp", "2", "--microbatches", "4", "--clock", "h100"]),
}


def exact(x):
    """A number as it is stored: an int as itself, a float as its hex (every bit)."""
    return x if isinstance(x, (int, type(None))) or isinstance(x, bool) else float(x).hex()


def digest(out: Path) -> dict:
    """What a run folder says that a refactor must not change (module docstring)."""
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    per_step = [{k: exact(s[k]) for k in ("step", "loss", "grad_norm", "collective_bytes_per_rank", "skipped")}
                for s in steps]
    calls: dict = defaultdict(lambda: [0, 0, 0])
    kinds: dict = defaultdict(lambda: [0, 0])
    for line in (out / "comm.jsonl").read_text().splitlines():
        e = json.loads(line)
        c = calls[f"rank {e['rank']} step {e['step']}"]
        c[0], c[1], c[2] = c[0] + 1, c[1] + e["bytes"], c[2] + e["wire_bytes"]
        k = kinds[f"rank {e['rank']} {e['phase']} {e['group']} {e['op']}"]
        k[0], k[1] = k[0] + e["bytes"], k[1] + e["wire_bytes"]
    out_digest = {"steps": per_step, "calls_bytes_wire": dict(sorted(calls.items())),
                  "bytes_wire_by_kind": dict(sorted(kinds.items()))}
    pipe = out / "pipeline.json"
    if pipe.exists():
        p = json.loads(pipe.read_text())
        out_digest["pipeline"] = {"bubble_measured": exact(p["bubble_fraction"]["measured"]),
                                  "p2p_bytes": exact(p["p2p_bytes"]["measured"]), "makespan": exact(p["makespan"]),
                                  "step_time": exact(p["step_time"])}
    return out_digest


def run(name: str) -> dict:
    ranks, args = LAYOUTS[name]
    with tempfile.TemporaryDirectory() as tmp:
        r = run_mpi(ranks, ["-m", "tpsim.demo", *args, *STEPS, "--out", tmp], timeout=600)
        if r.returncode:
            raise SystemExit(f"{name}: the demo failed (exit {r.returncode})\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        return digest(Path(tmp))


def differences(want, got, path: str = "") -> list[str]:
    """Every leaf where ``got`` differs from ``want``, as 'path: recorded -> now'."""
    if isinstance(want, dict) and isinstance(got, dict):
        return [d for k in sorted(set(want) | set(got)) for d in differences(want.get(k), got.get(k), f"{path}/{k}")]
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [d for i, (a, b) in enumerate(zip(want, got)) for d in differences(a, b, f"{path}/{i}")]
    return [] if want == got else [f"{path}: {want} -> {got}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/baselines.py", description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="write tests/baselines.json from this tree's runs")
    parser.add_argument("-k", default="", help="only the layouts whose name holds this")
    args = parser.parse_args(argv)
    os.environ["OPENBLAS_CORETYPE"] = CORETYPE  # the ranks inherit it
    names = [n for n in LAYOUTS if args.k in n]
    recorded = json.loads(FILE.read_text()) if FILE.exists() else {"layouts": {}}
    now = {n: run(n) for n in names}
    if args.record:
        layouts = {**recorded["layouts"], **now} if args.k else now
        meta = {"numpy": np.__version__, "openblas_coretype": CORETYPE, "steps": STEPS[1],
                "how": "python tests/baselines.py --record"}
        text = json.dumps({**meta, "layouts": layouts}, indent=1, sort_keys=True) + "\n"
        tmp = FILE.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(FILE)  # atomically
        print(f"recorded {len(now)} layouts in {FILE}")
        return 0
    bad = 0
    for n in names:
        diff = differences(recorded["layouts"].get(n), now[n])
        bad += bool(diff)
        print(f"{n}: {'the same, bit for bit' if not diff else f'{len(diff)} numbers differ'}")
        for d in diff[:8]:
            print(f"    {d}")
    if bad:
        print(f"BASELINES: {bad} of {len(names)} layouts differ from the recording (numpy {recorded.get('numpy')} "
              f"then, {np.__version__} now; OPENBLAS_CORETYPE {CORETYPE})")
        return 1
    print(f"BASELINES: all {len(names)} layouts the same, bit for bit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
