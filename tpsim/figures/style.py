"""What every formula figure shares: the toy GPT the runs measure, the TP sizes, colours, axes, and saving.

Everything here is seeded or fixed, so a rerun of ``make figures`` gives byte-identical PNGs.
"""

from __future__ import annotations

from pathlib import Path

from tpsim.arch.gpt2 import GPTConfig
from tpsim.plotting import pyplot
from tpsim import atomic

TP_SIZES = (1, 2, 4, 8)
SEED = 1234
TOY = dict(layers=2, hidden=64, heads=8, vocab=32, seq_len=16, batch_size=16)  # heads divide by 8
COLORS = {"params": "#4C72B0", "grads": "#55A868", "optimizer": "#8172B2", "activations": "#C44E52",
          "tp": "#4C72B0", "dp": "#DD8452"}


def toy_config() -> GPTConfig:
    """The GPT of every measured run: ``TOY``'s sizes as a ``GPTConfig``."""
    return GPTConfig(vocab_size=TOY["vocab"], n_positions=TOY["seq_len"], n_embd=TOY["hidden"],
                     n_layer=TOY["layers"], n_head=TOY["heads"])


def save_figure(fig, path: Path, title: str, footnote: str, bottom: float = 0.08) -> Path:
    """Title on top, sources in a footnote under the plots, saved without a timestamp."""
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.text(0.01, 0.01, footnote, fontsize=7, color="#444444", va="bottom", wrap=True)
    atomic.save_figure(fig, path, dpi=130, metadata={"Software": None})  # no version/timestamp: reruns give equal files
    pyplot().close(fig)
    return path


def tp_axes(ax, xlabel: str) -> None:
    """TP 1, 2, 4, 8 evenly spaced (log 2), log y (zeros left out), a light grid."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", nonpositive="mask")
    ax.set_xticks(TP_SIZES, [str(t) for t in TP_SIZES])
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3, which="both")
