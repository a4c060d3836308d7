"""The memory figures of ``make figures``: memory_per_rank.png and sp_memory.png.

memory_per_rank.png — parameters, gradients, optimizer state and activations per rank vs TP: the live arrays
(``tpsim.predict.memory.measure_memory``) on tpsim's exact formulas, and one layer beside Korthikanti et al.
(2022) Table 2 in 16-bit accounting.

sp_memory.png — activation memory per rank vs TP, with and without sequence parallelism.

``python -m tpsim.figures`` draws them from the memory worker's runs (``runs.measure_memory``): for
TP = 1, 2, 4, 8 one forward of the toy GPT per dropout setting, built with and without ``sequence_parallel``,
every live array of the cache counted by ``tpsim.predict.memory`` (buffers deduplicated by owner). sp_memory.png
has two panels:

    left   the whole forward cache on TP rank 0, float64 activations plus bool masks, as stored: measured
           points on our exact formula (``predict_memory(..., sequence_parallel=...)``), dropout off and on
    right  one transformer layer with dropout on, beside Korthikanti et al. (2022) Table 2's TP and TP + SP
           lines priced at tpsim's dtype: 8 bytes a float, 1 a mask (``korthikanti_layer_elements``)

Under plain TP the LayerNorm/dropout region stays whole on every rank, so the layer tends to a floor; under
SP it is split too and the whole layer falls as 1/t.
"""

from __future__ import annotations

from pathlib import Path

from tpsim.plotting import pyplot
from tpsim.figures.style import COLORS, TOY, TP_SIZES, save_figure, tp_axes, toy_config


def plot_memory(measured: dict[int, dict], path: Path) -> Path:
    import numpy as np

    from tpsim.predict.gpt_memory import block_activation_elements, korthikanti_layer_bytes
    from tpsim.predict.memory import predict_memory

    plt = pyplot()
    cfg, b, s = toy_config(), TOY["batch_size"], TOY["seq_len"]
    h, a = cfg.n_embd, cfg.n_head
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11.5, 4.8))
    for key in ("params", "grads", "optimizer", "activations"):
        pred = [predict_memory(cfg, t, b, s, np.float64)[key] / 2**20 for t in TP_SIZES]
        meas = [measured[t]["0.0"][0][key] / 2**20 for t in TP_SIZES]  # rank 0
        label = {"optimizer": "optimizer (AdamW m, v)", "grads": "grads (= params)"}.get(key, key)
        dashed = key == "params"  # params and grads are equal: dash one so both show
        ax.plot(TP_SIZES, pred, "--" if dashed else "-", color=COLORS[key], label=label)
        ax.plot(TP_SIZES, meas, "s" if dashed else "o", color=COLORS[key], mfc="none", ms=11 if dashed else 8)
    ax.text(1.1, 1.3, "activations: the replicated [b, s, h] terms do not\nshrink with TP (what sequence "
                      "parallelism splits)", fontsize=8, color=COLORS["activations"])
    ax.set_ylabel("MiB on TP rank 0")
    ax.set_title("memory per rank (lines: tpsim formulas, circles: live arrays)", fontsize=10)
    ts = np.array(TP_SIZES)
    paper = [korthikanti_layer_bytes(s, b, h, a, t) / 1024 for t in TP_SIZES]
    bx.plot(ts, paper, "k--", label="Korthikanti et al. 2022, Table 2 (TP)")
    for p, style in (("0.1", "-"), ("0.0", ":")):
        ours = [(2 * f + m) / 1024 for f, m in (block_activation_elements(b, s, h, a, t, p != "0.0") for t in ts)]
        meas = [(measured[t][p][0]["block0"]["activations"] / measured[t][p][0]["itemsize"] * 2
                 + measured[t][p][0]["block0"]["masks"]) / 1024 for t in TP_SIZES]
        bx.plot(ts, ours, style, color=COLORS["activations"], label=f"tpsim, dropout {'on' if p != '0.0' else 'off'}")
        bx.plot(ts, meas, "o", color=COLORS["activations"], mfc="none", ms=8)
    bx.set_ylabel("KiB per transformer layer per rank")
    bx.set_title("one layer's activations in 16-bit accounting (2 B a float, 1 B a mask)", fontsize=10)
    for axis in (ax, bx):
        tp_axes(axis, "tensor-parallel degree TP")
        axis.legend(fontsize=8)
    title = (f"Memory per rank vs TP — toy GPT (h {h}, {cfg.n_layer} layers, {a} heads, vocab {cfg.vocab_size}, "
             f"b {b}, s {s}, float64)")
    return save_figure(fig, path, title,
                       "Measured: tpsim.predict.memory.measure_memory (cache buffers deduplicated by "
                       "owner). Right: tpsim caches LayerNorm's x̂ and rstd, not its input, and no masks "
                       "without dropout; with dropout it is the paper's line plus 4·b·s bytes (the two "
                       "rstd vectors). The paper counts 16-bit; tpsim stores float64 (left panel).")


SP_COLOR = "#2A9D8F"
VARIANTS = {"TP": ("", COLORS["activations"]), "TP + SP": ("sp ", SP_COLOR)}  # name: (worker key prefix, colour)


def plot_sp_memory(measured: dict[int, dict], path: Path) -> Path:
    """``measured[tp][key][rank]``: the memory worker's dicts, key "0.0" / "0.1" (TP) or "sp 0.0" / "sp 0.1"."""
    import numpy as np
    from matplotlib.ticker import FormatStrFormatter

    from tpsim.predict.gpt_memory import block_activation_elements, korthikanti_layer_elements
    from tpsim.predict.memory import predict_memory

    plt = pyplot()
    cfg, b, s = toy_config(), TOY["batch_size"], TOY["seq_len"]
    h, a, item = cfg.n_embd, cfg.n_head, np.dtype(np.float64).itemsize
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11.5, 5))
    gap, layer = 0.0, {}
    for name, (prefix, color) in VARIANTS.items():
        sp = bool(prefix)
        for p, style in (("0.1", "-"), ("0.0", ":")):
            pred = [predict_memory(cfg, t, b, s, np.float64, dropout=p != "0.0", sequence_parallel=sp)
                    for t in TP_SIZES]
            meas = [measured[t][prefix + p][0] for t in TP_SIZES]  # TP rank 0
            ax.plot(TP_SIZES, [(m["activations"] + m["masks"]) / 2**20 for m in pred], style, color=color,
                    label=f"{name}, dropout {'on' if p != '0.0' else 'off'}")
            ax.plot(TP_SIZES, [(m["activations"] + m["masks"]) / 2**20 for m in meas], "o", color=color,
                    mfc="none", ms=8)
        ours = [block_activation_elements(b, s, h, a, t, dropout=True, sequence_parallel=sp) for t in TP_SIZES]
        paper = [korthikanti_layer_elements(s, b, h, a, t, sequence_parallel=sp) for t in TP_SIZES]
        meas = [measured[t][prefix + "0.1"][0]["block0"] for t in TP_SIZES]
        ours, paper = ([(item * f + m) / 1024 for f, m in rows] for rows in (ours, paper))
        gap = max([gap, *(1 - q / o for o, q in zip(ours, paper))])  # the rstd vectors' share of our layer
        layer[name] = ours
        bx.plot(TP_SIZES, ours, "-", color=color, lw=2.2, label=f"tpsim, {name}")
        bx.plot(TP_SIZES, [(m["activations"] + m["masks"]) / 1024 for m in meas], "o", color=color, mfc="none", ms=8)
        bx.plot(TP_SIZES, paper, ls="--" if sp else ":", color="black", lw=1.2,
                label=f"Korthikanti et al. 2022, Table 2, {name}")
    t, kept = TP_SIZES[-1], layer["TP + SP"][-1] / layer["TP"][-1]
    bx.text(0.97, 0.97, f"at TP {t}, SP keeps {kept:.0%} of TP's layer:\nthe LayerNorm/dropout region ÷ {t} too,\n"
                        f"attention and MLP internals ÷ {t} either way", fontsize=8, transform=bx.transAxes,
            ha="right", va="top")
    ax.set_ylabel("MiB on TP rank 0 (float64 activations + bool masks)")
    ax.set_title("whole forward cache (lines: tpsim formula, circles: live arrays)", fontsize=10)
    bx.set_ylabel("KiB per transformer layer on TP rank 0")
    bx.set_title("one layer, dropout on, at 8 B a float and 1 B a mask", fontsize=10)
    for axis in (ax, bx):
        tp_axes(axis, "tensor-parallel degree TP (DP = 1)")
        axis.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        axis.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
        axis.tick_params(axis="y", which="both", labelsize=8)
        axis.legend(fontsize=8, loc="lower left")
    title = (f"Activation memory per rank vs TP, with and without sequence parallelism (SP)\ntoy GPT: h {h}, "
             f"{cfg.n_layer} layers, {a} heads, vocab {cfg.vocab_size}, batch {b} x seq {s}, float64")
    return save_figure(fig, path, title,
                       "Measured: tpsim.predict.memory.measure_activations on one forward's cache "
                       "(buffers deduplicated by owner), TP rank 0; lines: predict_memory and "
                       "block_activation_elements(..., sequence_parallel). Paper: its 16-bit floats "
                       "re-priced at 8 B, masks at 1 B. What differs from the paper: tpsim keeps "
                       "LayerNorm's x̂ and rstd where Megatron keeps its input (+2·b·s/r floats a layer, "
                       f"r = 1 for TP, t for SP: at most {gap:.1%} here), keeps no masks with dropout off, "
                       "and stores float64; the rest agrees element for element.", bottom=0.09)
