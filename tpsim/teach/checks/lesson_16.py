"""Exercise 16's check: two memory terms of a plan against ``tpsim plan``'s own functions (arithmetic only)."""

from __future__ import annotations

from tpsim.config import dtype_name
from tpsim.plan.layout import Layout
from tpsim.plan.memory import ZERO_PAPER_STATE_BYTES, activation_bytes_per_layer, state_bytes_per_param
from tpsim.plan.models import gpt
from tpsim.teach.checks.registry import exercise
from tpsim.teach.verdict import Report
from tpsim.zero_stage import zero_stage


UNITS = {"GiB (bytes ÷ 2³⁰)": 2 ** 30, "GB (bytes ÷ 10⁹)": 10 ** 9}


def state_symptoms(params: int, dtype: str, zero: int, dp: int) -> dict:
    """Exercise 16's typical slips with the model state, as the number each gives."""
    whole, out = params * state_bytes_per_param(dtype, 0, dp)["total"], {}
    if zero_stage(zero).shards_optimizer and dp > 1:
        out["you divided the whole model state by dp: ZeRO-1 shards only the optimizer's"] = whole / dp
        out["ZeRO-1 was ignored: the optimizer state should be split over the dp replicas"] = whole
    zero_paper = params * state_bytes_per_param(dtype, zero, dp, table=ZERO_PAPER_STATE_BYTES)["total"]
    if dtype_name(dtype) == "bfloat16":
        out["2-byte gradients (the ZeRO paper's 2 + 2 + 12): with bf16 weights Megatron keeps fp32 gradients"] = \
            zero_paper
    if dtype_name(dtype) == "float16":
        out["the ZeRO paper's 2 + 2 + 12: an fp16 run accumulates its gradients in fp32, 4 bytes, as bf16's"] = \
            zero_paper
        out["dist_optimizer.md's fp16 row (2 + 2 + 16): fp16 runs keep fp32 gradients instead of the 16-bit copy "
            "beside a main one, 2 + 4 + 12"] = params * state_bytes_per_param(dtype, zero, dp, table=(2, 2, 16))[
                "total"]
    return out


def as_bytes(symptoms: dict) -> dict:
    """Every symptom's number as a float: byte counts are compared as numbers with a tolerance, never as the
    integer index arrays ``tpsim.teach.diagnose`` reads ints as."""
    return {sentence: float(value) for sentence, value in symptoms.items()}


def unit_symptoms(got, want: float) -> dict:
    """An answer in GiB or GB instead of bytes. Checked relative to the answer first: under the absolute
    tolerance of a byte count, any number near zero would pass for want / 2³⁰."""
    try:
        got = float(got)
    except (TypeError, ValueError, OverflowError):
        return {}
    return {f"your number is in {name}: the function returns bytes": want / unit
            for name, unit in UNITS.items() if abs(got * unit - want) <= 1e-6 * want}


def activation_symptoms(s, b, h, a, t, sp, recompute, want: float) -> dict:
    """Exercise 16's typical slips with Table 2, as the number each gives for this case (``want``: the right
    bytes)."""
    sbh, scores = s * b * h, 5 * a * s / h
    out = {"twice the bytes: Table 2 is already in bytes (2 per 16-bit value, 1 per mask); multiplying by 2 "
           "bytes an element counts them twice": 2 * want}
    if recompute == "none":
        out["the plain-TP line under SP: with SP the 10 (LayerNorm, dropout) is split by t too"] = \
            sbh * (10 + 24 / t + scores / t)
        out["the attention scores are not split by t: each GPU holds a/t heads' scores"] = \
            sbh * (34 / t + scores) if sp else sbh * (10 + 24 / t + scores)
    if recompute == "selective":
        out["selective recompute kept the attention scores (the 5as/h term)"] = \
            sbh / t * (34 + scores) if sp else sbh * (10 + 24 / t + scores / t)
    if recompute == "full" and sp:
        out["full recompute under SP kept the whole input: each GPU keeps only its s/t rows of it, 2sbh/t"] = \
            2 * sbh
    return out


@exercise("16", "model_state_bytes_per_gpu", "gpt_layer_activation_bytes",
          model_state_bytes_per_gpu=("what does Adam keep per parameter besides the weight and its gradient?",
                                     "bf16 and fp16 2 + 4 + 12 (fp32 gradients), fp32 4 + 4 + 8 bytes",
                                     "ZeRO-1 divides only the optimizer column by dp: 18 → 6 + 12/d"),
          gpt_layer_activation_bytes=("which parts of a layer does TP split, and which does every rank keep whole?",
                                      "TP sbh(10 + 24/t + 5as/(ht)); TP + SP sbh/t(34 + 5as/h)",
                                      "selective drops the 5as/h term; full recompute keeps the input, 2sbh, or "
                                      "its sequence shard 2sbh/t under SP"))
def check_16(r: Report) -> None:
    for params, dtype, zero, dp in [(1_000_003, "bf16", 0, 1), (2_270_756_864, "bf16", 1, 2), (7, "fp16", 0, 4),
                                    (7_500_000_000, "fp16", 1, 64), (123_457, "fp32", 1, 8), (10, "bf16", 0, 8)]:
        want = float(params * state_bytes_per_param(dtype, zero, dp)["total"])  # bytes, compared as a float
        got = r.call("model_state_bytes_per_gpu", params, dtype, zero, dp)
        symptoms = as_bytes({**state_symptoms(params, dtype, zero, dp), **unit_symptoms(got, want)})
        r.compare(f"model_state_bytes_per_gpu(params={params:,}, dtype={dtype!r}, zero={zero}, dp={dp})", got, want,
                  tol=1e-6 * want, symptoms=symptoms)
    for s, b, h, a, t in [(2048, 1, 12288, 96, 8), (1024, 4, 1600, 25, 1), (4096, 2, 4096, 32, 4)]:
        model = gpt("exercise", 50257, h, 1, a, s)
        for sp in (False, True):
            for recompute in ("none", "selective", "full"):
                want = activation_bytes_per_layer(model, Layout(tp=t, sp=sp, recompute=recompute, seq_len=s,
                                                                micro_batch=b))["paper"]
                got = r.call("gpt_layer_activation_bytes", s, b, h, a, t, sp, recompute)
                r.compare(f"gpt_layer_activation_bytes(s={s}, b={b}, h={h}, a={a}, t={t}, sp={sp}, "
                          f"recompute={recompute!r})", got, want, tol=1e-9 * want,
                          symptoms=as_bytes({**activation_symptoms(s, b, h, a, t, sp, recompute, want),
                                             **unit_symptoms(got, want)}))
