# %% [markdown]
# # Lesson 03 — Column-parallel and row-parallel linear layers
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/03_column_row_parallel.py` (or `tpsim lesson run 03`;
# as a notebook on as many engines: `tpsim lesson notebook 03`).
#
# A linear layer `y = x·W + b` with `W: [in, out]` can be split two ways, one per equation of lesson 01, each
# wrapped with the operators of lesson 02. tpsim uses Megatron-LM's names and switches:
#
# * `ColumnParallelLinear(gather_output=…)` — `W` split by columns: f, then `x·W_r + b_r` → `[…, out/p]`;
#   with `gather_output=True` an all-gather puts the full `[…, out]` back on every rank.
# * `RowParallelLinear(input_is_parallel=…)` — `W` split by rows: with `input_is_parallel=False` the input is
#   first split along its last dimension; then `x_r·W_r`, g (the all-reduce), and the bias, once.
#
# Both are built `from_serial(...)` from a serial layer's master weights, so each rank holds exactly its slice
# of the same matrix and the result can be compared with the serial layer at any rank count. The lesson ends
# with the reason the two are used as a pair: chained the right way, they save a gather and a split.
#
# Sources: the SenseParrots article, eqs. (1) and (2) and its §2.1.1; Shoeybi et al. 2019, "Megatron-LM",
# arXiv:1909.08053, §3 (the class and argument names are those of its code).

# %%
RANKS = 4

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.cost import wire_bytes
from tpsim.nn import Linear
from tpsim.teach.runtime import Lesson, shard_error, table
from tpsim.tp import ColumnParallelLinear, RowParallelLinear
from tpsim.table import human_bytes

lesson = Lesson("03", RANKS)
grid = ProcessGrid(tp=RANKS)
group, tracer = grid.tp_group, grid.tracer

rng = np.random.default_rng(3)  # the same master weights and data on every rank
tokens, hidden, ffn = 5, 6, 3 * RANKS
fc1 = Linear(hidden, ffn, rng=rng, std=0.5, bias_value=rng.standard_normal(ffn))
fc2 = Linear(ffn, hidden, rng=rng, std=0.5, bias_value=rng.standard_normal(hidden))
x = rng.standard_normal((tokens, hidden))
dy = rng.standard_normal((tokens, ffn))  # an upstream gradient for fc1's output

# %% [markdown]
# ## Column-parallel: each rank owns some output features
#
# Rank r keeps columns `[r·out/p, (r+1)·out/p)` of the weight and the same slice of the bias. The forward needs
# no communication; the backward computes this rank's weight gradient from its slice of `∂L/∂y` and a
# *partial* input gradient, which f's backward all-reduces (lesson 02). Every shard records where it sits in
# the master tensor (a `Partition`), so its gradient can be compared with the matching slice of the serial
# layer's gradient (`take_shard`; `shard_error` takes the largest difference over all of them).

# %%
lesson.section("Column-parallel: each rank owns some output features")
col = ColumnParallelLinear.from_serial(fc1, group, gather_output=False).set_path("fc1")
y_r, cache = col.forward(x)
y_serial, serial_cache = fc1.forward(x)
mine = np.arange(ffn).reshape(RANKS, -1)[group.rank]
lesson.expect(f"out/p = {ffn}/{RANKS} columns per rank, and they are the serial output's columns of this rank")
lesson.equal("shape of this rank's output y_r (tokens × out/p)", y_r.shape, (tokens, ffn // RANKS))
lesson.close("column-parallel forward: max |y_r − y_serial[:, my columns]|", y_r, y_serial[:, mine])

fc1.zero_grad()
dx = col.backward(dy[:, mine], cache)
dx_serial = fc1.backward(dy, serial_cache)
lesson.expect("∂L/∂x equals serial once f's all-reduce has summed the ranks' partial terms")
lesson.close("column-parallel backward: max |∂L/∂x − serial| (after f's all-reduce)", dx, dx_serial)
lesson.expect("the weight and bias gradients need no communication: slices of the serial ones (derived below)")
lesson.close("weight and bias gradient shards vs the serial gradients' slices",
             shard_error(col, dict(fc1.named_grads())), 0.0)

# %% [markdown]
# With `gather_output=True` the layer ends in an all-gather, so every rank gets the whole output — what you
# want when the next layer needs all features, and a waste when it does not (see the end of the lesson).

# %%
col_gathered = ColumnParallelLinear.from_serial(fc1, group, gather_output=True).set_path("fc1")
lesson.expect("the all-gather puts all out columns on every rank: the serial output everywhere")
lesson.close("gather_output=True: max |y − y_serial| on every rank", col_gathered.forward(x)[0], y_serial)

# %% [markdown]
# ## Row-parallel: each rank owns some input features
#
# Rank r keeps rows `[r·in/p, (r+1)·in/p)` of the weight and needs the same slice of the input's features.
# Its product is a full-size partial sum; g adds them up. The bias is **replicated** and added once, *after*
# the all-reduce — added to each partial sum it would be counted p times.

# %%
lesson.section("Row-parallel: each rank owns some input features")
u = rng.standard_normal((tokens, ffn))
dz = rng.standard_normal((tokens, hidden))
row = RowParallelLinear.from_serial(fc2, group, input_is_parallel=False).set_path("fc2")
z, cache = row.forward(u)  # splits u itself (no communication), then g
z_serial, serial_cache = fc2.forward(u)
lesson.expect("g sums the ranks' partial products, then the bias is added once: the serial output")
lesson.close("row-parallel forward: max |z − z_serial|", z, z_serial)

fc2.zero_grad()
du = row.backward(dz, cache)  # g's backward is the identity; the split's backward all-gathers ∂L/∂u
lesson.expect("∂L/∂u is whole again after the split's all-gather")
lesson.close("row-parallel backward: max |∂L/∂u − serial|", du, fc2.backward(dz, serial_cache))
lesson.expect("the weight rows and the replicated bias get their gradients without communication")
lesson.close("weight shard and replicated bias gradients vs serial", shard_error(row, dict(fc2.named_grads())), 0.0)
partials_with_bias = group.all_reduce(u[:, mine] @ row.params["weight"] + row.params["bias"])
lesson.expect("a bias added to every partial sum comes out p times: a large difference")
lesson.apart("the bias added before the all-reduce is counted p times", partials_with_bias, z_serial, 0.1)

# %% [markdown]
# ## The weight gradients, derived
#
# Why did the weight gradients need no communication? Take the column-parallel layer, `y_r = x·A_r + b_r`.
# Entry (t, j) of `y_r` is `Σ_k x[t, k]·A_r[k, j]`, so `∂L/∂A_r[k, j] = Σ_t x[t, k]·∂L/∂y_r[t, j]`:
#
#     column-parallel:  ∂L/∂A_r = xᵀ · ∂L/∂y_r          ∂L/∂b_r = Σ_t ∂L/∂y_r[t]
#
# `x` is replicated and `∂L/∂y_r` is the slice of the output gradient that belongs to this rank's columns, so
# both are local. The serial gradient `xᵀ·∂L/∂y` has the same columns: rank r's block of it *is* `xᵀ·∂L/∂y_r`.
#
# The row-parallel layer, `z = Σ_r u_r·B_r + b`, is the same computation with the roles turned. `z` depends
# on `B_r` only through the term `u_r·B_r`, so
#
#     row-parallel:     ∂L/∂B_r = u_rᵀ · ∂L/∂z           ∂L/∂b = Σ_t ∂L/∂z[t]  (replicated, the same on every rank)
#
# with `u_r` this rank's input columns and `∂L/∂z` on every rank already (g's backward is the identity). The
# serial `uᵀ·∂L/∂z` stacks the `u_rᵀ·∂L/∂z` row block by row block. Only the *input* gradients cross ranks:
# the column-parallel `∂L/∂x = Σ_r ∂L/∂y_r·A_rᵀ` needs f's all-reduce.

# %%
lesson.section("The weight gradients, derived")
serial_grads = {"column": dict(fc1.named_grads())["weight"], "row": dict(fc2.named_grads())["weight"]}
lesson.expect("xᵀ·∂L/∂y_r, computed by hand on this rank, is this rank's column block of the serial ∂L/∂A")
lesson.close("column: max |xᵀ·∂L/∂y_r − (serial ∂L/∂A)[:, my columns]|", x.T @ dy[:, mine],
             serial_grads["column"][:, mine])
lesson.expect("u_rᵀ·∂L/∂z, computed by hand on this rank, is this rank's row block of the serial ∂L/∂B")
lesson.close("row: max |u_rᵀ·∂L/∂z − (serial ∂L/∂B)[my rows]|", u[:, mine].T @ dz, serial_grads["row"][mine])
lesson.expect("and these are exactly what the two layers accumulated in their backward")
lesson.close("max |layers' weight gradients − the hand-derived ones|",
             np.concatenate([col.grads["weight"].ravel(), row.grads["weight"].ravel()]),
             np.concatenate([(x.T @ dy[:, mine]).ravel(), (u[:, mine].T @ dz).ravel()]))

# %% [markdown]
# ## Two layers in a row: gather-then-split, or nothing at all
#
# A transformer's MLP is two linears, `fc2(fc1(x))` (with a GeLU between them in lesson 04). Take the
# obvious route first: `fc1` column-parallel with `gather_output=True`, so every rank has the full hidden
# activation, then `fc2` row-parallel with `input_is_parallel=False`, which immediately throws away all but
# its own slice of it. Forward: an all-gather, then a split that keeps exactly the columns this rank
# computed itself. Backward: the split's backward all-gathers, and the gather's backward splits.
#
# Equation (1) then (2) of lesson 01 says the round trip is pointless: the slice `fc1` produced on rank r *is*
# the slice `fc2` needs on rank r. With `gather_output=False` and `input_is_parallel=True` the pair needs only
# f at the start and g at the end.

# %%
def run_pair(gather: bool, scope: str):
    """fc2(fc1(x)) forward and backward, traced under ``scope``; returns (output, ∂L/∂x)."""
    first = ColumnParallelLinear.from_serial(fc1, group, gather_output=gather).set_path(f"{scope}.fc1")
    second = RowParallelLinear.from_serial(fc2, group, input_is_parallel=not gather).set_path(f"{scope}.fc2")
    h, c1 = first.forward(x)
    out, c2 = second.forward(h)
    return out, first.backward(second.backward(dz, c2), c1)


lesson.section("Two layers in a row: gather-then-split, or nothing at all")
tracer.reset()
z_a, dx_a = run_pair(gather=True, scope="A")
z_b, dx_b = run_pair(gather=False, scope="B")
z_ref, ref_cache = fc2.forward(fc1.forward(x)[0])
lesson.expect("both routes compute the same function: serial outputs, and the same ∂L/∂x")
lesson.close("A (gather, then split): max |output − serial|", z_a, z_ref)
lesson.close("B (parallel input): max |output − serial|", z_b, z_ref)
lesson.expect("and the same input gradient: the routes differ only in what they move")
lesson.close("A and B give the same ∂L/∂x", dx_a, dx_b)

# %% [markdown]
# The trace tells the two apart. Counting this rank's records by route, phase and collective:

# %%
def calls(route: str, phase: str, op: str) -> list:
    return [e for e in tracer.events if e.scope.startswith(route + ".") and e.phase == phase and e.op == op]


rows = [["route", "phase", "all_gather", "all_reduce", "bytes", "wire bytes"]]
for route in ("A", "B"):
    for phase in ("forward", "backward"):
        ev = [e for e in tracer.events if e.scope.startswith(route + ".") and e.phase == phase]
        rows.append([route, phase, str(len(calls(route, phase, "all_gather"))),
                     str(len(calls(route, phase, "all_reduce"))), human_bytes(sum(e.bytes for e in ev)),
                     human_bytes(sum(e.wire_bytes for e in ev))])
lesson.say("collectives per rank, one forward + backward of fc2(fc1(x)):", table(rows, right=(2, 3, 4, 5)), "")

act = tokens * ffn * x.itemsize  # the gathered hidden activation [tokens, ffn]
out_bytes = tokens * hidden * x.itemsize  # the all-reduced [tokens, hidden] tensors
for phase in ("forward", "backward"):
    lesson.expect(f"{phase}: A adds an all-gather of the activation to the all-reduce that B alone needs")
    lesson.equal(f"A, {phase}: (all_gather, all_reduce) calls",
                 (len(calls("A", phase, "all_gather")), len(calls("A", phase, "all_reduce"))), (1, 1))
    lesson.equal(f"B, {phase}: (all_gather, all_reduce) calls",
                 (len(calls("B", phase, "all_gather")), len(calls("B", phase, "all_reduce"))), (0, 1))
saved = sum(e.bytes for e in tracer.events if e.scope.startswith("A.")) - \
    sum(e.bytes for e in tracer.events if e.scope.startswith("B."))
lesson.expect("A's extra bytes are its two all-gathers of the [tokens, ffn] activation")
lesson.equal("bytes B saves = two all-gathers of the [tokens, ffn] activation (2·tokens·ffn·8)", saved, 2 * act)
lesson.expect("B moves only the two [tokens, hidden] all-reduces that any route needs")
lesson.equal("bytes B still moves = two all-reduces of [tokens, hidden]",
             sum(e.bytes for e in tracer.events if e.scope.startswith("B.")), 2 * out_bytes)

# %% [markdown]
# The table has two byte columns, and they do not tell the same story. `bytes` is the logical size of each
# tensor; `wire bytes` is what this rank *sends* for it under the ring algorithm: an all-gather sends
# `(p−1)/p` of its output, an all-reduce `2(p−1)/p` of its buffer (a reduce-scatter then an all-gather;
# lesson 11 derives both). Per direction, with the gathered activation `[tokens, f]` and the all-reduced
# `[tokens, h]`:
#
#     logical  A / B = (f + h) / h
#     wire     A / B = ((p−1)/p·f + 2(p−1)/p·h) / (2(p−1)/p·h) = (f + 2h) / (2h)
#
# Here f = 12 and h = 6: 3× the logical bytes, 2× on the wire. The saving grows with the model: in a real
# MLP f = 4h, so route A moves **five times the logical bytes** of route B but sends **three times the wire
# bytes** (`6(p−1)/p·h` against `2(p−1)/p·h` per token and direction) — the all-gather it adds costs half
# an all-reduce of the same size.

# %%
def total(route: str, field: str) -> int:
    return sum(getattr(e, field) for e in tracer.events if e.scope.startswith(route + "."))


lesson.expect(f"measured logical ratio (f + h)/h = {(ffn + hidden) / hidden:g}, wire ratio (f + 2h)/(2h) = "
              f"{(ffn + 2 * hidden) / (2 * hidden):g}: an all-gather sends half of what an all-reduce of the same "
              "size does")
lesson.equal("this run, A / B: (logical bytes, wire bytes)",
             (total("A", "bytes") / total("B", "bytes"), total("A", "wire_bytes") / total("B", "wire_bytes")),
             ((ffn + hidden) / hidden, (ffn + 2 * hidden) / (2 * hidden)))
h_real, p_real = 1024, RANKS
gathered, reduced = tokens * 4 * h_real * 8, tokens * h_real * 8  # [tokens, 4h] and [tokens, h], per direction
logical_ratio = (gathered + reduced) / reduced
wire_ratio = (wire_bytes("all_gather", gathered, p_real) + wire_bytes("all_reduce", reduced, p_real)) / \
    wire_bytes("all_reduce", reduced, p_real)
lesson.expect("a real MLP (f = 4h, tpsim.cost's ring formulas): 5× the logical bytes, 3× on the wire")
lesson.equal("f = 4h, A / B: (logical bytes, wire bytes)", (logical_ratio, wire_ratio), (5.0, 3.0))

# %%
if lesson.rank == 0:
    plt = lesson.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    keys = [(route, phase) for route in ("A", "B") for phase in ("forward", "backward")]
    labels = [f"{route} {phase}" for route, phase in keys]
    gathered = [sum(e.bytes for e in calls(route, phase, "all_gather")) for route, phase in keys]
    reduced = [sum(e.bytes for e in calls(route, phase, "all_reduce")) for route, phase in keys]
    ax.barh(labels, gathered, color="#55A868", label="all_gather")
    ax.barh(labels, reduced, left=gathered, color="#4C72B0", label="all_reduce")
    ax.invert_yaxis()
    ax.set_xlabel("bytes per rank (logical size; the wire bytes are in the table)")
    ax.set_title("fc2(fc1(x)): A = gather + split, B = parallel input")
    ax.legend()
    fig.tight_layout()
    lesson.save(fig, "03_gather_split_saved.png")

# %% [markdown]
# ## What to take away
#
# * Column-parallel: same input, split output, no forward communication; f all-reduces ∂L/∂x.
# * Row-parallel: split input, partial outputs summed by g; the bias is added once, after the sum.
# * Chain them with `gather_output=False` → `input_is_parallel=True`: one all-reduce forward and one
#   backward for the pair, instead of an extra all-gather in each direction.
#
# Exercise: `row_parallel_forward` in `ex03_column_row_parallel.py`: `tpsim lesson start 03` copies it into your
# work folder (`tpsim-work/`), then `tpsim check 03`.

# %%
lesson.takeaways()
lesson.finish()
