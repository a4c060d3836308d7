"""16-bit all-reduce cost (not a test): bfloat16 (2-byte wire, user-defined float32-accumulating MPI op) and
float16 (MPI's native MPIX_C_FLOAT16 sum where this MPI has it) vs a float32 all-reduce of the same element
count, all through the traced ``Group.all_reduce`` over every rank.

    mpirun -n 8 python bench/bench_half_allreduce.py [--elements 262144 1048576] [--repeats 30]

A 16-bit message is half the bytes, but MPI cannot reduce bfloat16 itself: each combining step calls back
into Python/NumPy (cast up, add in float32, round), so the reduction's arithmetic is much slower than MPI's
native float32 sum. Prints the median time per call and the ratio to float32 on rank 0.
"""

from __future__ import annotations

import argparse
import time

import tpsim  # noqa: F401  - one BLAS thread per rank before NumPy is imported
import numpy as np
from mpi4py import MPI

from tpsim.comm import ProcessGrid
from tpsim.comm.half import native_half
from tpsim.nn.precision import bfloat16


def median_time(group, x: np.ndarray, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        group.barrier()
        t = time.perf_counter()
        group.all_reduce(x)
        times.append(time.perf_counter() - t)
    worst = group.comm.allreduce(float(np.median(times)), op=MPI.MAX)  # the slowest rank's median
    return worst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--elements", type=int, nargs="+", default=[2**18, 2**20])
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    grid = ProcessGrid(tp=MPI.COMM_WORLD.Get_size())
    grid.tracer.enabled = False
    g = grid.tp_group
    rng = np.random.default_rng(g.rank)
    rows = []
    for n in args.elements:
        base = rng.standard_normal(n).astype(np.float32)
        t32 = median_time(g, base, args.repeats)
        for name, dtype in (("bfloat16", bfloat16), ("float16", np.dtype(np.float16))):
            t16 = median_time(g, base.astype(dtype), args.repeats)
            rows.append((n, name, t16 * 1e3, t32 * 1e3, t16 / t32))
    if g.rank == 0:
        print(f"all_reduce over {g.size} ranks, median of {args.repeats} (slowest rank); "
              f"float16 native in this MPI: {native_half(np.float16)}")
        print(f"{'elements':>10}  {'dtype':>8}  {'16-bit ms':>9}  {'float32 ms':>10}  {'ratio':>6}")
        for n, name, a, b, r in rows:
            print(f"{n:>10}  {name:>8}  {a:9.3f}  {b:10.3f}  {r:6.2f}")


if __name__ == "__main__":
    main()
