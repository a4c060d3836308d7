"""Core benchmark (not a test): TP-4 MLP step vs serial, traced all-reduce vs raw mpi4py.

    mpirun -n 8 python bench/bench_core.py            (make bench)

1. MLP forward + backward, hidden 1024, 2048 tokens, float32. The serial step runs on one rank while the
   other seven sleep (not spin in MPI), so it has one core to itself. The TP step runs 2 DP × 4 TP on all 8
   ranks: on a 2-core machine each TP group then also has one core's worth of CPU, so the ratio measures what
   tensor parallelism itself costs — the split matmuls plus the all-reduces — on equal compute.
   Target: TP-4 step <= 1.10 x serial step.
2. all_reduce of 1 MiB float32 over the 8 ranks: the traced ``Group.all_reduce`` vs raw ``comm.Allreduce``
   (waited on as ``Group`` waits, see ``tpsim.comm.waiting``) on the same buffers, interleaved.
   Target: traced <= 1.05 x raw.
Medians over repeats; one BLAS thread per rank (tpsim sets it before NumPy loads).
"""

from __future__ import annotations

import argparse
import time

import tpsim  # noqa: F401  - sets one BLAS thread per rank before NumPy is imported
import numpy as np
from mpi4py import MPI

from tpsim.comm import ProcessGrid
from tpsim.comm.waiting import collective
from tpsim.nn import MLP
from tpsim.tp import ParallelMLP


def quiet_wait(comm: MPI.Comm) -> None:
    """Wait for the others without spinning a core (MPI's own barrier busy-polls)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def mlp_step(mlp, x, dz) -> None:
    z, cache = mlp.forward(x)
    mlp.backward(dz, cache)


def time_it(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--allreduce-iters", type=int, default=200)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    world, rank = comm.Get_size(), comm.Get_rank()
    tp = 4 if world % 4 == 0 else world
    grid = ProcessGrid(tp=tp)
    f32 = np.float32
    serial = MLP(args.hidden, rng=np.random.default_rng(0), dtype=f32)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((args.tokens, args.hidden)).astype(f32)
    dz = rng.standard_normal((args.tokens, args.hidden)).astype(f32)

    # 1. Three timings per round, interleaved so all see the same machine state; medians over the rounds:
    #    serial-alone   the serial model on rank 0, every other rank asleep (one core busy, one idle)
    #    serial-shared  one serial model per DP replica, on TP rank 0 of each TP group, concurrently: the same
    #                   share of the machine (a core, half the memory bandwidth and cache) a TP group gets
    #    TP             2 DP x 4 TP on all ranks
    par = ParallelMLP.from_serial(serial, grid.tp_group).set_path("mlp")
    grid.tracer.enabled = False
    in_replica = grid.tp_rank == 0
    if in_replica:
        mlp_step(serial, x, dz)  # warm-up
    quiet_wait(comm)
    mlp_step(par, x, dz)
    alone, shared, tp_times = [], [], []
    for _ in range(args.repeats):
        if rank == 0:
            alone.append(time_it(lambda: mlp_step(serial, x, dz), 1))
        quiet_wait(comm)
        if in_replica:
            shared.append(time_it(lambda: mlp_step(serial, x, dz), 1))
        quiet_wait(comm)
        comm.Barrier()
        t = time.perf_counter()
        mlp_step(par, x, dz)
        comm.Barrier()
        tp_times.append(time.perf_counter() - t)
    # the slowest rank sets the pace (pickled helper calls are fine here: outside the measured code)
    t_alone = comm.allreduce(float(np.median(alone)) if alone else 0.0, op=MPI.MAX)
    t_shared = comm.allreduce(float(np.median(shared)) if shared else 0.0, op=MPI.MAX)
    t_tp = comm.allreduce(float(np.median(tp_times)), op=MPI.MAX)

    # 2. traced vs raw all-reduce, 1 MiB, interleaved so both see the same machine state
    buf = np.ones(256 * 1024, dtype=f32)
    out = np.empty_like(buf)
    grid.tracer.enabled = True
    raw, traced = [], []
    for i in range(args.allreduce_iters):
        comm.Barrier()
        t = time.perf_counter()
        collective(comm, "Allreduce", buf, out)  # mpi4py, waited on the way Group waits: only tracing differs
        raw.append(time.perf_counter() - t)
        comm.Barrier()
        t = time.perf_counter()
        grid.world.all_reduce(buf, out=out)
        traced.append(time.perf_counter() - t)
        grid.tracer.reset()  # one record per call, discarded: measure the tracer's cost, not a growing list
    t_raw, t_traced = float(np.median(raw)), float(np.median(traced))
    if rank == 0:
        print(f"MLP fwd+bwd h={args.hidden} tokens={args.tokens} float32, {world} ranks (TP {tp} x DP {world // tp})")
        print(f"  serial, alone      {t_alone * 1e3:8.1f} ms   (rank 0 only: one core busy, the other idle)")
        print(f"  serial, shared     {t_shared * 1e3:8.1f} ms   (one serial model per DP replica, concurrently)")
        print(f"  TP-{tp} step          {t_tp * 1e3:8.1f} ms   ({world // tp} TP groups concurrently)")
        print(f"  ratio TP/serial    {t_tp / t_shared:8.3f}   (equal share of the machine; target <= 1.10)")
        print(f"  ratio TP/alone     {t_tp / t_alone:8.3f}   (the serial run also had the idle core's cache and "
              f"memory bandwidth)")
        print(f"all_reduce 1 MiB float32 over {world} ranks, median of {args.allreduce_iters}")
        print(f"  raw Allreduce      {t_raw * 1e6:8.1f} us")
        print(f"  traced all_reduce  {t_traced * 1e6:8.1f} us")
        print(f"  ratio traced/raw   {t_traced / t_raw:8.3f}   (target <= 1.05)")


if __name__ == "__main__":
    main()
