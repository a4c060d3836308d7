"""Reference answer to exercise 11b — predict the bytes, then run (lesson 11_reading_a_trace.py)."""

from __future__ import annotations


def predict_layer_bytes(tp: int, b: int, s: int, h: int, vocab: int, n_layer: int,
                        itemsize: int) -> dict[str, tuple[int, int]]:
    act = b * s * h * itemsize  # one [b, s, h] activation

    def all_reduces(nbytes: int, calls: int) -> tuple[int, int]:
        return calls * nbytes, calls * 2 * (tp - 1) * nbytes // tp  # the ring: 2(p − 1)/p of the bytes

    out = {"transformer.wte": all_reduces(act, 1)}  # the vocab-parallel embedding's g
    for i in range(n_layer):  # g forward (after c_proj) and f backward (before c_attn / c_fc), each [b, s, h]
        out[f"transformer.h.{i}.attn"] = all_reduces(act, 2)
        out[f"transformer.h.{i}.mlp"] = all_reduces(act, 2)
    out["loss"] = all_reduces(b * s * itemsize, 3)  # max, Σ exp, target logit: [b, s] each; never the vocabulary
    out["lm_head"] = all_reduces(act, 1)  # f of the tied head, in backward
    return out
