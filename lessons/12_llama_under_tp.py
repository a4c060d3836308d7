# %% [markdown]
# # Lesson 12 — Today's transformer under TP: GQA, SwiGLU and RoPE
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/12_llama_under_tp.py` (or `tpsim lesson run 12`;
# as a notebook on as many engines: `tpsim lesson notebook 12`).
#
# The models people split today are Llama-shaped (Touvron et al. 2023), not GPT-2-shaped. A Llama block is
#
#     x ──RMSNorm──[q, k, v: RoPE; grouped-query attention]──o_proj──(+ x)──RMSNorm──[down(silu(gate)·up)]──(+ x)──▶
#
# and three of its parts meet tensor parallelism in their own way:
#
# * **Grouped-query attention** (Ainslie et al. 2023): `heads` query heads share fewer `kv_heads` key/value
#   heads. Query heads split over TP as in lesson 05, but with 4 ranks and 2 KV heads some ranks must hold
#   the *same* KV head — and then its gradient is split over them.
# * **SwiGLU** (Shazeer 2020): `silu(gate) · up` pairs gate and up column by column, which brings back
#   lesson 05's layout trap when the two are fused into one weight.
# * **RoPE** (Su et al. 2021) rotates q and k by position: it needs no communication at all.
#
# The fourth new part is not new to TP. **RMSNorm** (Zhang & Sennrich 2019) is LayerNorm without the mean and
# without the bias: `y = x / √(mean(x²) + ε) · w` over the h features of each position, with one weight
# vector `w: [h]`. Like LayerNorm it is replicated: under plain TP every rank normalises the whole `[b, s, h]`
# itself, and under sequence parallelism its weight gradient is a partial sum that is all-reduced ("A whole
# Llama step" below shows the trace).
#
# Sources: Touvron et al. 2023, "Llama 2", arXiv:2307.09288; Touvron et al. 2023a, "LLaMA", arXiv:2302.13971,
# §2.2 (the SwiGLU width 2/3 · 4h); Ainslie et al. 2023, "GQA", arXiv:2305.13245;
# Shazeer 2020, "GLU Variants Improve Transformer", arXiv:2002.05202; Su et al. 2021, "RoFormer",
# arXiv:2104.09864; Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", arXiv:1910.07467;
# Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3 (splitting attention by heads, the MLP by
# columns); the SenseParrots article, eqs. (1)(2) (the column and row splits).

# %%
RANKS = 4

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.models.llama import parallel_llama, serial_llama
from tpsim.arch.llama import LlamaConfig
from tpsim.errors import ConfigError
from tpsim.nn.gqa_attention import GQAttention
from tpsim.nn.mlp import MLP
from tpsim.nn.rope import rope_cos_sin, rope_forward
from tpsim.nn.swiglu import SwiGLU
from tpsim.teach.runtime import Lesson, shard_error
from tpsim.tp.column_parallel import ColumnParallelLinear
from tpsim.tp.gqa_attention import ParallelGQAttention, kv_group, kv_head_layout
from tpsim.tp.multi_output_column_parallel import MultiOutputColumnParallelLinear
from tpsim.tp.swiglu import ParallelSwiGLU, gate_up_columns

lesson = Lesson("12", RANKS)
grid = ProcessGrid(tp=RANKS)
group, tracer = grid.tp_group, grid.tracer
p, me = group.size, group.rank

rng = np.random.default_rng(12)  # the same master weights and data on every rank
b, s, h, heads, kv_heads = 2, 6, 32, 8, 2  # head_dim 4; 4 query heads per KV head
attn = GQAttention(h, heads, kv_heads, rope_theta=100.0, rng=rng, std=0.3)
x = rng.standard_normal((b, s, h))
dy = rng.standard_normal((b, s, h))

# %% [markdown]
# ## RoPE: a rotation per head and position
#
# RoPE turns each pair of features of a head by an angle `position · θ^(−2i/d)`; Hugging Face pairs feature
# i with feature i + d/2 (`rotate_half`). A rotation keeps lengths, and the score `q·k` of a query at
# position m and a key at position n depends only on `m − n`. It touches one head at one position at a time,
# so a rank holding whole heads — and, under sequence parallelism, the whole sequence again after f̄ —
# rotates its own q and k with **no collective**: below, a rank's heads rotated alone equal the serial
# model's rotated heads, and the tracer saw nothing.

# %%
lesson.section("RoPE: a rotation per head and position")
cos, sin = rope_cos_sin(np.arange(16), 4, theta=100.0)
q1, k1 = rng.standard_normal(4), rng.standard_normal(4)
score = lambda m, n: rope_forward(q1, cos[m], sin[m])[0] @ rope_forward(k1, cos[n], sin[n])[0]  # noqa: E731
lesson.expect("the score of a rotated query and key depends on their distance only, not where they sit")
lesson.close("q·k at positions (9, 4) = at (15, 10): relative positions", score(9, 4), score(15, 10))
q_all = rng.standard_normal((b, heads, s, 4))
mine = slice(me * heads // p, (me + 1) * heads // p)
tracer.reset()
local = rope_forward(q_all[:, mine], *rope_cos_sin(np.arange(s), 4, 100.0))[0]
lesson.expect("each rank rotates its own heads: the serial values, and not one collective")
lesson.close("a rank's heads rotated alone = the serial rotation of those heads", local,
             rope_forward(q_all, *rope_cos_sin(np.arange(s), 4, 100.0))[0][:, mine])
lesson.equal("collectives issued by RoPE", len(tracer.events), 0)

# %% [markdown]
# ## KV heads: split or replicated
#
# Rank r holds query heads `r·heads/tp … (r+1)·heads/tp − 1`, and query head j reads KV head
# `j // (heads / kv_heads)`. When `kv_heads` is a multiple of tp each rank gets `kv_heads / tp` KV heads of
# its own. When tp is a multiple of `kv_heads` a KV head is read by the query heads of `tp / kv_heads`
# neighbouring ranks: each of them holds a **copy** of its k and v columns (vLLM and SGLang do the same;
# Megatron-LM instead requires `num_query_groups % tp == 0`, so it never copies a KV head). Any other layout
# gives the ranks overlapping, uneven sets of *whole* KV heads — heads 12, kv_heads 6, tp 4: rank 0's query
# heads read KV heads {0, 1}, rank 1's {1, 2}, rank 2's {3, 4}, rank 3's {4, 5} — which neither a split nor a
# uniform copy covers; tpsim refuses it with a one-line error. Here: 8 query heads, 2 KV heads, 4 ranks.

# %%
lesson.section("KV heads: split or replicated")
for kv in (8, 4, 2, 1):
    layout = [kv_head_layout(heads, kv, p, r)[0].tolist() for r in range(p)]
    lesson.say(f"  kv_heads {kv}: rank -> KV heads {dict(enumerate(layout))}"
               + (f"  (each on {p // kv} ranks)" if kv < p else ""))
odd_heads, odd_kv, odd_tp = 12, 6, 4  # neither of kv_heads and tp divides the other
per = odd_heads // odd_tp  # query heads per rank
odd = {r: sorted({j // (odd_heads // odd_kv) for j in range(r * per, (r + 1) * per)}) for r in range(odd_tp)}
lesson.say(f"  heads 12, kv_heads 6, tp 4: rank -> KV heads its query heads read {odd}")
try:
    kv_head_layout(odd_heads, odd_kv, odd_tp, 0)
    refusal = None
except ConfigError as err:
    refusal = str(err)
lesson.expect("heads 12, kv_heads 6 at tp 4: overlapping sets of whole KV heads, which tpsim refuses in one line")
lesson.equal("the KV heads each rank's query heads read", odd, {0: [0, 1], 1: [1, 2], 2: [3, 4], 3: [4, 5]})
lesson.check("kv_head_layout(12, 6, 4, rank 0) raises ConfigError", (refusal or "no error").split(", so")[0],
             refusal is not None and "neither divides the other" in refusal)

kv_sync = kv_group(group, heads, kv_heads)  # the ranks sharing my KV head: a traced sub-group "kv"
par = ParallelGQAttention.from_serial(attn, group, kv_sync=kv_sync).set_path("self_attn")
hd = h // heads
replicas = p // kv_heads  # ranks holding each KV head
my_kv = me // replicas
held = lesson.gather((par.kv_index.tolist(), kv_sync.ranks))  # every rank's, on rank 0
lesson.say(*(f"  rank {r}: KV heads {kv}, kv sub-group = world ranks {list(ranks)}"
             for r, (kv, ranks) in enumerate(held or [])))
lesson.expect("ranks 0, 1 hold KV head 0 and ranks 2, 3 KV head 1, each pair a kv sub-group; each copy is the "
              "serial k columns of its head")
pairs = [([r // replicas], tuple(range(r // replicas * replicas, (r // replicas + 1) * replicas))) for r in range(p)]
lesson.check("every rank's KV heads and kv sub-group (gathered): rank r holds KV head r // (tp / kv_heads)",
             f"{[kv for kv, _ in held] if held else 'judged on rank 0'}", held is None or held == pairs)
lesson.close("this rank's k_proj shard = the serial k_proj columns of its head", par.k_proj.params["weight"],
             attn.k_proj.params["weight"][:, my_kv * hd:(my_kv + 1) * hd])
y_ref, c_ref = attn.forward(x)
attn.zero_grad()
attn.backward(dy, c_ref)
tracer.reset()
y, cache = par.forward(x)
lesson.expect("with whole query heads and their KV head, every rank's output is the serial output")
lesson.close("parallel GQA output = serial", y, y_ref)

# %% [markdown]
# ## The gradient of a replicated KV head
#
# Each rank's k and v depend on its copy of the KV head's weights, and only *its own* query heads read them.
# So `dW_k` on rank 0 is the part of the serial gradient that comes from query heads 0 and 1; rank 1 holds
# the part from heads 2 and 3. The serial gradient is their **sum**, so the ranks sharing a KV head
# all-reduce `(dW_k, dW_v)` among themselves — a sub-group of the TP group, not the whole of it — once per
# layer in the backward. Afterwards both copies hold the same gradient, the optimizer keeps them equal, and
# a gradient norm counts the head once (tpsim numbers the copies in `Partition.replica`).

# %%
lesson.section("The gradient of a replicated KV head")
par.zero_grad()
with tracer.paused():  # the same backward without the kv all-reduce, to see the partial sum
    saved, par.qkv.replica_group = par.qkv.replica_group, None  # q/k/v's layer sums the replicas' dW_k, dW_v
    par.backward(dy, cache)
    partial = par.k_proj.grads["weight"].copy()
    par.qkv.replica_group = saved
serial_dwk = attn.k_proj.grads["weight"][:, my_kv * hd:(my_kv + 1) * hd]
lesson.expect("alone, a rank's dW_k is only part of the serial gradient; summed over the two sharing ranks, all")
lesson.apart("one rank's own dW_k differs from the serial dW_k of its head", partial, serial_dwk, 1e-3)
with tracer.paused():
    summed = kv_sync.all_reduce(partial)
lesson.close("the sum over the ranks sharing the head = the serial dW_k", summed, serial_dwk)
par.zero_grad()
tracer.reset()
dx = par.backward(dy, cache)
kv_events = [e for e in tracer.events if e.group == "kv"]
lesson.expect("the backward issues one all-reduce in the kv sub-group, (dW_k, dW_v) = [2, h, head_dim] of "
              "float64, after which dW_k and dx equal serial")
lesson.equal("kv collectives in one backward: (op, group size, shape)",
             [(e.op, e.group_size, e.shape) for e in kv_events], [("all_reduce", 2, (2, h, hd))])
lesson.check("its bytes: 2·h·head_dim float64 values", f"{kv_events[0].bytes} B", kv_events[0].bytes == 2 * h * hd * 8)
lesson.close("and then every gradient equals serial: dW_k", par.k_proj.grads["weight"], serial_dwk)
lesson.close("dx (after f's all-reduce over the whole TP group)", dx, attn.backward(dy, c_ref))

# %% [markdown]
# ## The gate/up layout trap
#
# SwiGLU multiplies `silu(x·W_gate)` by `x·W_up` column by column. Split both by the same columns and each
# rank computes its slice of the product alone (lesson 04's argument, with a gate). Checkpoints and fused
# kernels often store one weight `[h, 2·ffn] = [gate | up]`. Cut **that** into 4 contiguous blocks and ranks 0
# and 1 get only gate columns (each multiplies gate columns by gate columns), ranks 2 and 3 only up columns —
# every shape right, no error raised. Each rank must take its columns of gate *and the same columns of up*
# (`gate_up_columns`), as each had to take its q, k and v columns in lesson 05.
#
# Why Llama's ffn is about 8h/3 and not GPT's 4h: a SwiGLU has three `h × ffn` matrices (gate, up, down) where
# the GeLU MLP has two `h × 4h`, so `3·h·ffn = 2·h·4h` gives `ffn = 8h/3` — the parameters and the matmul
# FLOPs of a 4h MLP (Shazeer 2020, §2, shrinks d_ff by 2/3 for this reason; LLaMA, Touvron et al. 2023a, §2.2,
# takes 2/3 · 4h, which Meta's code rounds up to a multiple of 256: 11 008 at h = 4096, Llama-2-7B's size).
# This lesson's ffn of 16 is just small.

# %%
lesson.section("The gate/up layout trap")
ffn = 16
mlp = SwiGLU(h, ffn, rng=rng, std=0.3)
z_ref = mlp.forward(x)[0]
fused = np.concatenate([mlp.gate_proj.params["weight"], mlp.up_proj.params["weight"]], axis=1)  # [h, 2·ffn]


def from_fused(columns):
    """A ParallelSwiGLU whose gate and up shards are the given columns of the fused weight (halves)."""
    half = len(columns) // 2
    gate, up = (ColumnParallelLinear(h, 2 * ffn, group, gather_output=False, bias=False, weight=fused, columns=c)
                for c in (columns[:half], columns[half:]))
    gate.columns = up.columns = np.arange(me * ffn // p, (me + 1) * ffn // p)  # what a loader would claim
    gate_up = MultiOutputColumnParallelLinear({"gate_proj": gate, "up_proj": up})
    return ParallelSwiGLU(gate_up, ParallelSwiGLU.from_serial(mlp, group).down_proj)


contiguous = np.arange(me * 2 * ffn // p, (me + 1) * 2 * ffn // p)
blocks = lesson.gather(contiguous.tolist())
lesson.say(*(f"  rank {r}: contiguous block = fused columns {c[0]}..{c[-1]} "
             f"({'gate' if c[-1] < ffn else 'up' if c[0] >= ffn else 'gate and up'} only)"
             for r, c in enumerate(blocks or [])),
           f"  rank {me}: the right columns = {gate_up_columns(ffn, p, me).tolist()} (gate j and up j side by side)")
lesson.expect("a contiguous cut gives ranks 0, 1 only gate columns and ranks 2, 3 only up columns: it runs and "
              "is wrong; matching gate and up columns equal serial")
lesson.check("contiguous blocks of the fused [gate | up]: ranks 0, 1 inside gate (< ffn), ranks 2, 3 inside up",
             f"{[(c[0], c[-1]) for c in blocks] if blocks else 'judged on rank 0'}",
             blocks is None or all((max(c) < ffn) == (r < p // 2) and (min(c) >= ffn) == (r >= p // 2)
                                   for r, c in enumerate(blocks)))
lesson.apart("contiguous split of the fused weight vs serial", from_fused(contiguous).forward(x)[0], z_ref, 1e-3)
lesson.close("gate_up_columns split vs serial", from_fused(gate_up_columns(ffn, p, me)).forward(x)[0], z_ref)
matrices = lambda m: sum(w.size for name, w in m.named_parameters() if name.endswith("weight"))  # noqa: E731
lesson.expect("ffn = 8h/3: a SwiGLU's three matrices hold as many numbers as a 4h GeLU MLP's two; Llama's "
              "rounding gives 11 008 at h = 4096")
lesson.equal("matrix parameters of SwiGLU(h 48, ffn 128 = 8·48/3) vs a GeLU MLP(h 48, 4h)",
             matrices(SwiGLU(48, 128)), matrices(MLP(48)))
lesson.equal("2/3 · 4h at h = 4096, rounded up to a multiple of 256", 256 * -(-(2 * 4 * 4096 // 3) // 256), 11008)

# %% [markdown]
# ## A whole Llama step equals serial
#
# `parallel_llama` puts it together with Hugging Face's module names: vocab-parallel `embed_tokens`, RMSNorm
# replicated, GQA with the KV heads split or replicated, SwiGLU with matching gate/up columns, an untied
# column-parallel `lm_head` feeding the vocab-parallel cross-entropy of lesson 06. Loss and every gradient
# equal the serial model's, with and without sequence parallelism. Under SP each rank normalises only its
# `s/p` positions, so each RMSNorm's weight gradient `dw = Σ_positions dy · x̂` is a partial sum, all-reduced
# over the TP group like lesson 10's LayerNorm: one `[h]` message per RMSNorm (two per layer and `model.norm`),
# traced in phase `sp_grad_sync` under the norm's own name. Plain TP needs none: every rank saw every position.

# %%
lesson.section("A whole Llama step equals serial")
cfg = LlamaConfig(vocab_size=29, hidden_size=h, intermediate_size=ffn, num_hidden_layers=2, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, max_position_embeddings=8, initializer_range=0.3)
serial = serial_llama(cfg, seed=12)
ids, labels = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, b, 8))
loss_ref = serial.loss_and_grads(ids, labels)
ref = dict(serial.named_grads())
norms = [f"model.layers.{i}.{n}" for i in range(cfg.num_hidden_layers)
         for n in ("input_layernorm", "post_attention_layernorm")] + ["model.norm"]
step_events = {}
for sp in (False, True):
    model = parallel_llama(serial_llama(cfg, seed=12), group, sequence_parallel=sp)
    tracer.reset()
    loss = model.loss_and_grads(ids, labels)
    name = "TP + SP" if sp else "TP"
    step_events[name] = list(tracer.events)
    norm_sync = [(e.scope, e.op, e.shape) for e in step_events[name] if e.phase == "sp_grad_sync"]
    lesson.say(f"  {name}: RMSNorm gradient all-reduces (phase sp_grad_sync): "
               + (", ".join(f"{scope} {list(shape)}" for scope, _, shape in norm_sync) or "none"))
    lesson.expect(f"{name}: the same loss and the serial gradients' slices on every rank; "
                  + ("one [h] all-reduce per RMSNorm" if sp else "no RMSNorm all-reduce"))
    lesson.close(f"{name}: loss vs serial ({loss_ref:.6f})", loss, loss_ref)
    lesson.check(f"{name}: every gradient shard vs serial", "max relative difference ≤ 1e-10",
                 shard_error(model, ref) <= 1e-10)
    lesson.equal(f"{name}: the sp_grad_sync all-reduces, sorted (scope, op, shape)", sorted(norm_sync),
                 sorted((n, "all_reduce", (h,)) for n in norms) if sp else [])

# %% [markdown]
# ## What a replicated KV head costs
#
# A copy is not free. Memory: a KV head's k and v weights, `2 · h · head_dim` per layer, live on
# `tp / kv_heads` ranks, so the model stores them `tp / kv_heads` times — with their gradients and optimizer
# state — where a split stores each once. Communication: each layer's backward adds the kv all-reduce of
# `2 · h · head_dim` numbers to the four all-reduces of `[b, s, h]` the block issues anyway (g after o_proj
# and down_proj in the forward, f before attention and the MLP in the backward), `4 · b · s · h` numbers.
# The ratio is `head_dim / (2 · b · s)`, whatever h is: large here (b·s = 16 tokens), below 1 % for one
# sequence of 8192 tokens at Llama's head_dim of 128.

# %%
lesson.section("What a replicated KV head costs")
kv_per_rank = lesson.gather(par.k_proj.params["weight"].size + par.v_proj.params["weight"].size)  # on rank 0
serial_kv = attn.k_proj.params["weight"].size + attn.v_proj.params["weight"].size
held_kv = sum(kv_per_rank) if kv_per_rank else None  # judged on rank 0, where the numbers are
lesson.say(f"  k_proj + v_proj numbers of the GQA layer above, per rank: {kv_per_rank}; serial: {serial_kv}")
lesson.expect(f"the {p} ranks together hold tp / kv_heads = {replicas} copies of the serial k and v weights")
lesson.check("Σ over ranks of k_proj + v_proj numbers = (tp / kv_heads) × serial",
             f"{held_kv} = {replicas} × {serial_kv}", held_kv is None or held_kv == replicas * serial_kv)
tokens = ids.size  # b · s of the Llama step above
layer = [[e for e in step_events["TP"] if e.scope.startswith(f"model.layers.{i}.")]
         for i in range(cfg.num_hidden_layers)]
kv_numbers = [sum(int(np.prod(e.shape)) for e in calls if e.group == "kv") for calls in layer]
block_numbers = [sum(int(np.prod(e.shape)) for e in calls if e.group == "tp") for calls in layer]
lesson.say(f"  per layer of the TP step: kv all-reduce {kv_numbers} numbers, the block's TP all-reduces "
           f"{block_numbers}")
lesson.expect("per layer: 2·h·head_dim numbers in the kv sub-group beside 4·b·s·h in the TP group, "
              "a ratio head_dim / (2·b·s)")
lesson.equal("per layer: (kv numbers, TP numbers) = (2·h·head_dim, 4·b·s·h)",
             list(zip(kv_numbers, block_numbers)), [(2 * h * hd, 4 * tokens * h)] * cfg.num_hidden_layers)
lesson.check("head_dim / (2·b·s) here, and at head_dim 128 with one 8192-token sequence",
             f"{hd / (2 * tokens):.1%}, {128 / (2 * 8192):.2%}",
             kv_numbers[0] / block_numbers[0] == hd / (2 * tokens) and 128 / (2 * 8192) < 0.01)

# %% [markdown]
# ## What to take away
#
# * Query heads split over TP as in GPT; KV heads split when `kv_heads % tp == 0`, and are replicated on
#   `tp / kv_heads` neighbouring ranks when tp is a multiple of kv_heads (vLLM's and SGLang's rule; Megatron-LM
#   requires `kv_heads % tp == 0`). Any other layout is refused.
# * A replicated KV head's weight gradient is a partial sum on each copy: the ranks sharing it all-reduce
#   `(dW_k, dW_v)` in a sub-group, once per layer, and a gradient norm counts the head once. The copies cost
#   `tp / kv_heads` times the k/v weights, and `2·h·head_dim` numbers per layer beside the block's `4·b·s·h`.
# * `silu(gate) · up` pairs columns: gate and up must be split by the same columns. A contiguous split of a
#   fused `[gate | up]` weight runs silently and is wrong, like lesson 05's qkv.
# * RoPE rotates each head at each position: no communication. RMSNorm is replicated like LayerNorm; under SP
#   its `[h]` weight gradient is all-reduced (phase `sp_grad_sync`).
# * Llama's ffn ≈ 8h/3 gives its three SwiGLU matrices the parameters of a two-matrix 4h MLP.
#
# Exercise: the KV-head-to-rank map and who sums whose gradient, in `ex12_kv_heads.py`: `tpsim lesson start 12`
# copies it into your work folder (`tpsim-work/`), then `tpsim check 12`.

# %%
lesson.takeaways()
lesson.finish()
