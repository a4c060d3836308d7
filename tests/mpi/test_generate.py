"""TP inference: greedy tokens equal serial decoding at every TP size — with the KV cache and without it (the
training forward over the whole prefix, which shares no decoding code) — the vocab-parallel argmax equals np.argmax
(ties and padding included), and a decode step issues exactly the collectives the formula predicts."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import WORLD

from tpsim.generate import argmax
from tpsim.generate.argmax import check_tie_rules, serial_argmax, vocab_parallel_argmax
from tpsim.generate.check import LOGIT_TOLERANCE, first_difference
from tpsim.generate.decode import greedy, greedy_without_cache
from tpsim.generate.report import collective_counts, kv_cache_bytes, predicted_decode, step_events
from tpsim.models.build import parallel_gpt, serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.models.llama import parallel_llama, serial_llama
from tpsim.arch.llama import LlamaConfig
from tpsim.partition import padded_vocab_size

# 8 heads: whole heads at TP 1..8; vocabulary 37: padded at every TP > 1; large weights: varied tokens
CFG = GPTConfig(vocab_size=37, n_positions=20, n_embd=32, n_layer=2, n_head=8, initializer_range=0.5)
PROMPT = np.array([[5, 3, 36, 0, 17, 2], [1, 1, 2, 3, 5, 8]])
# 2 KV heads: split at TP 2, replicated on 2 and 4 ranks at TP 4 and 8
LLAMA = LlamaConfig(vocab_size=37, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=2, max_position_embeddings=20, initializer_range=0.5)


# arch -> (serial builder, TP builder, config, hidden, heads, KV heads)
MODELS = {"gpt2": (serial_gpt, parallel_gpt, CFG, CFG.n_embd, CFG.n_head, CFG.n_head),
          "llama": (serial_llama, parallel_llama, LLAMA, LLAMA.hidden_size, LLAMA.num_attention_heads,
                    LLAMA.num_key_value_heads)}


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_tp_greedy_tokens_equal_serial_decoding(grid, arch):
    """Same tokens on every rank as the serial model; the cache holds this rank's (KV) heads only."""
    serial_of, parallel_of, cfg, hidden, heads, kv_heads = MODELS[arch]
    serial = serial_of(cfg, seed=11)
    expected, _ = greedy(serial, PROMPT, 10)
    tokens, caches = greedy(parallel_of(serial, grid.tp_group), PROMPT, 10, grid.tracer)
    np.testing.assert_array_equal(tokens, expected)
    assert len(set(expected.ravel().tolist())) > 3, "a degenerate test: the tokens should vary"
    everyone = WORLD.allgather(tokens.tolist())
    assert all(t == tokens.tolist() for t in everyone), "every rank holds the same tokens"
    hd, positions = hidden // heads, PROMPT.shape[1] + 10 - 1
    kv_local = max(1, kv_heads // grid.tp)  # split, or (Llama at TP > kv_heads) one replicated head
    assert caches[0].k.shape == (2, kv_local, positions, hd), "this rank's (KV) heads only"
    assert sum(c.nbytes for c in caches) == kv_cache_bytes(2, 2, positions, kv_heads, hd, 8, grid.tp)
    for step in range(1, 10):
        assert collective_counts(step_events(grid.tracer.events, step)) == predicted_decode(2, 2, hidden, "float64")


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_tp_cached_decoding_equals_decoding_without_a_cache(grid, arch):
    """The cached TP decode against the training forward over positions 0..t per token: tokens equal, and this
    rank's logit slice within the check's tolerance at every step. The Llama's 2 KV heads are split at TP 2 and
    replicated at TP 4 and 8; a position or cache bug shared by serial and TP decoding fails here."""
    serial_of, parallel_of, cfg, *_ = MODELS[arch]
    serial = serial_of(cfg, seed=11)
    expected, reference = greedy_without_cache(serial, PROMPT, 10)
    model, logits = parallel_of(serial, grid.tp_group), []
    tokens, _ = greedy(model, PROMPT, 10, grid.tracer, logits)
    lo = model.lm_head.vocab_start
    hi = max(lo, min(lo + logits[0].shape[-1], cfg.vocab_size))  # this rank's real vocabulary ids, no padding
    mine, theirs = np.stack(logits)[..., :hi - lo], np.stack(reference)[..., lo:hi]
    worst, diff = first_difference(tokens, mine, expected, theirs, LOGIT_TOLERANCE["float64"])
    assert diff is None, f"TP {grid.tp} cached decoding vs no cache: first at {diff} (max |Δ| {worst:.2g})"


def test_a_decode_step_issues_the_predicted_collectives(grid):
    model = parallel_gpt(serial_gpt(CFG, seed=11), grid.tp_group)
    greedy(model, PROMPT, 3, grid.tracer)
    events = grid.tracer.events
    for step in (1, 2):
        assert collective_counts(step_events(events, step)) == predicted_decode(CFG.n_layer, 2, CFG.n_embd, "float64")
    prefill = collective_counts(step_events(events, 0))
    assert prefill[("all_reduce", "sum", (2, PROMPT.shape[1], CFG.n_embd), "float64")] == 2 * CFG.n_layer + 1
    assert not any(e.op == "all_gather" for e in events), "the logits are never gathered"


def test_vocab_parallel_argmax_breaks_ties_like_np_argmax(grid):
    group, p = grid.tp_group, grid.tp
    vocab = 4 * p + 3
    padded = padded_vocab_size(vocab, p)
    rng = np.random.default_rng(4)
    full = rng.integers(-3, 3, (6, padded)).astype(np.float64)  # many ties, some across rank boundaries
    full[0, :] = 1.0  # all tied: the first id wins
    full[1, vocab - 1] = full[1, 0] = 9.0  # the first and the last real id tie
    full[:, vocab:] = 100.0  # padding columns must never win
    width = padded // p
    local = full[:, group.rank * width:(group.rank + 1) * width]
    got = vocab_parallel_argmax(local, group.rank * width, vocab, group)
    np.testing.assert_array_equal(got, serial_argmax(full, vocab))
    assert got[0] == 0 and got[1] == 0



@pytest.mark.parametrize("vocab_of", [lambda tp: 4 * tp + 3, lambda tp: 2 * tp], ids=["padded", "unpadded"])
def test_tie_rules_check_passes_and_catches_a_broken_tie_or_padding_rule(grid, vocab_of, monkeypatch):
    """``--check-serial``'s crafted rows: the right argmax passes; ties to the largest id, and padding counted as 0
    instead of −∞, fail — rules that real logits, which never tie, let slip."""
    group, vocab = grid.tp_group, vocab_of(grid.tp)
    ok, line = check_tie_rules(group, vocab)
    assert ok, line

    def ties_to_largest(logits_local, vocab_start, vocab_size, group):
        ids = vocab_start + np.arange(logits_local.shape[-1])
        real = np.where(ids < vocab_size, logits_local, -np.inf)
        j = real.shape[-1] - 1 - np.argmax(real[:, ::-1], axis=-1)
        value = real[np.arange(len(j)), j]
        best = group.all_reduce(value, op="max")
        return group.all_reduce(np.where(value == best, vocab_start + j, -1), op="max")

    def padding_as_zero(logits_local, vocab_start, vocab_size, group):
        ids = vocab_start + np.arange(logits_local.shape[-1])
        return vocab_parallel_argmax(np.where(ids < vocab_size, logits_local, 0.0), vocab_start, 10**9, group)

    monkeypatch.setattr(argmax, "vocab_parallel_argmax", ties_to_largest)
    assert not check_tie_rules(group, vocab)[0]
    if padded_vocab_size(vocab, grid.tp) > vocab:  # padding columns exist: 0 beats the all-negative row
        monkeypatch.setattr(argmax, "vocab_parallel_argmax", padding_as_zero)
        assert not check_tie_rules(group, vocab)[0]
