# %% [markdown]
# # Lesson 02 — f and g, the conjugate operators
#
# Runs on **2 ranks**: `mpirun -n 2 python lessons/02_conjugate_f_g.py` (or `tpsim lesson run 02`;
# as a notebook on as many engines: `tpsim lesson notebook 02`).
#
# Lesson 01 showed where tensor parallelism communicates: after a row split the partial results must be summed.
# Megatron-LM packs all of its communication into two tiny operators, called **f** and **g** in its paper
# (Shoeybi et al. 2019, §3 and Figure 3), and places them at the two edges of every parallel region:
#
# | operator | Megatron name | forward | backward |
# |---|---|---|---|
# | f | `copy_to_tensor_model_parallel_region` | identity | all-reduce (sum) |
# | g | `reduce_from_tensor_model_parallel_region` | all-reduce (sum) | identity |
#
# Each one's backward is the other's forward: they are *conjugate*. This lesson derives both backwards, runs
# them on two real ranks against a serial computation, proves the conjugacy with a dot-product test, and reads
# the communication trace. From here on every process is a "device"; rank 0 does the printing.
#
# Sources: Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3 and Fig. 3 (f and g); the SenseParrots
# article, eqs. (1) and (2) and its §2.1.1 on the same two operators.

# %%
RANKS = 2

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.teach.runtime import Lesson, table
from tpsim.tp import CopyToTPRegion as f
from tpsim.tp import ReduceFromTPRegion as g
from tpsim.trace import format_comm_table, summarize

lesson = Lesson("02", RANKS)
grid = ProcessGrid(tp=RANKS)  # the whole world is one tensor-parallel group
group, tracer = grid.tp_group, grid.tracer
places = lesson.gather(grid.describe())
lesson.say(*(places or []), "")

# %% [markdown]
# ## f: where a replicated input enters a column-parallel layer
#
# Rank r holds a column block `A_r` of the weight and the whole input `x` (equation (1) of lesson 01), and
# computes `y_r = x · A_r`. Going forward nothing needs to move, so f's forward is the identity.
#
# Going backward, the loss depends on `x` through *every* rank's branch. With `G_r = ∂L/∂y_r`,
#
#     ∂L/∂x = Σ_r G_r · A_rᵀ
#
# and rank r can compute only its own term. The terms must be summed and the sum handed to every rank, since
# every rank holds a copy of `x` (and of whatever came before it): f's backward is an all-reduce.
#
# Every rank draws the same master tensors from the same seed (that is how tpsim keeps "the serial model"
# available on every rank for checking), then keeps its own columns.

# %%
rng = np.random.default_rng(2)
tokens, hidden, out = 5, 6, 4 * RANKS
x = rng.standard_normal((tokens, hidden))
A = rng.standard_normal((hidden, out))
G = rng.standard_normal((tokens, out))  # ∂L/∂y of the serial layer y = x·A
cols = np.arange(out).reshape(RANKS, -1)[group.rank]  # this rank's columns

lesson.section("f: where a replicated input enters a column-parallel layer")
lesson.expect("f's forward is the identity, so x·A_r is already this rank's columns of x·A")
y_r = f.forward(x, group) @ A[:, cols]
lesson.close("forward: max |y_r − (x·A)[:, my columns]|", y_r, (x @ A)[:, cols])

dx_partial = G[:, cols] @ A[:, cols].T  # this rank's term of Σ_r G_r·A_rᵀ
lesson.expect("one rank's term is far from ∂L/∂x: the other rank's columns are missing from it")
lesson.apart("one rank's term alone is not ∂L/∂x: max |G_r·A_rᵀ − G·Aᵀ|", dx_partial, G @ A.T, 0.1)
dx = f.backward(dx_partial, group)  # the all-reduce
lesson.expect("after f's backward (the all-reduce) every rank holds the serial gradient, to rounding")
lesson.close("f backward: max |Σ_r G_r·A_rᵀ − G·Aᵀ| (serial gradient)", dx, G @ A.T)

# %% [markdown]
# ## g: where partial sums leave a row-parallel layer
#
# Now rank r holds a row block `B_r` and the matching slice `u_r` of the input (equation (2)); its product
# `u_r · B_r` is a full-size *partial* result. g's forward adds them — an all-reduce — so that every rank
# leaves the region with the whole `z = Σ_r u_r·B_r`.
#
# Backward, `∂z/∂(u_r·B_r)` is the identity for every r: nudging one term of a sum moves the sum by exactly the
# same amount. So every rank's partial result receives the upstream gradient `∂L/∂z` unchanged, and g's
# backward does nothing. `∂L/∂z` is already on every rank because `z` is.

# %%
lesson.section("g: where partial sums leave a row-parallel layer")
u = rng.standard_normal((tokens, out))
B = rng.standard_normal((out, hidden))
dZ = rng.standard_normal((tokens, hidden))  # ∂L/∂z, the same on every rank

z = g.forward(u[:, cols] @ B[cols], group)  # the all-reduce
lesson.expect("g's forward (the all-reduce) adds the two partial products into the serial u·B")
lesson.close("g forward: max |Σ_r u_r·B_r − u·B|", z, u @ B)
d_partial = g.backward(dZ, group)
dB_r = u[:, cols].T @ d_partial  # what rank r's weight gradient needs: its rows of uᵀ·∂L/∂z
lesson.expect("g's backward hands ∂L/∂z on unchanged, and that is all this rank's weight gradient needs")
lesson.close("g backward feeds the weight gradient: max |u_rᵀ·∂L/∂z − (uᵀ·∂L/∂z)[my rows]|", dB_r,
             (u.T @ dZ)[cols])

# %% [markdown]
# ## Why they are conjugate: a map and its transpose
#
# Forget the networks for a moment. The backward of a *linear* map is its transpose: if `y = M·x` then
# `∂L/∂x = Mᵀ·∂L/∂y`. f's forward copies one vector onto p ranks — the map `C: x ↦ (x, …, x)`, a stack of
# identity matrices. Its transpose adds the p pieces up, `Cᵀ: (w_1, …, w_p) ↦ Σ_r w_r`, which is exactly g's
# forward. And g's forward `S = Cᵀ` has the transpose `Sᵀ = C`, the copy, which is f's forward. Hence:
#
#     backward(f) = forward(g)          backward(g) = forward(f)
#
# The dot-product test checks a map against its transpose without writing either down: for any `x` and `w`,
# `⟨C·x, w⟩ = ⟨x, Cᵀ·w⟩`. On the parallel side the inner product is a sum over the ranks of the local inner
# products. We run it with the real operators on the real ranks (the bookkeeping sum is untraced).

# %%
lesson.section("Why they are conjugate: a map and its transpose")
w = np.random.default_rng([22, group.rank]).standard_normal((tokens, hidden))  # a different w_r on every rank
with tracer.paused():
    lhs_f = float(group.all_reduce(np.array([np.vdot(f.forward(x, group), w)]))[0])  # ⟨C·x, w⟩ = Σ_r ⟨x, w_r⟩
    rhs_f = float(np.vdot(x, f.backward(w, group)))  # ⟨x, Cᵀ·w⟩
    lhs_g = float(np.vdot(g.forward(w, group), x))  # ⟨S·w, x⟩
    rhs_g = float(group.all_reduce(np.array([np.vdot(w, g.backward(x, group))]))[0])  # Σ_r ⟨w_r, Sᵀ·x⟩
lesson.expect("⟨C·x, w⟩ = ⟨x, Cᵀ·w⟩ to rounding, once with f's pair and once with g's")
lesson.close(f"dot-product test for f: ⟨f(x), w⟩ = {lhs_f:.6f} vs ⟨x, f_backward(w)⟩", lhs_f, rhs_f)
lesson.close(f"dot-product test for g: ⟨g(w), x⟩ = {lhs_g:.6f} vs ⟨w, g_backward(x)⟩", lhs_g, rhs_g)

# %% [markdown]
# ## The trace: who communicates when
#
# Every collective in tpsim goes through a traced `Group`; the operators tag their calls with the phase
# (`forward`/`backward`) and a layer supplies the scope. Run each operator forward and backward once, under
# scopes named after them, and read the records back.

# %%
lesson.section("The trace: who communicates when")
tracer.reset()
with tracer.region(scope="f"):
    f.backward(f.forward(x, group), group)
with tracer.region(scope="g"):
    g.backward(g.forward(x, group), group)

counts = {(op, phase): len(tracer.select(scope=op, phase=phase)) for op in ("f", "g")
          for phase in ("forward", "backward")}
rows = [["operator", "forward", "backward"]] + [[op, str(counts[op, "forward"]), str(counts[op, "backward"])]
                                               for op in ("f", "g")]
lesson.say("collectives per call:", table(rows), "")
lesson.expect("f: nothing forward, one all-reduce backward")
lesson.equal("collectives of f (forward, backward)", (counts["f", "forward"], counts["f", "backward"]), (0, 1))
lesson.expect("g: one all-reduce forward, nothing backward — f's mirror image")
lesson.equal("collectives of g (forward, backward)", (counts["g", "forward"], counts["g", "backward"]), (1, 0))

records = [e.as_dict() for e in tracer.events]
lesson.say(format_comm_table(summarize(records, keys=("scope", "phase", "op"), ranks=1),
                             keys=("scope", "phase", "op"), title="rank 0's trace:"), "")
nbytes = x.nbytes
lesson.expect(f"every all-reduce is of the whole [tokens, hidden] tensor, {nbytes} bytes")
lesson.equal("bytes of each all-reduce = the [tokens, hidden] tensor", {e.bytes for e in tracer.events}, {nbytes})
lesson.expect("on the wire a ring all-reduce sends 2(p−1)/p of it — at p = 2 exactly the same number "
              "(lessons 03, 06 and 11 run at p = 4, where the two differ)")
lesson.equal("wire bytes per rank = 2·(p−1)/p · bytes (ring all-reduce)", {e.wire_bytes for e in tracer.events},
             {2 * (RANKS - 1) * nbytes // RANKS})

# %% [markdown]
# ## A picture of f and g
#
# The board below draws the four passes on this run's ranks, one lane per rank, and is saved as `02_f_and_g.png`
# in the `--out` folder. f is blue and g red in every diagram of the course; a thick border marks an all-reduce.
# Read it along the diagonals: f's backward is g's forward, g's backward is f's forward — the conjugacy the
# dot-product test just confirmed. Lessons 04 and 05 draw the same two boxes around the MLP and attention.

# %%
lesson.section("A picture of f and g")
if lesson.rank == 0:
    from tpsim.teach.diagrams import f_g_diagram

    lesson.save(f_g_diagram(RANKS), "02_f_and_g.png")

# %% [markdown]
# ## What to take away
#
# * f (identity forward, all-reduce backward) opens a parallel region; g (all-reduce forward, identity
#   backward) closes it. Between them, nothing moves.
# * They are conjugate because copying and summing are transposes of each other, and a backward is a transpose.
# * Lesson 03 wraps them into the column- and row-parallel layers.
#
# Exercise: write `f_backward` and `g_backward` in `ex02_conjugate_f_g.py`: `tpsim lesson start 02` copies it into
# your work folder (`tpsim-work/`), then `tpsim check 02`.

# %%
lesson.takeaways()
lesson.finish()
