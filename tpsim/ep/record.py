"""What the experts did in a step: tokens per expert per layer, the imbalance, the drops, the auxiliary losses.

Every ``ExpertParallelMoE`` logs each forward (a micro-batch): the assignments it kept per expert (this rank's
tokens, after capacity), how many it dropped, and its L_aux and L_z. ``collect`` empties the logs of one step and
gathers them to rank 0 (untraced: a record, not model traffic), as ``Routing``:

    counts [ranks, layers, m, E]   per rank, MoE layer (in layer order) and micro-batch: the kept assignments
    load   [layers, E]             Σ over ranks and micro-batches: tokens per expert (each of k choices counted)
    imbalance [layers]             max / mean of load: 1 balanced; E / k when every token picks the same k
    dropped, aux_loss, z_loss      summed; the losses as the loss is (the mean over micro-batches and replicas)

The formulas of the all-to-all's bytes read ``counts`` (``tpsim.predict.moe_comm``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.ep.moe import ExpertParallelMoE


class Routing(NamedTuple):
    layers: list[str]  # the MoE layers' paths
    holders: list[list[int]]  # per layer: the ranks holding it (its stage's)
    counts: np.ndarray  # int [ranks, layers, m, E]
    dropped: int
    aux_loss: list[float]  # per layer
    z_loss: list[float]

    @property
    def load(self) -> np.ndarray:
        return self.counts.sum(axis=(0, 2))

    @property
    def imbalance(self) -> np.ndarray:
        load = self.load
        return load.max(axis=-1) / np.maximum(load.mean(axis=-1), 1e-300)

    def metrics(self) -> dict:
        """The step's numbers for metrics.jsonl."""
        return {"moe": {"layers": self.layers, "tokens_per_expert": self.load.tolist(),
                        "imbalance": [round(float(x), 6) for x in self.imbalance], "dropped": self.dropped,
                        "aux_loss": self.aux_loss, "z_loss": self.z_loss}}


def moe_layers(module) -> list[ExpertParallelMoE]:
    return [m for _, m in module.named_modules() if isinstance(m, ExpertParallelMoE)]


def collect(module, grid: ProcessGrid) -> Routing | None:
    """This step's routing of every rank, on rank 0 (None elsewhere, and where the model has no experts). Every
    rank calls it (a gather over the world); stages hold different layers, so each rank sends its own."""
    layers = moe_layers(module)
    mine = {m.path: m.log for m in layers}
    for m in layers:
        m.log = []
    with grid.tracer.paused():
        every = grid.world.gather_objects(mine, root=0)
    if grid.rank != 0 or not any(every):
        return None
    stage_of = {}  # layer path -> the ranks' logs (a rank of another stage holds none of it)
    for rank, logs in enumerate(every):
        for path, log in logs.items():
            stage_of.setdefault(path, {})[rank] = log
    paths = sorted(stage_of, key=lambda p: [int(t) if t.isdigit() else t for t in p.split(".")])
    m = max(len(log) for logs in stage_of.values() for log in logs.values())
    E = len(next(iter(next(iter(stage_of.values())).values()))[0][0])
    counts = np.zeros((grid.world_size, len(paths), m, E), dtype=np.int64)
    dropped, aux, z = 0, [], []
    for i, path in enumerate(paths):
        a = zs = 0.0
        for rank, log in stage_of[path].items():
            for j, (load, drop, la, lz) in enumerate(log):
                counts[rank, i, j] = load
                dropped += int(drop)
                a, zs = a + la, zs + lz
        n = len(stage_of[path]) * m  # each rank's value is its replica's (its sequences'), so the mean is the loss
        aux.append(a / n)
        z.append(zs / n)
    return Routing(paths, [sorted(stage_of[p]) for p in paths], counts, dropped, aux, z)


def routing_lines(routing: Routing) -> list[str]:
    """The last step's routing in words: tokens per expert per layer, the imbalance, the drops, the losses."""
    lines = ["Experts in the last step (tokens per expert: every rank and micro-batch, each of a token's k choices):"]
    for path, load, imb, a, z in zip(routing.layers, routing.load, routing.imbalance, routing.aux_loss,
                                     routing.z_loss):
        lines.append(f"  {path:<22} {' '.join(f'{int(n):>5}' for n in load)}   imbalance (max/mean) {imb:.3f}"
                     f"   L_aux {a:.5f}   L_z {z:.5f}")
    lines.append(f"  {routing.dropped} assignments dropped by capacity (their tokens keep the residual alone)")
    return lines
