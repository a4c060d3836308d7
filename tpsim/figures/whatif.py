"""whatif_tp_placement.png: where should TP live? The α-β time of one step's collectives for GPT sizes the toy
runs cannot reach, TP 8 placed inside a node (NVLink) vs across nodes (InfiniBand).

Bytes from ``tpsim.predict.formulas.predict_step``, priced by ``tpsim.predict.hardware`` — the reason Megatron keeps
TP within the machine (Shoeybi et al., 2019, §5; Narayanan et al., 2021).
"""

from __future__ import annotations

from pathlib import Path

from tpsim.arch.gpt2 import GPTConfig
from tpsim.plotting import pyplot
from tpsim.figures.style import COLORS, save_figure
from tpsim.config import RunConfig
from tpsim.predict.formulas import predict_step
from tpsim.links import IB_NDR, NVLINK4_H100
from tpsim.predict.hardware import estimate_breakdown

# Real sizes for the what-if (16-bit, sequence 2048, 4 sequences per DP rank, TP 8 x DP 8 = 8 nodes x 8 GPUs)
WHATIF_MODELS = {"GPT-2 medium\n(h 1024, 24 layers)": (1024, 24, 16), "GPT-3 2.7B\n(h 2560, 32 layers)":
                 (2560, 32, 32), "GPT-3 6.7B\n(h 4096, 32 layers)": (4096, 32, 32)}
WHATIF = dict(tp=8, dp=8, rows_per_dp=4, seq=2048, vocab=50257, bytes=2)


def whatif_numbers() -> dict[str, dict[str, dict[str, float]]]:
    """Seconds per step, by group, for each WHATIF model, TP placed inside vs across nodes."""
    w, out = WHATIF, {}
    placements = {"TP in node (NVLink), DP across nodes (IB)": {"tp": NVLINK4_H100, "dp": IB_NDR},
                  "TP across nodes (IB), DP in node (NVLink)": {"tp": IB_NDR, "dp": NVLINK4_H100}}
    for name, (h, layers, heads) in WHATIF_MODELS.items():
        cfg = GPTConfig(vocab_size=w["vocab"], n_positions=w["seq"], n_embd=h, n_layer=layers, n_head=heads)
        run = RunConfig.of(cfg, tp=w["tp"], dp=w["dp"], batch_size=w["rows_per_dp"] * w["dp"], seq_len=w["seq"])
        rows = predict_step(run, clip=True, ddp_buckets=1, itemsize=w["bytes"])
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
    return save_figure(fig, path, "",
                       "Predicted bytes (tpsim.predict.formulas), priced by tpsim.predict.hardware: NVLink 4 "
                       "450 GB/s per direction, α 3 µs (NVIDIA H100 datasheet, 900 GB/s total); "
                       "InfiniBand NDR 50 GB/s per GPU, α 8 µs (ConnectX-7, 400 Gb/s). Nominal peaks and "
                       "assumed α, not measurements; one micro-batch, no gradient accumulation, no overlap "
                       "with compute.")
