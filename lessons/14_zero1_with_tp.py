# %% [markdown]
# # Lesson 14 — ZeRO-1 × TP: who owns which slice of the optimizer
#
# Runs on **8 ranks**: `mpirun -n 8 python lessons/14_zero1_with_tp.py` (or `tpsim lesson run 14`;
# as a notebook on as many engines: `tpsim lesson notebook 14`).
#
# Under data parallelism every DP replica runs the same AdamW step on the same averaged gradients, so every
# replica keeps the same exp_avg and exp_avg_sq — d copies of the largest piece of model state. ZeRO stage 1
# (Rajbhandari et al. 2019) keeps the step and splits its work: each DP rank owns 1/d of the gradients,
# updates only that slice, and keeps optimizer state only for it. Megatron-LM's *distributed optimizer* is
# exactly this, on top of tensor parallelism:
#
#     grads  ── reduce-scatter over DP ──▶ my 1/d slice, averaged
#     AdamW on my slice (m and v for 1/d of the parameters)
#     params ◀── all-gather over DP ──── every rank's updated slice
#
# The SenseParrots article sets TP beside ZeRO (its reference 1) as the two ways to fit a bigger model. This
# lesson runs both together on a TP(2) × DP(4) grid: the owned slices of a padded gradient buffer, the bytes
# (a reduce-scatter plus an all-gather is an all-reduce), equality with plain DP × TP, and memory per rank.
#
# Sources: Rajbhandari et al. 2019, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
# arXiv:1910.02054, §5 (stage 1, P_os); Megatron-LM's `docs/source/api-guide/dist_optimizer.md` (the
# bytes-per-parameter table); Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053; the SenseParrots
# article, §3.1 (DP + TP the Megatron way).

# %%
RANKS = 8

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.cost import wire_bytes
from tpsim.data import ReverseTask
from tpsim.demo.gpt_tour import read_batch
from tpsim.models.build import build_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.teach.runtime import Lesson, table
from tpsim.predict.memory import param_elements
from tpsim.predict.model_state import MEGATRON_LAYOUTS, format_formula, zero_optimizer_bytes
from tpsim.partition import owned_range, owned_segments, padded_length
from tpsim.train import AdamW, GradSync, train_step
from tpsim.train.zero import DistributedOptimizer

lesson = Lesson("14", RANKS)
grid = ProcessGrid(tp=2, dp=4)
lesson.say(grid.table(), "")

# %% [markdown]
# ## Who owns which slice
#
# The gradients of one TP rank are packed, last layer first, into flat buckets (as DDP packs them). A
# bucket of `n` elements is padded with zeros to `n_pad = ⌈n/d⌉·d` so that a reduce-scatter can split it
# evenly, and DP rank r owns positions `[r·n_pad/d, (r+1)·n_pad/d)`. The slices ignore parameter
# boundaries: a parameter can straddle two owners, and each updates its own piece (AdamW is element-wise, so
# a piece is as good as the whole). `owned_segments` says which piece of which parameter falls in a slice.

# %%
lesson.section("Who owns which slice")
config = GPTConfig(vocab_size=19, n_positions=8, n_embd=12, n_layer=2, n_head=4)  # odd sizes: padding
SEED, BATCH, STEPS, CLIP, CAP = 5, 8, 4, 0.5, 2000  # CAP bytes: several buckets


def adamw(model):
    return AdamW(model, lr=1e-2, weight_decay=0.1, no_decay=lambda n: n.endswith("bias"))


model = build_gpt(config, grid.tp_group, seed=SEED)
zero = DistributedOptimizer(adamw(model), grid, bucket_cap_bytes=CAP)
lesson.say(zero.describe(), "")
sizes = {name: p.size for name, p in model.named_parameters()}
padded_first = [b for b in zero.buckets if sum(sizes[name] for name in b.names) % grid.dp]
first = (padded_first or zero.buckets)[0]  # a bucket that needs padding, to see it
n = sum(sizes[name] for name in first.names)
rows = [["DP rank", "owned range", "pieces (parameter: elements)"]]
for r in range(grid.dp):
    pieces = owned_segments([sizes[name] for name in first.names], grid.dp, r)
    rows.append([str(r), f"[{owned_range(n, grid.dp, r).start}, {owned_range(n, grid.dp, r).stop})",
                 ", ".join(f"{first.names[s.index].split('.')[-2]}.{first.names[s.index].split('.')[-1]}: "
                           f"{s.start}..{s.stop - 1}" for s in pieces)])
lesson.say(f"bucket {zero.buckets.index(first)} on TP rank {grid.tp_rank}: {n} gradient elements, padded to "
           f"{padded_length(n, grid.dp)}",
           table(rows), "")
ranges = grid.dp_group.gather_objects([(r.start, r.stop) for r in zero.owned])
lesson.expect("the DP ranks' slices tile every padded bucket exactly once, in rank order")
tiles = ranges is None or all([ranges[r][b] for r in range(grid.dp)] ==
                              [(r * len(buf) // grid.dp, (r + 1) * len(buf) // grid.dp) for r in range(grid.dp)]
                              for b, buf in enumerate(zero.buffers))
lesson.check("owned ranges of every bucket, gathered over the DP group", f"{len(zero.buckets)} buckets", tiles)

# %% [markdown]
# ## ZeRO-1 equals plain DP × TP
#
# Train the same sharded GPT twice for a few AdamW steps with clipping that really scales: once with DDP's
# all-reduce and a full AdamW on every replica, once with the distributed optimizer. Clipping needs the
# norm of the *whole* gradient, but a rank now holds only its slices: each adds Σg² over its slices — a
# TP-replicated parameter (LayerNorm, row-parallel bias) only on TP rank 0, exactly as plain TP clipping
# avoids counting it p times — and one all-reduce over the world sums them. Every element is then counted
# once, and the norm, the losses and the parameters are those of plain DP × TP (float64).

# %%
lesson.section("ZeRO-1 equals plain DP × TP")
task = ReverseTask(config.vocab_size, config.n_positions)


def train(use_zero: bool):
    m = build_gpt(config, grid.tp_group, seed=SEED)
    if use_zero:
        opt = sync = DistributedOptimizer(adamw(m), grid, bucket_cap_bytes=CAP)
    else:
        opt, sync = adamw(m), GradSync(m, grid.dp_group, bucket_cap_bytes=CAP)
    grid.tracer.reset()
    results = []
    for step in range(STEPS):
        grid.tracer.step = step
        ids, labels, _ = read_batch(grid, task, SEED, step, BATCH)
        results.append(train_step(m, opt, grid, sync, ids, labels, clip=CLIP))
    return m, opt, results, [e for e in grid.tracer.events if e.step == STEPS - 1]


plain_model, _, plain_results, plain_events = train(use_zero=False)
zero_model, zero, zero_results, zero_events = train(use_zero=True)
lesson.say(table([["step", "loss plain", "loss ZeRO-1", "|grad| plain", "|grad| ZeRO-1"]] +
                 [[str(i), f"{a.loss:.12f}", f"{b.loss:.12f}", f"{a.grad_norm:.12f}", f"{b.grad_norm:.12f}"]
                  for i, (a, b) in enumerate(zip(plain_results, zero_results))]), "")
lesson.expect("the same losses and clip norms, and every parameter shard equal, to float64 rounding")
lesson.close("losses and norms, ZeRO-1 vs plain", [(r.loss, r.grad_norm) for r in zero_results],
             [(r.loss, r.grad_norm) for r in plain_results], tol=1e-12)
lesson.close("every parameter shard after the steps",
             np.concatenate([p.ravel() for _, p in zero_model.named_parameters()]),
             np.concatenate([p.ravel() for _, p in plain_model.named_parameters()]), tol=1e-12)

# %% [markdown]
# ## Reduce-scatter + all-gather = all-reduce: the bytes
#
# A ring all-reduce *is* a reduce-scatter followed by an all-gather: each rank sends `(d−1)/d` of the buffer
# in each half, `2(d−1)/d` in all. ZeRO-1 issues the two halves separately and runs the optimizer between
# them — on the reduced slice — so it sends exactly what DDP sends. The buffer is only larger by the padding.

# %%
lesson.section("Reduce-scatter + all-gather = all-reduce: the bytes")
plain_dp = [e for e in plain_events if e.group == "dp" and e.scope.startswith("ddp")]
zero_dp = [e for e in zero_events if e.group == "dp" and e.scope.startswith("zero")]
by_op = {op: sum(e.wire_bytes for e in zero_dp if e.op == op) for op in ("reduce_scatter", "all_gather")}
padded = sum(len(b) * b.itemsize for b in zero.buffers)
lesson.say(table([["last step, this rank", "calls", "bytes", "wire bytes"],
                  ["DDP all-reduce", str(len(plain_dp)), f"{sum(e.bytes for e in plain_dp):,}",
                   f"{sum(e.wire_bytes for e in plain_dp):,}"],
                  ["ZeRO-1 reduce-scatter (dp_sync)", str(sum(e.op == 'reduce_scatter' for e in zero_dp)),
                   f"{padded:,}", f"{by_op['reduce_scatter']:,}"],
                  ["ZeRO-1 all-gather (optimizer)", str(sum(e.op == 'all_gather' for e in zero_dp)),
                   f"{padded:,}", f"{by_op['all_gather']:,}"]]), "")
lesson.expect("reduce-scatter + all-gather send the all-reduce's 2(d−1)/d of the (padded) buffer, to the byte")
lesson.equal("ZeRO-1 wire bytes = ring all-reduce of the padded buckets",
             sum(by_op.values()), sum(wire_bytes("all_reduce", len(b) * b.itemsize, grid.dp) for b in zero.buffers))
lesson.check("and the padding is all the difference from DDP's", f"{padded - sum(e.bytes for e in plain_dp)} "
             f"bytes of padding", 0 <= padded - sum(e.bytes for e in plain_dp) < 8 * grid.dp * len(zero.buffers))

# %% [markdown]
# ## Memory per rank vs d
#
# Parameters and gradients stay whole on every DP rank (ZeRO-1 shards neither), the optimizer state is 1/d.
# tpsim's AdamW updates the model's own arrays, so in float32 its layout is Megatron's last row: 4 bytes of
# parameter, 4 of gradient, 8 of Adam moments → `8 + 8/d`. Megatron's 16-bit rows add fp32 main parameters
# (and, for fp16 gradients, fp32 main gradients), which are sharded with the optimizer state.

# %%
lesson.section("Memory per rank vs d")
state = zero.state_bytes()
lesson.expect("the optimizer state this rank holds is the formula's, exactly (float64, each bucket's padding)")
elements = [sum(sizes[name] for name in b.names) for b in zero.buckets]
lesson.equal("optimizer bytes on this rank = 2 slots × 8 bytes × Σ padded buckets / d", state,
             zero_optimizer_bytes(elements, grid.dp, itemsize=8, slots=2))
lesson.check("about 1/d of plain AdamW's", f"{state:,} vs {2 * 8 * param_elements(config, grid.tp):,} bytes",
             abs(state * grid.dp - 2 * 8 * param_elements(config, grid.tp)) < 16 * grid.dp * len(elements))
rows = [["bytes per parameter", "plain", "formula", *[f"d = {d}" for d in (1, 2, 4, 8, 64)]]]
rows += [[row.name, str(row.bytes_per_parameter()), format_formula(row),
          *[f"{float(row.bytes_per_parameter(d, distributed=True)):g}" for d in (1, 2, 4, 8, 64)]]
         for row in MEGATRON_LAYOUTS]
lesson.say(table(rows), "")
lesson.expect("Megatron's three rows: 20 → 4 + 16/d, 18 → 6 + 12/d, 16 → 8 + 8/d, plain at d = 1")
lesson.equal("the rows at d = 1 and d = 4",
             [(int(r.bytes_per_parameter(1, True)), float(r.bytes_per_parameter(4, True))) for r in MEGATRON_LAYOUTS],
             [(20, 8.0), (18, 9.0), (16, 10.0)])

# %% [markdown]
# As d grows the sharded part vanishes and what is left is what ZeRO-1 does not touch: the 16-bit
# parameters and gradients. ZeRO-2 shards the gradients too, ZeRO-3 the parameters; tensor parallelism
# divides all of them by t, and activations as well — which is why the two are used together.
#
# ## What to take away
#
# * ZeRO-1 = reduce-scatter (dp_sync) → the optimizer on my 1/d slice → all-gather (optimizer): the same
#   bytes as DDP's all-reduce, the same result, 1/d of the optimizer state.
# * Buckets are padded to a multiple of d; rank r owns `[r·n_pad/d, (r+1)·n_pad/d)`, whatever parameters
#   that cuts through.
# * The clip norm sums every rank's slices over the world, counting TP-replicated parameters on TP rank 0.
# * Bytes per parameter: fp32 16 → 8 + 8/d; bf16 params + fp32 grads 18 → 6 + 12/d; fp16 20 → 4 + 16/d.
#
# Exercise: `owned_range` and `owned_pieces` in `lessons/exercises/ex14_zero1_with_tp.py`, then
# `tpsim check 14`.

# %%
lesson.takeaways()
lesson.finish()
