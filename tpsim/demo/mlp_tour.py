"""The demo's first stop: a parallel MLP in every TP group, checked against its serial twin.

1. Build the grid and print it.  2. Draw the serial MLP's master weights (same seed on every rank) and shard
them.  3. TP rank 0 of each group reads a batch and broadcasts it inside its TP group (DP groups get different
batches).  4. Forward and backward, traced.  5. Compare output, input gradient and every parameter shard
with the serial model.  6. Print the per-layer communication table and write ``comm.jsonl``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.comm.agree import Agreement
from tpsim.compare import relative_difference, shard_differences
from tpsim.demo.report import difference_lines, say
from tpsim.nn import MLP
from tpsim.phases import DATA
from tpsim.tp import ParallelMLP
from tpsim.trace import format_comm_table, gather_records, summarize, write_jsonl

TOLERANCE = {"float64": 1e-12, "float32": 1e-5}  # of relative_difference (floor 1: absolute below 1)


def run(demo) -> int:
    """One parallel MLP forward and backward (``demo``: a ``tpsim.demo.cli.DemoConfig``) vs the serial MLP."""
    run, tokens = demo.run, demo.tokens
    name, hidden, seed = run.precision.dtype, run.model.hidden, run.schedule.seed
    dtype = np.dtype(name)
    grid = ProcessGrid(tp=run.parallel.tp, dp=run.parallel.dp)
    tracer = grid.tracer
    say(grid, grid.table(), "")

    serial = MLP(hidden, rng=np.random.default_rng(seed), dtype=dtype)
    mlp = ParallelMLP.from_serial(serial, grid.tp_group).set_path("mlp")

    x = np.empty((tokens, hidden), dtype=dtype)
    dz = np.empty_like(x)
    if grid.tp_rank == 0:  # only TP rank 0 "reads" data; each DP group gets its own batch
        rng = np.random.default_rng([seed, grid.dp_rank])
        x[:], dz[:] = rng.standard_normal(x.shape), rng.standard_normal(x.shape)
    with tracer.region(phase=DATA):
        grid.tp_group.broadcast(x)
        grid.tp_group.broadcast(dz)

    z, cache = mlp.forward(x)
    dx = mlp.backward(dz, cache)

    with tracer.paused():  # the serial reference is bookkeeping, not part of the parallel step
        z_ref, c_ref = serial.forward(x)
        dx_ref = serial.backward(dz, c_ref)
    diffs = {"output": relative_difference(z, z_ref), "input grad": relative_difference(dx, dx_ref),
             **shard_differences(mlp, dict(serial.named_grads("mlp")), prefix="mlp", floor=1.0)}
    worst = Agreement(grid.world).reduce(list(diffs.values()), op="max")
    tol = TOLERANCE[name]
    ok = bool(np.all(worst <= tol))
    say(grid, f"Parallel MLP (h={hidden}, ffn={4 * hidden}, {tokens} tokens, {name}) "
              f"vs the serial MLP, max relative difference over all {grid.world_size} ranks:",
        *difference_lines(diffs, worst),
        f"VERDICT: {'MATCH' if ok else 'MISMATCH'} — TP({grid.tp}) equals serial within {tol:g}", "")

    records = gather_records(tracer, grid.world)
    if grid.rank == 0:
        model = [r for r in records if r["phase"] in ("forward", "backward", "data")]
        print(format_comm_table(summarize(model, ranks=grid.world_size),
                                title="Communication per rank (one MLP forward + backward):"))
        out = Path(run.files.out)
        write_jsonl(records, out / "comm.jsonl")
        print(f"\nwrote {out / 'comm.jsonl'} ({len(records)} records from {grid.world_size} ranks)", flush=True)
    return 0 if ok else 1
