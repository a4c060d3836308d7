# %% [markdown]
# # Lesson 05 — Parallel self-attention: split by heads, and the qkv layout trap
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/05_parallel_attention.py` (or `tpsim lesson run 05`;
# as a notebook on as many engines: `tpsim lesson notebook 05`).
#
# GPT-2's attention is two linears around a core:
#
#     x [b, s, h] --c_attn--> qkv [b, s, 3h] = q | k | v --attention per head--> ctx [b, s, h] --c_proj--> y
#
# From `q·kᵀ` to `probs·v`, every head works alone. So, as Megatron-LM does (Shoeybi et al. 2019, Fig. 3b), give
# each rank whole heads: `c_attn` becomes column-parallel (each rank computes the q, k and v of its heads),
# the core runs locally, and `c_proj` becomes row-parallel (the context of its heads is a slice of `c_proj`'s
# input). It is the MLP's pattern again — one all-reduce forward, one backward — with one trap in it.
#
# Sources: Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3 and Fig. 3b; the SenseParrots article,
# §2.1.1 (its attention code, whose reshape shows the fused qkv layout Megatron uses); GPT-2's layout as
# Hugging Face `transformers` stores it.

# %%
RANKS = 4

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.nn import CausalSelfAttention, qkv_attention_forward
from tpsim.teach.runtime import Lesson, shard_error, table
from tpsim.tp import ColumnParallelLinear, ParallelSelfAttention, RowParallelLinear, head_columns

lesson = Lesson("05", RANKS)
grid = ProcessGrid(tp=RANKS)
group, tracer = grid.tp_group, grid.tracer

rng = np.random.default_rng(5)  # the same master weights and data on every rank
batch, seq, hidden, heads = 2, 6, 32, 8  # 8 heads of 4 dims; 2 heads per rank
serial = CausalSelfAttention(hidden, heads, rng=rng, std=0.3).set_path("attn")
for layer in (serial.c_attn, serial.c_proj):
    layer.params["bias"][...] = 0.1 * rng.standard_normal(layer.params["bias"].shape)
x = rng.standard_normal((batch, seq, hidden))
dy = rng.standard_normal((batch, seq, hidden))
y_ref, serial_cache = serial.forward(x)
dx_ref = serial.backward(dy, serial_cache)

# %% [markdown]
# ## The layout trap
#
# `c_attn.weight` is `[h, 3h]` and its 3h columns are laid out `q | k | v`; inside each, head j owns
# columns `j·hd … (j+1)·hd − 1` (hd = h / heads = 4 here). The default column split of lesson 03 hands rank r
# the contiguous block `[r·3h/p, (r+1)·3h/p)` — which holds no whole head at all. With h = 32 and 4 ranks,
# rank 0 gets 24 *q* columns, rank 1 gets the last 8 q columns and 16 k columns, and so on. Each rank must
# instead hold the q, k **and** v columns of its own heads: `head_columns(h, heads, p, r)`.

# %%
def describe(columns: np.ndarray) -> str:
    """Master columns as q/k/v ranges, e.g. 'q 0–7 | k 0–7 | v 0–7'."""
    parts = []
    for name, offset in (("q", 0), ("k", hidden), ("v", 2 * hidden)):
        inside = columns[(columns >= offset) & (columns < offset + hidden)] - offset
        if inside.size:
            parts.append(f"{name} {inside.min()}–{inside.max()}")
    return " | ".join(parts)


lesson.section("The layout trap")
naive = [np.arange(3 * hidden).reshape(RANKS, -1)[r] for r in range(RANKS)]  # the default contiguous split
right = [head_columns(hidden, heads, RANKS, r) for r in range(RANKS)]  # pure arithmetic: any rank can print all
rows = [["rank", "heads", "contiguous split of the 3h columns", "head_columns"]]
rows += [[str(r), f"{2 * r}, {2 * r + 1}", describe(naive[r]), describe(right[r])] for r in range(RANKS)]
lesson.say("c_attn columns held by each rank (q, k, v index ranges inside [0, h)):", table(rows, right=()), "")
lesson.expect("rank 1's contiguous block straddles the q/k border; head_columns gives it three strided blocks")
lesson.equal("rank 1's contiguous block mixes q and k", describe(naive[1]), "q 24–31 | k 0–15")
lesson.equal("head_columns gives rank 1 the q, k and v of heads 2 and 3", describe(right[1]),
             "q 8–15 | k 8–15 | v 8–15")

# %% [markdown]
# ## Falling into it
#
# Build the column-parallel `c_attn` with the default split and run the per-head core on what comes out:
# rank 0 reads its 24 columns as "q, k, v of 2 heads" — in truth they are all q. Nothing crashes; the numbers
# are simply wrong.

# %%
lesson.section("Falling into it")
c_attn_naive = ColumnParallelLinear.from_serial(serial.c_attn, group, gather_output=False)
c_proj = RowParallelLinear.from_serial(serial.c_proj, group, input_is_parallel=True)
with tracer.paused():
    qkv, _ = c_attn_naive.forward(x)
    ctx, _ = qkv_attention_forward(qkv, heads // RANKS)
    y_naive, _ = c_proj.forward(ctx)
lesson.expect("no error, and a large difference from the serial output: q columns were read as k and v")
lesson.apart("contiguous split: max |y − y_serial| (wrong, silently)", y_naive, y_ref, 0.01)

try:
    ParallelSelfAttention(c_attn_naive, c_proj, heads)
    refused = "accepted"
except ValueError as err:
    refused = "refused"
    lesson.say(f"ParallelSelfAttention says: {err}", "")
lesson.expect("tpsim's layer checks the columns it was given and refuses the contiguous split")
lesson.equal("ParallelSelfAttention with the contiguous split", refused, "refused")

# %% [markdown]
# ## Split by heads, done right
#
# `ParallelSelfAttention.from_serial` picks `c_attn`'s columns with `head_columns` and `c_proj`'s rows by
# the default (contiguous) split — the context columns of heads 2r and 2r+1 *are* contiguous, since
# `merge_heads` lays the heads side by side. Forward and backward against the serial layer:

# %%
lesson.section("Split by heads, done right")
attn = ParallelSelfAttention.from_serial(serial, group).set_path("attn")
tracer.reset()
y, cache = attn.forward(x)
dx = attn.backward(dy, cache)
lesson.expect("with head_columns: output, input gradient and every gradient shard equal serial, to rounding")
lesson.close("split by heads: max |y − y_serial|", y, y_ref)
lesson.close("split by heads: max |∂L/∂x − serial|", dx, dx_ref)
lesson.close("every gradient shard (c_attn columns of my heads, c_proj rows, bias) vs serial",
             shard_error(attn, dict(serial.named_grads("attn")), prefix="attn"), 0.0)
lesson.expect(f"heads / p = {heads}/{RANKS} whole heads per rank")
lesson.equal("heads on this rank", attn.heads_per_partition, heads // RANKS)

# %% [markdown]
# The trace is the MLP's: g in `c_proj` forward, f in `c_attn` backward, each a `[b, s, h]` all-reduce.
# The attention scores `[b, heads, s, s]` — the tensor that grows with the square of the sequence — never
# leave their rank.

# %%
lesson.expect("the MLP's trace: one [b, s, h] all-reduce forward (g), one backward (f); the scores stay put")
lesson.equal("collectives (scope, phase, op, shape)",
             [(e.scope, e.phase, e.op, tuple(e.shape)) for e in tracer.events],
             [("attn.c_proj", "forward", "all_reduce", (batch, seq, hidden)),
              ("attn.c_attn", "backward", "all_reduce", (batch, seq, hidden))])

# %% [markdown]
# ## Two layouts of the fused qkv: GPT-2's and Megatron's
#
# Whether the contiguous split is wrong depends on how the fused weight is laid out, and real checkpoints
# differ. GPT-2 (and Hugging Face's `c_attn`) stores `[q | k | v]`: all heads' q, then all k, then all v.
# Megatron-LM stores its fused `query_key_value` **interleaved per head**: the 3h columns read as
# `[heads, 3, hd]` — head 0's q, k, v, then head 1's, and so on. The SenseParrots article's attention code
# shows that layout in its reshape of the fused output to `[B, N, heads_per_partition, 3, head_dim]`.
#
# In Megatron's layout a rank's heads *are* contiguous, so the default contiguous column split is right and
# the reshape above recovers q, k and v. In GPT-2's layout the same split is the trap, and `head_columns`
# is the fix. So the right split depends on the layout — and that is why checkpoint converters between
# Hugging Face and Megatron permute the qkv columns (and the bias) on the way in and out: the permutation
# below, or its inverse.

# %%
lesson.section("Two layouts of the fused qkv: GPT-2's and Megatron's")
hd = hidden // heads
to_gpt2 = np.arange(3 * hidden).reshape(3, heads, hd).transpose(1, 0, 2).ravel()  # Megatron column -> GPT-2's
w_megatron = serial.c_attn.params["weight"][:, to_gpt2]  # what a converter writes: [h, heads·3·hd]
b_megatron = serial.c_attn.params["bias"][to_gpt2]
in_megatron = [to_gpt2[naive[r]] for r in range(RANKS)]  # contiguous blocks of Megatron's layout, as GPT-2 columns
rows = [["rank", "contiguous split of GPT-2's [q | k | v]", "contiguous split of Megatron's [heads, 3, hd]"]]
rows += [[str(r), describe(naive[r]), describe(in_megatron[r])] for r in range(RANKS)]
lesson.say("what each rank holds, in q/k/v index ranges inside [0, h):", table(rows, right=()), "")


def whole_heads(columns: np.ndarray, r: int) -> bool:
    """True when ``columns`` (GPT-2 indices) are the q, k and v of rank r's heads, in any order."""
    return bool(np.array_equal(np.sort(columns), np.sort(right[r])))


lesson.expect("a contiguous split holds whole heads in Megatron's layout, not in GPT-2's; head_columns fixes "
              "GPT-2's")
lesson.equal("whole heads on every rank? (contiguous on Megatron's, contiguous on GPT-2's, head_columns on GPT-2's)",
             tuple(all(whole_heads(cols[r], r) for r in range(RANKS)) for cols in (in_megatron, naive, right)),
             (True, False, True))

mine = naive[group.rank]  # the default contiguous split, now applied to Megatron's layout
qkv_r = x @ w_megatron[:, mine] + b_megatron[mine]  # [b, s, heads_per_partition·3·hd]
per_head = qkv_r.reshape(batch, seq, heads // RANKS, 3, hd)  # the article's reshape
q_k_v = per_head.transpose(0, 1, 3, 2, 4).reshape(batch, seq, -1)  # [q | k | v] of this rank's heads
with tracer.paused():
    y_megatron, _ = c_proj.forward(qkv_attention_forward(q_k_v, heads // RANKS)[0])
lesson.expect("Megatron's layout split contiguously, read back with the article's reshape: the serial output")
lesson.close("Megatron's layout, contiguous split: max |y − y_serial|", y_megatron, y_ref)

# %% [markdown]
# ## A picture of the two splits of GPT-2's layout
#
# Each strip is the 3h columns of `c_attn`, coloured by the rank holding them.

# %%
lesson.section("A picture of the two splits of GPT-2's layout")
if lesson.rank == 0:
    plt = lesson.pyplot()
    owner = np.zeros((2, 3 * hidden))
    for r in range(RANKS):
        owner[0, naive[r]], owner[1, right[r]] = r, r
    fig, ax = plt.subplots(figsize=(9, 2.2))
    ax.imshow(owner, aspect="auto", cmap="tab10", vmin=0, vmax=9, interpolation="nearest")
    ax.set_yticks([0, 1], ["contiguous", "head_columns"])
    ax.set_xticks([hidden / 2, 1.5 * hidden, 2.5 * hidden], ["q", "k", "v"])
    for edge in (hidden - 0.5, 2 * hidden - 0.5):
        ax.axvline(edge, color="white", linewidth=2)
    ax.set_title("c_attn's 3h columns by owning rank (colour = rank 0…3)")
    fig.tight_layout()
    lesson.save(fig, "05_qkv_layout.png")

# %% [markdown]
# ## The whole block in one picture
#
# Figure 3b of the Megatron-LM paper (Shoeybi et al. 2019, arXiv:1909.08053), redrawn for this run — 4 ranks,
# 8 heads — and saved as `05_attention_f_g.png`. Each lane computes the q, k and v of its own two heads (the
# columns `head_columns` picks), runs the attention core head by head, and multiplies the context by its rows
# `B_r` of `c_proj`. f and g sit exactly where they sat around the MLP in lesson 04.

# %%
lesson.section("The whole block in one picture")
if lesson.rank == 0:
    from tpsim.teach.diagrams import attention_diagram

    lesson.save(attention_diagram(RANKS, heads), "05_attention_f_g.png")

# %% [markdown]
# ## What to take away
#
# * Attention splits by whole heads: column-parallel `c_attn`, a local core, row-parallel `c_proj`.
# * A rank's `c_attn` columns are the q, k and v of its heads — three strided blocks, not one contiguous one.
#   The wrong split runs without an error; only a comparison with the serial layer catches it.
# * The right split depends on the checkpoint's layout: contiguous for Megatron's per-head `[heads, 3, hd]`,
#   `head_columns` for GPT-2's `[q | k | v]`; converters permute between the two.
# * One all-reduce forward and one backward per attention layer; scores and probabilities stay local.
#
# Exercise: `qkv_columns` in `ex05_parallel_attention.py`: `tpsim lesson start 05` copies it into your work folder
# (`tpsim-work/`), then `tpsim check 05`.

# %%
lesson.takeaways()
lesson.finish()
