# %% [markdown]
# # Lesson 13 — Inference under TP: a KV cache per rank, per-token collectives, latency vs bandwidth
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/13_inference.py` (or `tpsim lesson run 13`;
# as a notebook on as many engines: `tpsim lesson notebook 13`).
#
# Training runs one forward over a whole batch of sequences. Generating text runs one forward per *token*:
# the prompt first (the **prefill**), then one position at a time (**decode**), each step feeding the token
# the last one chose. This lesson decodes greedily with the layers of lessons 03–06 and 12, split over TP 4:
#
# 1. models from **Hugging Face folders** (`config.json` + `model.safetensors`), a GPT-2 and a Llama with
#    grouped-query attention, read by `tpsim.hf` and sharded at TP 4;
# 2. the **KV cache**: the keys and values of every earlier position, kept — on each rank only for the heads
#    that rank computes, so it shrinks with TP like the attention weights, and costs no communication;
# 3. the **argmax without the logits**: the LM head's output stays vocab-parallel, two all-reduces of `[b]`;
# 4. the **collectives of one token**, and what they cost in the α-β model of lesson 11 (with an assumed α):
#    α, not bandwidth.
#
# Sources: Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3 (attention split by heads, the
# vocab-parallel output layer); the SenseParrots article, eqs. (3) and (4) (the max over every rank's
# columns — the argmax below is the same reduction); Ainslie et al. 2023, "GQA", arXiv:2305.13245; Touvron
# et al. 2023, "Llama 2", arXiv:2307.09288; Pope et al. 2022, "Efficiently Scaling Transformer Inference",
# arXiv:2211.05102 (small-batch decode is memory-bandwidth bound: each token reads all the weights and the
# KV cache; the KV cache's memory).

# %%
RANKS = 4

import shutil
import tempfile

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.cost import ring_steps, wire_bytes
from tpsim.generate.argmax import local_argmax, serial_argmax, vocab_parallel_argmax
from tpsim.generate.decode import greedy, greedy_without_cache
from tpsim.generate.report import (collective_counts, describe_counts, kv_cache_bytes, kv_table, latency_table,
                                   predicted_decode, step_events)
from tpsim.generate.run import parallel_model, serial_model
from tpsim.hf.folder import read_folder
from tpsim.hf.write import write_hf_folder
from tpsim.models.build import serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.models.llama import serial_llama
from tpsim.arch.llama import LlamaConfig
from tpsim.plan.models import PRESETS as PLAN_MODELS
from tpsim.teach.runtime import Lesson, table
from tpsim.links import NVLINK4_H100

lesson = Lesson("13", RANKS)
grid = ProcessGrid(tp=RANKS)
tracer = grid.tracer
lesson.say(grid.table(), "")

# %% [markdown]
# ## Models from Hugging Face folders
#
# A Hugging Face checkpoint is a folder: `config.json` (the shape, in `GPT2Config`'s or `LlamaConfig`'s
# words) and the weights in `model.safetensors` — a JSON header and raw little-endian bytes, float32,
# float16 or bfloat16. Rank 0 writes two such folders from random weights (`tpsim.hf.write`, what
# `save_pretrained` writes); then *every* rank reads the whole folder and keeps its shard, exactly as with
# tpsim's own checkpoints: the file holds the serial model, so it loads at any TP size. The Llama has 8
# query heads and 2 KV heads: at TP 4 each KV head is **replicated** on 2 ranks (lesson 12). Weights large
# enough (std 0.5) that greedy decoding does not repeat one token forever.

# %%
lesson.section("Models from Hugging Face folders")
gpt_config = GPTConfig(vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=4, initializer_range=0.5)
llama_config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=32,
                           initializer_range=0.5)
folders = {"gpt2": tempfile.mkdtemp(prefix="lesson13-gpt2-"), "llama": tempfile.mkdtemp(prefix="lesson13-llama-")}
folders = grid.world.comm.bcast(folders if grid.rank == 0 else None)  # one set of paths for every rank
if grid.rank == 0:
    write_hf_folder(folders["gpt2"], gpt_config, dict(serial_gpt(gpt_config, 13).named_parameters()),
                    dtype="float32")
    write_hf_folder(folders["llama"], llama_config, dict(serial_llama(llama_config, 13).named_parameters()),
                    dtype="bfloat16", shards=2)
grid.world.comm.Barrier()
loaded = {arch: read_folder(folder) for arch, folder in folders.items()}  # (config, full tensors): every rank
models = {arch: parallel_model(cfg, tensors, grid.tp_group, np.float64) for arch, (cfg, tensors) in loaded.items()}
lesson.say(*(f"{arch}: {type(cfg).__name__}, {len(tensors)} tensors read from {folders[arch]}"
             for arch, (cfg, tensors) in loaded.items()))
lesson.expect("the folder describes the model it was written from (the config round-trips)")
lesson.check("config.json read back equals the model's config", "gpt2 and llama",
             loaded["gpt2"][0] == gpt_config and loaded["llama"][0] == llama_config)

# %% [markdown]
# ## Prefill, then one token at a time
#
# `tpsim.generate.decode.greedy` runs the prefill over the whole prompt, takes the argmax of the last
# position's logits, and then feeds one token per step. Each attention layer appends the new keys and
# values to the cache and lets the new query attend to *all* cached positions — so a step computes one
# position, not the whole sequence again. Nothing about the layers changes: they are the training layers,
# forward only, with the same f and g. The tracer's `step` numbers the forward passes: 0 is the prefill.

# %%
lesson.section("Prefill, then one token at a time")
prompt = np.array([[7, 3, 41, 0, 19], [2, 2, 8, 31, 5]])
NEW = 12
tokens, caches = {}, {}
for arch, model in models.items():
    tracer.reset()
    tokens[arch], caches[arch] = greedy(model, prompt, NEW, tracer)
    if arch == "llama":
        events = list(tracer.events)  # the Llama's trace, read in the sections below
    lesson.say(f"{arch}: generated {tokens[arch].tolist()}")
serial = {arch: greedy(serial_model(cfg, tensors, np.float64), prompt, NEW)[0]
          for arch, (cfg, tensors) in loaded.items()}

# the slow way, sharing none of greedy's code: the whole sequence through the training forward at every step
slow, _ = greedy_without_cache(serial_model(*loaded["llama"], np.float64), prompt, NEW)
lesson.expect("TP 4 (with its KV cache) decodes exactly the serial model's tokens (gpt2, llama), and "
              "recomputing the whole sequence serially, without a cache, gives the same tokens (llama)")
lesson.equal("TP 4 tokens == serial decoding with a cache (gpt2, llama)", [tokens[a].tolist() for a in models],
             [serial[a].tolist() for a in models])
lesson.equal("llama: TP 4's tokens == the serial forward over the whole sequence at every step (no cache)",
             tokens["llama"].tolist(), slow.tolist())

# %% [markdown]
# ## The KV cache holds this rank's heads
#
# Per layer and rank the cache is `K, V: [b, kv_heads_local, T, head_dim]`: the GPT-2 keeps heads / tp = 1
# of its 4 heads; the Llama keeps kv_heads / tp — here 2 / 4 is not whole, so it keeps **one replicated KV
# head**, the one its query heads read. Memory per rank is therefore
# `2 · n_layer · b · T · kv_heads_local · head_dim · itemsize`. Grouped-query attention shrinks it by
# heads / kv_heads; TP shrinks it by tp — until tp reaches kv_heads, after which replication stops the
# shrinking (the table's flat rows).
#
# How many positions T does the cache hold after 5 prompt tokens and 12 new ones? Not 17: the prefill caches
# the 5 prompt positions, and each decode step caches the position it feeds, which is the token the step
# before chose. The 12th new token is chosen by the last forward and never fed back, so the cache holds
# `T = prompt + NEW − 1 = 5 + 11 = 16` positions.

# %%
lesson.section("The KV cache holds this rank's heads")
hd, positions = llama_config.head_dim, prompt.shape[1] + NEW - 1  # the last new token is never fed back
lesson.say(kv_table(2, 2, positions, 8, 2, hd, 8), "")
shapes = {arch: caches[arch][0].k.shape for arch in models}
lesson.say(*(f"{arch}: layer 0's K on this rank {list(s)}" for arch, s in shapes.items()))
live = sum(c.nbytes for c in caches["llama"])
lesson.expect("the GPT-2 keeps 1 of its 4 heads per rank, the Llama 1 replicated KV head of its 2; both hold "
              "T = 5 + 12 − 1 = 16 positions; the Llama's bytes are the formula's")
lesson.equal("KV heads per rank (gpt2, llama)", (shapes["gpt2"][1], shapes["llama"][1]), (1, 1))
lesson.equal("positions held (gpt2, llama) == prompt + NEW − 1", (caches["gpt2"][0].length, caches["llama"][0].length),
             (positions, positions))
lesson.equal("llama: this rank's cache bytes == 2 · layers · b · T · kv_local · hd · 8", live,
             kv_cache_bytes(2, 2, positions, 2, hd, 8, RANKS))

# %% [markdown]
# ## A KV cache at real size
#
# This toy's cache is a few KiB. At real sizes it is what fills a GPU besides the weights, and it grows with
# the batch and the context (Pope et al. 2022). Take Llama-3-70B (tpsim's planner preset `llama3-70b`:
# 80 layers, 8 KV heads of head_dim 128) and one sequence of its 8192-token context in bfloat16, priced with
# the same `kv_cache_bytes` as above: `2 · 80 · 8 · 128 · 8192 · 2 B` = 2.68 GB (2.5 GiB) per sequence. At
# TP 8 each GPU holds one of the 8 KV heads, 0.34 GB (320 MiB). Without GQA — 64 KV heads, one per query
# head — it would be 8 times that: 21.5 GB per sequence, 2.7 GB per GPU at TP 8. And past TP 8 the copies of
# lesson 12 stop the shrinking: at TP 16 every GPU still holds one whole KV head.

# %%
lesson.section("A KV cache at real size")
llama70 = PLAN_MODELS["llama3-70b"]
ctx, bf16 = llama70.positions, 2  # one 8192-token sequence, 2-byte numbers


def kv_70b(kv: int, tp: int) -> int:
    return kv_cache_bytes(llama70.layers, 1, ctx, kv, llama70.head_dim, bf16, tp)


def gb(n: int) -> str:
    """Decimal GB, and the binary unit beside it: lesson 16's GB vs GiB."""
    binary = f"{n / 2 ** 30:.3g} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.3g} MiB"
    return f"{n / 1e9:.2f} GB ({binary})"


rows = [["Llama-3-70B, one 8192-token sequence, bf16", "KV heads", "per sequence (TP 1)", "per GPU at TP 8",
         "per GPU at TP 16"]]
for label, kv in (("GQA (the model)", llama70.kv_heads), ("without GQA", llama70.heads)):
    rows.append([label, f"{kv}", gb(kv_70b(kv, 1)), gb(kv_70b(kv, 8)), gb(kv_70b(kv, 16))])
lesson.say(f"  {llama70.layers} layers, {llama70.kv_heads} KV heads of head_dim {llama70.head_dim}, {llama70.heads} query heads",
           table(rows), "")
lesson.expect("2 · 80 · 8 · 128 · 8192 · 2 B = 2.68 GB per sequence, 1/8 of it per GPU at TP 8, 8× without GQA, "
              "and no smaller at TP 16")
lesson.equal("per sequence: kv_cache_bytes == 2 · 80 · 8 · 128 · 8192 · 2 B",
             (kv_70b(llama70.kv_heads, 1), gb(kv_70b(llama70.kv_heads, 1))),
             (2 * 80 * 8 * 128 * 8192 * 2, "2.68 GB (2.5 GiB)"))
lesson.equal("per GPU at TP 8 = per sequence / 8", (kv_70b(llama70.kv_heads, 8), gb(kv_70b(llama70.kv_heads, 8))),
             (kv_70b(llama70.kv_heads, 1) // 8, "0.34 GB (320 MiB)"))
lesson.equal("without GQA (64 KV heads): 8× per sequence and per GPU at TP 8",
             (kv_70b(llama70.heads, 1) // kv_70b(llama70.kv_heads, 1), kv_70b(llama70.heads, 8) // kv_70b(llama70.kv_heads, 8),
              gb(kv_70b(llama70.heads, 1))), (8, 8, "21.47 GB (20 GiB)"))
lesson.equal("TP 16 holds as much per GPU as TP 8 (each GPU one whole, copied KV head)", kv_70b(llama70.kv_heads, 16),
             kv_70b(llama70.kv_heads, 8))

# %% [markdown]
# ## The argmax without the logits
#
# The LM head is column-parallel over the vocabulary (lesson 06): rank r holds the logits of its slice
# only. Gathering them would move `b · V` numbers per token — at Llama-3's V = 128 256, 128 256 · 8 B ≈
# 1.03 MB (0.98 MiB) per sequence in float64. Instead each rank reduces its slice to one (value, global id)
# pair per row; an all-reduce MAX finds the winning value and an all-reduce MIN of "my id if I reached it,
# else V" finds the first id that reaches it — `np.argmax`'s tie rule, so the tokens equal serial decoding
# bit for bit. Padding columns (ids ≥ V, there so that the padded vocabulary divides by tp) count as −∞:
# their weight rows are zero, so their logit is 0, and that must lose even to a row of negative logits.

# %%
lesson.section("The argmax without the logits")
head = models["gpt2"].lm_head
full = np.random.default_rng(13).standard_normal((4, head.padded_vocab_size))  # [b, Vp], b = 4 rows
full[0] = 1.0  # every id ties: the first one wins
full[1, [20, 45]] = 5.0  # two ranks tie (ids 20 and 45 live on ranks 1 and 3): the smaller id wins
full[:, head.vocab_size:] = 100.0  # padding (ids 50, 51) must never win
full[3, :head.vocab_size] = -1.0 - np.abs(full[3, :head.vocab_size])  # every real logit negative ...
full[3, head.vocab_size:] = 0.0  # ... beside padding logits of 0, what the zero weight rows give
mine = full[:, head.vocab_start:head.vocab_start + full.shape[1] // RANKS]
value, index = local_argmax(mine, head.vocab_start, head.vocab_size)
tracer.reset()
winner = vocab_parallel_argmax(mine, head.vocab_start, head.vocab_size, grid.tp_group)
argmax_calls = [(e.op, e.reduce_op, e.shape, e.bytes) for e in tracer.events]
moved = sum(e.bytes for e in tracer.events)
local_best = lesson.gather(index.tolist())
lesson.say(*(f"rank {r}'s best ids: {ids}" for r, ids in enumerate(local_best or [])),
           f"the whole vocabulary's: {winner.tolist()}",
           f"collectives: {describe_counts(collective_counts(tracer.events))} — {moved} bytes, "
           f"vs {full[:, :head.vocab_size].nbytes} bytes of logits to gather")
lesson.expect("two all-reduces of [b] (MAX of the values, MIN of the ids, 8 bytes a row each) give np.argmax of "
              "the full row, ties across ranks, padding and an all-negative row included")
lesson.equal("the argmax's collectives: (op, reduce op, shape, bytes)", argmax_calls,
             [("all_reduce", "max", (4,), 4 * 8), ("all_reduce", "min", (4,), 4 * 8)])
lesson.equal("vocab_parallel_argmax == np.argmax over the real vocabulary", winner.tolist(),
             serial_argmax(full, head.vocab_size).tolist())
llama3_vocab = PLAN_MODELS["llama3-8b"].vocab
lesson.expect("gathering Llama-3's logits instead: about 1 MB per sequence and token in float64, a little under "
              "1 MiB")
lesson.check("b · V · 8 B at V = 128 256, b = 1", f"{llama3_vocab * 8 / 1e6:.2f} MB = "
             f"{llama3_vocab * 8 / 2 ** 20:.2f} MiB", llama3_vocab == 128256 and 1e6 < llama3_vocab * 8 < 2 ** 20)

# %% [markdown]
# ## The collectives of one token
#
# Up to the LM head, the prefill and every decode step issue the *same* collectives as training's forward, on
# `[b, t, h]` with t = the prompt's length, then t = 1: one all-reduce after the vocab-parallel embedding, one
# after attention's row-parallel output projection (g), one after the MLP's, per layer. After the LM head
# they differ: training's vocab-parallel cross-entropy issues three all-reduces of `[b·t]` (lesson 06: the
# maximum, the sum of exponentials, the target's logit), greedy decoding the argmax's two of `[b]`. That is
# `2 · n_layer + 3` collectives per generated token, whatever the model's width. RoPE, the cache and a
# replicated KV head add none: a forward never needs the KV-gradient reduction of lesson 12. Below, a
# training forward (the loss, no backward) of the same TP model on the prompt, beside the prefill.

# %%
lesson.section("The collectives of one token")
prefill, decode = step_events(events, 0), step_events(events, 1)
lesson.say(f"llama prefill ({prompt.shape[1]} positions): {describe_counts(collective_counts(prefill))}",
           f"llama decode (per token): {describe_counts(collective_counts(decode))}", "")
tracer.reset()
models["llama"].forward(prompt, np.roll(prompt, -1, axis=1))  # training's forward: the loss of the prompt
calls = {"training forward": [(e.op, e.reduce_op, e.shape) for e in tracer.events],
         "prefill": [(e.op, e.reduce_op, e.shape) for e in prefill]}
lesson.say(f"llama training forward (the loss of the same {prompt.shape[1]} positions): "
           f"{describe_counts(collective_counts(tracer.events))}", "")
bt, body = prompt.size, 2 * llama_config.num_hidden_layers + 1  # b·t rows of the loss; embedding + 2 per layer
lesson.expect("up to the LM head the prefill issues a training forward's collectives, 2·n_layer + 1 all-reduces "
              "of [b, t, h]; after it the loss's 3 all-reduces of [b·t] become the argmax's 2 of [b]")
lesson.equal("up to the LM head: (count, prefill == training forward, op by op)",
             (len(calls["prefill"]) - 2, calls["prefill"][:-2] == calls["training forward"][:-3]), (body, True))
lesson.equal("after the LM head: training's (op, reduce op, shape), then the prefill's",
             (calls["training forward"][body:], calls["prefill"][body:]),
             ([("all_reduce", "max", (bt,)), ("all_reduce", "sum", (bt,)), ("all_reduce", "sum", (bt,))],
              [("all_reduce", "max", (prompt.shape[0],)), ("all_reduce", "min", (prompt.shape[0],))]))
lesson.expect("a decode step: 2·n_layer + 1 all-reduces of [b, 1, h] and the argmax's 2 of [b], every step")
lesson.equal("every decode step's collectives == the prediction",
             all(collective_counts(step_events(events, k)) == predicted_decode(2, 2, 32, "float64")
                 for k in range(1, NEW)), True)

# %% [markdown]
# ## Latency vs bandwidth
#
# The α-β model (lesson 11) prices a collective as `steps · α + wire_bytes · β`, with an *assumed* α: 3 µs
# per ring step on the NVLink preset (`tpsim.links`; NCCL's small-message latencies are of that
# order, not a datasheet value). A decode step's messages are a few hundred bytes here and a few KiB in a real
# model, so in this model the β term is nothing and the `2(p − 1)` ring steps of α per all-reduce are
# everything: **a decode step's collectives are all α**. A prefill of a long prompt moves `s` times more
# bytes through the same number of collectives, and there bandwidth takes over. Below,
# this run's trace, then a Llama-2-7B-sized model (h 4096, 32 layers, bfloat16, one sequence) at TP 8 on
# NVLink, priced from the formula alone. The ring's `2(p − 1)` steps overstate α for small messages (NCCL
# switches to tree and low-latency protocols there), so read the absolute microseconds as an upper bound;
# the split between α and β is the point.

# %%
lesson.section("Latency vs bandwidth")
lesson.say(latency_table(decode, RANKS), "")


def per_token(tokens_in_flight: int, h=4096, layers=32, itemsize=2, p=8, link=NVLINK4_H100):
    """(α part, β part) of one forward's collectives: 2·layers + 1 all-reduces of [1, t, h] + the argmax's 2."""
    big, small = tokens_in_flight * h * itemsize, 8
    alpha = (2 * layers + 3) * ring_steps("all_reduce", p) * link.alpha
    beta = ((2 * layers + 1) * wire_bytes("all_reduce", big, p) + 2 * wire_bytes("all_reduce", small, p)) * link.beta
    return alpha, beta


rows = [["7B-sized, TP 8, NVLink", "α part", "β part", "latency share"]]
for label, t in (("decode (1 token)", 1), ("prefill (2048 tokens)", 2048)):
    a, b = per_token(t)
    rows.append([label, f"{a * 1e6:.0f} µs", f"{b * 1e6:.1f} µs", f"{a / (a + b):.1%}"])
lesson.say(table(rows), "")
a1, b1 = per_token(1)
a2, b2 = per_token(2048)
lesson.expect("in the α-β model (α assumed): a decode step's collectives are > 99 % α; a long prefill's are "
              "mostly bandwidth")
lesson.check("decode's collectives: α share > 99 %; a 2048-token prefill's: β part > α part",
             f"{a1 / (a1 + b1):.1%} vs {a2 / (a2 + b2):.1%}", a1 / (a1 + b1) > 0.99 and b2 > a2)

# %% [markdown]
# This is why inference servers fight for every microsecond of collective latency (NVLink inside a node,
# fused all-reduce kernels, fewer collectives per layer), and why TP for decoding stops paying off sooner
# than for training. A small-batch decode step is bound by memory bandwidth (Pope et al. 2022): each token
# reads every weight, and the KV cache, from HBM. TP divides the weight bytes each GPU reads per token by
# about t — exactly t for every split matrix; the replicated RMSNorm weights, the KV-head copies and the
# vocabulary's padding rows are the rest — but not the α of the step's `2 · n_layer + 3` all-reduces. The KV
# cache, not the weights, is what grows with the batch and the context — and what GQA and TP are there to
# shrink. Below, the Llama's weights on this rank against the folder's whole tensors.

# %%
whole = {name: tensor.size for name, tensor in loaded["llama"][1].items()}
here = {name: w.size for name, w in models["llama"].named_parameters()}
split = [n for n in here if n.endswith(("q_proj.weight", "o_proj.weight", "gate_proj.weight", "up_proj.weight",
                                        "down_proj.weight"))]
copied = [n for n in here if n.endswith(("k_proj.weight", "v_proj.weight"))]
share = sum(here.values()) / sum(whole.values())
lesson.say(f"llama weights on this rank: {sum(here.values())} of {sum(whole.values())} numbers ({share:.1%})")
lesson.expect("each split matrix is exactly 1/tp on a rank; a copied KV head's k/v are 1/kv_heads; the whole "
              "rank a little over 1/tp")
lesson.equal("split matrices (q, o, gate, up, down: 5 per layer): numbers here × tp == whole",
             (len(split), all(here[n] * RANKS == whole[n] for n in split)), (5 * llama_config.num_hidden_layers, True))
lesson.equal("k_proj, v_proj: numbers here × kv_heads == whole (one KV head of 2 per rank)",
             all(here[n] * llama_config.num_key_value_heads == whole[n] for n in copied) and len(copied) > 0, True)
lesson.check("this rank's share of the weights", f"{share:.1%} (1/tp = {1 / RANKS:.0%})",
             1 / RANKS < share < 1.25 / RANKS)

# %% [markdown]
# ## What to take away
#
# * Decoding = one prefill over the prompt, then one forward per token; a KV cache keeps every earlier
#   position's keys and values so a step computes one position.
# * Under TP each rank caches only its own (KV) heads: `2 · n_layer · b · T · kv_heads_local · hd · itemsize`
#   bytes; a KV head replicated on tp / kv_heads ranks is cached on each of them.
# * The argmax of vocab-parallel logits takes two all-reduces of `[b]` (max, then the first id that reaches
#   it): the `[b, V]` logits never travel.
# * A decode step issues `2 · n_layer + 3` small collectives — a training forward's up to the LM head, then the
#   argmax's two where the loss had three: in the α-β model their cost is α, not bandwidth. TP divides the
#   weight bytes each GPU reads per token by t, but not that α.
# * At real size the KV cache is gigabytes: Llama-3-70B, one 8k-token sequence in bf16, 2.68 GB, 0.34 GB per
#   GPU at TP 8, 8× more without GQA.
# * `mpirun -n N python -m tpsim.generate --init-from DIR --prompt 1,2,3` does all of this on any folder.
#
# Exercise: `vocab_parallel_argmax` in `ex13_inference.py`: `tpsim lesson start 13` copies it into your work folder
# (`tpsim-work/`), then `tpsim check 13`.

# %%
grid.world.comm.Barrier()  # every rank has read the folders: rank 0 removes them
if grid.rank == 0:
    for folder in folders.values():
        shutil.rmtree(folder)
lesson.takeaways()
lesson.finish()
