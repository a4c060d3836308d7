# %% [markdown]
# # Lesson 04 — The parallel MLP: GeLU lets the gather wait
#
# Runs on **2 ranks**: `mpirun -n 2 python lessons/04_parallel_mlp.py` (or `tpsim lesson run 04`;
# as a notebook on as many engines: `tpsim lesson notebook 04`).
#
# The transformer's MLP is `Z = GeLU(X·A)·B` with `A: [h, 4h]` (GPT-2's `c_fc`) and `B: [4h, h]`
# (`c_proj`), plus biases. It holds two thirds of a block's weights, so it is the first thing to split. Two
# ranks are enough to see every idea, as in Figure 3a of the Megatron-LM paper (Shoeybi et al. 2019):
# `A = [A1 A2]`, `B = [B1; B2]`.
#
# The question is which way to split `A`. The answer comes from one inequality about GeLU.
#
# Sources: Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3, eq. (3) (the GeLU split) and Fig. 3a;
# the SenseParrots article, eqs. (1) and (2) and its §2.1.1.

# %%
RANKS = 2

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.nn import MLP, gelu_forward
from tpsim.teach.runtime import Lesson, shard_error, table
from tpsim.tp import ParallelMLP
from tpsim.table import human_bytes

lesson = Lesson("04", RANKS)
grid = ProcessGrid(tp=RANKS)
group, tracer = grid.tp_group, grid.tracer

rng = np.random.default_rng(4)  # the same master weights and data on every rank
tokens, hidden = 7, 6
serial = MLP(hidden, rng=rng, std=0.5)  # c_fc [6, 24], c_proj [24, 6]
for layer in (serial.c_fc, serial.c_proj):  # non-zero biases, so a misplaced bias would show
    layer.params["bias"][...] = rng.standard_normal(layer.params["bias"].shape)
x = rng.standard_normal((tokens, hidden))
A, a = serial.c_fc.params["weight"], serial.c_fc.params["bias"]
ffn = A.shape[1]
mine = np.arange(ffn).reshape(RANKS, -1)[group.rank]  # this rank's hidden units: columns of A, rows of B

# %% [markdown]
# ## Option 1: split A by rows — GeLU blocks the way
#
# Split `A` by rows and `X` by columns (equation (2)): rank r computes the partial product `X_r·A_r` and
# `X·A = X1·A1 + X2·A2`. But GeLU is not linear,
#
#     GeLU(X1·A1 + X2·A2)  ≠  GeLU(X1·A1) + GeLU(X2·A2)
#
# so the partial products must be summed — an all-reduce of the whole `[tokens, 4h]` activation — *before*
# the GeLU, in the middle of the layer.

# %%
lesson.section("Option 1: split A by rows — GeLU blocks the way")
rows = np.arange(hidden).reshape(RANKS, -1)[group.rank]  # rank r's rows of A and columns of X
partial = x[:, rows] @ A[rows]  # X_r·A_r
lesson.expect("a large difference: GeLU is not linear, so summing GeLUs of partial products is wrong")
with tracer.paused():  # a wrong turn, kept out of the trace
    gelu_then_summed = group.all_reduce(gelu_forward(partial + a / RANKS)[0])
lesson.apart("GeLU of a sum is not the sum of GeLUs: max |Σ_r GeLU(X_r·A_r + a/2) − GeLU(X·A + a)|",
             gelu_then_summed, gelu_forward(x @ A + a)[0], 0.1)

# %% [markdown]
# So option 1 must all-reduce the `[tokens, 4h]` pre-activation, apply GeLU to the (now replicated) sum, and
# can then use `B` split by rows on its own slice, with a second all-reduce at the end. Correct — at a price
# the trace will show in a moment.

# %%
B, b = serial.c_proj.params["weight"], serial.c_proj.params["bias"]
tracer.reset()
with tracer.region(scope="option1", phase="forward"):
    hidden_units, _ = gelu_forward(group.all_reduce(partial) + a)  # the mid-layer sum GeLU forces
    z_option1 = group.all_reduce(hidden_units[:, mine] @ B[mine]) + b
option1_bytes = sum(e.bytes for e in tracer.events)
lesson.expect("summing before the GeLU (an all-reduce of [tokens, 4h]) gives the serial output")
lesson.close("option 1 (sum, then GeLU) is right: max |Z − Z_serial|", z_option1, serial.forward(x)[0])

# %% [markdown]
# ## Option 2: split A by columns — GeLU works on the shard
#
# Split `A` by columns instead (equation (1)). Rank r computes `X·A_r`, a slice of the hidden units, with no
# communication. GeLU works element by element, so applied to the slice it gives exactly the slice of the
# serial result:
#
#     GeLU([X·A1  X·A2]) = [GeLU(X·A1)  GeLU(X·A2)]
#
# and that slice is precisely the input `c_proj` needs when `B` is split by rows (lesson 03's chain). The
# gather the hidden units seem to need "waits" — forever: the only sum is g at the very end.

# %%
lesson.section("Option 2: split A by columns — GeLU works on the shard")
h_r, _ = gelu_forward(x @ A[:, mine] + a[mine])  # every nn function returns (out, cache)
lesson.expect("GeLU is element-wise, so on a column shard it gives that shard of the serial result exactly")
lesson.close("GeLU on the column shard: max |GeLU(X·A_r + a_r) − GeLU(X·A + a)[:, my columns]|",
             h_r, gelu_forward(x @ A + a)[0][:, mine])

# %% [markdown]
# ## The whole layer: tpsim's ParallelMLP
#
# `ParallelMLP.from_serial` builds `c_fc` as a `ColumnParallelLinear(gather_output=False)` and `c_proj` as
# a `RowParallelLinear(input_is_parallel=True)` from the serial master weights. Forward and backward are
# compared with the serial MLP: the output, the input gradient and every parameter's gradient shard.

# %%
lesson.section("The whole layer: tpsim's ParallelMLP")
mlp = ParallelMLP.from_serial(serial, group).set_path("mlp")
dz = rng.standard_normal((tokens, hidden))
tracer.reset()
z, cache = mlp.forward(x)
dx = mlp.backward(dz, cache)

serial.zero_grad()
z_ref, serial_cache = serial.forward(x)
dx_ref = serial.backward(dz, serial_cache)
lesson.expect("forward, input gradient and every gradient shard equal the serial MLP's, to rounding")
lesson.close("parallel MLP forward: max |Z − Z_serial|", z, z_ref)
lesson.close("parallel MLP backward: max |∂L/∂X − serial|", dx, dx_ref)
lesson.close("every gradient shard (c_fc columns, c_proj rows, replicated c_proj bias) vs serial",
             shard_error(mlp, dict(serial.named_grads("mlp")), prefix="mlp"), 0.0)
lesson.expect(f"each rank keeps only its 4h/p = {ffn // RANKS} columns of the GeLU output for the backward")
lesson.equal("this rank's largest activation, GeLU(X·A_r) (tokens × 4h/p)", cache.c_proj.x.shape,
             (tokens, ffn // RANKS))

# %% [markdown]
# ## One all-reduce forward, one backward
#
# The trace of that forward and backward should hold exactly two collectives per rank: g in `c_proj` going
# forward and f in `c_fc` going backward, each an all-reduce of a `[tokens, h]` tensor.

# %%
lesson.section("One all-reduce forward, one backward")
events = [(e.scope, e.phase, e.op, tuple(e.shape)) for e in tracer.events]
rows = [["scope", "phase", "op", "shape", "bytes", "wire bytes"]] + [
    [e.scope, e.phase, e.op, str(list(e.shape)), human_bytes(e.bytes), human_bytes(e.wire_bytes)]
    for e in tracer.events]
lesson.say("rank 0's collectives:", table(rows, right=(4, 5)), "")
lesson.expect("g in c_proj forward and f in c_fc backward, each of the [tokens, h] tensor, and nothing else")
lesson.equal("collectives (scope, phase, op, shape)", events,
             [("mlp.c_proj", "forward", "all_reduce", (tokens, hidden)),
              ("mlp.c_fc", "backward", "all_reduce", (tokens, hidden))])
nbytes = tokens * hidden * 8
lesson.equal("bytes per all-reduce = tokens · h · 8", [e.bytes for e in tracer.events], [nbytes, nbytes])
forward_bytes = sum(e.bytes for e in tracer.events if e.phase == "forward")
lesson.expect("option 1 all-reduces [tokens, 4h] and [tokens, h] forward, option 2 only [tokens, h]: 5× the bytes "
              "(all all-reduces, so the wire ratio is the same)")
lesson.equal("forward bytes, option 1 / option 2 (measured) = (4h + h) / h", option1_bytes / forward_bytes, 5.0)

# %% [markdown]
# ## A picture of the inequality
#
# GeLU(t) ≈ t for large t and ≈ 0 for very negative t, with a smooth bend around 0. Fix `b = 1`, which itself
# sits on the bend (GeLU(1) ≈ 0.84, not 1), and vary `a`: `GeLU(a + 1)` and `GeLU(a) + GeLU(1)` meet only at
# `a = 0`, where GeLU(a) = 0. Far to the right both are straight lines of slope 1, but a gap of
# 1 − GeLU(1) ≈ 0.16 stays between them; far to the left `GeLU(a + 1)` goes to 0 while the sum goes to
# GeLU(1) ≈ 0.84.

# %%
lesson.section("A picture of the inequality")
t = np.linspace(-4, 4, 401)  # the a axis of the figure; t[200] = 0
gap = gelu_forward(t + 1.0)[0] - (gelu_forward(t)[0] + gelu_forward(np.array(1.0))[0])
g1 = float(gelu_forward(np.array(1.0))[0])
lesson.expect("the curves touch only at a = 0; at a = 4 the gap is ≈ 1 − GeLU(1), at a = −4 ≈ −GeLU(1)")
lesson.equal("where the plotted curves meet (|gap| < 1e-12) and the gap at a = −4, 4 (2 decimals)",
             (t[np.abs(gap) < 1e-12].tolist(), round(float(gap[0]), 2), round(float(gap[-1]), 2)),
             ([0.0], round(-g1, 2), round(1 - g1, 2)))
if lesson.rank == 0:
    plt = lesson.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot(t, gelu_forward(t + 1.0)[0], label="GeLU(a + 1)")
    ax.plot(t, gelu_forward(t)[0] + gelu_forward(np.array(1.0))[0], "--", label="GeLU(a) + GeLU(1)")
    ax.set_xlabel("a")
    ax.set_title("GeLU does not distribute over a sum")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    lesson.save(fig, "04_gelu_not_additive.png")

# %% [markdown]
# ## The whole layer in one picture
#
# Figure 3a of the Megatron-LM paper (Shoeybi et al. 2019, arXiv:1909.08053), redrawn for this run's ranks and
# saved as `04_mlp_f_g.png`: f where the replicated `X` enters, one lane per rank holding its columns `A_r` of
# `c_fc`, the GeLU on its own slice and its rows `B_r` of `c_proj`, then g where the partial results are summed.
# Inside the lanes the activations are `[b, s, 4h/p]` (here `[tokens, 4h/p]`) and never move; only the
# `[b, s, h]` tensors at f and g cross between ranks — the two all-reduces the trace above recorded.

# %%
lesson.section("The whole layer in one picture")
if lesson.rank == 0:
    from tpsim.teach.diagrams import mlp_diagram

    lesson.save(mlp_diagram(RANKS), "04_mlp_f_g.png")

# %% [markdown]
# ## What to take away
#
# * Split `c_fc` by columns so GeLU runs on each rank's slice; split `c_proj` by rows so it consumes that
#   slice directly.
# * The parallel MLP then communicates once forward (g) and once backward (f), each a `[tokens, h]`
#   all-reduce — and each rank stores only `1/p` of the weights and of the `[tokens, 4h]` activation.
#
# Exercise: wire `parallel_mlp_forward` in `ex04_parallel_mlp.py`: `tpsim lesson start 04` copies it into your work
# folder (`tpsim-work/`), then `tpsim check 04`.

# %%
lesson.takeaways()
lesson.finish()
