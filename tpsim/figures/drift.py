"""Why the loss changes with TP: the demo's GPT trained at TP 1, 2, 4 in float64, float32, bfloat16, float16.

    mpiexec -n 4 python -m tpsim.figures.drift [--out figures] [--steps 300]      (make figures)

Every run starts from the same master weights and sees the same batches (AdamW, clip 1.0, DP 1); the serial
model in each dtype is the reference. In float64 TP equals serial to rounding (~1e-15); in 16 bits it cannot:
TP adds partial matmul results (each rounded to 16 bits) in another order, and the all-reduce rounds again at
every combining step. Then, for bfloat16 at the largest TP, one kind of TP sum at a time is done in float32
(the partial products kept in float32 through the all-reduce and rounded once after it, as the serial matmul
rounds once) to see which one the drift comes from: the row-parallel g of every block's forward, or the
column-parallel f of the backward (c_attn, c_fc and the LM head). Writes ``drift.png``, ``drift.json`` (the numbers
docs/guide/mixed-precision.md and lesson 15 quote) and ``drift_curves.json`` (every run's loss at every step), from
which ``--replot`` redraws the figure without training:

    python -m tpsim.figures.drift --replot --out figures

On one machine the study is deterministic: runs idle or loaded, spinning or sleep-polling give byte-identical
``drift.json``. Across machines the last digits (and, in 16 bits, more) differ: OpenBLAS picks its matrix
kernels, and so its summation order, by CPU (``OPENBLAS_CORETYPE=Sandybridge`` on an AVX-512 machine changes
the 50-step bfloat16 loss from 1.76 to 1.66), and 16-bit training amplifies each rounding difference.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from mpi4py import MPI

from tpsim.comm import ProcessGrid
from tpsim.compare import shard_differences
from tpsim.data import ReverseTask
from tpsim.models.build import build_gpt, serial_gpt
from tpsim.nn.precision import dtype_of, wgrad
from tpsim.tp.mappings import CopyToTPRegion, ReduceFromTPRegion
from tpsim.tp.regions import TensorParallelRegion
from tpsim.figures.style import SEED, TOY, save_figure, toy_config
from tpsim.train import AdamW, apply_update, compute_grads, mixed_precision
from tpsim.options import OneLineParser, count

DTYPES = ("float64", "float32", "bfloat16", "float16")
# the TP sums that can be done in float32, one at a time: partials kept in float32 through the all-reduce,
# rounded to 16 bits once after it — what the serial model's single float32-accumulated matmul does
SITES = ("row-parallel g (fwd)", "column-parallel f (bwd)", "both")
CURVES = "drift_curves.json"  # beside drift.json: the per-step losses the figure's two left panels draw


def _f32(x, w):
    """``x [..., k] · w [k, n]`` of a shard, the partial product left in float32 (unrounded)."""
    return wgrad(x.reshape(-1, w.shape[0]), w).reshape(*x.shape[:-1], w.shape[1])


def _leave_f32(dtype):
    """The row-parallel forward's ``y·B`` then g (``TensorParallelRegion.matmul_leave``), summed in float32."""
    return lambda self, y, w, g: ReduceFromTPRegion.forward(_f32(y, w), g).astype(dtype)


def _enter_backward_f32(dtype):
    """The column-parallel backward's ``Σ dy·Wᵀ`` then f (``TensorParallelRegion.matmul_enter_backward``), in
    float32 through the all-reduce."""
    return lambda self, dys, ws, g: CopyToTPRegion.backward(sum(_f32(dy, w.T) for dy, w in zip(dys, ws)),
                                                            g).astype(dtype)


@contextmanager
def fp32_sums(site: str | None, dtype):
    """Inside: the chosen TP sums add float32 partials and round once (a study switch; restored on exit)."""
    saved = (TensorParallelRegion.matmul_leave, TensorParallelRegion.matmul_enter_backward)
    if site in ("row-parallel g (fwd)", "both"):
        TensorParallelRegion.matmul_leave = _leave_f32(dtype)
    if site in ("column-parallel f (bwd)", "both"):
        TensorParallelRegion.matmul_enter_backward = _enter_backward_f32(dtype)
    try:
        yield
    finally:
        TensorParallelRegion.matmul_leave, TensorParallelRegion.matmul_enter_backward = saved


def step0_gradient_difference(model, cfg, dtype, ids, labels, scale: float, group) -> float:
    """Max over parameters of max|g_TP − g_serial| / max|g_serial| at step 0, both in ``dtype`` (one step: no
    training has amplified anything yet), the worst over the TP group."""
    serial = serial_gpt(cfg, SEED, dtype)
    serial.zero_grad()
    _, cache = serial.forward(ids, labels)
    serial.backward(scale, cache)  # float16: the same loss scale as the TP model's backward
    worst = max(shard_differences(model, dict(serial.named_grads()), floor=1e-30).values())
    return float(group.all_reduce(np.array([worst]), op="max")[0])


def train(grid: ProcessGrid, dtype_name: str, steps: int, *, serial: bool = False, site=None) -> dict:
    """Loss and gradient norm per step of one run on ``grid`` (DP 1), and the step-0 gradient difference."""
    cfg, dtype = toy_config(), dtype_of(dtype_name)
    model = serial_gpt(cfg, SEED, dtype) if serial else build_gpt(cfg, grid.tp_group, SEED, dtype)
    opt = mixed_precision(model, lambda m: AdamW(m, lr=3e-3, weight_decay=0.01), grid.world)
    task = ReverseTask(TOY["vocab"], TOY["seq_len"])
    losses, norms, step0 = [], [], 0.0
    with fp32_sums(site, dtype):
        for step in range(steps):
            ids, labels = task.batch(SEED, step, TOY["batch_size"])
            scale = opt.loss_scale
            loss, _ = compute_grads(model, grid, None, ids, labels, loss_scale=scale)
            if step == 0 and not serial:
                step0 = step0_gradient_difference(model, cfg, dtype, ids, labels, scale, grid.tp_group)
            norm = apply_update(model, opt, grid, 1.0)
            losses.append(float(loss))
            norms.append(float("nan") if norm is None else float(norm))
    return {"loss": losses, "grad_norm": norms, "step0_grad_difference": step0}


def run_all(steps: int, tp_sizes: tuple[int, ...], comm=MPI.COMM_WORLD) -> dict | None:
    """Every run; rank 0 returns ``{"tp{t} {dtype}" or "... fp32 at <site>": curves}``, the others None."""
    results = {}
    for tp in tp_sizes:
        sub = comm.Split(color=0 if comm.Get_rank() < tp else MPI.UNDEFINED, key=comm.Get_rank())
        if sub != MPI.COMM_NULL:
            grid = ProcessGrid(tp=tp, comm=sub)
            grid.tracer.enabled = False
            for name in DTYPES:
                results[f"tp{tp} {name}"] = train(grid, name, steps, serial=tp == 1)
            if tp == max(tp_sizes) and tp > 1:
                for site in SITES:
                    results[f"tp{tp} bfloat16 fp32 at {site}"] = train(grid, "bfloat16", steps, site=site)
            sub.Free()
        comm.Barrier()
    return results if comm.Get_rank() == 0 else None


def summarize(results: dict, tp_sizes, window: int = 20) -> dict:
    """Mean |Δloss| over the last ``window`` steps vs the serial model in the same dtype and vs float64."""
    ref64 = np.array(results["tp1 float64"]["loss"])
    out = {}
    for key, curves in results.items():
        name = key.split()[1]
        loss = np.array(curves["loss"])
        same = np.array(results[f"tp1 {name}"]["loss"])
        gn, gn_same = np.array(curves["grad_norm"]), np.array(results[f"tp1 {name}"]["grad_norm"])
        out[key] = {"final_loss": float(loss[-1]),
                    "vs_serial_same_dtype": float(np.mean(np.abs(loss - same)[-window:])),
                    "vs_float64": float(np.mean(np.abs(loss - ref64)[-window:])),
                    "grad_norm_vs_serial_same_dtype": float(np.nanmean(np.abs(gn - gn_same)[-window:])),
                    "step0_grad_difference": curves["step0_grad_difference"]}
    return out


def write_curves(results: dict, path: Path) -> Path:
    """The loss of every run at every step, one run per line: what ``--replot`` redraws the figure from."""
    lines = [f" {json.dumps(key)}: {json.dumps(results[key]['loss'])}" for key in sorted(results)]
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    return path


FLOOR = 1e-17  # where an exact 0 is drawn on the log axes (|Δloss| = 0: float64 serial against itself, ...)
BAR_LABELS = {None: "all 16-bit", "row-parallel g (fwd)": "only the row-parallel g (fwd)\nin float32",
              "column-parallel f (bwd)": "only the column-parallel f (bwd)\nin float32",
              "both": "g and f both in float32"}


def plot(results: dict, summary: dict, tp_sizes, path: Path) -> Path:
    """The figure: |Δloss| per step vs serial in the same dtype and vs serial float64, and the step-0 bars."""
    from tpsim.plotting import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    colors = {"float64": "#4C72B0", "float32": "#55A868", "bfloat16": "#C44E52", "float16": "#8172B2"}
    styles = {2: "--", 4: "-", 8: ":"}
    for name in DTYPES:
        ref = np.array(results[f"tp1 {name}"]["loss"])
        ref64 = np.array(results["tp1 float64"]["loss"])
        for tp in tp_sizes[1:]:
            loss = np.array(results[f"tp{tp} {name}"]["loss"])
            axes[0].plot(np.abs(loss - ref) + FLOOR, styles.get(tp, "-"), color=colors[name], lw=1,
                         label=f"{name} TP {tp}")
        for tp in tp_sizes:
            loss = np.array(results[f"tp{tp} {name}"]["loss"])
            axes[1].plot(np.abs(loss - ref64) + FLOOR, styles.get(tp, "-" if tp > 1 else "-."),
                         color=colors[name], lw=1, label=f"{name} TP {tp}" if tp > 1 else f"{name} serial")
    for ax, title in zip(axes[:2], ("|loss(TP) − loss(serial)|, same dtype", "|loss − loss(serial float64)|")):
        ax.set_yscale("log")
        ax.set_xlabel("training step")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.axhline(FLOOR, color="#999999", lw=0.6, ls=":")
    from matplotlib.lines import Line2D  # one legend for both panels: colour = dtype, line = TP size

    handles = [Line2D([], [], color=colors[name], lw=2) for name in DTYPES]
    lines = ("-.", *(styles.get(t, "-") for t in tp_sizes[1:]))  # serial, then each TP size
    handles += [Line2D([], [], color="#333333", lw=1, ls=ls) for ls in lines]
    handles.append(Line2D([], [], color="#999999", lw=0.6, ls=":"))
    names = [*DTYPES, "serial (middle panel)", *(f"TP {t}" for t in tp_sizes[1:]), "exact 0, drawn at 1e-17"]
    fig.legend(handles, names, loc="lower left", bbox_to_anchor=(0.03, 0.05), ncol=len(names), fontsize=8,
               frameon=False)
    top = max(tp_sizes)
    sites = [None] + [s for s in SITES if f"tp{top} bfloat16 fp32 at {s}" in summary]
    keys = [f"tp{top} bfloat16" + (f" fp32 at {s}" if s else "") for s in sites]
    values = [summary[k]["step0_grad_difference"] for k in keys]
    axes[2].barh(range(len(keys)), values, color="#C44E52")
    axes[2].set_xscale("log")
    axes[2].set_xlim(right=max(values) * 8)  # room for the value labels
    for i, v in enumerate(values):
        axes[2].text(v, i, f" {v:.1e}", va="center", fontsize=8)
    axes[2].set_yticks(range(len(keys)), [BAR_LABELS[s] for s in sites], fontsize=8)
    axes[2].invert_yaxis()
    axes[2].set_xlabel("step-0 max |Δgrad| / max |grad| vs serial bfloat16")
    axes[2].set_title(f"bfloat16 TP {top}: one kind of TP sum at a time in float32", fontsize=10)
    axes[2].text(0.98, 0.03, "The bars do not add: each is one worst\nelement. Where 'only f in float32' is "
                 "worst,\nf's 16-bit roundings had partly cancelled\ng's, so that bar can exceed 'all 16-bit'.",
                 transform=axes[2].transAxes, ha="right", va="bottom", fontsize=7,
                 bbox={"facecolor": "white", "edgecolor": "#cccccc", "alpha": 0.9})
    return save_figure(fig, path, "Why the loss changes with TP: summation order in 16 bits",
                       "tpsim drift study (python -m tpsim.figures.drift): the demo's GPT, same seed and "
                       "batches; Megatron's mixed precision (Micikevicius et al. 2017, arXiv:1710.03740). "
                       "Left and middle: |Δloss| of 0 is drawn at 1e-17.",
                       bottom=0.12)


def replot(out: Path) -> Path:
    """Redraw ``drift.png`` from ``drift.json`` and ``drift_curves.json`` in ``out``, without training.

    The curves must be the summary's run: each row's final loss and mean |Δloss| over the last 20 steps are
    recomputed from them and must equal ``drift.json``'s to the bit, or nothing is drawn."""
    summary = json.loads((out / "drift.json").read_text())["summary"]
    results = {key: {"loss": loss} for key, loss in json.loads((out / CURVES).read_text()).items()}
    if set(results) != set(summary):
        raise SystemExit(f"{out / CURVES} and {out / 'drift.json'} hold different runs")
    ref64 = np.array(results["tp1 float64"]["loss"])
    for key, row in summary.items():
        loss, same = np.array(results[key]["loss"]), np.array(results[f"tp1 {key.split()[1]}"]["loss"])
        again = (float(loss[-1]), float(np.mean(np.abs(loss - same)[-20:])), float(np.mean(np.abs(loss - ref64)[-20:])))
        if again != (row["final_loss"], row["vs_serial_same_dtype"], row["vs_float64"]):
            raise SystemExit(f"{key}: the curves in {out / CURVES} are not the run {out / 'drift.json'} summarizes")
    tp_sizes = tuple(sorted({int(key.split()[0][2:]) for key in summary}))
    return plot(results, summary, tp_sizes, out / "drift.png")


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m tpsim.figures.drift", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="figures")
    p.add_argument("--steps", type=count, default=300)
    p.add_argument("--tp", type=count, nargs="+", default=[1, 2, 4], help="TP sizes; 1 is the serial model")
    p.add_argument("--replot", action="store_true",
                   help=f"no training: redraw drift.png in --out from its drift.json and {CURVES} (one process)")
    args = p.parse_args(argv)
    if args.replot:
        print(f"wrote {replot(Path(args.out))}")
        return 0
    tp_sizes = tuple(sorted(set(args.tp) | {1}))
    if MPI.COMM_WORLD.Get_size() < max(tp_sizes):
        raise SystemExit(f"launch with at least {max(tp_sizes)} ranks (mpiexec -n {max(tp_sizes)})")
    results = run_all(args.steps, tp_sizes)
    if results is None:
        return 0
    summary = summarize(results, tp_sizes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [plot(results, summary, tp_sizes, out / "drift.png"), out / "drift.json", out / CURVES]
    paths[1].write_text(json.dumps({"steps": args.steps, "summary": summary}, indent=1, sort_keys=True) + "\n")
    write_curves(results, paths[2])
    for key, row in summary.items():
        print(f"{key:40s} final loss {row['final_loss']:.4f}  |Δloss| vs serial same dtype "
              f"{row['vs_serial_same_dtype']:.2e}  vs float64 {row['vs_float64']:.2e}  step-0 |Δgrad| "
              f"{row['step0_grad_difference']:.2e}")
    print("wrote " + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
