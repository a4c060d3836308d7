"""The live part of exercise 21's check: the learner's answers against a real ``DistributedOptimizer`` (ZeRO-1)
over every rank of the world (TP 2 × DP world/2), once every pure answer was right.

A small GPT-2 is built on the grid, its gradients packed into padded buckets; one clipped AdamW step is traced.
A second model of the same sizes gets a ZeRO-2 optimizer, for its gradients at rest.
Then, on this rank:

    owned_slice(n, d, dp_rank)      for every bucket: the optimizer's owned range, and its positions that no
                                    piece of a parameter fills (the padding); the slices' lengths × 8 bytes:
                                    the gradients a ZeRO-2 optimizer (``stage=2``) keeps at rest, ``grad_bytes()``
    zero3_step_bytes(n, d, 8)       summed over the buckets: 3/2 of the step's traced reduce-scatter and
                                    all-gather bytes (float64: parameters and gradients of one dtype)

Imports MPI (``tpsim.comm``, ``tpsim.train``): ``lesson_21`` loads it only when it gets here.
"""

from __future__ import annotations

import numpy as np

from tpsim.teach.returned import as_numbers, describe
from tpsim.teach.verdict import Report

SEED, BATCH, CAP = 21, 4, 1500  # several buckets, most of them padded


def check_live(r: Report) -> None:
    from tpsim.arch.gpt2 import GPTConfig
    from tpsim.data import ReverseTask
    from tpsim.demo.tour_parts import read_batch
    from tpsim.models.build import build_gpt
    from tpsim.train import AdamW, train_step
    from tpsim.train.zero import DistributedOptimizer

    grid = r.grid(2 if r.world_size % 2 == 0 else 1)
    config = GPTConfig(vocab_size=19, n_positions=7, n_embd=10, n_layer=1, n_head=2)  # odd: padded buckets
    model = build_gpt(config, grid.tp_group, seed=SEED)
    zero = DistributedOptimizer(AdamW(model, lr=1e-2), grid, bucket_cap_bytes=CAP)
    sizes = dict((name, p.size) for name, p in model.named_parameters())
    elements = [sum(sizes[name] for name in bucket.names) for bucket in zero.buckets]
    # built on every rank, whatever the learner returns below (building one may be collective)
    zero2 = DistributedOptimizer(AdamW(build_gpt(config, grid.tp_group, seed=SEED)), grid, bucket_cap_bytes=CAP,
                                 stage=2)
    r.tracer.reset()
    ids, labels, _ = read_batch(grid, ReverseTask(config.vocab_size, config.n_positions), SEED, 0, BATCH)
    train_step(model, zero, grid, zero, ids, labels, clip=0.5)
    traced = sum(e.wire_bytes for e in r.tracer.events if e.group == "dp" and e.scope.startswith("zero"))
    where = (f"the live ZeRO-1 over {r.world_size} ranks ({grid.describe()}, {len(elements)} float64 buckets "
             f"of {', '.join(map(str, elements))} elements)")

    got = [r.call("owned_slice", n, grid.dp, grid.dp_rank) for n in elements]
    rows = []
    for answer, n in zip(got, elements):
        numbers = as_numbers(answer)
        if isinstance(numbers, str) or numbers[0].size != 3:
            r.require(False, "owned_slice on the live optimizer", f"your owned_slice returned {describe(answer)}: "
                                                                   "return three whole numbers (start, stop, padding)")
            rows = None
            break
        rows.append(numbers[0].reshape(-1))
    real = [(mine.start, mine.stop, len(mine) - sum(p.param.size for p in pieces))
            for mine, pieces in zip(zero.owned, zero.slices)]
    if rows is not None:
        r.compare(f"owned_slice(n, {grid.dp}, {grid.dp_rank}) for every bucket of {where}: its owned ranges and the "
                  "positions no parameter's piece fills", np.array(rows), np.array(real, dtype=np.float64), tol=0,
                  layout="rows")
        r.compare(f"8 bytes × the lengths (stop − start) of your owned slices of every bucket, against the gradient "
                  f"bytes a ZeRO-2 optimizer of the same buckets holds at rest on rank {r.rank} (grad_bytes())",
                  float(8 * sum(row[1] - row[0] for row in rows)), float(zero2.grad_bytes()), tol=0)

    got = [r.call("zero3_step_bytes", n, grid.dp, 8) for n in elements]
    read = [as_numbers(x) for x in got]
    bad = [answer for answer, x in zip(got, read) if isinstance(x, str) or x[0].size != 1]
    if bad:
        r.require(False, "zero3_step_bytes on the live optimizer", "your zero3_step_bytes returned "
                                                                   f"{describe(bad[0])}: return a number of bytes")
        return
    r.compare(f"zero3_step_bytes summed over the buckets of {where}, against 3/2 of the reduce-scatter and "
              f"all-gather bytes that rank {r.rank}'s step traced", float(sum(x[0].sum() for x in read)),
              1.5 * traced, tol=0)
