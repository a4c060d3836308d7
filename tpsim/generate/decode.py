"""Greedy decoding with a KV cache, on the serial model or its TP twin, GPT-2 or Llama — one code path for all.

The layers are the training layers, called forward only: their ``forward`` returns ``(out, cache)`` and the
cache is dropped. Under TP the same calls issue the same collectives as in training's forward, now on
``[b, t, h]`` with t = the prompt length (prefill) or 1 (each decode step):

    embedding       vocab-parallel lookup: 1 all-reduce [b, t, h]
    per block       attention's c_proj / o_proj (row-parallel): 1 all-reduce [b, t, h]; the MLP's: 1 more
    LM head         logits of this rank's vocabulary slice, never gathered; the argmax: 2 all-reduces of [b]
                    (``tpsim.generate.argmax``)

so a decode step takes 2·n_layer + 3 collectives of a few KiB at most: each costs its latency α and almost no
bandwidth (in the α-β model, α assumed: all latency). Llama's RoPE rotates q and k at their absolute positions (start..)
before k enters the cache; GQA's query heads read their KV head out of the cache (``cached_attention``); a KV
head replicated over ranks is cached on each of them, and a forward needs none of lesson 12's gradient sums.

The tracer's ``step`` numbers the forward passes: 0 = the prefill, k = the k-th decode step; each forward is
timed as a compute span with scope "prefill" or "decode".

``greedy_without_cache`` is the reference that shares none of this: token t+1 from the training forward over
the whole sequence 0..t (its causal mask, its RoPE at positions 0..t), O(t) work per token where the cache
makes it O(1). A cache or position bug written into both the serial and the TP decode (they run the code
above) shows only against it.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from tpsim.errors import ConfigError
from tpsim.generate.argmax import serial_argmax, vocab_parallel_argmax
from tpsim.generate.kv_cache import LayerKV, cached_attention
from tpsim.nn.attention import merge_heads, split_heads
from tpsim.nn.rope import rope_cos_sin
from tpsim.phases import FORWARD

PREFILL, DECODE = "prefill", "decode"  # the scopes of the compute spans that time each forward


def local_heads(attn) -> tuple[int, int]:
    """(query heads, KV heads) this rank computes: all of them in the serial model; GPT-2 has no separate KV heads."""
    q = getattr(attn, "heads_per_partition", attn.heads)
    if hasattr(attn, "kv_index"):  # tensor-parallel GQA: split or replicated KV heads
        return q, len(attn.kv_index)
    return q, getattr(attn, "kv_heads", q)


def new_caches(model, batch: int, capacity: int, dtype) -> list[LayerKV]:
    """One empty ``LayerKV`` per block, holding this rank's KV heads only."""
    blocks = model.body().parts()[2]
    return [LayerKV(batch, local_heads(b.parts()[1])[1], capacity, b.parts()[1].head_dim, dtype) for b in blocks]


def gpt2_qkv(attn, x: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPT-2: this rank's heads of the packed c_attn, ``q, k, v: [b, heads, t, hd]``."""
    qkv, _ = attn.c_attn.forward(x)  # q | k | v of this rank's heads, [b, t, 3·heads·hd]; f: no communication
    heads = local_heads(attn)[0]
    q, k, v = (split_heads(part, heads) for part in np.split(qkv, 3, axis=-1))
    return q, k, v


def llama_qkv(attn, x: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Llama: q, k, v projections of this rank's heads, RoPE at positions ``start..`` (no communication)."""
    heads, kv_heads = local_heads(attn)
    cos, sin = rope_cos_sin(np.arange(start, start + x.shape[1]), attn.rotary_dim, attn.rope_theta, x.dtype)
    turn = attn.rope[0]  # all of each head (Llama), or its first rotary_dim features (Nemotron)
    q = turn(split_heads(attn.q_proj.forward(x)[0], heads), cos, sin)[0]
    k = turn(split_heads(attn.k_proj.forward(x)[0], kv_heads), cos, sin)[0]
    return q, k, split_heads(attn.v_proj.forward(x)[0], kv_heads)


def cached_self_attention(attn, x: np.ndarray, kv: LayerKV, start: int) -> np.ndarray:
    """Attention of the positions ``start..`` of ``x: [b, t, h]`` against the cache (which they are appended to)."""
    llama = hasattr(attn, "o_proj")
    q, k, v = (llama_qkv if llama else gpt2_qkv)(attn, x, start)
    k_all, v_all = kv.append(k, v)  # RoPE'd keys are cached: a position's rotation never changes
    out = attn.o_proj if llama else attn.c_proj
    y, _ = out.forward(merge_heads(cached_attention(q, k_all, v_all, start)))  # TP: the all-reduce (g)
    return y


def last_logits(model, ids: np.ndarray, caches: list[LayerKV], start: int) -> np.ndarray:
    """Last-position logits ``[b, V]`` (TP: this rank's ``[b, Vp/p]``) of ``ids: [b, t]`` at positions start.."""
    embed, positions, blocks, final_norm = model.body().parts()
    x = embed.forward(ids)[0]  # TP: the vocab-parallel lookup's all-reduce
    if positions is not None:  # GPT-2's learned positions; Llama's RoPE acts inside attention
        x = x + positions.forward(np.arange(start, start + ids.shape[1]))[0]
    for block, kv in zip(blocks, caches):
        norm_1, attn, norm_2, mlp = block.parts()
        x = x + cached_self_attention(attn, norm_1.forward(x)[0], kv, start)
        x = x + mlp.forward(norm_2.forward(x)[0])[0]  # TP: the MLP's all-reduce
    h = final_norm.forward(x[:, -1:])[0]  # only the last position feeds the next token
    return model.lm_head.forward(h)[0][:, -1]


def next_token(model, logits: np.ndarray) -> np.ndarray:
    """Greedy choice ``int64 [b]``: serial argmax, or the vocab-parallel one (same on every rank)."""
    head = model.lm_head
    vocab = model.config.vocab_size
    if not hasattr(head, "group"):
        return serial_argmax(logits, vocab)
    with head.group.tracer.region(scope=head.path + ".argmax", phase=FORWARD):
        return vocab_parallel_argmax(logits, head.vocab_start, vocab, head.group)


def max_positions(config) -> int:
    return getattr(config, "n_positions", None) or config.max_position_embeddings


def greedy(model, prompt: np.ndarray, max_new_tokens: int, tracer=None,
           logits: list | None = None) -> tuple[np.ndarray, list[LayerKV]]:
    """Greedy-decode ``max_new_tokens`` after ``prompt: int [b, s]`` -> ``(new tokens int64 [b, K], caches)``.

    ``logits``, when given, receives each step's last-position logits ``[b, V]`` (TP: this rank's ``[b, Vp/p]``).
    """
    prompt = np.asarray(prompt, dtype=np.int64)
    b, s = prompt.shape
    total, limit = s + max_new_tokens, max_positions(model.config)
    if total - 1 > limit:  # the last token is produced, never fed back
        raise ConfigError(f"prompt {s} + {max_new_tokens} new tokens needs {total - 1} positions, "
                          f"the model has {limit}")
    if max_new_tokens < 1 or s < 1:
        raise ConfigError(f"need a prompt of at least 1 token and --max-new-tokens >= 1 (got {s}, {max_new_tokens})")
    dtype = next(p for _, p in model.named_parameters()).dtype
    caches = new_caches(model, b, total - 1, dtype)
    out = np.empty((b, max_new_tokens), dtype=np.int64)
    ids, start = prompt, 0
    for i in range(max_new_tokens):
        if tracer is not None:
            tracer.step = i  # 0: prefill, then one step per decoded token
        with nullcontext() if tracer is None else tracer.span(PREFILL if i == 0 else DECODE, FORWARD):
            step_logits = last_logits(model, ids, caches, start)
            out[:, i] = next_token(model, step_logits)
        if logits is not None:
            logits.append(step_logits)
        start += ids.shape[1]
        ids = out[:, i:i + 1]
    return out, caches


def greedy_without_cache(model, prompt: np.ndarray, max_new_tokens: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Greedy decoding the slow way, on a serial model: every new token from the training forward over the whole
    sequence so far (positions 0..t), argmax of the last position -> ``(tokens int64 [b, K], logits [b, V] per
    step)``. No KV cache and none of the decoding code above: the reference for ``greedy``."""
    ids = np.asarray(prompt, dtype=np.int64)
    s, logits = ids.shape[1], []
    for _ in range(max_new_tokens):
        h, _ = model.body().forward(ids)
        logits.append(model.lm_head.forward(h[:, -1:])[0][:, -1])
        ids = np.concatenate([ids, serial_argmax(logits[-1], model.config.vocab_size)[:, None]], axis=1)
    return ids[:, s:], logits
