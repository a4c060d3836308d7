"""The partial-FC stop: the InsightFace way vs the Megatron way for a face model with a huge classifier.

The two ways are §3.2 and §3.1 of the SenseParrots article; the InsightFace way is the model parallelism of
An et al. 2021, "Partial FC" (without its sampling of negative classes).

1. Draw the serial face model (backbone + classifier over ``classes`` identities) and a global batch.
2. Build both parallel models over the world group: Megatron (everything TP, batch broadcast, backbone run on
   every rank) and InsightFace (data-parallel backbone, class-sliced classifier, embeddings all-gathered).
3. One forward + backward each, traced separately; compare loss, d(embeddings) and every gradient with serial.
4. Side by side, per step per rank: bytes by collective, and FLOPs (backbone useful / redundant, classifier).
5. Rank 0 draws ``partial_fc.png``: bytes by op per way, FLOPs per rank per way.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.comm.agree import Agreement
from tpsim.comm.launch import world_size
from tpsim.compare import relative_difference, shard_differences
from tpsim.demo.mlp_tour import TOLERANCE
from tpsim.demo.report import difference_lines, say
from tpsim.errors import ConfigError
from tpsim.models.partial_fc import (FaceConfig, MegatronFaceModel, PartialFCModel, SerialFaceModel, backbone_flops,
                                     local_rows, loss_and_grads, redundant_flops, step_flops, synthetic_batch)
from tpsim.plotting import pyplot
from tpsim.table import format_table
from tpsim.trace import gather_records, summarize
from tpsim.table import human_bytes
from tpsim.atomic import save_figure

TITLES = {"megatron": "Megatron way", "partial_fc": "InsightFace way"}
PHASES = ("data", "forward", "backward", "dp_sync")  # what one training step moves (not "trace"/"verify")


def config_from(demo, world: int) -> FaceConfig:
    """Sizes from the ``DemoConfig`` (``--hidden`` is the backbone's, ``--classes`` the classifier's; features and
    the embedding at FaceConfig's defaults), checked on every rank before any collective."""
    cfg = FaceConfig(hidden=demo.run.model.hidden, classes=demo.classes)
    dtype, batch_size = demo.run.precision.dtype, demo.run.schedule.batch_size
    if dtype not in TOLERANCE:
        raise ConfigError(f"--dtype must be one of {sorted(TOLERANCE)}, got {dtype!r}")
    for name in ("features", "hidden", "emb_dim", "classes"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if cfg.classes < world:
        raise ConfigError(f"--classes {cfg.classes} must be at least the world size {world} (one class per rank)")
    if batch_size < 1 or batch_size % world:
        raise ConfigError(f"--batch-size {batch_size} must be a positive multiple of the world size {world} "
                          f"(equal per-rank batches for the data-parallel backbone)")
    return cfg


def human_flops(n: float) -> str:
    for unit in ("", "K", "M", "G"):
        if abs(n) < 1000 or unit == "G":
            return f"{n:.0f} {unit}FLOP" if not unit else f"{n:.1f} {unit}FLOP"
        n /= 1000
    return f"{n:.1f} GFLOP"  # pragma: no cover


def compare(model, serial, loss, loss_ref, d_emb, d_emb_ref) -> dict[str, float]:
    """Max relative difference of the loss, d(embeddings) and every gradient (shard vs master's matching part)."""
    return {"loss": relative_difference(loss, loss_ref), "d(embeddings)": relative_difference(d_emb, d_emb_ref),
            **shard_differences(model, dict(serial.named_grads()), floor=1.0)}


def comm_lines(summaries: dict[str, dict[tuple, object]]) -> list[str]:
    """Side-by-side (phase, op) rows: calls, bytes, wire bytes per rank for each way, and a total line."""
    keys = sorted({k for s in summaries.values() for k in s}, key=lambda k: (PHASES.index(k[0]), k[1]))
    head = ["phase", "op"] + [f"{TITLES[w]}: {c}" if c == "calls" else c for w in summaries
                              for c in ("calls", "bytes", "wire")]
    rows = [head]
    for key in keys + ["total"]:
        row = list(key) if key != "total" else ["total", ""]
        for s in summaries.values():
            picked = list(s.values()) if key == "total" else [s[key]] if key in s else []
            if not picked:
                row += ["-", "-", "-"]
                continue
            row += [f"{sum(r.calls for r in picked):g}", human_bytes(sum(r.bytes for r in picked)),
                    human_bytes(sum(r.wire_bytes for r in picked))]
        rows.append(row)
    return format_table(rows, right=range(2, len(head))).split("\n")


def flop_lines(flops: dict[str, list], cfg: FaceConfig, n: int, world: int) -> list[str]:
    """Per-rank rows (backbone useful / redundant, classifier, total) for each way, a sum row, the redundancy."""
    fields = ("backbone_useful", "backbone_redundant", "classifier", "total")
    rows = [["rank"] + [f"{TITLES[w]}: backbone useful" if f == fields[0] else f.replace("backbone_", "")
                        for w in flops for f in fields]]
    for r in range(world):
        rows.append([str(r)] + [human_flops(getattr(flops[w][r], f)) for w in flops for f in fields])
    rows.append(["all"] + [human_flops(sum(getattr(x, f) for x in flops[w])) for w in flops for f in fields])
    full = backbone_flops(n, cfg)
    waste = {w: human_flops(redundant_flops(cfg, n, world, w)) for w in flops}
    return format_table(rows).split("\n") + [
        f"redundant backbone FLOPs per step over the world: Megatron way {waste['megatron']} = {world - 1} x one "
        f"backbone pass of {human_flops(full)} (it runs {world}x), InsightFace way {waste['partial_fc']} (it runs 1x)"]


def plot(path: Path, summaries: dict, flops: dict, world: int) -> None:
    """Two panels: bytes per step per rank stacked by op, and FLOPs per rank stacked by kind (rank 0 only)."""
    plt = pyplot()  # on the plotting rank only: importing pyplot on every rank is slow
    fig, (ax_b, ax_f) = plt.subplots(1, 2, figsize=(12, 4.5))
    ways = list(summaries)
    ops = sorted({k[1] for s in summaries.values() for k in s})
    bottom = np.zeros(len(ways))
    for op in ops:
        vals = np.array([sum(r.bytes for k, r in summaries[w].items() if k[1] == op) for w in ways])
        ax_b.bar([TITLES[w] for w in ways], vals, bottom=bottom, label=op)
        bottom += vals
    for i, w in enumerate(ways):
        wire = sum(r.wire_bytes for r in summaries[w].values())
        ax_b.annotate(f"wire {human_bytes(wire)}", (i, bottom[i]), ha="center", va="bottom")
    ax_b.set(title="Collective bytes per step per rank, by op", ylabel="bytes (logical)")
    ax_b.legend()

    width, x = 0.38, np.arange(world)
    kinds = (("backbone_useful", "backbone (useful)", "tab:green"),
             ("backbone_redundant", "backbone (redundant)", "tab:red"), ("classifier", "classifier", "tab:blue"))
    for j, w in enumerate(ways):
        base = np.zeros(world)
        for attr, label, color in kinds:
            vals = np.array([getattr(f, attr) for f in flops[w]], dtype=float)
            ax_f.bar(x + (j - 0.5) * width, vals, width, bottom=base, color=color, hatch="//" if j else None,
                     edgecolor="white", label=None if j else label)  # colours name the kind, hatching the way
            base += vals
    ax_f.set_xticks(x, [f"rank {r}" for r in range(world)])
    ax_f.set(title="FLOPs per step per rank (plain: Megatron, hatched: InsightFace)", ylabel="FLOPs")
    ax_f.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def run(demo) -> int:
    """Both ways of ``demo`` (a ``tpsim.demo.cli.DemoConfig``: seed, dtype, out, classes, batch size, hidden)."""
    cfg = config_from(demo, world_size())
    name, seed, n = demo.run.precision.dtype, demo.run.schedule.seed, demo.run.schedule.batch_size
    dtype = np.dtype(name)
    grid = ProcessGrid(tp=1)  # the world group is the model-parallel group of both ways
    world, tracer = grid.world, grid.tracer

    serial = SerialFaceModel(cfg, rng=np.random.default_rng(seed), dtype=dtype)
    x, labels = synthetic_batch(seed, n, cfg, dtype)
    with tracer.paused():  # the serial reference is bookkeeping, not part of either parallel step
        loss_ref, d_emb_ref = loss_and_grads(serial, x, labels)

    mine = local_rows(n, world)
    batches = {"megatron": (x, labels) if world.rank == 0 else (np.zeros_like(x), np.zeros_like(labels)),
               "partial_fc": (x[mine], labels[mine])}  # Megatron reads on rank 0; InsightFace: each rank its own
    models = {"megatron": MegatronFaceModel(serial, world), "partial_fc": PartialFCModel(serial, world)}
    summaries, diffs = {}, {}
    for way, model in models.items():
        tracer.reset()
        loss, d_emb = loss_and_grads(model, *batches[way])
        records = gather_records(tracer, world)
        if world.rank == 0:
            steps = [r for r in records if r["phase"] in PHASES]
            summaries[way] = {row.key: row for row in summarize(steps, keys=("phase", "op"), ranks=world.size)}
        d_emb_mine = d_emb_ref[mine] if way == "partial_fc" else d_emb_ref  # InsightFace: own samples' rows
        diffs[way] = compare(model, serial, loss, loss_ref, d_emb, d_emb_mine)

    tol, ok = TOLERANCE[name], True
    about = {"megatron": f"all TP({world.size}): batch broadcast, backbone on every rank, column-parallel classifier",
             "partial_fc": f"DP({world.size}) backbone + partial-FC classifier, "
                           f"{'uneven' if cfg.classes % world.size else 'even'} class slices"}
    say(grid, f"Face model: features {cfg.features} -> hidden {cfg.hidden} -> embedding {cfg.emb_dim}, "
              f"{cfg.classes} classes, global batch {n}, {name}, {world.size} ranks", "")
    for way, d in diffs.items():
        worst = Agreement(world).reduce(list(d.values()), op="max")
        good = bool(np.all(worst <= tol))
        ok &= good
        say(grid, f"{TITLES[way]} ({about[way]}) vs serial, max relative difference over all ranks:",
            *difference_lines(d, worst),
            f"VERDICT: {'MATCH' if good else 'MISMATCH'} — {TITLES[way]} equals serial within {tol:g}", "")

    flops = {w: [step_flops(cfg, n, world.size, r, w) for r in range(world.size)] for w in models}
    if world.rank == 0:
        say(grid, "Collectives per step per rank (bytes = logical tensor, wire = sent under ring algorithms):",
            *comm_lines(summaries), "",
            "FLOPs per step per rank (matmuls, forward + backward ~ 3 x forward):",
            *flop_lines(flops, cfg, n, world.size))
        path = Path(demo.run.files.out) / "partial_fc.png"
        plot(path, summaries, flops, world.size)
        say(grid, f"\nwrote {path}")
    return 0 if ok else 1
