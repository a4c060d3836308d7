"""A run folder as data: read its files back, pick a step, and draw its figures.

The demo writes the files (``tpsim.demo.report.write_outputs``) and draws the figures with ``write_figures``;
``tpsim plot`` reads the files back (``load_run``) and calls the same ``write_figures``, so a regenerated
figure is the figure the run drew. Everything here is single-process: no MPI.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpsim.kinds import LAYER
from tpsim.phases import DP_SYNC, PASSES
from tpsim.trace.records import grid_sizes, pipeline_size, read_jsonl
from tpsim.trace.schema import COMM_FIELDS, OVERLAP_FIELDS, P2P_FIELDS, SPAN_FIELDS, field_problems

FILES = {"comm": "comm.jsonl", "metrics": "metrics.jsonl", "spans": "spans.jsonl"}


class RunFolderError(Exception):
    """A run folder that cannot be read: missing, lacking a file, or holding a malformed line."""


@dataclass
class Run:
    path: Path
    comm: list[dict] | None  # None: the file is not there
    metrics: list[dict] | None
    spans: list[dict] | None

    @property
    def ranks(self) -> int:
        return max(1, len({r["rank"] for r in self.comm or []}))


def load_run(path: str | Path, need: tuple[str, ...] = ("comm",)) -> Run:
    """Read every known file of the folder; raise ``RunFolderError`` if one in ``need`` is missing or bad."""
    path = Path(path)
    if not path.is_dir():
        raise RunFolderError(f"no run folder {path} (run: mpirun -n 8 python -m tpsim.demo --out {path})")
    loaded = {}
    for key, name in FILES.items():
        file = path / name
        if not file.exists():
            if key in need:
                raise RunFolderError(f"{file} is missing (is {path} a tpsim run folder?)")
            loaded[key] = None
            continue
        try:
            rows = read_jsonl(file)
        except (OSError, ValueError) as err:
            raise RunFolderError(str(err)) from None
        if key == "spans":  # folders written before spans had kinds hold layer spans only
            for row in rows:
                row.setdefault("kind", LAYER)
        fields = {"comm": COMM_FIELDS, "spans": SPAN_FIELDS}.get(key)
        for number, row in enumerate(rows if fields else [], start=1):  # the first bad row is enough to say
            problems = field_problems(row, fields)
            if key == "comm" and row.get("op") in ("send", "recv"):
                problems += field_problems(row, P2P_FIELDS)
            if key == "comm" and "gemms" in row:  # a step of a collective pipelined with GEMMs
                problems += field_problems(row, OVERLAP_FIELDS)
            if problems:
                raise RunFolderError(f"{file} record {number}: {'; '.join(problems)}")
        loaded[key] = rows
    return Run(path, **loaded)


def training_steps(records: list[dict]) -> list[int]:
    """Steps that ran the model (have forward/backward records), ascending."""
    return sorted({r["step"] for r in records if r["phase"] in PASSES})


def default_step(run: Run) -> int:
    """The last training step: from metrics.jsonl, else from the model's collectives, else the last step seen."""
    if run.metrics:
        return int(run.metrics[-1]["step"])
    steps = training_steps(run.comm or []) or sorted({r["step"] for r in run.comm or []})
    if not steps:
        raise RunFolderError(f"{run.path / FILES['comm']} holds no records")
    return steps[-1]


def check_step(run: Run, step: int) -> None:
    steps = sorted({r["step"] for r in run.comm or []})
    if step not in steps:
        shown = f"{steps[0]}..{steps[-1]}" if steps else "none"
        raise RunFolderError(f"step {step} is not in {run.path / FILES['comm']} (steps: {shown})")


def run_title(records: list[dict]) -> str:
    """``TP 4 x DP 2`` (``x PP 2`` with pipeline stages) from the records' group sizes (what the demo puts in its
    figure titles)."""
    sizes, pp = grid_sizes(records), pipeline_size(records)
    if not sizes:
        return f"{len({r['rank'] for r in records})} ranks"
    return f"TP {sizes[0]} x DP {sizes[1]}" + (f" x PP {pp}" if pp > 1 else "")


def write_figures(out: Path, records: list[dict], metrics: list[dict] | None, spans: list[dict] | None,
                  step: int, ranks: int, title: str) -> list[Path]:
    """loss.png (from metrics), comm_bytes.png (one step's collectives), timeline.png (one step's spans and
    collectives, when spans of that step exist), experts.png (a MoE run's load). Returns the paths written."""
    from tpsim.trace.expert_plot import plot_expert_load
    from tpsim.trace.plots import plot_layer_bytes, plot_loss
    from tpsim.trace.timeline import plot_timeline

    paths = []
    if metrics:
        paths.append(plot_loss([m["step"] for m in metrics], [m["loss"] for m in metrics], out / "loss.png",
                               title=f"loss — {title}"))
        experts = plot_expert_load(metrics, out / "experts.png", title=f"expert load per layer and step — {title}")
        paths += [experts] if experts is not None else []
    one_step = [r for r in records if r["step"] == step]
    paths.append(plot_layer_bytes(one_step, out / "comm_bytes.png", ranks=ranks,
                                  phases=(*PASSES, DP_SYNC),
                                  title=f"collective bytes per layer, one step — {title}"))
    if spans and any(s["step"] == step for s in spans):
        paths.append(plot_timeline(spans, records, step, out / "timeline.png",
                                   title=f"step {step} on every rank — {title}"))
    return paths
