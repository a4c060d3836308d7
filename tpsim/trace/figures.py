"""The formula figures, from real runs: ``python -m tpsim.trace.figures [--out figures/]`` (``make figures``).

For TP = 1, 2, 4, 8 (DP 1) it launches the demo under ``mpiexec`` in a subprocess — exactly what a reader
runs — reads the last step of its ``comm.jsonl``, and launches this module's memory worker, which builds the
same toy GPT, runs one forward and measures every live array (``tpsim.trace.memory``). Then it draws

    bytes_vs_tp.png          bytes per rank per step by phase and op: measured points on predict_step's lines
    whatif_tp_placement.png  α-β estimate of a step's communication for GPT sizes the toy runs cannot reach,
                             TP inside a node (NVLink) vs TP across nodes (InfiniBand) — the reason Megatron
                             keeps TP within the machine (Shoeybi et al., 2019, §5; Narayanan et al., 2021)
    memory_per_rank.png      measured memory per rank vs TP with our exact formulas, and the activation bytes
                             of one layer beside Korthikanti et al. (2022), Table 2
    sp_memory.png            activation memory per rank with and without sequence parallelism (``figures_memory``)

and ``figures.json`` with the numbers. Everything is seeded and the PNGs carry no timestamp, so a rerun gives
the same files. About 10 s on two cores, most of it ``mpiexec`` start-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tpsim.launcher import launch as run_mpiexec
from tpsim.plotting import pyplot

TP_SIZES = (1, 2, 4, 8)
SEED = 1234
TOY = dict(layers=2, hidden=64, heads=8, vocab=32, seq_len=16, batch_size=16)  # heads divide by 8
# Real sizes for the what-if (16-bit, sequence 2048, 4 sequences per DP rank, TP 8 x DP 8 = 8 nodes x 8 GPUs)
WHATIF_MODELS = {"GPT-2 medium\n(h 1024, 24 layers)": (1024, 24, 16), "GPT-3 2.7B\n(h 2560, 32 layers)":
                 (2560, 32, 32), "GPT-3 6.7B\n(h 4096, 32 layers)": (4096, 32, 32)}
WHATIF = dict(tp=8, dp=8, rows_per_dp=4, seq=2048, vocab=50257, bytes=2)
COLORS = {"params": "#4C72B0", "grads": "#55A868", "optimizer": "#8172B2", "activations": "#C44E52",
          "tp": "#4C72B0", "dp": "#DD8452"}


def toy_config():
    from tpsim.models.config import GPTConfig

    return GPTConfig(vocab_size=TOY["vocab"], n_positions=TOY["seq_len"], n_embd=TOY["hidden"],
                     n_layer=TOY["layers"], n_head=TOY["heads"])


# --- runs ------------------------------------------------------------------------------------------------------


def launch(n: int, args: list[str], timeout: float = 180) -> str:
    """``mpiexec -n N python ARGS`` (``tpsim.launcher``: killed whole on timeout); returns stdout or raises."""
    run = run_mpiexec(n, args, timeout=timeout)
    if run.returncode:
        what = f"did not finish within {timeout} s" if run.timed_out else f"exited with {run.returncode}"
        raise RuntimeError(f"mpiexec -n {n} {' '.join(args)} {what}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return run.stdout


def measure_comm(tp: int, folder: Path) -> list[dict]:
    """The demo at TP ``tp`` x DP 1 for 2 steps; the records of its last step (step 1), every rank."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TOY.items()]
    launch(tp, ["-m", "tpsim.demo", "--tp", str(tp), "--dp", "1", "--steps", "2", "--seed", str(SEED), *flags,
                "--out", str(folder)])
    records = [json.loads(line) for line in (folder / "comm.jsonl").read_text().splitlines()]
    return [r for r in records if r["step"] == 1]


def memory_worker(tp: int, path: str) -> int:
    """Under mpiexec: one forward of the toy GPT per dropout setting, without and with sequence parallelism
    (keys "0.0", "0.1", "sp 0.0", "sp 0.1"); rank 0 writes every rank's bytes."""
    from dataclasses import replace

    from tpsim.comm import ProcessGrid
    from tpsim.data import ReverseTask
    from tpsim.models.build import build_gpt
    from tpsim.models.gpt import DropoutPlan
    from tpsim.tp.random import ExactDropoutRNG
    from tpsim.trace.memory import measure_activations, measure_memory
    from tpsim.train import AdamW, GradSync

    grid = ProcessGrid(tp=tp)
    out = {}
    for sp, p in ((False, 0.0), (False, 0.1), (True, 0.0), (True, 0.1)):
        cfg = replace(toy_config(), dropout=p)
        model = build_gpt(cfg, grid.tp_group, seed=SEED, sequence_parallel=sp)
        GradSync(model, grid.dp_group)
        ids, labels = ReverseTask(cfg.vocab_size, TOY["seq_len"]).batch(SEED, 0, TOY["batch_size"])
        plan = DropoutPlan(ExactDropoutRNG(SEED), 0) if p else DropoutPlan()
        with grid.tracer.paused():
            _, cache = model.forward(ids, labels, plan)
        mine = measure_memory(model, AdamW(model), cache, exclude=(ids, labels)).as_dict()
        # GPT cache = (transformer, head, loss); transformer = (wte, wpe, dropout mask, [block caches], ln_f)
        mine["block0"] = measure_activations(cache[0][3][0])
        mine["itemsize"] = model.transformer.ln_f.params["weight"].itemsize
        out[("sp " if sp else "") + str(p)] = grid.world.gather_objects(mine)
    if grid.rank == 0:
        Path(path).write_text(json.dumps(out))
    return 0


# --- figures ---------------------------------------------------------------------------------------------------


def _save(fig, path: Path, title: str, footnote: str, bottom: float = 0.08) -> Path:
    """Title on top, sources in a footnote under the plots, saved without a timestamp."""
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.text(0.01, 0.01, footnote, fontsize=7, color="#444444", va="bottom", wrap=True)
    fig.savefig(path, dpi=130, metadata={"Software": None})  # no version/timestamp: reruns give equal files
    pyplot().close(fig)
    return path


def _tp_axes(ax, xlabel: str) -> None:
    """TP 1, 2, 4, 8 evenly spaced (log 2), log y (zeros left out), a light grid."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", nonpositive="mask")
    ax.set_xticks(TP_SIZES, [str(t) for t in TP_SIZES])
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3, which="both")


def series_of(rows, ranks: int = 1) -> dict[str, list[float]]:
    """``{"<phase> <op> (<GROUP>)": [bytes, wire bytes]}`` per rank, summed over layers (records or Predictions)."""
    out: dict[str, list[float]] = {}
    for r in rows:
        get = r.get if isinstance(r, dict) else lambda k, r=r: getattr(r, k)
        acc = out.setdefault(f"{get('phase')} {get('op')} ({get('group').upper()})", [0.0, 0.0])
        acc[0] += get("bytes") / ranks
        acc[1] += get("wire_bytes") / ranks
    return out


def plot_bytes_vs_tp(measured: dict[int, list[dict]], predicted: dict[int, list], path: Path) -> Path:
    plt = pyplot()
    names = sorted({k for tp in TP_SIZES for k in series_of(predicted[tp])},
                   key=lambda k: -max(series_of(predicted[tp]).get(k, [0])[0] for tp in TP_SIZES))
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.2), sharey=True)
    styles = ["-", "--", "-.", ":"]
    for ax, col, what in zip(axes, (0, 1), ("logical bytes (size of each collective's tensor)",
                                            "wire bytes (what one rank sends, ring algorithm)")):
        for i, name in enumerate(names + ["total"]):
            color, style = ("black", "-") if name == "total" else (f"C{i}", styles[i % len(styles)])

            def ys(rows, ranks=1):
                s = series_of(rows, ranks)
                return sum(v[col] for v in s.values()) if name == "total" else s.get(name, [0, 0])[col]

            pred = [ys(predicted[tp]) / 1024 for tp in TP_SIZES]
            meas = [ys(measured[tp], tp) / 1024 for tp in TP_SIZES]
            ax.plot(TP_SIZES, pred, style, color=color, lw=1.8, label=f"{name}, predicted")
            ax.plot(TP_SIZES, meas, "os^vD"[i % 5], color=color, mfc="none", ms=9 - i, label=f"{name}, measured")
        _tp_axes(ax, "tensor-parallel degree TP (DP = 1)")
        ax.set_title(what, fontsize=10)
    axes[0].set_ylabel("KiB per rank per training step")
    axes[0].text(1.1, 60, "every all-reduce carries the whole [b, s, h]:\nthe same bytes at any TP", fontsize=8)
    axes[1].text(1.1, 60, "the ring sends 2(p−1)/p of it:\n×1 at TP 2, ×1.5 at 4, ×1.75 at 8", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7.5, loc="lower center", ncol=len(names) + 1, bbox_to_anchor=(0.5, 0.07))
    title = (f"Collective bytes per rank per step vs TP — toy GPT (h {TOY['hidden']}, {TOY['layers']} layers, "
             f"vocab {TOY['vocab']}, batch {TOY['batch_size']} x seq {TOY['seq_len']}, float64)")
    return _save(fig, path, title, "Measured: `python -m tpsim.demo --tp T --dp 1`, step 1 of comm.jsonl, "
                                   "averaged per rank. Predicted: tpsim.trace.formulas.predict_step (Shoeybi et al. "
                                   "2019: 2 all-reduces of b·s·h forward, 2 backward per block; loss: 3 of b·s). At "
                                   "TP 1 nothing goes on the wire (0 is not drawn on a log axis).", bottom=0.17)


def whatif_numbers() -> dict[str, dict[str, dict[str, float]]]:
    """Seconds per step, by group, for each WHATIF model, TP placed inside vs across nodes."""
    from tpsim.models.config import GPTConfig
    from tpsim.trace.formulas import predict_step
    from tpsim.trace.hardware import IB_NDR, NVLINK4_H100, estimate_breakdown

    w, out = WHATIF, {}
    placements = {"TP in node (NVLink), DP across nodes (IB)": {"tp": NVLINK4_H100, "dp": IB_NDR},
                  "TP across nodes (IB), DP in node (NVLink)": {"tp": IB_NDR, "dp": NVLINK4_H100}}
    for name, (h, layers, heads) in WHATIF_MODELS.items():
        cfg = GPTConfig(vocab_size=w["vocab"], n_positions=w["seq"], n_embd=h, n_layer=layers, n_head=heads)
        rows = predict_step(cfg, w["tp"], w["dp"], w["rows_per_dp"] * w["dp"], w["seq"], w["bytes"], clip=True,
                            ddp_buckets=1)
        out[name] = {place: estimate_breakdown(rows, links) for place, links in placements.items()}
    return out


def plot_whatif(numbers, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 5.2))
    places = list(next(iter(numbers.values())))
    width = 0.38
    for m, (model, per_place) in enumerate(numbers.items()):
        for j, place in enumerate(places):
            x, bottom = m + (j - 0.5) * width, 0.0
            for group in ("tp", "dp"):
                ms = per_place[place].get(group, 0.0) * 1e3
                ax.bar(x, ms, width, bottom=bottom, color=COLORS[group], hatch="" if j == 0 else "//",
                       edgecolor="white", label=f"{group.upper()} collectives" if m == j == 0 else None)
                bottom += ms
            first = sum(per_place[places[0]].values()) * 1e3
            ratio = "" if j == 0 else f"\n(x{bottom / first:.1f})"
            ax.text(x, bottom, f"{bottom:.0f} ms{ratio}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(numbers)), list(numbers), fontsize=9)
    ax.set_ylabel("communication time per step (ms)")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.1)  # room for the labels above the tallest bar
    handles, labels = ax.get_legend_handles_labels()
    from matplotlib.patches import Patch

    handles += [Patch(facecolor="white", edgecolor="black", label=places[0]),
                Patch(facecolor="white", edgecolor="black", hatch="//", label=places[1])]
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    w = WHATIF
    ax.set_title(f"Where should TP live? α-β ring estimate of one step's collectives, TP {w['tp']} x DP {w['dp']} "
                 f"on 8 nodes x 8 GPUs,\n{w['rows_per_dp']} sequences of {w['seq']} tokens per DP rank, 16-bit "
                 "activations and gradients", fontsize=10)
    return _save(fig, path, "", "Predicted bytes (tpsim.trace.formulas), priced by tpsim.trace.hardware: NVLink 4 "
                                "450 GB/s per direction, α 3 µs (NVIDIA H100 datasheet, 900 GB/s total); "
                                "InfiniBand NDR 50 GB/s per GPU, α 8 µs (ConnectX-7, 400 Gb/s). Nominal peaks and "
                                "assumed α, not measurements; one micro-batch, no gradient accumulation, no overlap "
                                "with compute.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpsim.trace.figures", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="figures", help="output folder (default figures/)")
    parser.add_argument("--memory-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_worker:  # one of the mpiexec launches below; run_main exits
        from tpsim.comm.launch import run_main

        run_main(lambda: memory_worker(args.tp, args.json), prog="tpsim.trace.figures")
    import numpy as np

    from tpsim.trace.figures_memory import plot_memory, plot_sp_memory
    from tpsim.trace.formulas import compare, predict_step
    from tpsim.trace.memory import predict_memory

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    comm, predicted, memory = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for tp in TP_SIZES:
            comm[tp] = measure_comm(tp, Path(tmp) / f"tp{tp}")
            launch(tp, ["-m", "tpsim.trace.figures", "--memory-worker", "--tp", str(tp), "--json", f"{tmp}/m.json"])
            memory[tp] = json.loads(Path(f"{tmp}/m.json").read_text())
            predicted[tp] = predict_step(toy_config(), tp, 1, TOY["batch_size"], TOY["seq_len"], np.float64,
                                         clip=True)
            runs = [(predict_memory(toy_config(), tp, TOY["batch_size"], TOY["seq_len"], np.float64, rank,
                                    dropout=key.endswith("0.1"), sequence_parallel=key.startswith("sp")), got)
                    for key, per_rank in memory[tp].items() for rank, got in enumerate(per_rank)]
            memory_ok = all(got[k] == v for pred, got in runs for k, v in pred.items())  # every run, every rank
            if not all(r.match for r in compare(comm[tp], predicted[tp])) or not memory_ok:
                raise SystemExit(f"TP {tp}: a measurement differs from its formula; not drawing it")
    print(f"measured bytes and memory (TP, TP + SP) equal the formulas exactly at TP {', '.join(map(str, TP_SIZES))}")
    numbers = whatif_numbers()
    paths = [plot_bytes_vs_tp(comm, predicted, out / "bytes_vs_tp.png"),
             plot_whatif(numbers, out / "whatif_tp_placement.png"),
             plot_memory(memory, out / "memory_per_rank.png"), plot_sp_memory(memory, out / "sp_memory.png")]
    summary = {"bytes_per_rank_per_step": {tp: series_of(comm[tp], tp) for tp in TP_SIZES},
               "memory_rank0": {tp: memory[tp]["0.0"][0] for tp in TP_SIZES},
               "memory_rank0_sequence_parallel": {tp: memory[tp]["sp 0.0"][0] for tp in TP_SIZES},
               "whatif_seconds": {m.replace("\n", " "): v for m, v in numbers.items()}}
    paths.append(out / "figures.json")
    paths[-1].write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
