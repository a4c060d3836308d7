"""Where a planned step goes, as one line of text and one figure (``tpsim plan ... --figure step.png``).

The step (``time_s.step``, the critical path) split into its parts, which add up to it exactly:

    compute        by kernel class (``tpsim.plan.breakdown``: GEMM, attention, memory-bound, FP8 casts, recompute)
    bubble         idle on the pipeline's virtual clock
    exposed comm   TP, CP and PP inside the schedule; the loss and embedding collectives and the DP sync after it;
                   ZeRO's parameter all-gathers (ZeRO-1/2 after the step or under the next forward, ZeRO-3 inside)
    optimizer      its kernels at HBM speed and the clip norm's all-reduce

and beside the total the error to expect (``expected_error``): what the kernel model missed, by median and worst,
on the published runs of the families it was not fitted to (leave one family out, ``tpsim.plan.lofo``; under
``--dtype fp8`` the FP8 families of ``tpsim.plan.published_fp8``, each at the FP8 GEMM speed-up fitted without
it, ``tpsim.plan.fit_fp8``). Under ``--mfu`` or with efficiencies or the speed-up given by hand no band is
claimed. The figure is written atomically. Pure arithmetic but for the
figure (matplotlib, imported when it draws); no MPI.
"""

from __future__ import annotations

from pathlib import Path

from tpsim.plan.breakdown import CLASSES
from tpsim.plan.planner import Plan

COMM = (("bubble", ("bubble",)), ("TP exposed", ("tp",)), ("CP exposed", ("cp",)), ("PP exposed", ("pp",)),
        ("loss + embedding", ("loss", "embedding")), ("DP exposed", ("dp",)), ("ZeRO all-gather", ("dp_gather",)),
        ("ZeRO-3 gathers", ("zero3_gather",)), ("optimizer", ("optimizer",)))


def step_parts(p: Plan) -> list[tuple[str, float]]:
    """``[(label, seconds)]`` of the step's non-zero parts, compute by kernel class first; they sum to the step."""
    t, classes = p.time_s, p.compute_classes_s
    parts = [(f"compute: {c}", classes.get(c, 0.0)) for c in CLASSES]
    parts += [(label, sum(t[k] for k in keys)) for label, keys in COMM]
    return [(label, s) for label, s in parts if s > 0]


def expected_error(p: Plan) -> dict | None:
    """``{"median", "worst", "rows", "bias"}``: the relative step-time error to expect for this plan (module
    docstring), or None where no validation speaks for it (``--mfu``, hand-set efficiencies or speed-up)."""
    lay = p.layout
    if lay["mfu"] is not None or lay["gemm_efficiency"] is not None or lay["hbm_efficiency"] is not None:
        return None
    if lay["fp8_gemm_speedup"] is not None:
        return None
    if lay["fp8"]:
        return fp8_band()
    from tpsim.plan.lofo import committed
    lofo = committed()
    if lofo is None:
        return None
    return {"median": lofo["median"], "worst": lofo["worst"], "rows": "the development rows, each family left out "
                                                                      "of the fit", "bias": None}


def fp8_band() -> dict | None:
    """The error to expect under ``--dtype fp8``: each FP8 family priced at the speed-up fitted without it
    (``tpsim.plan.fit_fp8``), or None before the grid was written."""
    from tpsim.plan.lofo import fp8_committed as committed
    lofo = committed()
    if lofo is None:
        return None
    return {"median": lofo["median"], "worst": lofo["worst"],
            "rows": "the FP8 rows (H100, B200, GB200), each family left out", "bias": None}


def error_line(p: Plan) -> str:
    """The expected error in one line (or why none is claimed)."""
    band = expected_error(p)
    if band is None:
        return "expected error: none claimed (--mfu or efficiencies set by hand are not what was validated)"
    bias = f"; {band['bias']}" if band["bias"] else ""
    return (f"expected error of the step: {band['median']:.1%} median, {band['worst']:.1%} worst on {band['rows']}"
            f"{bias} (tpsim plan --published)")


def plot_step(p: Plan, path) -> Path:
    """One horizontal bar of the step's parts (``step_parts``) with the expected error's band at its end."""
    from tpsim import atomic
    from tpsim.plotting import pyplot

    plt = pyplot()
    parts, total = step_parts(p), p.time_s["step"]
    fig, ax = plt.subplots(figsize=(10, 3.2))
    left, colours = 0.0, plt.get_cmap("tab20").colors
    for i, (label, seconds) in enumerate(parts):
        share = seconds / total
        ax.barh(0, seconds, left=left, color=colours[i % len(colours)], edgecolor="white",
                label=f"{label}: {share:.1%}" if share >= 1e-3 else f"{label}: < 0.1%")
        left += seconds
    band = expected_error(p)
    if band is not None:
        ax.errorbar([total], [0], xerr=[[total * band["worst"]], [total * band["worst"]]], fmt="none",
                    ecolor="grey", capsize=3, label=f"worst ±{band['worst']:.1%}")
        ax.errorbar([total], [0], xerr=[[total * band["median"]], [total * band["median"]]], fmt="none",
                    ecolor="black", elinewidth=3, capsize=7, label=f"expected error ±{band['median']:.1%} (median)")
    lay, model = p.layout, p.model
    ax.set_yticks([])
    ax.set_xlabel("seconds of one training step")
    ax.set_title(f"{model['name']} on {lay['gpus']} x {lay['gpu']}: TP {lay['tp']} x CP {lay['cp']} x PP {lay['pp']} "
                 f"x DP {lay['dp']}, step {total:.3g} s", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    out = atomic.save_figure(fig, path, dpi=130, metadata={"Software": None})
    plt.close(fig)
    return out
