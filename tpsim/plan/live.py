"""The live side of ``tpsim plan --validate``: one rank of a small real run (run under ``mpiexec``).

    mpiexec -n N python -m tpsim.plan.live --tp T --dp D [--sp] --json PATH

Builds the toy GPT (float64, dropout 0.1 so the paper's masks exist), runs one traced training step of a
global batch split over the DP replicas, and measures on every rank: the bytes one layer (``transformer.h.0``)
caches, the parameters, gradients and optimizer state held, and the wire bytes of the step's collectives —
one layer's TP collectives and the DP gradient sync. Rank 0 writes every rank's numbers to PATH.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TOY = dict(vocab_size=37, n_positions=16, n_embd=24, n_layer=2, n_head=4, dropout=0.1)
ROWS_PER_REPLICA, SEED = 2, 16


def worker(tp: int, dp: int, sp: bool, path: str) -> int:
    import numpy as np

    from tpsim.comm import ProcessGrid
    from tpsim.models.build import build_gpt
    from tpsim.models.config import GPTConfig
    from tpsim.nn.dropout import DropoutPlan
    from tpsim.tp.random import ExactDropoutRNG
    from tpsim.trace.memory import measure_activations, measure_memory
    from tpsim.train import AdamW, GradSync, compute_grads

    grid = ProcessGrid(tp=tp, dp=dp)
    cfg = GPTConfig(**TOY)
    model = build_gpt(cfg, grid.tp_group, seed=SEED, sequence_parallel=sp)
    sync = GradSync(model, grid.dp_group) if dp > 1 else None
    rows = slice(grid.dp_rank * ROWS_PER_REPLICA, (grid.dp_rank + 1) * ROWS_PER_REPLICA)
    ids = np.random.default_rng(SEED).integers(0, cfg.vocab_size, (ROWS_PER_REPLICA * dp, cfg.n_positions))[rows]
    labels = np.roll(ids, -1, axis=1)
    plan = DropoutPlan(ExactDropoutRNG(SEED), 0)
    with grid.tracer.paused():
        _, cache = model.forward(ids, labels, plan)
    mine = measure_memory(model, AdamW(model), cache, exclude=(ids, labels)).as_dict()
    mine["layer"] = measure_activations(cache.transformer.h[0])
    grid.tracer.reset()
    compute_grads(model, grid, sync, ids, labels, plan=plan)
    events = list(grid.tracer.events)
    mine["tp_layer_wire"] = sum(e.wire_bytes for e in events if e.group == "tp"
                                and e.scope.startswith("transformer.h.0."))
    mine["dp_grad_wire"] = sum(e.wire_bytes for e in events if e.group == "dp" and e.scope.startswith("ddp"))
    everyone = grid.world.gather_objects(mine)
    if grid.rank == 0:
        Path(path).write_text(json.dumps(everyone))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tpsim.plan.live", description=worker.__doc__)
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--sp", action="store_true")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    from tpsim.comm.launch import run_main

    run_main(lambda: worker(args.tp, args.dp, args.sp, args.json), prog="tpsim.plan.live")
