"""Exercise 16's check: two memory terms of a plan against ``tpsim plan``'s own functions (arithmetic only)."""

from __future__ import annotations

from tpsim.config import dtype_name
from tpsim.plan.layout import Layout
from tpsim.plan.memory import activation_bytes_per_layer, state_bytes_per_param
from tpsim.plan.models import gpt
from tpsim.teach.checks.registry import exercise
from tpsim.teach.verdict import Report


def state_symptoms(params: int, dtype: str, zero: int, dp: int) -> dict:
    """Exercise 16's typical slips with the model state, as the number each gives."""
    whole, out = params * state_bytes_per_param(dtype, 0, dp)["total"], {}
    if zero and dp > 1:
        out["you divided the whole model state by dp: ZeRO-1 shards only the optimizer's"] = whole / dp
        out["ZeRO-1 was ignored: the optimizer state should be split over the dp replicas"] = whole
    if dtype_name(dtype) == "bfloat16":
        out["2-byte gradients: with bf16 weights Megatron keeps fp32 gradients (4 bytes)"] = \
            params * (state_bytes_per_param(dtype, zero, dp)["total"] - 2)
    return out


def activation_symptoms(s, b, h, a, t, sp) -> dict:
    sbh, scores = s * b * h, 5 * a * s / h
    return {"the plain-TP line under SP: with SP the 10 (LayerNorm, dropout) is split by t too":
            sbh * (10 + 24 / t + scores / t),
            "the attention scores are not split by t: each GPU holds a/t heads' scores": sbh * (10 + 24 / t + scores)
            if not sp else sbh * (34 / t + scores),
            "selective recompute kept the attention scores (the 5as/h term)": sbh / t * (34 + scores) if sp else
            sbh * (10 + 24 / t + scores / t)}


@exercise("16", "model_state_bytes_per_gpu", "gpt_layer_activation_bytes",
          model_state_bytes_per_gpu=("what does Adam keep per parameter besides the weight and its gradient?",
                                     "Megatron's table: bf16 2 + 4 + 12, fp16 2 + 2 + 16, fp32 4 + 4 + 8 bytes",
                                     "ZeRO-1 divides only the optimizer column by dp: 18 → 6 + 12/d"),
          gpt_layer_activation_bytes=("which parts of a layer does TP split, and which does every rank keep whole?",
                                      "TP sbh(10 + 24/t + 5as/(ht)); TP + SP sbh/t(34 + 5as/h)",
                                      "selective drops the 5as/h term; full recompute keeps only the input, 2sbh"))
def check_16(r: Report) -> None:
    for params, dtype, zero, dp in [(1_000_003, "bf16", 0, 1), (2_270_756_864, "bf16", 1, 2), (7, "fp16", 0, 4),
                                    (7_500_000_000, "fp16", 1, 64), (123_457, "fp32", 1, 8), (10, "bf16", 0, 8)]:
        want = params * state_bytes_per_param(dtype, zero, dp)["total"]
        got = r.call("model_state_bytes_per_gpu", params, dtype, zero, dp)
        r.compare(f"model_state_bytes_per_gpu(params={params:,}, dtype={dtype!r}, zero={zero}, dp={dp})", got, want,
                  tol=1e-6 * want, symptoms=state_symptoms(params, dtype, zero, dp))
    for s, b, h, a, t in [(2048, 1, 12288, 96, 8), (1024, 4, 1600, 25, 1), (4096, 2, 4096, 32, 4)]:
        model = gpt("exercise", 50257, h, 1, a, s)
        for sp in (False, True):
            for recompute in ("none", "selective", "full"):
                want = activation_bytes_per_layer(model, Layout(tp=t, sp=sp, recompute=recompute, seq_len=s,
                                                                micro_batch=b))["paper"]
                got = r.call("gpt_layer_activation_bytes", s, b, h, a, t, sp, recompute)
                r.compare(f"gpt_layer_activation_bytes(s={s}, b={b}, h={h}, a={a}, t={t}, sp={sp}, "
                          f"recompute={recompute!r})", got, want, tol=1e-9 * want,
                          symptoms=activation_symptoms(s, b, h, a, t, sp) if recompute == "none" else None)
