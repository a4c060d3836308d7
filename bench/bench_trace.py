"""Tracing overhead benchmark (not a test): demo-sized GPT training steps with the tracer on vs off.

    mpirun -n 8 python bench/bench_trace.py

The demo's model and step (2 layers, hidden 64, 4 heads, vocab 32, seq 16, global batch 16, float64,
TP 4 x DP 2, AdamW, DP gradient sync, clipping). "Off" is ``tracer.enabled = False``, which silences both the
collective records and the compute spans. Steps alternate off/on (swapping which goes first every pair) so
both see the same machine state; every step starts after a barrier and counts as the slowest rank's time.
Target: median(on) / median(off) <= 1.03.

Below the ratio, the per-call costs, timed in a tight loop on rank 0 while the other ranks sleep: one span,
and one collective's bookkeeping in ``Group._record`` (sizes, dtype name, the ``CommEvent``). With 8 ranks on
2 cores every microsecond of Python on every rank costs about four of wall time, and more where it pushes a
rank past its scheduler slice, so the measured ratio sits above the plain CPU estimate printed last.
"""

from __future__ import annotations

import argparse
import os
import time

import tpsim  # noqa: F401  - sets one BLAS thread per rank before NumPy is imported
import numpy as np
from mpi4py import MPI

from tpsim.comm import ProcessGrid, Tracer
from tpsim.data import ReverseTask
from tpsim.models.build import build_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.train import AdamW, GradSync, dp_slice, train_step


def quiet_wait(comm: MPI.Comm) -> None:
    """Wait for the others without spinning a core (MPI's own barrier busy-polls)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def per_call_us(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def micro_costs(group, n: int) -> dict[str, float]:
    """Microseconds per span (on, off) and per collective's record (``Group._record``, the whole bookkeeping
    a traced collective adds), in a tight loop on one rank."""
    on, off = Tracer(), Tracer(enabled=False)

    def span(tr):
        with tr.span("transformer.h.0.attn", "forward"):
            pass

    x = np.zeros((8, 16, 64))
    group.tracer.enabled = True
    empty = per_call_us(lambda: None, n)
    costs = {"span on": per_call_us(lambda: span(on), n) - empty, "span off": per_call_us(lambda: span(off), n) - empty,
             "record": per_call_us(lambda: group._record("all_reduce", x, x.shape, 0.0, "sum"), n) - empty}
    group.tracer.reset()
    return costs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=150, help="off/on pairs of training steps")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    world, rank = comm.Get_size(), comm.Get_rank()
    tp = args.tp if world % args.tp == 0 else world
    grid = ProcessGrid(tp=tp)
    cfg = GPTConfig(vocab_size=32, n_positions=16, n_embd=64, n_layer=2, n_head=4).check(tp)
    model = build_gpt(cfg, grid.tp_group, seed=1234)
    sync = GradSync(model, grid.dp_group, bucket_cap_bytes=25 * 2**20)
    opt = AdamW(model, lr=3e-3, weight_decay=0.01)
    ids, labels = ReverseTask(32, 16).batch(1234, 0, 16)
    rows = dp_slice(16, grid.dp, grid.dp_rank)
    ids, labels = ids[rows], labels[rows]
    tracer = grid.tracer

    def one_step(enabled: bool, step: int) -> float:
        tracer.enabled = enabled
        tracer.step = step
        comm.Barrier()  # every step starts together, so each rank's time is the step's
        t = time.perf_counter()
        train_step(model, opt, grid, sync, ids, labels, clip=1.0)
        return time.perf_counter() - t

    for step in range(5):  # warm-up: first-touch allocations, MPI connections
        one_step(True, step)
    counts = (len(tracer.events) // 5, (len(tracer.spans) + len(tracer.marks)) // 5)
    samples: dict[bool, list[float]] = {False: [], True: []}
    for i in range(args.pairs):  # alternate step by step, swapping which goes first every pair
        for enabled in ((False, True) if i % 2 == 0 else (True, False)):
            samples[enabled].append(one_step(enabled, i))
    times = {}
    for enabled, local in samples.items():  # the slowest rank's time of each step
        worst = np.empty(len(local))
        comm.Allreduce(np.array(local), worst, op=MPI.MAX)
        times[enabled] = worst
    costs = micro_costs(grid.tp_group, 100_000) if rank == 0 else {}  # rank 0 alone: the others sleep
    quiet_wait(comm)
    off, on = float(np.median(times[False])), float(np.median(times[True]))
    if rank == 0:
        print(f"GPT {cfg.n_layer} layers, hidden {cfg.n_embd}, {cfg.n_head} heads, vocab {cfg.vocab_size}, "
              f"seq 16, batch 16, float64; TP {grid.tp} x DP {grid.dp} on {world} ranks")
        print(f"{args.pairs} off/on pairs of training steps, interleaved; medians of the slowest rank's time")
        print(f"  tracing off      {off * 1e3:8.2f} ms/step   (min {min(times[False]) * 1e3:.2f})")
        print(f"  tracing on       {on * 1e3:8.2f} ms/step   (min {min(times[True]) * 1e3:.2f})")
        print(f"  ratio on/off     {on / off:8.3f}   (target <= 1.03)")
        estimate_us = counts[0] * costs["record"] + counts[1] * costs["span on"]
        cores = len(os.sched_getaffinity(0))
        print(f"per rank per step: {counts[0]} collective records, {counts[1]} compute spans")
        print(f"  one span {costs['span on']:.2f} us on, {costs['span off']:.2f} us off; one collective's record "
              f"{costs['record']:.2f} us")
        print(f"  CPU estimate: {estimate_us:.0f} us per rank per step; x {world} ranks / {cores} cores = "
              f"{estimate_us * world / cores / (off * 1e6):.2%} of a step")


if __name__ == "__main__":
    main()
