# %% [markdown]
# # Lesson 10 — Sequence parallelism: f̄, ḡ and the activations plain TP keeps whole
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/10_sequence_parallelism.py` (or `tpsim lesson run 10`;
# as a notebook on as many engines: `tpsim lesson notebook 10`).
#
# Tensor parallelism splits the attention and the MLP, but not what sits between them. In a pre-LN block
#
#     x ──LayerNorm──f──[attention or MLP, split over p ranks]──g──dropout──(+ x)──▶
#
# the LayerNorm, the dropout and the residual add work on the whole `[b, s, h]` activation on *every* rank:
# the same numbers, computed p times and cached p times for the backward. Korthikanti et al. (2022),
# "Reducing Activation Recomputation in Large Transformer Models", §4.2.2, notice that all three act on
# each sequence position on its own, so they can be split along the **sequence** instead. Rank r then keeps
# positions `[r·s/p, (r+1)·s/p)` of those regions, and the operators that join them to the tensor-parallel
# regions change from (f, g) to (f̄, ḡ):
#
# | operator | Megatron name | forward | backward |
# |---|---|---|---|
# | f̄ | `gather_from_sequence_parallel_region` | all-gather along s | reduce-scatter along s |
# | ḡ | `reduce_scatter_to_sequence_parallel_region` | reduce-scatter along s | all-gather along s |
#
# This lesson runs both operators against serial math, builds an MLP block with sequence parallelism (SP)
# and checks it against serial, reads the bytes off the trace, measures the activation memory, and trains a
# whole GPT step with SP against the serial model. tpsim keeps activations batch-first, `[b, s, h]`, so the
# sequence is **axis 1** (Megatron keeps `[s, b, h]` and splits axis 0; the operators are the same).
#
# Sources: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
# arXiv:2205.05198, §4.2.2 and Table 2; Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3 (f and g).

# %%
RANKS = 4

import copy

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.models.build import parallel_gpt, serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.nn import MLP, DropoutPlan, LayerNorm, layernorm_backward
from tpsim.teach.runtime import Lesson, shard_error, table
from tpsim.tp import SP_REGION, ExactDropoutRNG, ParallelMLP, SequenceParallelLayerNorm
from tpsim.tp import GatherFromSequenceParallelRegion as f_bar
from tpsim.tp import ReduceScatterToSequenceParallelRegion as g_bar
from tpsim.tp.sequence_parallel import split_sequence
from tpsim.table import human_bytes
from tpsim.predict.gpt_memory import korthikanti_layer_bytes
from tpsim.trace.measure import measure_activations

lesson = Lesson("10", RANKS)
grid = ProcessGrid(tp=RANKS)
group, tracer = grid.tp_group, grid.tracer
p = group.size

rng = np.random.default_rng(10)  # the same master weights and data on every rank
b, s, h = 3, 8, 6  # 8 positions: 2 per rank
serial_ln = LayerNorm(h)
serial_ln.params["weight"][...] = 1 + 0.5 * rng.standard_normal(h)  # not ones and zeros, so a mistake shows
serial_ln.params["bias"][...] = rng.standard_normal(h)
serial_mlp = MLP(h, rng=rng, std=0.5)  # c_fc [6, 24], c_proj [24, 6]
for layer in (serial_mlp.c_fc, serial_mlp.c_proj):
    layer.params["bias"][...] = rng.standard_normal(layer.params["bias"].shape)
x = rng.standard_normal((b, s, h))
dy = rng.standard_normal((b, s, h))  # an upstream gradient for the block's output
mine = np.arange(s).reshape(p, -1)[group.rank]  # this rank's sequence positions

# %% [markdown]
# ## What plain TP keeps whole
#
# Run the LayerNorm the way plain TP does — on the replicated input — and look at what it caches for its
# backward (`x̂` and `1/σ`: every tpsim layer returns `(out, cache)`). Every rank holds the full `[b, s, h]`,
# and the four copies are equal: memory spent four times on one tensor. The dropout after attention and
# after the MLP is the same story, with a `[b, s, h]` mask per site. With SP each rank normalises only its
# own positions, and its cache is a quarter of the serial one.

# %%
lesson.section("What plain TP keeps whole")
ln_tp = copy.deepcopy(serial_ln)  # plain TP replicates the LayerNorm: a copy on every rank
xhat_tp = ln_tp.forward(x)[1].xhat  # the cache: LayerNormCache(xhat, rstd, w)
_, ln_cache_serial = serial_ln.forward(x)
xhat_serial = ln_cache_serial.xhat
copies = lesson.gather(xhat_tp)  # every rank's x̂, on rank 0
identical = copies is None or all(np.array_equal(c, copies[0]) for c in copies)  # judged where they are
lesson.expect("plain TP: every rank caches the whole x̂, p equal copies of one tensor")
lesson.check("plain TP: every rank caches the whole [b, s, h] x̂, and the 4 copies are equal",
             f"shape {xhat_tp.shape} on each rank", identical)

ln_sp = SequenceParallelLayerNorm.from_serial(serial_ln, group).set_path("sp.ln_2")
_, ln_cache_sp = ln_sp.forward(split_sequence(x, group))
xhat_sp = ln_cache_sp.xhat
lesson.expect("SP: each rank caches x̂ for its own s/p positions only, and they are the serial values")
lesson.equal("SP: x̂ of this rank's positions only, [b, s/p, h]", xhat_sp.shape, (b, s // p, h))
lesson.close("SP: the shard is the serial x̂ at this rank's positions", xhat_sp, xhat_serial[:, mine])

# %% [markdown]
# ## f̄ and ḡ on real ranks
#
# **ḡ** replaces g after a row-parallel linear. Each rank holds a full-size *partial sum* `[b, s, h]`; g
# all-reduced them so every rank had the whole sum. The next region (dropout, residual, LayerNorm) now wants
# only this rank's positions, so it is enough to sum and keep `s/p` of them: a **reduce-scatter** along s.
#
# **f̄** replaces f before a column-parallel linear. f was the identity (the input was replicated); now the
# input is a sequence shard and the matmul needs every position: an **all-gather** along s.
#
# The backwards follow from lesson 02's rule: a backward is the transpose of the forward. After f̄, the
# column-parallel layer gives every rank a partial sum of the gradient of the *whole* gathered input; rank r
# needs the total for its own positions — sum and keep `s/p`: a reduce-scatter. After ḡ, every rank needs
# the gradient of its whole partial sum, and each rank holds `s/p` rows of it: an all-gather.

# %%
lesson.section("f̄ and ḡ on real ranks")
partial = np.random.default_rng([10, group.rank]).standard_normal((b, s, h))  # a different partial per rank
with tracer.paused():
    everyone = group.all_gather(partial[None], axis=0)  # [p, b, s, h] bookkeeping: every rank's partial
total = everyone.sum(axis=0)

lesson.expect("ḡ: the sum of the ranks' partials, this rank's positions only; backward, the whole dy again")
lesson.close("ḡ forward: reduce-scatter = (Σ_r partial_r)[:, my positions]", g_bar.forward(partial, group),
             total[:, mine])
lesson.close("ḡ backward: all-gather of the shards = the whole dy", g_bar.backward(dy[:, mine], group), dy)
lesson.expect("f̄: the shards gathered into the whole x; backward, the summed gradient of this rank's positions")
lesson.close("f̄ forward: all-gather of the shards = the whole x", f_bar.forward(x[:, mine], group), x)
lesson.close("f̄ backward: reduce-scatter = (Σ_r partial_r)[:, my positions]", f_bar.backward(partial, group),
             total[:, mine])

# %% [markdown]
# ### Why they are conjugate
#
# The two operators are each other's transpose, exactly like f and g. With shards `x_r` on the ranks, f̄ is
# the map `(x_1, …, x_p) ↦ (X, …, X)` where `X` is the shards side by side; ḡ is
# `(w_1, …, w_p) ↦ ((Σ_q w_q)[rows of 1], …, (Σ_q w_q)[rows of p])`. The dot-product test of lesson 02,
# `⟨f̄(x), w⟩ = ⟨x, ḡ(w)⟩` with inner products summed over the ranks, says ḡ's forward is f̄'s transpose,
# hence f̄'s backward (and f̄'s forward is ḡ's backward): the same reduce-scatter, the same all-gather.

# %%
x_r = np.random.default_rng([11, group.rank]).standard_normal((b, s // p, h))
w = np.random.default_rng([12, group.rank]).standard_normal((b, s, h))
with tracer.paused():
    lhs = float(group.all_reduce(np.array([np.vdot(f_bar.forward(x_r, group), w)]))[0])  # Σ_r ⟨X, w_r⟩
    rhs = float(group.all_reduce(np.array([np.vdot(x_r, g_bar.forward(w, group))]))[0])  # Σ_r ⟨x_r, ḡ(w)_r⟩
    same_rs = np.array_equal(f_bar.backward(w, group), g_bar.forward(w, group))
    same_ag = np.array_equal(g_bar.backward(x_r, group), f_bar.forward(x_r, group))
lesson.expect("⟨f̄(x), w⟩ = ⟨x, ḡ(w)⟩, and each one's backward is literally the other's forward")
lesson.close(f"dot-product test: ⟨f̄(x), w⟩ = {lhs:.6f} vs ⟨x, ḡ(w)⟩", lhs, rhs)
lesson.equal("conjugate: backward(f̄) = forward(ḡ) and backward(ḡ) = forward(f̄)", (same_rs, same_ag),
             (True, True))

# %% [markdown]
# ## An MLP block with SP equals serial
#
# The block `y = x + MLP(LayerNorm(x))` with SP: the input and output are sequence shards `[b, s/p, h]`;
# `SequenceParallelLayerNorm` normalises the shard; `ParallelMLP(region=SP_REGION)` opens with f̄ in
# `c_fc` and ends with ḡ in `c_proj`; the residual add works on the shard. Beside it, the same block with
# plain TP (f and g, replicated LayerNorm), both built from the serial block's master weights.

# %%
def run_block(ln, mlp, x_in, dy_in):
    """y = x + MLP(LN(x)) forward and backward; returns (y, ∂L/∂x)."""
    hid, c_ln = ln.forward(x_in)
    m, c_mlp = mlp.forward(hid)
    dh = mlp.backward(dy_in, c_mlp)
    return x_in + m, dy_in + ln.backward(dh, c_ln)


lesson.section("An MLP block with SP equals serial")
serial_ln.zero_grad(), serial_mlp.zero_grad()
y_serial, dx_serial = run_block(serial_ln, serial_mlp, x, dy)
ln_tp.set_path("tp.ln_2")
mlp_tp = ParallelMLP.from_serial(serial_mlp, group).set_path("tp.mlp")
mlp_sp = ParallelMLP.from_serial(serial_mlp, group, region=SP_REGION).set_path("sp.mlp")
ln_sp.zero_grad()

tracer.reset()
y_tp, dx_tp = run_block(ln_tp, mlp_tp, x, dy)
y_sp, dx_sp = run_block(ln_sp, mlp_sp, split_sequence(x, group), dy[:, mine])
lesson.expect("both blocks equal serial: plain TP whole, SP on this rank's positions, gradients included")
lesson.close("plain TP block: max |y − serial|", y_tp, y_serial)
lesson.close("SP block: max |y_r − serial y[:, my positions]|", y_sp, y_serial[:, mine])
lesson.close("SP block: max |∂L/∂x_r − serial ∂L/∂x[:, my positions]|", dx_sp, dx_serial[:, mine])
lesson.expect("and every parameter gradient of the SP block, MLP shards and replicated LayerNorm, is serial")
lesson.close("SP block: MLP weight and bias shards' gradients vs serial",
             shard_error(mlp_sp, dict(serial_mlp.named_grads())), 0.0)
lesson.close("SP block: LayerNorm weight and bias gradients vs serial",
             shard_error(ln_sp, dict(serial_ln.named_grads())), 0.0)

# %% [markdown]
# ## All-reduce = reduce-scatter + all-gather: the bytes
#
# The ring all-reduce is *built* from two halves: a reduce-scatter (each rank ends with the sum of one
# chunk) followed by an all-gather (each rank hands its chunk to everyone). SP just stops between the two
# halves: ḡ is the first half, the next f̄ the second, and the LayerNorm, dropout and residual run in between,
# on the chunk.

# %%
lesson.section("All-reduce = reduce-scatter + all-gather: the bytes")
lesson.expect("the two halves in a row are an all-reduce, to rounding")
with tracer.paused():
    two_halves = group.all_gather(group.reduce_scatter(partial, axis=1), axis=1)
    lesson.close("all_gather(reduce_scatter(x)) = all_reduce(x)", two_halves, group.all_reduce(partial))

# %% [markdown]
# So a block's forward with SP should put on the wire exactly what plain TP did. The trace of the two blocks
# above, per rank (`bytes` is the logical tensor of each call, `wire` what this rank sends under the ring:
# all-reduce 2(p−1)/p·B, all-gather and reduce-scatter (p−1)/p·B each):

# %%
def calls(prefix: str, phase: str, op: str | None = None) -> list:
    return [e for e in tracer.events if e.scope.startswith(prefix) and e.phase == phase and op in (None, e.op)]


rows = [["block", "phase", "calls", "bytes", "wire bytes"]]
for prefix in ("tp.", "sp."):
    for phase in ("forward", "backward", "sp_grad_sync"):
        ev = calls(prefix, phase)
        if ev:
            rows.append([prefix[:-1], phase, ", ".join(f"{e.op} ({e.scope.rsplit('.', 1)[-1]})" for e in ev),
                         human_bytes(sum(e.bytes for e in ev)), human_bytes(sum(e.wire_bytes for e in ev))])
lesson.say(table(rows, right=(3, 4)), "")

B = b * s * h * x.itemsize  # one [b, s, h] activation
wire = lambda events: sum(e.wire_bytes for e in events)  # noqa: E731
lesson.expect("forward: one all-reduce of B for plain TP, an all-gather and a reduce-scatter of B for SP — "
              "2(p−1)/p·B on the wire either way")
lesson.equal("plain TP forward: one all-reduce of B = b·s·h·8", [(e.op, e.bytes) for e in calls("tp.", "forward")],
             [("all_reduce", B)])
lesson.equal("SP forward: f̄'s all-gather and ḡ's reduce-scatter, each of the same logical B",
             [(e.op, e.bytes) for e in calls("sp.", "forward")], [("all_gather", B), ("reduce_scatter", B)])
lesson.expect("two halves of (p−1)/p·B each = one all-reduce's 2(p−1)/p·B: the same wire bytes")
lesson.equal("SP forward sends what the plain TP forward sends (wire bytes per rank)",
             wire(calls("sp.", "forward")), wire(calls("tp.", "forward")))

# %% [markdown]
# The backward is the same story, plus one all-gather. `c_fc` needs its whole input `[b, s, h]` again for
# its weight gradient `xᵀ·dy`. Plain TP cached it (it was replicated anyway). With SP, caching f̄'s gathered
# output would put the full `[b, s, h]` back in memory — the very thing SP removes — so, as in Megatron-LM,
# the layer caches only its `[b, s/p, h]` shard and all-gathers it once more in the backward (Megatron
# overlaps that gather with the input-gradient matmul). Memory bought with communication.

# %%
with tracer.paused():
    fc_cache_tp, fc_cache_sp = mlp_tp.forward(x)[1].c_fc, mlp_sp.forward(x[:, mine])[1].c_fc
lesson.expect("with SP, c_fc keeps only its [b, s/p, h] shard of the input for the backward")
lesson.equal("what c_fc keeps for its backward: plain TP [b, s, h], SP [b, s/p, h]",
             (fc_cache_tp.x.shape, fc_cache_sp.x.shape), ((b, s, h), (b, s // p, h)))
regather = calls("sp.mlp.c_fc", "backward", "all_gather")
lesson.expect("backward: plain TP's traffic plus one all-gather, c_fc re-gathering the input it did not keep")
lesson.equal("SP backward: ḡ's all-gather, c_fc's re-gather of its input, f̄'s reduce-scatter",
             [(e.scope, e.op) for e in calls("sp.", "backward")],
             [("sp.mlp.c_proj", "all_gather"), ("sp.mlp.c_fc", "all_gather"), ("sp.mlp.c_fc", "reduce_scatter")])
lesson.expect("take the re-gather away and the SP backward sends what the plain TP backward sends")
lesson.equal("SP backward wire bytes − the re-gather = plain TP backward wire bytes",
             wire(calls("sp.", "backward")) - wire(regather), wire(calls("tp.", "backward")))

# %% [markdown]
# ## The LayerNorm gradient all-reduce
#
# The LayerNorm's weight and bias stay replicated: every rank holds all `h` of them. Their gradients are
# sums over *every* position, `dw = Σ_{b,s} dy·x̂` and `db = Σ_{b,s} dy`. With SP a rank sees only its own
# `s/p` positions, so its sums are partial — the same situation as f's backward in lesson 02. One all-reduce
# of the stacked `[2, h]` (dw, db) over the TP group completes them; tpsim traces it in phase
# `sp_grad_sync`, under the LayerNorm's own scope, because it synchronises a parameter's gradient rather than
# moving an activation. Without it the replicas of the "same" LayerNorm would drift apart after one step.
#
# The row-parallel bias needs no such sum: its gradient is taken from ḡ's all-gathered `dz`, which covers
# every position already.

# %%
lesson.section("The LayerNorm gradient all-reduce")
_, dw_r, db_r = layernorm_backward(dy[:, mine], ln_cache_sp)  # this rank's positions only
lesson.expect("one rank's positions give a partial (dw, db); the sum over the ranks is the serial gradient")
_, dw_serial, db_serial = layernorm_backward(dy, ln_cache_serial)
lesson.apart("one rank's (dw, db) from its own positions is not the gradient", np.stack([dw_r, db_r]),
             np.stack([dw_serial, db_serial]), 0.1)
with tracer.paused():
    summed = group.all_reduce(np.stack([dw_r, db_r]))
lesson.expect("summed over the ranks, the partial (dw, db) are the serial gradient")
lesson.close("the all-reduce (sum over the ranks) of the partial (dw, db) is the serial gradient", summed,
             np.stack([dw_serial, db_serial]))
ln_sync = calls("sp.ln_2", "sp_grad_sync")
lesson.expect("the SP block did that sum itself: one [2, h] all-reduce, traced as sp_grad_sync")
lesson.equal("the trace: one all-reduce of [2, h] in phase sp_grad_sync, scope sp.ln_2",
             [(e.op, e.shape) for e in ln_sync], [("all_reduce", (2, h))])

# %% [markdown]
# ## Activation memory: the LayerNorm/dropout regions shrink by p
#
# Now a whole GPT (2 blocks, dropout 0.1 with the exact RNG of lesson 07), plain TP and TP + SP from the same
# seed. `tpsim.predict.memory.measure_activations` counts the bytes a forward's cache holds (each buffer once,
# views folded into the array that owns them). We measure the LayerNorm caches and dropout masks of the
# embedding, every block and `ln_f` — the "LayerNorm/dropout regions" — and the whole cache.

# %%
lesson.section("Activation memory: the LayerNorm/dropout regions shrink by p")
cfg = GPTConfig(vocab_size=13, n_positions=8, n_embd=16, n_layer=2, n_head=4, dropout=0.1)
SEED, batch = 10, 2
ids = np.random.default_rng(SEED).integers(0, cfg.vocab_size, (batch, cfg.n_positions))
labels = np.roll(ids, -1, axis=1)
plan = DropoutPlan(ExactDropoutRNG(SEED), step=0)
serial = serial_gpt(cfg, seed=SEED)
models = {"TP": parallel_gpt(serial, group), "TP+SP": parallel_gpt(serial, group, sequence_parallel=True)}


def ln_dropout_region(cache):
    """The LayerNorm caches (x̂, rstd) and dropout masks of the embedding, every block and ln_f."""
    tr = cache.transformer
    return [tr.drop, tr.ln_f] + [(blk.ln_1, blk.attn_dropout, blk.ln_2, blk.mlp_dropout) for blk in tr.h]


memory, losses, events = {}, {}, {}
for name, model in models.items():
    model.zero_grad()
    tracer.reset()
    losses[name], cache = model.forward(ids, labels, plan)
    region = measure_activations(ln_dropout_region(cache))
    memory[name] = {"region": region["activations"] + region["masks"],
                    "cache": sum(measure_activations(cache).values())}
    model.backward(1.0, cache)
    events[name] = list(tracer.events)

rows = [["model", "LN/dropout regions", "whole forward cache"]]
rows += [[name, human_bytes(m["region"]), human_bytes(m["cache"])] for name, m in memory.items()]
lesson.say(table(rows), "")
lesson.expect("the LN/dropout regions exactly p times smaller with SP, so the whole cache is smaller too")
lesson.equal("LN/dropout region bytes: TP+SP × tp = plain TP", memory["TP+SP"]["region"] * p, memory["TP"]["region"])
lesson.expect("and so the whole forward cache shrinks with SP, though q, k, v and the rest were split already")
lesson.check("and the whole forward cache is smaller with SP",
             f"{memory['TP+SP']['cache']:,} vs {memory['TP']['cache']:,} bytes",
             memory["TP+SP"]["cache"] < memory["TP"]["cache"])

# %% [markdown]
# The rest of the cache — q, k, v, the attention probabilities, the GeLU input and output — was already
# split over the ranks by plain TP. Korthikanti et al.'s Table 2 counts one layer's activations (16-bit,
# 1-byte masks) as `sbh·(10 + 24/t + 5as/(ht))` for TP and `sbh/t·(34 + 5as/h)` for TP + SP: the `10·sbh`
# that plain TP keeps whole is exactly what SP divides by t. For GPT-3 175B (h 12288, 96 heads, s 2048,
# b 1, t 8):

# %%
gpt3 = dict(s=2048, b=1, h=12288, a=96, t=8)
tp_line, sp_line = korthikanti_layer_bytes(**gpt3), korthikanti_layer_bytes(**gpt3, sequence_parallel=True)
sbh = gpt3["s"] * gpt3["b"] * gpt3["h"]
lesson.say(f"per layer: TP {tp_line / 2**20:,.0f} MiB, TP+SP {sp_line / 2**20:,.0f} MiB")
lesson.expect("the two lines of Table 2 differ by the 10·sbh that SP divides by t")
lesson.close("Table 2: TP line − TP+SP line = 10·sbh·(1 − 1/t) bytes", tp_line - sp_line,
             10 * sbh * (1 - 1 / gpt3["t"]), tol=1e-6)

# %% [markdown]
# ## A whole GPT step with SP equals serial
#
# The same step on the serial model, with the same dropout bits (the exact RNG draws a bit per *global*
# position, so a rank holding positions 2–3 draws what the serial model draws there).

# %%
lesson.section("A whole GPT step with SP equals serial")
loss_serial = serial.loss_and_grads(ids, labels, plan)
serial_grads = dict(serial.named_grads())
for name, model in models.items():
    lesson.expect(f"{name}: the serial loss and gradients, dropout included (the exact RNG)")
    lesson.close(f"{name}: |loss − serial loss {loss_serial:.6f}|", losses[name], loss_serial)
    lesson.close(f"{name}: every gradient shard vs serial", shard_error(model, serial_grads), 0.0)

per_block = [(wire([e for e in events["TP+SP"] if e.scope.startswith(f"transformer.h.{i}.") and e.phase == "forward"]),
              wire([e for e in events["TP"] if e.scope.startswith(f"transformer.h.{i}.") and e.phase == "forward"]))
             for i in range(cfg.n_layer)]
lesson.expect("inside every block SP sends what TP sends forward; the LayerNorms each all-reduce their gradient")
lesson.equal("every block of the GPT: SP forward wire bytes = TP forward wire bytes",
             [sp == tp for sp, tp in per_block], [True] * cfg.n_layer)
lesson.expect("one gradient all-reduce per LayerNorm fed sequence shards: 2 per block, plus ln_f")
lesson.equal("LayerNorm gradient all-reduces in the SP step (2 per block + ln_f)",
             sorted(e.scope for e in events["TP+SP"] if e.phase == "sp_grad_sync"),
             sorted([f"transformer.h.{i}.{ln}" for i in range(cfg.n_layer) for ln in ("ln_1", "ln_2")]
                    + ["transformer.ln_f"]))

# %% [markdown]
# Outside the blocks SP adds a little: the LM head all-gathers `ln_f`'s shard (and in the backward gathers it
# again and reduce-scatters), and the embedding's backward all-gathers the sequence it split. The picture,
# from rank 0's trace of the two steps:

# %%
if lesson.rank == 0:
    plt = lesson.pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [2.2, 1]})
    colors = {"all_reduce": "#4C72B0", "all_gather": "#55A868", "reduce_scatter": "#C44E52"}
    bars = [(name, phase) for phase in ("forward", "backward", "sp_grad_sync") for name in models
            if any(e.phase == phase for e in events[name])]
    labels_ = [f"{name}\n{phase}" for name, phase in bars]
    left = np.zeros(len(bars))
    for op, color in colors.items():
        kib = np.array([sum(e.wire_bytes for e in events[name] if e.phase == phase and e.op == op)
                        for name, phase in bars]) / 1024
        ax.bar(labels_, kib, bottom=left, color=color, label=op)
        left += kib
    ax.set_ylabel("wire KiB per rank")
    ax.set_title("one GPT step: bytes on the wire by op", fontsize=10)
    ax.legend(fontsize=8)
    region = [memory[name]["region"] / 1024 for name in models]
    rest = [(memory[name]["cache"] - memory[name]["region"]) / 1024 for name in models]
    ax2.bar(list(models), region, color="#8172B2", label="LayerNorm / dropout regions")
    ax2.bar(list(models), rest, bottom=region, color="#CCB974", label="rest of the forward cache")
    ax2.set_ylabel("KiB per rank")
    ax2.set_title("activation memory (forward cache)", fontsize=10)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    lesson.save(fig, "10_sequence_parallel.png")

# %% [markdown]
# ## What to take away
#
# * Plain TP leaves LayerNorm, dropout and the residual replicated; SP splits them along the sequence.
# * f̄ (all-gather forward, reduce-scatter backward) and ḡ (reduce-scatter forward, all-gather backward) are
#   conjugate, like f and g; together they are an all-reduce cut in two, so the forward sends the same bytes.
# * The backward gathers each column-parallel input again, because the layer keeps only its shard.
# * Replicated parameters fed sequence shards (the LayerNorms) all-reduce their gradients.
# * The LayerNorm/dropout activations shrink by p; the model still equals serial, dropout included.
#
# Exercise: ḡ's forward and backward in `ex10_sequence_parallelism.py`: `tpsim lesson start 10` copies it into your
# work folder (`tpsim-work/`), then `tpsim check 10`.

# %%
lesson.takeaways()
lesson.finish()
