"""What the demo shows at the end: the per-layer communication table, figures and files in ``--out``."""

from __future__ import annotations

import json
from pathlib import Path

from tpsim.trace import format_comm_table, summarize, write_jsonl
from tpsim.trace.aggregate import by_layer

MODEL_PHASES = ("forward", "backward", "dp_sync", "data", "optimizer")


def step_table(records: list[dict], step: int, ranks: int) -> str:
    """Calls and bytes per rank for one training step, by layer, phase, op and group."""
    rows = [r for r in by_layer(records) if r["step"] == step and r["phase"] in MODEL_PHASES]
    order = {p: i for i, p in enumerate(MODEL_PHASES)}
    table = sorted(summarize(rows, ranks=ranks), key=lambda row: order[row.key[1]])  # stable: call order
    return format_comm_table(table, title=f"Communication per rank in training step {step} "
                                          f"(bytes = logical size, wire = ring algorithm):")


def write_outputs(out: Path, records: list[dict], metrics: list[dict], ranks: int, step: int,
                  title: str) -> list[Path]:
    """comm.jsonl, metrics.jsonl, loss.png and comm_bytes.png (rank 0 only calls this)."""
    from tpsim.trace.plots import plot_layer_bytes, plot_loss

    out.mkdir(parents=True, exist_ok=True)
    paths = [write_jsonl(records, out / "comm.jsonl")]
    with (out / "metrics.jsonl").open("w") as fh:
        for m in metrics:
            fh.write(json.dumps(m) + "\n")
    paths.append(out / "metrics.jsonl")
    if metrics:
        paths.append(plot_loss([m["step"] for m in metrics], [m["loss"] for m in metrics], out / "loss.png",
                               title=f"loss — {title}"))
    one_step = [r for r in records if r["step"] == step]
    paths.append(plot_layer_bytes(one_step, out / "comm_bytes.png", ranks=ranks,
                                  phases=("forward", "backward", "dp_sync"),
                                  title=f"collective bytes per layer, one step — {title}"))
    return paths
