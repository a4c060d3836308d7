"""Which kernels ``tpsim plan --dtype fp8`` speeds up: the layers' weight matmuls, and nothing else.

Fault 4 of four ("FP8 in the planner on the wrong kernels: TransformerEngine and Megatron keep dot-product
attention in bf16 unless FP8 attention is asked for"). ``--dtype fp8`` plans a bfloat16 run whose ``Linear``
layers run their GEMMs at the FP8 peak — QKV, attention's output projection and the MLP's two (fc1/fc2, or
Llama's gate_up/down), forward, input gradient and weight gradient. Attention's score and context products
(QKᵀ, softmax·V, their gradients, a fused flash kernel), the norms, softmax, activations, the LM head, the
embedding, the optimizer and every byte and second of communication stay as in bf16.

So a plan in fp8 is compared with the same plan in bf16 (both built by the CLI's own ``layout_of``) term by term:
every kernel's ``kernel_seconds`` for F, B (dX) and W (dW) of a layer and of the head, then every leaf of the
planner's dict, where only the derived sums of compute time listed below may move, and only towards faster; an
unlisted leaf that moves fails with its path. Attention's products are memory-bound on the roofline with unfused
attention (d FLOPs a byte, below the ridge), so there a wrong peak would not show in their time: the same
comparison runs under the flat ``--mfu`` model and with ``--attention fused``, where they are priced by their
FLOPs, and each case first shows which kept-bf16 matmuls the FP8 peak *would* speed up.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from tpsim.pipeline.schedules import build
from tpsim.plan.cli import layout_of, main, parser
from tpsim.gpus import GPUS, gpu
from tpsim.plan.kernel_time import FP8_GEMM_SPEEDUP, kernel_seconds
from tpsim.plan.kernels import head, layer
from tpsim.plan.models import PRESETS
from tpsim.plan.planner import plan

H100 = gpu("h100-80gb")
AT_FP8_PEAK = replace(H100, peak_flops_16bit=H100.peak_flops_fp8)  # any 16-bit matmul priced at the FP8 peak
# any 16-bit matmul priced at the FP8 GEMM rate: the fitted speed-up over the 16-bit rate (the kernel model's)
AT_FP8_RATE = replace(H100, peak_flops_16bit=H100.peak_flops_16bit * FP8_GEMM_SPEEDUP)

# tp > 1, pp > 1, sp; GPT with selective recompute (B repeats the attention products) on 1F1B, Llama on ZB-H1 (W
# its own action)
MODELS = {
    "gpt3-175b": ["--tp", "4", "--pp", "4", "--dp", "2", "--sp", "--seq-len", "2048", "--global-batch", "16",
                  "--recompute", "selective"],
    "llama3-8b": ["--tp", "2", "--pp", "2", "--dp", "2", "--sp", "--seq-len", "4096", "--global-batch", "16",
                  "--schedule", "zb-h1"],
}
WEIGHT_MATMULS = {"gpt2": ("qkv", "proj", "fc1", "fc2"), "llama": ("qkv", "proj", "gate_up", "down")}
HEAD = {"logits", "d_logits_input", "d_logits_weight"}
ATTENTION_PRODUCTS = {"scores", "context", "d_context_v", "d_probs", "d_q", "d_k"}
# pricing -> (its flags, the kept-bf16 matmuls whose time the FP8 peak would change there: what a fault can show)
PRICINGS = {
    "roofline": ([], HEAD),
    "fused attention": (["--attention", "fused"], HEAD | {"flash_attention"}),
    "flat mfu": (["--mfu", "0.5"], HEAD | ATTENTION_PRODUCTS),
}

INPUT = "layout/fp8"  # the switch itself, False -> True
# derived sums of compute time (seconds, or instants on the step's clock): may change, only to smaller
FASTER = re.compile(r"time_s/(compute|bubble|step|pipeline)|compute_classes_s/(GEMM|recompute)"
                    r"|pipeline/(step_s|makespan\w*_s)|pipeline/stages/\*/[FBW]_s"
                    r"|pipeline/ranks/\*/(busy|idle|finish)_s|pipeline/after_schedule/(ends|before_dp)/\*"
                    r"|pipeline/after_schedule/dp_streams/\*/(compute_end_s|end_s|buckets/\*/(ready|start|end))")
HIGHER = {"tflops_per_gpu", "hardware_tflops_per_gpu"}  # the same FLOPs over a shorter step
EITHER = {"pipeline/bubble_fraction/measured",  # idle over makespan: both shrink, the messages and collectives not
          "compute_classes_s/FP8 casts"}  # new in fp8, 0 bf16; 0 both under the flat --mfu (passes are free)
KEPT = ("per_gpu/memory_bytes/total", "per_gpu/wire_bytes_per_step/tp", "per_gpu/wire_bytes_per_step/dp",
        "per_gpu/wire_bytes_per_step/pp", "pipeline/p2p_bytes/measured", "pipeline/messages", "time_s/tp",
        "time_s/dp", "time_s/pp", "time_s/loss", "time_s/embedding", "time_s/optimizer",
        "pipeline/stages/0/F_collectives_s", "pipeline/bubble_fraction/formula")  # compared, among all the others


def layouts(name: str, pricing: str):
    """``tpsim plan --model name ... --dtype bf16`` and the same with ``--dtype fp8``, as the CLI builds them."""
    model, argv = PRESETS[name], ["--model", name, *MODELS[name], *PRICINGS[pricing][0], "--gpu", "h100-80gb"]
    bf16, fp8 = (layout_of(parser().parse_args([*argv, "--dtype", d]), model) for d in ("bf16", "fp8"))
    assert (bf16.dtype, bf16.fp8, fp8.dtype, fp8.fp8) == ("bfloat16", False, "bfloat16", True)
    return model, bf16, fp8


def fp8_kernels(model) -> set[str]:
    """The kernels of the layers' weight matmuls: forward, input gradient (B) and weight gradient (W)."""
    names = WEIGHT_MATMULS[model.arch]
    assert names == tuple(n for n, _, _ in model.architecture.memory.layer_matmuls(model, 1))
    return {*names, *(f"d_{n}_input" for n in names), *(f"d_{n}_weight" for n in names)}


def leaves(tree, path: str = ""):
    """Every leaf of a nested dict / list as ``(path, value)``, the path's keys joined by "/"."""
    if isinstance(tree, (dict, list, tuple)):
        for key, value in (tree.items() if isinstance(tree, dict) else enumerate(tree)):
            yield from leaves(value, f"{path}/{key}" if path else str(key))
    else:
        yield path, tree


def same(a, b) -> bool:
    """Equal; seconds to 1e-9 relative, as some are differences of makespans that faster compute shifts by a
    rounding error (``time_s/tp`` = busy − busy without collectives)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


@pytest.mark.parametrize("pricing", PRICINGS)
@pytest.mark.parametrize("name", MODELS)
def test_fp8_speeds_up_exactly_the_layers_weight_matmuls_kernel_by_kernel(name, pricing):
    """Every kernel of a layer's and the head's F, B and W: the weight matmuls at the FP8 rate's time (the
    kernel model's: the 16-bit rate times the fitted speed-up; the flat --mfu model's: the FP8 peak), every
    other kernel's seconds unchanged — and the case can see a fault: the listed kept matmuls would change."""
    model, bf16, fp8 = layouts(name, pricing)
    at_fp8 = AT_FP8_PEAK if pricing == "flat mfu" else AT_FP8_RATE
    fast, would_change, seen = fp8_kernels(model), set(), set()
    for part in (layer, head):
        for op, kernels in part(model, bf16).items():
            kept = [k for k in part(model, fp8)[op] if "fp8_cast_" not in k.name]
            assert kept == kernels, f"{part.__name__} {op}: fp8 changed the kernels themselves"
            for k in kernels:
                before, after = kernel_seconds(k, bf16, H100), kernel_seconds(k, fp8, H100)
                seen.add(k.name)
                if k.name in fast:
                    assert after < before, f"{part.__name__} {op} {k.name}: {before:.3e} s -> {after:.3e} s in fp8"
                    assert after == kernel_seconds(k, bf16, at_fp8), f"{k.name}: not at the FP8 rate"
                    continue
                assert after == before, f"{part.__name__} {op} {k.name}: {before:.3e} s in bf16, {after:.3e} s in fp8"
                if k.is_matmul and kernel_seconds(k, bf16, at_fp8) < before:
                    would_change.add(k.name)
    assert fast <= seen, f"weight matmuls missing from the kernels: {sorted(fast - seen)}"
    assert would_change == PRICINGS[pricing][1], sorted(would_change)


@pytest.mark.parametrize("name", MODELS)
def test_fp8_adds_one_cast_per_weight_matmul_forward_and_backward(name):
    """Transformer Engine's FP8 linear casts its input (forward) and its incoming gradient (backward) to FP8 in
    both layouts: read 2 bytes, write 1 + 1, for every element of [T, in] and [T, out]; its weight once a step
    ([in, out], 1/m of it in each micro-batch's forward). Nothing else is added, and only in fp8; the head and
    attention keep none (they stay bf16)."""
    model, bf16, fp8 = layouts(name, "roofline")
    T, m = fp8.micro_batch * fp8.local_seq, fp8.microbatches
    shapes = model.architecture.memory.layer_matmuls(model, fp8.tp)
    casts = {op: [k for k in ks if "fp8_cast_" in k.name] for op, ks in layer(model, fp8).items()}
    assert [(k.name, k.nbytes) for k in casts["F"]] == [(f"fp8_cast_{n}", 4 * (T * i + i * o / m))
                                                         for n, i, o in shapes]
    assert [(k.name, k.nbytes) for k in casts["B"]] == [(f"d_fp8_cast_{n}", 4 * T * o) for n, i, o in shapes[::-1]]
    assert not casts["W"] and not any("fp8_cast_" in k.name for ks in layer(model, bf16).values() for k in ks)
    assert not any("fp8_cast_" in k.name for ks in head(model, fp8).values() for k in ks)


@pytest.mark.parametrize("pricing", PRICINGS)
@pytest.mark.parametrize("name", MODELS)
def test_fp8_changes_no_planned_term_but_the_compute_times_built_from_those_matmuls(name, pricing):
    """Every leaf of ``plan``: memory, bytes, communication and optimizer seconds, the bubble formula unchanged;
    the derived compute times no slower, the step and compute strictly faster; each stage's F, B, W faster by
    exactly its layers × the weight matmuls' saving (the head and everything else saving nothing)."""
    model, bf16, fp8 = layouts(name, pricing)
    before, after = plan(model, bf16), plan(model, fp8)
    old, new = dict(leaves(before.as_dict())), dict(leaves(after.as_dict()))
    assert old.keys() == new.keys() and set(KEPT) <= old.keys()
    wrong = []
    for path, a in old.items():
        b, kind = new[path], re.sub(r"/\d+(?=/|$)", "/*", path)
        if path == INPUT:
            ok = (a, b) == (False, True)
        elif FASTER.fullmatch(kind):
            ok = b <= a or same(a, b)
        elif kind in HIGHER:
            ok = b > a
        else:
            ok = kind in EITHER or same(a, b)
        if not ok:
            wrong.append(f"{path}: {a!r} in bf16, {b!r} in fp8")
    assert not wrong, "terms fp8 must not change (or not this way):\n" + "\n".join(wrong)
    for term in ("time_s/step", "time_s/compute"):
        assert new[term] < old[term] and not same(old[term], new[term]), term

    fast = fp8_kernels(model)
    saving = {op: sum(kernel_seconds(k, bf16, H100) - kernel_seconds(k, fp8, H100) for k in ks if k.name in fast)
              - sum(kernel_seconds(k, fp8, H100) for k in layer(model, fp8)[op] if "fp8_cast_" in k.name)
              for op, ks in layer(model, bf16).items()}  # the FP8 peak's saving, less the casts FP8 adds
    split = build(bf16.schedule, bf16.pp, bf16.microbatches, bf16.vp).splits_backward
    per_action = saving if split else {"F": saving["F"], "B": saving["B"] + saving["W"], "W": 0.0}
    for s, (x, y) in enumerate(zip(before.pipeline["stages"], after.pipeline["stages"])):
        for op in "FBW":
            assert x[f"{op}_s"] - y[f"{op}_s"] == pytest.approx(x["layers"] * per_action[op], rel=1e-9,
                                                                abs=1e-15), f"stage {s} {op}"


NO_FP8 = [name for name, g in GPUS.items() if g.peak_flops_fp8 is None]


@pytest.mark.parametrize("gpu_name", NO_FP8)
def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_refused_in_one_line(gpu_name, capsys):
    """Only Hopper and Blackwell have FP8 tensor cores among the presets: elsewhere ``--dtype fp8`` is a one-line
    error, exit 2."""
    assert set(GPUS) - set(NO_FP8) == {"h100-80gb", "h200-141gb", "h800-80gb", "b200", "gb200", "gb300"}
    code = main(["--model", "gpt3-175b", "--tp", "8", "--dtype", "fp8", "--gpu", gpu_name])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out)
    assert err.splitlines() == [f"tpsim plan: error: --dtype fp8: the {gpu_name} has no FP8 tensor cores "
                                "(Hopper and Blackwell parts have)"], err
