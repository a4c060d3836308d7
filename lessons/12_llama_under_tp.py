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
# Sources: Touvron et al. 2023, "Llama 2", arXiv:2307.09288; Ainslie et al. 2023, "GQA", arXiv:2305.13245;
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
from tpsim.nn.gqa_attention import GQAttention
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
# neighbouring ranks: each of them holds a **copy** of its k and v columns (vLLM and Megatron-LM do the
# same). Anything else would need part of a KV head on some rank, and tpsim refuses it with a one-line error.
# Here: 8 query heads, 2 KV heads, 4 ranks.

# %%
lesson.section("KV heads: split or replicated")
for kv in (8, 4, 2, 1):
    layout = [kv_head_layout(heads, kv, p, r)[0].tolist() for r in range(p)]
    lesson.say(f"  kv_heads {kv}: rank -> KV heads {dict(enumerate(layout))}"
               + (f"  (each on {p // kv} ranks)" if kv < p else ""))
kv_sync = kv_group(group, heads, kv_heads)  # the ranks sharing my KV head: a traced sub-group "kv"
par = ParallelGQAttention.from_serial(attn, group, kv_sync=kv_sync).set_path("self_attn")
hd = h // heads
my_kv = me // (p // kv_heads)
lesson.expect("ranks 0, 1 hold KV head 0 and ranks 2, 3 KV head 1: the same k columns on two ranks")
lesson.equal("this rank's KV heads", par.kv_index.tolist(), [my_kv])
lesson.close("its k_proj shard = the serial k_proj columns of that head", par.k_proj.params["weight"],
             attn.k_proj.params["weight"][:, my_kv * hd:(my_kv + 1) * hd])
lesson.equal("the kv sub-group of this rank: world ranks", kv_sync.ranks, tuple(range(my_kv * 2, my_kv * 2 + 2)))
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
lesson.expect("the backward issues one all-reduce in the kv sub-group: (dW_k, dW_v) = [2, h, head_dim]")
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
# kernels often store one weight `[h, 2·ffn] = [gate | up]`. Cut **that** into 4 contiguous blocks and rank 0
# gets the first half of gate twice over — gate columns multiplied by gate columns, every shape right,
# no error raised. Each rank must take its columns of gate *and the same columns of up*
# (`gate_up_columns`), as each had to take its q, k and v columns in lesson 05.

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
lesson.say(f"  rank {me}: contiguous block = fused columns {contiguous[0]}..{contiguous[-1]}; "
           f"right = {gate_up_columns(ffn, p, me).tolist()}")
lesson.expect("a contiguous cut of [gate | up] runs and is wrong; matching gate and up columns equal serial")
lesson.apart("contiguous split of the fused weight vs serial", from_fused(contiguous).forward(x)[0], z_ref, 1e-3)
lesson.close("gate_up_columns split vs serial", from_fused(gate_up_columns(ffn, p, me)).forward(x)[0], z_ref)

# %% [markdown]
# ## A whole Llama step equals serial
#
# `parallel_llama` puts it together with Hugging Face's module names: vocab-parallel `embed_tokens`, RMSNorm
# replicated, GQA with the KV heads split or replicated, SwiGLU with matching gate/up columns, an untied
# column-parallel `lm_head` feeding the vocab-parallel cross-entropy of lesson 06. Loss and every gradient
# equal the serial model's, with and without sequence parallelism (then the RMSNorm weight gradients are
# all-reduced, like lesson 10's LayerNorm).

# %%
lesson.section("A whole Llama step equals serial")
cfg = LlamaConfig(vocab_size=29, hidden_size=h, intermediate_size=ffn, num_hidden_layers=2, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, max_position_embeddings=8, initializer_range=0.3)
serial = serial_llama(cfg, seed=12)
ids, labels = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, b, 8))
loss_ref = serial.loss_and_grads(ids, labels)
ref = dict(serial.named_grads())
for sp in (False, True):
    model = parallel_llama(serial_llama(cfg, seed=12), group, sequence_parallel=sp)
    loss = model.loss_and_grads(ids, labels)
    name = "TP + SP" if sp else "TP"
    lesson.expect(f"{name}: the same loss and the serial gradients' slices on every rank")
    lesson.close(f"{name}: loss vs serial ({loss_ref:.6f})", loss, loss_ref)
    lesson.check(f"{name}: every gradient shard vs serial", "max relative difference ≤ 1e-10",
                 shard_error(model, ref) <= 1e-10)

# %% [markdown]
# ## What to take away
#
# * Query heads split over TP as in GPT; KV heads split when `kv_heads % tp == 0`, and are replicated on
#   `tp / kv_heads` neighbouring ranks when tp is larger.
# * A replicated KV head's weight gradient is a partial sum on each copy: the ranks sharing it all-reduce
#   `(dW_k, dW_v)` in a sub-group, once per layer, and a gradient norm counts the head once.
# * `silu(gate) · up` pairs columns: gate and up must be split by the same columns. A contiguous split of a
#   fused `[gate | up]` weight runs silently and is wrong, like lesson 05's qkv.
# * RoPE rotates each head at each position: no communication.
#
# Exercise: the KV-head-to-rank map and who sums whose gradient, in `lessons/exercises/ex12_kv_heads.py`,
# then `tpsim check 12`.

# %%
lesson.takeaways()
lesson.finish()
