"""``--check-serial``: the TP decode against two serial references of the same weights, step by step.

    with the KV cache      ``greedy`` on the serial model: the same decoding code, so it isolates what TP adds
                           (sharded heads, vocab-parallel logits and argmax, the all-reduces)
    without a cache        ``greedy_without_cache``: the training forward over positions 0..t for every new
                           token, so it shares no decoding code — a cache or position bug (a RoPE position off
                           by one) that the first reference repeats shows here

At each step t (0 = the prefill, k = the k-th decode step) the tokens must be equal and the logits over the real
vocabulary close: ``|Δ| ≤ tol · max(1, max |logit|)`` with tol = 1e-10 in float64 (measured: ~1e-14, the
summation orders of the cached attention and the TP all-reduces), 1e-4 in float32 (measured: ~2e-5). The first
step that fails either is named, with the sequence, both tokens and the largest logit difference.
"""

from __future__ import annotations

import numpy as np

from tpsim.generate.decode import greedy, greedy_without_cache

LOGIT_TOLERANCE = {"float64": 1e-10, "float32": 1e-4}
WITH_CACHE = "with the KV cache (the same decoding code)"
WITHOUT_CACHE = "without a cache (a full forward over positions 0..t per token)"


def first_difference(tokens: np.ndarray, logits: np.ndarray, ref_tokens: np.ndarray, ref_logits: np.ndarray,
                     tol: float) -> tuple[float, str | None]:
    """``tokens: [b, K]``, ``logits: [K, b, V]`` vs the reference's -> ``(max |Δ logit|, None or the first step
    that differs, in words)``. Steps after a differing token are not compared: their prefixes differ."""
    worst = 0.0
    for step in range(tokens.shape[1]):
        diff = float(np.max(np.abs(logits[step] - ref_logits[step])))
        bound = tol * max(1.0, float(np.max(np.abs(ref_logits[step]))))
        seqs = np.flatnonzero(tokens[:, step] != ref_tokens[:, step])
        if seqs.size or diff > bound:
            j = int(seqs[0]) if seqs.size else int(np.argmax(np.max(np.abs(logits[step] - ref_logits[step]), -1)))
            where = "the prefill" if step == 0 else f"decode step {step}"
            return max(worst, diff), (f"step {step} ({where}, new token {step + 1}), sequence {j}: token "
                                      f"{int(tokens[j, step])} vs {int(ref_tokens[j, step])}, logits differ by "
                                      f"up to {diff:.3g} (allowed {bound:.3g})")
        worst = max(worst, diff)
    return worst, None


def against_serial(serial, prompt: np.ndarray, tokens: np.ndarray, logits: np.ndarray,
                   tp: int) -> tuple[bool, list[str]]:
    """Compare the TP decode (``tokens [b, K]``, gathered real-vocabulary ``logits [K, b, V]``) with both serial
    references on ``serial`` -> ``(ok, report lines ending with the VERDICT line)``."""
    k, vocab = tokens.shape[1], serial.config.vocab_size
    dtype = str(next(p for _, p in serial.named_parameters()).dtype)
    tol = LOGIT_TOLERANCE[dtype]
    cached = []
    cached_tokens, _ = greedy(serial, prompt, k, logits=cached)
    references = {WITH_CACHE: (cached_tokens, cached), WITHOUT_CACHE: greedy_without_cache(serial, prompt, k)}
    lines, failures = [], []
    for name, (ref_tokens, ref_logits) in references.items():
        worst, diff = first_difference(tokens, logits, ref_tokens, np.stack(ref_logits)[..., :vocab], tol)
        same = f"tokens equal, logits within {tol:g}·max(1, |logit|) (max |Δ| {worst:.2g})"
        lines.append(f"serial decoding {name}: " + (f"MISMATCH at {diff}" if diff else same))
        failures += [f"{name.split(' (')[0]}: first at {diff}"] if diff else []
    ok = not failures
    verdict = (f"VERDICT: MATCH — TP({tp}) greedy tokens and logits ({dtype}) equal serial decoding of the same "
               f"weights, with and without the KV cache" if ok else
               f"VERDICT: MISMATCH — TP({tp}) greedy decoding differs from serial decoding " + "; ".join(failures))
    return ok, lines + [verdict]
