"""tpsim against PyTorch, side by side in the same mpirun processes (issue 12, item 1). A benchmark, not a test.

    mpirun -n 8 python bench/bench_vs_torch.py                 (make bench-torch; writes tpsim-out/bench_vs_torch.json)
    mpirun -n 8 python bench/bench_vs_torch.py --hidden 128 --tokens 256 --batch 2 --seq 64 --repeats 3   (small)

a. mlp    ParallelMLP h 1024 -> 4h -> h, 2048 tokens, float32, fwd+bwd, TP 4 (ranks 0-3; the others sleep)
b. block  one pre-LN GPT-2 block, h 1024, 16 heads, batch 4 x seq 512, float32, fwd+bwd, TP 4 (ranks 0-3)
c. demo   the demo's whole training step at its defaults, TP 4 x DP 2 on 8 ranks (TP 4 x DP world/4)
d. the GEMM limit of each: the step's matmul FLOPs per rank (bench/gemm_limit.py) / the single-thread GEMM
   rate rank 0 measures alone on those shapes (the others asleep) in every round, x ranks per core.

The PyTorch side (bench/torch_tp.py) is Megatron TP written by hand: f and g as autograd Functions over gloo,
the world taken from MPI, one torch thread per rank (tpsim: one BLAS thread). Each round runs a tpsim step,
a torch step, then the GEMMs alone, each started together on every rank; a round's time is the slowest rank's.
Medians and bests over the rounds are both reported; ratios divide median by median (and best by best).
Before timing, each case runs both sides once on the same inputs and checks that outputs and gradients agree
(bench/vs_torch_cases.py). Without torch it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time
from pathlib import Path

import tpsim  # noqa: F401  - one BLAS thread per rank, set before NumPy loads
import numpy as np
from mpi4py import MPI

from bench_core import quiet_wait
from gemm_limit import gemm_limit_seconds, ranks_per_core, total_flops
from result_json import SCHEMA, case_ratios, stats, validate
from tpsim.atomic import write_text
from tpsim.trace.kind_split import format_kind_table


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="mlp,block,demo", help="comma-separated subset of mlp,block,demo")
    ap.add_argument("--hidden", type=int, default=1024, help="h of the MLP and the block")
    ap.add_argument("--tokens", type=int, default=2048, help="tokens of the MLP case")
    ap.add_argument("--heads", type=int, default=16, help="heads of the block case")
    ap.add_argument("--batch", type=int, default=4, help="batch of the block case")
    ap.add_argument("--seq", type=int, default=512, help="sequence length of the block case")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds of mlp and block (each: tpsim, torch, GEMMs)")
    ap.add_argument("--demo-repeats", type=int, default=30,
                    help="timed rounds of the demo case (its steps take milliseconds; noise needs more rounds)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    ap.add_argument("--cores", type=int, default=None, help="cores for the GEMM limit (default: rank 0's affinity)")
    ap.add_argument("--json", default="tpsim-out/bench_vs_torch.json", help="result file (rank 0 writes it)")
    ap.add_argument("--note", default="", help="free text stored in settings.note (e.g. 'machine loaded')")
    args = ap.parse_args(argv)
    unknown = set(args.cases.split(",")) - {"mlp", "block", "demo"}
    if unknown:
        ap.error(f"unknown case(s) {sorted(unknown)}: choose from mlp, block, demo")
    return args


def start_together(comm) -> None:
    quiet_wait(comm)  # nobody spins while the last rank finishes
    comm.Barrier()  # then a tight release, so every rank starts its step at the same moment


def alternate(comm, steps: list, rounds: int, warmup: int) -> list[list[float]]:
    """Per-round seconds of the slowest rank for each of ``steps`` (None: nothing on this rank), interleaved."""
    times = np.zeros((len(steps), rounds))
    for r in range(warmup + rounds):
        for side, step in enumerate(steps):
            start_together(comm)
            t = time.perf_counter()
            if step is not None:
                step()
            if r >= warmup:
                times[side, r - warmup] = time.perf_counter() - t
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return times.tolist()


def gemm_step(gemms, dtype: str, inner: int | None = None):
    """A callable running exactly these GEMMs ``inner`` times on one thread (contiguous operands, ``out=``
    buffers), and ``inner`` (by default: enough repeats of small shapes for ~0.05 s, so a timing means something)."""
    rng = np.random.default_rng(0)
    ops = []
    for g in gemms:
        lead = (g.batch,) if g.batch > 1 else ()
        ops.append((rng.standard_normal(lead + (g.m, g.k)).astype(dtype),
                    rng.standard_normal(lead + (g.k, g.n)).astype(dtype), np.empty(lead + (g.m, g.n), dtype)))

    def once():
        for a, b, c in ops:
            np.matmul(a, b, out=c)

    if inner is None:
        t = time.perf_counter()
        once()
        inner = max(1, int(0.05 / max(time.perf_counter() - t, 1e-9)))

    def step():
        for _ in range(inner):
            once()
    return step, inner


def machine(torch_version: str) -> dict:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.processor())
    return {"hostname": socket.gethostname(), "cpu": cpu, "cores": len(os.sched_getaffinity(0)),
            "logical_cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "torch": torch_version, "mpi": MPI.Get_library_version().splitlines()[0].strip()}


def build_cases(args, comm) -> list:
    """The requested cases that fit this world; the 4-rank ones run on ranks 0-3 while the others sleep."""
    import torch_tp
    from tpsim.comm import ProcessGrid
    from vs_torch_cases import block_case, demo_case, mlp_case

    world, rank = comm.Get_size(), comm.Get_rank()
    wanted = args.cases.split(",")
    if world < 4 or world % 4:
        say(comm, f"every case runs TP 4: launch with a multiple of 4 ranks (mpirun -n 8), not {world}")
        return []
    cases = []
    if {"mlp", "block"} & set(wanted):
        sub = comm.Split(0 if rank < 4 else MPI.UNDEFINED, rank)
        tgroup, _ = torch_tp.new_groups(np.arange(4).reshape(1, 4))
        grid = ProcessGrid(tp=4, comm=sub) if sub != MPI.COMM_NULL else None
        if grid is not None:
            grid.tracer.enabled = False  # layers alone, untraced (bench_core.py measures the tracer's cost)
        for name, make in (("mlp", mlp_case), ("block", block_case)):
            if name in wanted:
                cases.append(make(args, 4, grid and grid.tp_group, tgroup))
    if "demo" in wanted:
        groups = torch_tp.new_groups(np.arange(world).reshape(world // 4, 4))
        cases.append(demo_case(ProcessGrid(tp=4, dp=world // 4), groups, world))
    return cases


def say(comm, *lines) -> None:
    if comm.Get_rank() == 0:
        print(*lines, sep="\n", flush=True)


def run_case(args, comm, case, cores: int) -> dict:
    diff, what = case.check() if case.check else (0.0, "")
    diff = comm.allreduce(float(diff), op=MPI.MAX)
    ok = diff <= case.tolerance
    say(comm, f"{case.name}: {case.description}; TP {case.tp} x DP {case.dp}, {case.dtype}",
        f"  check: max relative difference tpsim vs torch {diff:.1e} (tolerance {case.tolerance:g}) "
        f"{'OK' if ok else 'MISMATCH'}")
    # The GEMMs alone, timed in every round between the steps so all see the same machine: on rank 0 alone, the
    # others asleep (one thread's rate: the limit is that x ranks per core), and on every rank of the case at
    # once (what the placement really allows while the machine is shared: a lone process gets more than its
    # 1/ranks-per-core share of a loaded machine, which makes the first limit too high)
    alone, inner = gemm_step(case.gemms, case.dtype) if comm.Get_rank() == 0 else (None, None)
    inner = comm.bcast(inner, root=0)
    together = gemm_step(case.gemms, case.dtype, inner)[0] if case.tpsim_step is not None else None
    rounds = args.demo_repeats if case.name == "demo" else args.repeats
    tp_times, torch_times, alone_times, together_times = alternate(
        comm, [case.tpsim_step, case.torch_step, alone, together], rounds, args.warmup)
    flops, per_rank = total_flops(case.gemms), stats([t / inner for t in alone_times])
    limit = {k: gemm_limit_seconds(flops, flops / per_rank[k], case.ranks, cores) for k in ("median", "best")}
    concurrent = stats([t / inner for t in together_times])
    seconds = {"tpsim": stats(tp_times), "torch": stats(torch_times)}
    ratios = case_ratios(seconds["tpsim"], seconds["torch"], {"gemm_limit": limit, "gemm_concurrent": concurrent})
    for side in ("tpsim", "torch"):
        s = seconds[side]
        say(comm, f"  {side:6} median {s['median'] * 1e3:9.2f} ms   best {s['best'] * 1e3:9.2f} ms")
    say(comm, f"  GEMM limit median {limit['median'] * 1e3:9.2f} ms   best {limit['best'] * 1e3:9.2f} ms   "
              f"({flops / 1e9:.3f} GFLOP per rank, best {flops / per_rank['best'] / 1e9:.1f} GFLOP/s single-thread, "
              f"x {ranks_per_core(case.ranks, cores):.1f} ranks per core)",
        f"  GEMMs on all {case.ranks} ranks at once  median {concurrent['median'] * 1e3:9.2f} ms   "
        f"best {concurrent['best'] * 1e3:9.2f} ms",
        *(f"  {k:22} {v['median']:7.3f} (median)  {v['best']:7.3f} (best)" for k, v in ratios.items()), "")
    split = case.kinds() if case.kinds is not None else None  # one traced tpsim step: where its time goes
    if split is not None:
        say(comm, format_kind_table(split[0], title=f"  where one traced tpsim {case.name} step's time goes "
                                                    f"(tpsim report --by kind), ms per rank over {split[1]} ranks:"), "")
    return {"description": case.description, "shape": case.shape, "dtype": case.dtype, "tp": case.tp,
            "dp": case.dp, "ranks": case.ranks, "rounds": rounds, "seconds": seconds,
            "gemm": {"flops_per_rank": flops, "seconds_per_rank": per_rank,
                     "rate_flops_per_s": flops / per_rank["best"], "ranks_per_core": ranks_per_core(case.ranks, cores),
                     "limit_s": limit, "concurrent_s": concurrent}, "ratios": ratios,
            "check": {"max_rel_diff": diff, "tolerance": case.tolerance, "ok": bool(ok), "what": what},
            **({"kinds_s": split[0]} if split else {}), **case.extra}


def main(argv=None) -> int:
    args = parse(argv)
    comm = MPI.COMM_WORLD
    try:
        import torch
    except ImportError:
        say(comm, "bench_vs_torch: PyTorch is not installed, nothing to compare against; skipped "
                  "(pip install torch to run it)")
        return 0
    import torch_tp

    torch_tp.init_world(comm)
    cores = args.cores or comm.bcast(len(os.sched_getaffinity(0)), root=0)
    world = comm.Get_size()
    say(comm, f"tpsim vs PyTorch {torch.__version__} (gloo), {world} ranks on {cores} cores, one thread per rank; "
              f"{args.repeats} rounds ({args.demo_repeats} for the demo) after {args.warmup} warm-up", "")
    cases = build_cases(args, comm)
    if not cases:
        torch.distributed.destroy_process_group()
        return 2
    results = {case.name: run_case(args, comm, case, cores) for case in cases}
    if comm.Get_rank() == 0:
        doc = {"schema": SCHEMA, "command": f"mpirun -n {world} python " + " ".join(sys.argv),
               "machine": machine(torch.__version__),
               "settings": {"ranks": world, "repeats": args.repeats, "demo_repeats": args.demo_repeats,
                            "warmup": args.warmup, "threads_per_rank": 1,
                            "cores_for_limit": cores, "statistics": "median and best of the rounds; a round's "
                            "time is the slowest rank's", "note": args.note},
               "cases": results}
        problems = validate(doc)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_text(args.json, json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}" + (f"; schema problems: {problems}" if problems else ""))
    ok = all(r["check"]["ok"] for r in results.values())
    torch.distributed.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
