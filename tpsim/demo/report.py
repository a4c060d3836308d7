"""What the demo prints and writes: rank 0's lines, differences from the serial model, the per-layer
communication table, figures and files in ``--out``."""

from __future__ import annotations

import json
from pathlib import Path

from tpsim.comm import ProcessGrid
from tpsim.phases import BACKWARD, DATA, DP_SYNC, FORWARD, OPTIMIZER, SP_GRAD_SYNC
from tpsim.table import format_table
from tpsim.trace import format_comm_table, summarize, write_jsonl
from tpsim.trace.aggregate import by_layer
from tpsim.atomic import write_lines

MODEL_PHASES = (FORWARD, BACKWARD, SP_GRAD_SYNC, DP_SYNC, DATA, OPTIMIZER)  # the order of the table's rows


def grid_label(grid: ProcessGrid, sep: str = "x") -> str:
    """``TP(4) x DP(2)``, with ``x PP(2)`` when the model is cut into pipeline stages, ``x CP(2)`` after TP under
    context parallelism."""
    pp, cp = getattr(grid, "pp", 1), getattr(grid, "cp", 1)  # a stand-in grid may have neither
    label = f"TP({grid.tp}) {sep} " + (f"CP({cp}) {sep} " if cp > 1 else "") + f"DP({grid.dp})"
    return label + (f" {sep} PP({pp})" if pp > 1 else "")


def say(grid: ProcessGrid, *lines: str) -> None:
    """Print ``lines`` on rank 0 only, in one write."""
    if grid.rank == 0:
        print("\n".join(lines), flush=True)


def difference_lines(names, worst) -> list[str]:
    """``  name  1.2e-16`` per tensor, names aligned: each tensor's worst difference over the ranks."""
    rows = [[name, f"{value:.2e}"] for name, value in zip(names, worst)]
    return ["  " + line for line in format_table(rows, right=()).split("\n")]


def step_table(records: list[dict], step: int, ranks: int) -> str:
    """Calls and bytes per rank for one training step, by layer, phase, op and group."""
    rows = by_layer(r for r in records if r["step"] == step and r["phase"] in MODEL_PHASES)  # filter, then copy
    order = {p: i for i, p in enumerate(MODEL_PHASES)}
    table = sorted(summarize(rows, ranks=ranks), key=lambda row: order[row.key[1]])  # stable: call order
    return format_comm_table(table, title=f"Communication per rank in training step {step} "
                                          f"(bytes = logical size, wire = ring algorithm):")


def write_outputs(out: Path, records: list[dict], metrics: list[dict], ranks: int, step: int,
                  title: str, *, spans: list[dict] | None = None, virtual: dict | None = None) -> list[Path]:
    """comm.jsonl, metrics.jsonl, loss.png and comm_bytes.png; given the compute ``spans`` (``gather_spans``)
    also spans.jsonl, timeline.json (Chrome trace of the steps they cover, with a pipeline's ``virtual`` clock
    tracks when given) and timeline.png (rank 0 only)."""
    from tpsim.trace.run_folder import write_figures
    from tpsim.trace.timeline import chrome_trace, write_chrome_trace

    out.mkdir(parents=True, exist_ok=True)
    paths = [write_jsonl(records, out / "comm.jsonl")]
    paths.append(write_lines(out / "metrics.jsonl", (json.dumps(m) for m in metrics)))
    if spans is not None:
        paths.append(write_jsonl(spans, out / "spans.jsonl"))
        paths.append(write_chrome_trace(chrome_trace(spans, records, virtual=virtual), out / "timeline.json"))
    # the same function `tpsim plot` calls, so a regenerated figure is the one the run drew
    return paths + write_figures(out, records, metrics, spans, step, ranks, title)


def training_line(run, start: int, digits: int) -> str:
    """The line before the step table: which steps (``start`` > 0 when resumed), the optimizer, the task."""
    sch, opt = run.schedule, run.optimizer
    which = f"steps {start}..{sch.steps - 1}" if start else f"{sch.steps} steps"
    return (f"Training {which} (AdamW lr {opt.lr}, clip {opt.clip or 'off'}) on the reverse task "
            f"({digits} digits):")


def passed(checks: dict[str, bool | None]) -> bool:
    """Whether a run passes (exit status 0): no check failed; one that could not decide (None) fails nothing."""
    return all(held is not False for held in checks.values())


def closing_lines(grid: ProcessGrid, steps: int, metrics: list[dict], out: str,
                  checks: dict[str, bool | None]) -> list[str]:
    """The demo's last two lines: what the run showed (or which checks failed) and what to try next.

    ``checks``: each check by a short name (``"step 0 = serial"``) and whether it held: True, False, or None where
    it could not decide (the final state of a training that amplifies rounding too far); each has its line above.
    """
    failed = [name for name, held in checks.items() if held is False]
    undecided = [name for name, held in checks.items() if held is None]
    held = [name for name, held in checks.items() if held]
    first = metrics[0].get("step", 0) if metrics else 0  # > 0: a resumed run (--resume), which trained from there
    span = f"steps {first}..{steps - 1}" if first else f"{steps} step{'' if steps == 1 else 's'}"
    trained = f"{span}, loss {metrics[0]['loss']:.4f} -> {metrics[-1]['loss']:.4f}" if metrics else "step 0"
    verdict = f"FAILED: {', '.join(failed)} (see above)" if failed else f"every check holds: {', '.join(held)}"
    if undecided:
        verdict += f"; not decided: {', '.join(undecided)} (see above)"
    return [f"summary: {grid_label(grid)}, {trained}; {verdict}",
            f"next: tpsim report {out} --by kind · {out}/timeline.json in ui.perfetto.dev · tpsim lesson list"]
