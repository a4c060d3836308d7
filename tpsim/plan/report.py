"""The planner's readable output: one layout as a short report, a search as a ranked table."""

from __future__ import annotations

from tpsim.plan.breakdown import class_line
from tpsim.plan.planner import Plan
from tpsim.plan.step_figure import error_line
from tpsim.arch import architecture
from tpsim.table import RULE, format_table
from tpsim.zero_stage import zero_stage

GB = 1e9


def gb(x: float) -> str:
    return f"{x / GB:,.2f} GB"


def capacity(lay: dict) -> str:
    """A GPU's memory as the planner takes it: what the card reports, less what the CUDA context reserves."""
    return f"{lay['gpu_usable_bytes'] / GB:,.2f} GB ({lay['gpu_memory_bytes'] / 2**20:,.0f} MiB - 1 GiB)"


def seconds(x: float) -> str:
    return f"{x * 1e3:,.1f} ms" if x < 1 else f"{x:,.2f} s"


def layout_name(lay: dict) -> str:
    extra = "".join([" +SP" if lay["sp"] else "", f" ZeRO-{lay['zero']}" if lay["zero"] else "",
                     f" recompute {lay['recompute']}" if lay["recompute"] != "none" else ""])
    cp = f" x CP {lay['cp']}" if lay["cp"] > 1 else ""
    return f"TP {lay['tp']}{cp} x PP {lay['pp']} x DP {lay['dp']}{extra}"


def schedule_name(lay: dict) -> str:
    return lay["schedule"] + (f" vp {lay['vp']}" if lay["vp"] > 1 else "")


def runs(layers: list[int]) -> str:
    """``[7, 8, 8, 8, 7]`` as ``7, 8 x 3, 7``."""
    out: list[list[int]] = []
    for n in layers:
        if out and out[-1][0] == n:
            out[-1][1] += 1
        else:
            out.append([n, 1])
    return ", ".join(f"{n} x {k}" if k > 1 else str(n) for n, k in out)


def pipeline_rows(p: Plan) -> list[list[str]]:
    """The schedule and its stages, the busiest stage's peak in flight, the bubble measured beside the formula,
    the p2p bytes of one replica."""
    pipe, lay = p.pipeline, p.layout
    layers = runs([s["layers"] for s in pipe["stages"]])
    bubble, p2p = pipe["bubble_fraction"], pipe["p2p_bytes"]
    held = pipe["ranks"][p.per_gpu["stage"]]["peak_in_flight"]
    where = "virtual stages of" if lay["vp"] > 1 else "stages of" if lay["pp"] > 1 else "one stage of"
    return [["pipeline", schedule_name(lay), f"{where} {layers} layers"],
            ["in flight at the peak", str(held), "(micro-batch, chunk) pairs" if lay["vp"] > 1 else "micro-batches"],
            ["bubble: measured / formula", f"{bubble['measured']:.4f} / {bubble['formula']:.4f}",
             "virtual clock / unit costs (tpsim.predict.pipeline)"],
            ["p2p per step, one replica", gb(p2p["measured"]), f"{pipe['messages']:,} messages, 2m(v*p - 1)"],
            ["step on the pipeline's clock", seconds(pipe["step_s"]),
             "the schedule, its collectives, the DP sync" + (" + gather" if zero_stage(lay["zero"]).gathers_after_step
                                                               else "")]]


def why_bubble(p: Plan) -> list[str]:
    """Why the measured bubble exceeds the formula's, when it does: unequal ranks, exposed messages."""
    pipe, lay = p.pipeline, p.layout
    bubble = pipe["bubble_fraction"]
    if bubble["measured"] <= bubble["formula"] * (1 + 1e-9) or lay["pp"] == 1:  # one stage: no pipeline to wait in
        return []
    busy = [r["busy_s"] for r in pipe["ranks"]]
    slow, fast = max(range(len(busy)), key=busy.__getitem__), min(busy)
    p2p = f"the p2p messages add {seconds(p.time_s['pp'])} to the makespan"
    if busy[slow] <= fast * (1 + 1e-9):
        return [f"the measured bubble exceeds the formula's: {p2p}"]
    head = " (the LM head)" if slow == lay["pp"] - 1 else ""
    uneven = ", stages uneven" if len({s["layers"] for s in pipe["stages"]}) > 1 else ""
    return [f"the measured bubble exceeds the formula's: rank {slow}{head} is busy {busy[slow] / fast - 1:.1%} longer "
            f"than the least busy rank{uneven},", f"and the others wait for it; {p2p}"]


def compute_source(lay: dict) -> str:
    if lay["mfu"] is not None:
        return f"matmuls at peak {lay['peak_flops'] / 1e12:g} TFLOP/s x mfu {lay['mfu']}"
    from tpsim.plan.kernel_time import GEMM_EFFICIENCY, HBM_EFFICIENCY
    gemm = GEMM_EFFICIENCY if lay["gemm_efficiency"] is None else lay["gemm_efficiency"]
    hbm = HBM_EFFICIENCY if lay["hbm_efficiency"] is None else lay["hbm_efficiency"]
    return f"kernels' roofline: GEMM {gemm:g}, HBM {hbm:g}" + (", FP8 matmuls" if lay["fp8"] else "")


def time_rows(p: Plan) -> list[list[str]]:
    """The step's critical path in parts that add up to it (``tpsim.plan.timing``), what each hides."""
    t, lay, wire = p.time_s, p.layout, p.per_gpu["wire_bytes_per_step"]
    hidden = t.get("hidden", {})
    dp_how = (f"{seconds(hidden['dp'])} more hidden under the backward" if lay["overlap_grad_reduce"]
              else "after the schedule")
    dp_name, stage = "time: DP exposed", zero_stage(lay["zero"])
    if stage.reduces_every_microbatch and not stage.buckets_at_units:  # ZeRO-2: every micro-batch's, issued as its
        # backward finishes each bucket (tpsim.plan.dp_overlap)
        dp_name = "time: ZeRO-2 scatter exposed"
        dp_how = f"{seconds(hidden['dp'])} more hidden under the backward, {lay['microbatches']} a bucket"
    rows = [["time: compute", seconds(t["compute"]), compute_source(lay)],
            ["time: TP exposed", seconds(t["tp"]), "inside F/B/W" + (f"; {seconds(hidden['tp'])} more hidden by "
                                                                     "the GEMMs" if lay["tp_comm_overlap"] else "")],
            *cp_time_rows(p),
            ["time: bubble / PP exposed", " / ".join(seconds(t[k]) for k in ("bubble", "pp")),
             "idle on the virtual clock / what messages add"],
            ["time: loss + embedding", seconds(t["loss"] + t["embedding"]),
             f"after the schedule; embedding {gb(wire['embedding'])}" if t["embedding"] else "after the schedule"],
            [dp_name, seconds(t["dp"]), dp_how],
            ["time: optimizer", seconds(t["optimizer"]), "its kernels at HBM speed + the clip norm"]]
    if stage.gathers_after_step:
        rows.append([f"time: ZeRO-{lay['zero']} all-gather", seconds(t["dp_gather"]),
                     f"{seconds(hidden['dp_gather'])} more hidden under the next forward" if lay["overlap_param_gather"]
                     else "after the DP sync"])
    if stage.gathers_around_units:
        rows.append(["time: ZeRO-3 gathers exposed", seconds(t["zero3_gather"]),
                     "per piece before F and B, one ahead; + reduce-scatters"])
    hardware = p.hardware_tflops_per_gpu
    rate = f"{p.tflops_per_gpu:,.0f} TFLOP/s per GPU (model FLOPs)" + (
        f", {hardware:,.0f} hardware (the recompute too)" if hardware != p.tflops_per_gpu else "")
    rows.append(["step (critical path)", seconds(t["step"]), rate])
    return rows


def cp_rows(p: Plan) -> list[list[str]]:
    """Context parallelism's lines: its bytes a layer, the variant, the layout, where the group sits (none at cp 1)."""
    cp = p.cp
    if cp["cp"] == 1:
        return []
    per = cp["bytes_per_layer_per_microbatch"]
    busiest = f" (busiest {cp['busiest_share'] * cp['cp']:.2f}x)" if cp["busiest_share"] * cp["cp"] > 1 + 1e-9 else ""
    return [[f"CP {cp['cp']} a layer: forward + backward", f"{gb(per['forward'])} + {gb(per['backward'])}",
             f"{cp['comm']}, {cp['layout']}{busiest}, {cp['placement']}"],
            ["CP wire per step", gb(cp["wire_bytes_per_step"]), f"on {cp['link']}"]]


def cp_time_rows(p: Plan) -> list[list[str]]:
    """What the CP messages expose, a layer's beside all of their time (the ring hides its steps under blocks)."""
    cp = p.cp
    if cp["cp"] == 1:
        return []
    t, x = cp["exposed_s_per_layer"], cp["transfer_s_per_layer"]
    return [["time: CP exposed", seconds(p.time_s["cp"]),
             f"F {seconds(t['F'])} of {seconds(x['F'])}, B {seconds(t['B'])} of {seconds(x['B'])} a layer"]]


def fit_note(total: float, lay: dict) -> str:
    """``fits, 13.36 GB left`` or ``DOES NOT FIT, 6.51 GB over``: the GPU's usable memory less the total."""
    left = lay["gpu_usable_bytes"] - total
    return f"fits, {gb(left)} left" if left >= 0 else f"DOES NOT FIT, {gb(-left)} over"


def zero_note(lay: dict, sharded: bool) -> str:
    """`` (ZeRO-2 / dp)`` beside a model-state column that ZeRO ``lay["zero"]`` shards (``sharded``)."""
    over = "dp x cp" if lay["cp"] > 1 else "dp"
    return f" (ZeRO-{lay['zero']} / {over})" if sharded else ""


def format_plan(p: Plan) -> str:
    m, lay, g = p.model, p.layout, p.per_gpu
    mem, act, state, wire = g["memory_bytes"], g["activation_bytes_per_layer"], g["model_state_bytes_per_param"], \
        g["wire_bytes_per_step"]
    head = [f"{m['name']} ({m['arch']}, {m['params_total'] / 1e9:,.2f} B parameters) on {lay['gpus']} x {lay['gpu']}"
            f" ({lay['gpus_per_node']} per node): {layout_name(lay)}",
            f"  batch {lay['global_batch']} x {lay['seq_len']} tokens, micro-batch {lay['micro_batch']}, "
            f"{lay['microbatches']} micro-batches per replica, {lay['dtype']}" + (" (FP8 matmuls)" if lay["fp8"]
                                                                                   else "")
            + (", fused attention" if lay["attention"] == "fused" else "")]
    stage, zero = f"stage {g['stage']}", zero_stage(lay["zero"])
    rows = [[f"per GPU of {stage} (most memory)", "value", "source"], RULE,
            ["parameters", f"{g['params']:,}", ""],
            ["params", gb(mem["params"]), f"{state['params']:g} B/param" + zero_note(lay, zero.shards_params)],
            ["grads", gb(mem["grads"]), f"{state['grads']:g} B/param" + zero_note(lay, zero.shards_grads)],
            ["optimizer", gb(mem["optimizer"]), f"{state['optimizer']:g} B/param"
             + zero_note(lay, zero.shards_optimizer)],
            ["activations", gb(mem["activations"]), "layers x in flight + logits" + (
                f" + {gb(g['zero3_gathered_bytes'])} gathered" if zero.shards_params else "")],
            ["total", gb(mem["total"]), f"of {capacity(lay)}: " + fit_note(mem["total"], lay)],
            RULE,
            ["activations per layer", gb(act["paper"]), architecture(m["arch"]).memory.ACTIVATION_SOURCE],
            ["  + tpsim's own terms", f"{act['tpsim_extra']:,.0f} B", "apart (not in the total)"],
            ["TP wire per layer per micro-batch", gb(g["tp_wire_bytes_per_layer_per_microbatch"]), "predict_step"],
            ["wire per step: TP / DP / PP", " / ".join(gb(wire[k]) for k in ("tp", "dp", "pp")),
             f"{stage}'s own sends; PP the schedule's" + ("; DP over dp x cp" if lay["cp"] > 1 else "")],
            *cp_rows(p),
            RULE, *pipeline_rows(p), RULE,
            *time_rows(p)]
    return "\n".join([*head, format_table(rows, right=(1,)), class_line(p.compute_classes_s), error_line(p),
                      *why_bubble(p)])


def format_search(plans: list[Plan], gpus: int, top: int = 10) -> str:
    if not plans:
        return f"no layout of {gpus} GPUs fits"
    rows = [["#", "layout", "memory/GPU", "step", "compute", "TP", "DP", "PP", "bubble", "TFLOP/s"], RULE]
    for i, p in enumerate(plans[:top], 1):
        t = p.time_s
        rows.append([str(i), layout_name(p.layout), gb(p.per_gpu["memory_bytes"]["total"]),
                     *(seconds(t[k]) for k in ("step", "compute", "tp")), seconds(t["dp"] + t["zero3_gather"]),
                     *(seconds(t[k]) for k in ("pp", "bubble")),
                     f"{p.tflops_per_gpu:,.0f}"])
    name = plans[0].model["name"]
    return format_table(rows, right=range(2, 10), title=f"{name} on {gpus} GPUs: {len(plans)} layouts fit, "
                                                         f"fastest first (top {min(top, len(plans))})")
