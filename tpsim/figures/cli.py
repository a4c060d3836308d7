"""The formula figures, from real runs: ``python -m tpsim.figures [--out figures/]`` (``make figures``).

Measure at TP 1, 2, 4, 8 (``runs``), refuse to draw unless every measured byte equals its formula, then draw
the four figures (``comm``, ``whatif``, ``memory``), the planner's three (``plan``) and write ``figures.json``
with their numbers.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from tpsim.figures.comm import plot_bytes_vs_tp, series_of
from tpsim.figures.memory import plot_memory, plot_sp_memory
from tpsim.figures.plan import plot_plan_figures
from tpsim.figures.runs import measure_comm, measure_memory
from tpsim.figures.style import TOY, TP_SIZES, toy_config
from tpsim.figures.whatif import plot_whatif, whatif_numbers
from tpsim.config import RunConfig
from tpsim.predict.formulas import predict_step
from tpsim.trace.formula_check import compare
from tpsim.predict.memory import predict_memory
from tpsim.atomic import write_text
from tpsim.errors import ConfigError
from tpsim.paths import check_output_dir
from tpsim.options import OneLineParser


def memory_matches(tp: int, measured: dict[str, list[dict]]) -> bool:
    """Every run of the memory worker ("0.0" ... "sp 0.1"), every rank, equals ``predict_memory`` exactly."""
    runs = [(predict_memory(toy_config(), tp, TOY["batch_size"], TOY["seq_len"], np.float64, rank,
                            dropout=key.endswith("0.1"), sequence_parallel=key.startswith("sp")), got)
            for key, per_rank in measured.items() for rank, got in enumerate(per_rank)]
    return all(got[k] == v for pred, got in runs for k, v in pred.items())


def measure_all(folder: Path) -> tuple[dict[int, list[dict]], dict[int, list], dict[int, dict]]:
    """``(comm, predicted, memory)`` keyed by TP: the demo's last-step records, ``predict_step``'s rows, and
    the memory worker's bytes. Raises ``SystemExit`` when a measurement differs from its formula."""
    comm, predicted, memory = {}, {}, {}
    for tp in TP_SIZES:
        comm[tp] = measure_comm(tp, folder / f"tp{tp}")
        memory[tp] = measure_memory(tp, folder)
        run = RunConfig.of(toy_config(), tp=tp, batch_size=TOY["batch_size"], seq_len=TOY["seq_len"])
        predicted[tp] = predict_step(run, clip=True)
        if not all(r.match for r in compare(comm[tp], predicted[tp])) or not memory_matches(tp, memory[tp]):
            raise SystemExit(f"TP {tp}: a measurement differs from its formula; not drawing it")
    return comm, predicted, memory


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m tpsim.figures", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="figures", help="output folder (default figures/)")
    args = parser.parse_args(argv)
    try:
        out = Path(check_output_dir(args.out, "--out"))  # before minutes of runs
    except ConfigError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        comm, predicted, memory = measure_all(Path(tmp))
    print(f"measured bytes and memory (TP, TP + SP) equal the formulas exactly at TP {', '.join(map(str, TP_SIZES))}")
    numbers = whatif_numbers()
    paths = [plot_bytes_vs_tp(comm, predicted, out / "bytes_vs_tp.png"),
             plot_whatif(numbers, out / "whatif_tp_placement.png"),
             plot_memory(memory, out / "memory_per_rank.png"), plot_sp_memory(memory, out / "sp_memory.png")]
    summary = {"bytes_per_rank_per_step": {tp: series_of(comm[tp], tp) for tp in TP_SIZES},
               "memory_rank0": {tp: memory[tp]["0.0"][0] for tp in TP_SIZES},
               "memory_rank0_sequence_parallel": {tp: memory[tp]["sp 0.0"][0] for tp in TP_SIZES},
               "whatif_seconds": {m.replace("\n", " "): v for m, v in numbers.items()}}
    plan_paths, summary["plan"] = plot_plan_figures(out)  # tpsim plan at real sizes: arithmetic, no runs
    paths += plan_paths
    paths.append(out / "figures.json")
    write_text(paths[-1], json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
