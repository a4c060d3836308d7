# %% [markdown]
# # Lesson 21 — ZeRO's four stages side by side, under tensor parallelism
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/21_zero_stages.py` (or `tpsim lesson run 21`;
# as a notebook on as many engines: `tpsim lesson notebook 21`).
#
# Lesson 14 ran ZeRO stage 1 live: the optimizer state cut into d owned slices, a reduce-scatter and an
# all-gather in place of DDP's all-reduce. Rajbhandari et al. go two stages further. Stage 2 (P_os+g) keeps of
# each gradient bucket only the owned slice: the bucket is reduce-scattered as the backward fills it and freed.
# Stage 3 (P_os+g+p) keeps of each parameter only the owned slice too, and gathers a layer's parameters just
# before the layer needs them. This lesson sets the four stages side by side: the bytes each keeps per
# parameter (the ZeRO paper's, Megatron's bf16 recipe, tpsim's float64), its Figure 1, how a bucket is cut
# into owned slices, when each stage moves what, who holds what once TP is there too, and a live ZeRO-1,
# ZeRO-2 and ZeRO-3 over the 4 ranks (TP 2 × DP 2) equal to plain DP × TP.
#
# Sources: Rajbhandari et al. 2019, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
# arXiv:1910.02054, §5 (P_os, P_os+g, P_os+g+p and their bytes, 2 + 2 + K with K = 12), §7 (the communication:
# stages 1 and 2 at DDP's volume, stage 3 at 1.5 times) and Figure 1; Megatron-LM's
# `docs/source/api-guide/dist_optimizer.md` (bytes per parameter of the distributed optimizer); Zhao et al.
# 2023, "PyTorch FSDP", arXiv:2304.11277 (full sharding, the per-layer gathers); the SenseParrots article, §3.1
# (DP beside TP, and ZeRO as its reference 1).

# %%
RANKS = 4

import os
from fractions import Fraction

import numpy as np

from tpsim.arch.gpt2 import GPTConfig
from tpsim.comm import ProcessGrid
from tpsim.cost import wire_bytes
from tpsim.data import ReverseTask
from tpsim.demo.tour_parts import read_batch
from tpsim.models.build import build_gpt
from tpsim.partition import owned_range, owned_segments, padded_length
from tpsim.plan.comm import dp_collectives, dp_wire_bytes
from tpsim.plan.layout import Layout
from tpsim.plan.models import PRESETS
from tpsim.plan.published import ZERO_PAPER_GB, ZERO_STAGE_NAMES, zero_stages_example
from tpsim.plan.zero3 import IN_FLIGHT, gathered_bytes, piece_elements, sharded_state
from tpsim.predict.model_state import (MEGATRON_LAYOUTS, TPSIM_FLOAT64, StateLayout, format_formula,
                                       zero_optimizer_bytes)
from tpsim.teach.runtime import Lesson, table
from tpsim.train import AdamW, GradSync, train_step
from tpsim.train.zero import DistributedOptimizer

lesson = Lesson("21", RANKS)
grid = ProcessGrid(tp=2, dp=2)
lesson.say(grid.table(), "")

# %% [markdown]
# ## Four stages, the bytes each keeps
#
# A parameter's model state is three pieces: the parameter the forward reads (p bytes), its gradient (g) and
# the optimizer's state (o: for mixed-precision Adam an fp32 master copy and two fp32 moments). Stage 0 is
# plain data parallelism: every one of the d ranks keeps all three. Each stage cuts one more piece into d owned
# slices, in the order a step stops needing it whole:
#
#     stage 0   p + g + o          stage 2   p + (g + o)/d
#     stage 1   p + g + o/d        stage 3   (p + g + o)/d
#
# The paper counts p = g = 2 (fp16) and K = o = 12: 16 → 4 + 12/d → 2 + 14/d → 16/d. Megatron's bf16 recipe
# keeps fp32 main gradients (g = 4): 18 → 6 + 12/d → 2 + 16/d → 18/d. tpsim's float64 AdamW steps the model's
# own arrays (p = g = 8, o = 16): 32 → 16 + 16/d → 8 + 24/d → 32/d. Two pieces of code compute these: the
# live tables' `StateLayout.bytes_per_zero_stage` and the planner's `sharded_state`; they must agree.

# %%
lesson.section("Four stages, the bytes each keeps")
PAPER = StateLayout("ZeRO paper (fp16, K = 12)", 2, 2, 0, 0, 12)
BF16 = MEGATRON_LAYOUTS[1]
LAYOUTS = (PAPER, BF16, TPSIM_FLOAT64)
DS = (1, 2, 4, 8, 64)
rows = [["bytes per parameter", *[f"ZeRO-{z}" for z in range(4)], *[f"ZeRO-3, d = {d}" for d in DS[1:]]]]
rows += [[row.name, *[format_formula(row, z) for z in range(4)],
          *[f"{float(row.bytes_per_zero_stage(3, d)):g}" for d in DS[1:]]] for row in LAYOUTS]
lesson.say(table(rows), "")
lesson.expect("the ZeRO paper's 16, 4 + 12/d, 2 + 14/d, 16/d; Megatron's bf16 18, 6 + 12/d, 2 + 16/d, 18/d; tpsim's "
              "float64 32, 16 + 16/d, 8 + 24/d, 32/d")
lesson.equal("the formulas, three layouts × four stages",
             [[format_formula(row, z) for z in range(4)] for row in LAYOUTS],
             [["16", "4 + 12/d", "2 + 14/d", "16/d"], ["18", "6 + 12/d", "2 + 16/d", "18/d"],
              ["32", "16 + 16/d", "8 + 24/d", "32/d"]])
agree = [row.bytes_per_zero_stage(z, d) == sum(sharded_state(Fraction(row.param), Fraction(row.grad),
                                                              Fraction(row.sharded), z, d))
         for row in LAYOUTS for z in range(4) for d in DS]  # Fractions in: the planner's arithmetic, exactly
lesson.expect("the live tables' bytes_per_zero_stage = the planner's sharded_state, for every layout, stage and d")
lesson.check("bytes_per_zero_stage vs sharded_state (3 layouts × 4 stages × d = 1, 2, 4, 8, 64)",
             f"{sum(agree)} of {len(agree)} equal", all(agree))
lesson.expect("at d = 1 nothing is split: every stage is plain data parallelism")
lesson.equal("every stage at d = 1, three layouts", [{int(row.bytes_per_zero_stage(z, 1)) for z in range(4)}
                                                     for row in LAYOUTS], [{16}, {18}, {32}])
lesson.expect("ZeRO-1 is Megatron's distributed optimizer: its column of dist_optimizer.md, for all three rows")
lesson.check("bytes_per_zero_stage(1, d) = bytes_per_parameter(d, distributed) at d = 1, 2, 4, 8, 64", "3 rows",
             all(row.bytes_per_zero_stage(1, d) == row.bytes_per_parameter(d, distributed=True)
                 for row in MEGATRON_LAYOUTS for d in DS))

# %% [markdown]
# ## The ZeRO paper's Figure 1
#
# The paper's opening picture: a model of Ψ = 7.5 B parameters on Nd = 64 GPUs. At 16 bytes a parameter plain
# data parallelism needs 120 GB on every GPU; P_os 4 + 12/64 bytes, 31.4 GB; P_os+g 2 + 14/64, 16.6 GB; P_os+g+p
# 16/64, 1.9 GB (1.875, rounded half up). `tpsim plan --zero-example` prints the same table beside the bf16
# recipe's.

# %%
lesson.section("The ZeRO paper's Figure 1")
figure = zero_stages_example(7.5e9, 64)
lesson.say(table([["stage", "paper's column", "B/param", "GB / GPU", "as printed", "bf16 recipe GB"]] +
                 [[str(r["zero"]), r["name"], f"{r['bytes_per_param']['total']:g}", f"{r['gb']:.4g}",
                   f"{r['paper_gb']:g}", f"{r['planner_gb']:.4g}"] for r in figure]), "")
lesson.expect("Figure 1's 120, 31.4, 16.6 and 1.9 GB, from 7.5e9 × the paper's bytes per parameter at d = 64")
lesson.equal("GB per GPU as the paper prints them", tuple(r["paper_gb"] for r in figure), ZERO_PAPER_GB)
lesson.expect("the same GB from this lesson's own StateLayout of Rajbhandari et al.'s accounting, exactly")
lesson.check("7.5e9 × PAPER.bytes_per_zero_stage(z, 64) / 1e9 vs the planner's GB, stages 0–3",
             ", ".join(f"{ZERO_STAGE_NAMES[z]} {float(7.5 * PAPER.bytes_per_zero_stage(z, 64)):g}" for z in range(4)),
             all(abs(float(7.5 * PAPER.bytes_per_zero_stage(z, 64)) - figure[z]["gb"]) < 1e-9 for z in range(4)))

# %% [markdown]
# ## One bucket cut into d owned slices
#
# Every stage cuts the same way (lesson 14): the gradients of a TP rank are packed into flat buckets, a bucket
# of n elements is padded with zeros to n_pad = ⌈n/d⌉·d, and DP rank r owns positions [r·n_pad/d,
# (r + 1)·n_pad/d). Stage 1 keeps the optimizer state of that slice, stage 2 its gradients too, stage 3 its
# parameters too: the cut is the same, only what is kept of it grows. The slices ignore parameter boundaries; a
# parameter may straddle two owners, and `owned_segments` says which piece of which parameter a slice holds. The
# figure draws one bucket of this run's model at this run's d = 2 and at d = 4, from `owned_segments` alone.

# %%
lesson.section("One bucket cut into d owned slices")
config = GPTConfig(vocab_size=19, n_positions=7, n_embd=10, n_layer=2, n_head=2)  # odd sizes: padding
SEED, BATCH, STEPS, CLIP, CAP = 21, 8, 3, 0.5, 2000


def adamw(model):
    return AdamW(model, lr=1e-2, weight_decay=0.1, no_decay=lambda n: n.endswith("bias"))


model = build_gpt(config, grid.tp_group, seed=SEED)
zero = DistributedOptimizer(adamw(model), grid, bucket_cap_bytes=CAP)
sizes = {name: p.size for name, p in model.named_parameters()}
elements = [sum(sizes[name] for name in b.names) for b in zero.buckets]
shown = max(range(len(elements)), key=lambda b: (len(zero.buckets[b].names) > 1, elements[b] % grid.dp,
                                                 padded_length(elements[b], 4) - elements[b]))
names = list(zero.buckets[shown].names)
n, bucket_sizes = elements[shown], [sizes[name] for name in names]
lesson.say(f"TP rank {grid.tp_rank}'s bucket {shown}: {len(names)} parameters, {n} elements, padded to "
           f"{padded_length(n, grid.dp)} at d = {grid.dp} and to {padded_length(n, 4)} at d = 4", "")


def slice_rows(d: int) -> list[list[str]]:
    out = []
    for r in range(d):
        mine = owned_range(n, d, r)
        pieces = [f"{names[s.index].removeprefix('transformer.')} [{s.start}, {s.stop})"
                  for s in owned_segments(bucket_sizes, d, r)]
        pad = len(mine) - sum(s.stop - s.start for s in owned_segments(bucket_sizes, d, r))
        out.append([str(d), str(r), f"[{mine.start}, {mine.stop})", "; ".join(pieces) or "-", str(pad)])
    return out


lesson.say(table([["d", "DP rank", "owns", "pieces [start, stop) inside each parameter", "padded"]] +
                 slice_rows(grid.dp) + slice_rows(4)), "")
live = [(p.name, p.start, p.start + p.param.size) for p in zero.slices[shown]]
lesson.expect("the pieces owned_segments gives this DP rank are the ones its live optimizer updates")
lesson.check(f"bucket {shown}: the live optimizer's pieces vs owned_segments, on every rank",
             f"{len(live)} pieces on this rank", live == [(names[s.index], s.start, s.stop) for s in
                                                          owned_segments(bucket_sizes, grid.dp, grid.dp_rank)])


def tiles_once(d: int) -> bool:
    """Every parameter's pieces over the d ranks, in rank order, run from 0 to its size with no gap or overlap."""
    for i, size in enumerate(bucket_sizes):
        spans = [(s.start, s.stop) for r in range(d) for s in owned_segments(bucket_sizes, d, r) if s.index == i]
        starts, stops = [a for a, _ in spans], [b for _, b in spans]
        if starts != [0, *stops[:-1]] or stops[-1] != size:
            return False
    return True


lesson.expect("at d = 2 and d = 4 the slices' pieces cover every parameter exactly once, and the rest is padding")
lesson.check("pieces over all DP ranks: each parameter whole, once", f"d = {grid.dp}: {n} + "
             f"{padded_length(n, grid.dp) - n} padded, d = 4: {n} + {padded_length(n, 4) - n} padded",
             tiles_once(grid.dp) and tiles_once(4))


PALETTE = ["#4C72B0", "#55A868", "#C44E52", "#8172B2", "#CCB974", "#64B5CD", "#DD8452"]  # one colour a parameter


def draw_bucket(ax, d: int) -> None:
    """One bar: each rank's pieces coloured by parameter (from owned_segments), the padding hatched grey."""
    n_pad, shard = padded_length(n, d), padded_length(n, d) // d
    for r in range(d):
        for s in owned_segments(bucket_sizes, d, r):
            ax.barh(0, s.stop - s.start, left=s.buffer_start, height=0.6, color=PALETTE[s.index % len(PALETTE)],
                    edgecolor="white", lw=0.5)
        ax.text((r + 0.5) * shard, 0.45, f"rank {r}: [{r * shard}, {(r + 1) * shard})", ha="center",
                va="bottom", fontsize=7)
        ax.axvline(r * shard, color="black", lw=1.5)
    ax.axvline(n_pad, color="black", lw=1.5)
    ax.barh(0, n_pad - n, left=n, height=0.6, color="#DDDDDD", hatch="///", edgecolor="#888888")
    for edge in np.cumsum(bucket_sizes)[:-1]:
        ax.axvline(edge, ymin=0.2, ymax=0.55, color="white", lw=2, ls=":")
    ax.set_xlim(0, padded_length(n, 4))
    ax.set_ylim(-0.6, 1.0)
    ax.set_yticks([])
    ax.set_title(f"d = {d}: {n} elements + {n_pad - n} padded (hatched), slices of {shard}", fontsize=8)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


if lesson.rank == 0:
    plt = lesson.pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(10, 3.6), sharex=True)
    for ax, d in zip(axes, (grid.dp, 4)):
        draw_bucket(ax, d)
    labels = [name.removeprefix("transformer.") for name in names]
    handles = [plt.Rectangle((0, 0), 1, 1, color=PALETTE[i % len(PALETTE)]) for i in range(len(names))]
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(names)), fontsize=7, frameon=False)
    axes[-1].set_xlabel("position in the bucket (colours: parameters; black lines: owned slices)", fontsize=8)
    fig.suptitle(f"TP rank 0's bucket {shown} cut into d owned slices (the same cut at every ZeRO stage)",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    lesson.save(fig, "21_owned_slices.png")

# %% [markdown]
# ## When each stage moves what
#
# A ring all-reduce is a reduce-scatter and an all-gather, (d − 1)/d of the buffer each. DDP all-reduces the
# gradients. ZeRO-1 reduce-scatters them into the owned slices, steps its slice, and all-gathers the updated
# parameters: the all-reduce's two halves with the step between them. ZeRO-2 issues the same two, the
# reduce-scatter bucket by bucket during the backward (and the rest of each bucket freed): at one micro-batch
# DDP's bytes again (with m micro-batches, m reduce-scatters). ZeRO-3 keeps no whole parameter, so every layer
# is all-gathered before its forward, freed, gathered *again* before its backward, and its gradients
# reduce-scattered after it: 3 × (d − 1)/d, 1.5 times DDP's bytes in one dtype (Rajbhandari et al. §7). Below, for the
# 2,000,000 float64 elements of one TP rank's gradients at d = 4, the planner's `dp_collectives`:

# %%
lesson.section("When each stage moves what")
N, D4 = 2_000_000, 4
plans = {z: Layout(dp=D4, zero=z, dtype="float64", micro_batch=1, global_batch=D4) for z in range(4)}
rows = [["stage", "DP collectives of a step (logical bytes)", "wire bytes a rank", "÷ DDP's"]]
for z, lay in plans.items():
    ops = ", ".join(f"{op} {nbytes:,}" for op, nbytes in dp_collectives(lay, N))
    ratio = Fraction(dp_wire_bytes(lay, N), dp_wire_bytes(plans[0], N))
    rows.append([f"ZeRO-{z}", ops, f"{dp_wire_bytes(lay, N):,}", str(ratio)])
lesson.say(table(rows), "")
ddp = 2 * (D4 - 1) * N * 8 // D4
lesson.expect("ZeRO-1 and ZeRO-2 send DDP's 2(d − 1)/d of the buffer; ZeRO-3 3(d − 1)/d, 3/2 of it")
lesson.equal("wire bytes a rank, stages 0–3, vs 2(d − 1)/d · N · 8 and 3/2 of it",
             [dp_wire_bytes(lay, N) for lay in plans.values()], [ddp, ddp, ddp, 3 * ddp // 2])
lesson.expect("ZeRO-3's extra bytes are one more all-gather of the parameters: (d − 1)/d of the buffer")
lesson.equal("ZeRO-3 − ZeRO-1 wire bytes vs one ring all-gather of N · 8 bytes",
             dp_wire_bytes(plans[3], N) - dp_wire_bytes(plans[1], N), wire_bytes("all_gather", N * 8, D4))

# %% [markdown]
# What ZeRO-3 holds at once besides its slices: the layer it computes with, gathered whole, and the next one,
# prefetched — and in the backward their whole gradients before the reduce-scatter. The planner charges two of
# the stage's largest *pieces* (the embedding, each layer, the head) at p + g bytes an element, with the
# activations (`tpsim.plan.zero3.gathered_bytes`). At GPT-3 175B size on TP 8 × DP 64 in bf16 (p = 2, g = 4):

# %%
gpt3 = PRESETS["gpt3-175b"]
big = Layout(tp=8, dp=64, zero=3, dtype="bfloat16", micro_batch=1, global_batch=64)
pieces = piece_elements(gpt3, big, 0)
transient = gathered_bytes(gpt3, big, 0, 2, 4)
lesson.say(f"pieces on one TP rank: embedding {pieces[0]:,}, each of {len(pieces) - 2} layers {pieces[1]:,}, head "
           f"{pieces[-1]:,} elements; all of them {sum(pieces):,}",
           f"gathered at once: {IN_FLIGHT} × {max(pieces):,} × (2 + 4) bytes = {transient / 1e9:.2f} GB; its whole "
           f"bf16 parameters would be {2 * sum(pieces) / 1e9:.1f} GB, its ZeRO-3 model state "
           f"{float(BF16.bytes_per_zero_stage(3, 64)) * sum(pieces) / 1e9:.2f} GB", "")
lesson.expect("two of the largest pieces (here a layer) in flight, at p + g bytes: a few GB, not the whole model")
lesson.equal("gathered_bytes vs IN_FLIGHT · max(pieces) · (2 + 4)", transient, float(2 * pieces[1] * 6))
lesson.expect("at d = 1 nothing is sharded, so nothing is gathered")
lesson.equal("gathered_bytes at DP 1", gathered_bytes(gpt3, Layout(tp=8, dp=1, zero=3, micro_batch=1, global_batch=1),
                                                      0, 2, 4), 0.0)

# %% [markdown]
# ## Who holds what with TP
#
# Tensor parallelism cuts each weight first, by rows or columns over the t TP ranks; ZeRO then cuts each TP
# rank's *shard* over its d DP ranks: the buckets above are one TP rank's, and the DP ranks that share a TP rank
# own slices of the same shard. Megatron's distributed optimizer does exactly this, and so does FSDP2 with TP (a
# 2-D mesh: the TP shard of each weight sharded again over DP). Each of the t·d GPUs thus keeps 1/(t·d) of the
# sharded state. On this run, TP 2 × DP 2:

# %%
lesson.section("Who holds what with TP")
mine = (grid.tp_rank, grid.dp_rank, sum(elements), sum(len(o) for o in zero.owned), zero.state_bytes())
everyone = lesson.gather(mine)
if everyone is not None:
    lesson.say(table([["rank", "TP rank", "DP rank", "its TP shard's elements", "owned elements", "optimizer bytes"]]
                     + [[str(k), str(t), str(d), f"{s:,}", f"{o:,}", f"{b:,}"]
                        for k, (t, d, s, o, b) in enumerate(everyone)]), "")
ranges = grid.dp_group.gather_objects([(o.start, o.stop) for o in zero.owned])
lesson.expect("the DP ranks of one TP rank own slices of the same padded buckets, tiling each exactly once")
lesson.check("owned ranges of every bucket, gathered over the DP group", f"{len(elements)} buckets",
             ranges is None or all([ranges[r][b] for r in range(grid.dp)] ==
                                   [(r * len(buf) // grid.dp, (r + 1) * len(buf) // grid.dp) for r in range(grid.dp)]
                                   for b, buf in enumerate(zero.buffers)))
lesson.expect("each rank's optimizer state: 2 slots × 8 bytes × its owned slices = 1/d of its TP shard's padded "
              "buckets")
lesson.equal("state_bytes() vs zero_optimizer_bytes(buckets, d, 8)", zero.state_bytes(),
             zero_optimizer_bytes(elements, grid.dp, itemsize=8, slots=2))

# %% [markdown]
# ## ZeRO-1 equals plain DP × TP, live
#
# The same GPT trained twice for three clipped AdamW steps on the 4 ranks: once with DDP's all-reduce and a
# whole AdamW on every replica, once with the distributed optimizer, each DP rank stepping its owned slices and
# the clip norm summed over the slices of the world. In float64 the losses, the norms and every parameter shard
# must be plain DP × TP's to 1e-12, and the traced DP bytes those of the table above.

# %%
lesson.section("ZeRO-1 equals plain DP × TP, live")
task = ReverseTask(config.vocab_size, config.n_positions)


def train(stage: int):
    """The model after STEPS clipped AdamW steps with DDP (stage 0) or ZeRO-``stage``: (model, optimizer, the
    steps' results, the last step's traced DP wire bytes)."""
    m = build_gpt(config, grid.tp_group, seed=SEED)
    if stage:
        opt = sync = DistributedOptimizer(adamw(m), grid, bucket_cap_bytes=CAP, stage=stage)
    else:
        opt, sync = adamw(m), GradSync(m, grid.dp_group, bucket_cap_bytes=CAP)
    results = []
    for step in range(STEPS):
        grid.tracer.reset()
        ids, labels, _ = read_batch(grid, task, SEED, step, BATCH)
        results.append(train_step(m, opt, grid, sync, ids, labels, clip=CLIP))
    dp_bytes = sum(e.wire_bytes for e in grid.tracer.events if e.group == "dp" and e.scope.startswith(("ddp", "zero")))
    sync.finish_param_gather()  # ZeRO-3: the whole parameters, gathered from the owned slices for us to read
    return m, opt, results, dp_bytes


plain_model, plain_opt, plain_results, plain_bytes = train(stage=0)
zero_model, zero_opt, zero_results, zero_bytes = train(stage=1)
lesson.say(table([["step", "loss plain", "loss ZeRO-1", "|grad| plain", "|grad| ZeRO-1"]] +
                 [[str(i), f"{a.loss:.12f}", f"{b.loss:.12f}", f"{a.grad_norm:.12f}", f"{b.grad_norm:.12f}"]
                  for i, (a, b) in enumerate(zip(plain_results, zero_results))]), "")
lesson.expect("the clip really scales (every norm above 0.5), and the losses and norms are plain DP × TP's")
lesson.check("grad norms above the clip", ", ".join(f"{r.grad_norm:.3f}" for r in plain_results),
             all(r.grad_norm > CLIP for r in plain_results))
lesson.close("losses and norms, ZeRO-1 vs plain", [(r.loss, r.grad_norm) for r in zero_results],
             [(r.loss, r.grad_norm) for r in plain_results], tol=1e-12)
lesson.expect("every parameter shard after 3 steps equal to float64 rounding")
lesson.close("every parameter shard, ZeRO-1 vs plain",
             np.concatenate([p.ravel() for _, p in zero_model.named_parameters()]),
             np.concatenate([p.ravel() for _, p in plain_model.named_parameters()]), tol=1e-12)
lesson.expect("ZeRO-1's optimizer state is 1/d of plain AdamW's, up to the padding of its owned slices")
lesson.equal("d × ZeRO-1 state bytes vs 2 slots × 8 bytes × the padded buckets (plain AdamW's, with the padding)",
             grid.dp * zero_opt.state_bytes(), 2 * 8 * sum(padded_length(n, grid.dp) for n in elements))
lesson.expect("the last step's traced DP bytes: DDP's all-reduce and ZeRO-1's pair, as the planner prices them")
lesson.equal("traced DP wire bytes (plain, ZeRO-1) vs dp_wire_bytes(zero 0 of the buckets, zero 1 of the padded)",
             (plain_bytes, zero_bytes),
             (sum(dp_wire_bytes(Layout(dp=grid.dp, zero=0, dtype="float64"), n) for n in elements),
              sum(dp_wire_bytes(Layout(dp=grid.dp, zero=1, dtype="float64"), padded_length(n, grid.dp))
                  for n in elements)))

# %% [markdown]
# ## ZeRO-2 live: the same training, only the owned slices of the gradients
#
# `DistributedOptimizer(..., stage=2)` materialises a gradient bucket only while the backward writes into it,
# reduce-scatters it into this rank's owned slice as soon as its layers are done, and frees it: at rest a rank
# holds n_pad/d gradient elements a bucket (`grad_bytes()`), where ZeRO-1 keeps every bucket whole. Everything
# after the reduce-scatter — the clip norm, the step on the owned slices, the all-gather — is ZeRO-1's, so at one
# micro-batch the numbers are ZeRO-1's bit for bit, and so are the bytes sent.

# %%
lesson.section("ZeRO-2 live: the same training, only the owned slices of the gradients")
zero2_model, zero2_opt, zero2_results, zero2_bytes = train(stage=2)
lesson.expect("ZeRO-2's losses, norms and parameters are plain DP × TP's, and ZeRO-1's bit for bit")
lesson.close("losses and norms, ZeRO-2 vs plain", [(r.loss, r.grad_norm) for r in zero2_results],
             [(r.loss, r.grad_norm) for r in plain_results], tol=1e-12)
zero2_params = np.concatenate([p.ravel() for _, p in zero2_model.named_parameters()])
lesson.close("every parameter shard, ZeRO-2 vs plain", zero2_params,
             np.concatenate([p.ravel() for _, p in plain_model.named_parameters()]), tol=1e-12)
lesson.check("every parameter shard, ZeRO-2 vs ZeRO-1, bit for bit", f"stage {zero2_opt.zero_stage}",
             zero2_opt.zero_stage == 2 and np.array_equal(
                 zero2_params, np.concatenate([p.ravel() for _, p in zero_model.named_parameters()])))
owned_bytes = 8 * sum(len(owned_range(n, grid.dp, grid.dp_rank)) for n in elements)
lesson.say(f"this rank's gradients at rest: ZeRO-1 {8 * sum(padded_length(n, grid.dp) for n in elements):,} bytes "
           f"(its whole buckets), ZeRO-2 {zero2_opt.grad_bytes():,} bytes (its owned slices)")
lesson.expect("ZeRO-2's grad_bytes() is the owned slices only: 8 bytes × Σ n_pad/d, 1/d of ZeRO-1's buckets")
lesson.equal("grad_bytes() vs 8 × Σ owned slice lengths, and d × it vs ZeRO-1's padded buckets",
             (zero2_opt.grad_bytes(), grid.dp * zero2_opt.grad_bytes()),
             (owned_bytes, 8 * sum(padded_length(n, grid.dp) for n in elements)))
lesson.expect("the model state per TP-shard parameter: 8 of parameter, then 8 + 16 sharded over d, padding and all")
lesson.equal("8·Ψ + grad_bytes() + state_bytes() vs 8·Ψ + 24·Σ n_pad/d (8 + 24/d a parameter)",
             8 * sum(elements) + zero2_opt.grad_bytes() + zero2_opt.state_bytes(),
             8 * sum(elements) + 24 * sum(padded_length(n, grid.dp) for n in elements) // grid.dp)
lesson.expect("at one micro-batch ZeRO-2 sends ZeRO-1's bytes: one reduce-scatter and one all-gather a bucket")
lesson.equal("traced DP wire bytes of the last step, ZeRO-2 vs ZeRO-1", zero2_bytes, zero_bytes)

# %% [markdown]
# ## ZeRO-3 live: the parameters sharded too, each layer gathered around its use
#
# `DistributedOptimizer(..., stage=3)` cuts its buckets at the layers the model calls one after another — each
# block, the two embeddings, the final norm — one bucket a layer, padded to a multiple of d, as FSDP wraps a
# unit in one flat parameter. At rest every parameter of the model is a read-only placeholder that holds no
# memory; a rank keeps its owned slice of each bucket (`param_bytes()`). Just before a layer's forward its bucket
# is all-gathered and freed after it, and again around its backward; the gradients go as ZeRO-2's. The LM head
# is tied to the word embedding, so it gathers the embedding's bucket for its own forward and backward too: that
# bucket four times a step, every other twice. Nothing is gathered after the step: the owned slices *are* the
# parameters, updated in place.

# %%
lesson.section("ZeRO-3 live: the parameters sharded too, each layer gathered around its use")
zero3_model, zero3_opt, zero3_results, zero3_bytes = train(stage=3)
lesson.expect("ZeRO-3's losses, norms and parameters are plain DP × TP's (other buckets: equal to rounding)")
lesson.close("losses and norms, ZeRO-3 vs plain", [(r.loss, r.grad_norm) for r in zero3_results],
             [(r.loss, r.grad_norm) for r in plain_results], tol=1e-12)
lesson.close("every parameter shard, ZeRO-3 vs plain",
             np.concatenate([p.ravel() for _, p in zero3_model.named_parameters()]),
             np.concatenate([p.ravel() for _, p in plain_model.named_parameters()]), tol=1e-12)
units = zero3_opt.buckets


def unit_name(names: tuple[str, ...]) -> str:
    """The layer a unit bucket holds: its parameters' common dotted prefix."""
    parts = names[0].split(".")[:-1] if len(names) == 1 else os.path.commonprefix([n.split(".") for n in names])
    return ".".join(parts)


lesson.say(table([["bucket", "unit", "elements, padded", "gathers in the last step"]] +
                 [[str(i), unit_name(b.names), f"{n:,}", str(g)] for i, (b, n, g) in
                  enumerate(zip(units, zero3_opt.bucket_sizes, zero3_opt.sharded_params.gathers))]), "")
lesson.expect("every unit's bucket gathered twice (forward, backward), the tied embedding's four times")
lesson.equal("all-gathers of each bucket in the last step", zero3_opt.sharded_params.gathers,
             [4 if b.names == ("transformer.wte.weight",) else 2 for b in units])
lesson.expect("at rest the parameters are the owned slices: 8 bytes × Σ n_pad/d; one unit gathered at a time")
lesson.equal("param_bytes() vs 8 × Σ owned slice lengths of the unit buckets", zero3_opt.param_bytes(),
             8 * sum(len(owned_range(n, grid.dp, grid.dp_rank)) for n in zero3_opt.bucket_sizes))
lesson.equal("the most parameter bytes gathered at once vs the largest unit's bucket",
             zero3_opt.sharded_params.peak_bytes, 8 * max(zero3_opt.bucket_sizes))
wte = next(b.nbytes for b in units if b.names == ("transformer.wte.weight",))
lesson.expect("the bytes: 1.5 × DDP's all-reduce of the same buckets (§7), and the tied head's two gathers")
lesson.equal("traced DP wire bytes of the last step vs 3/2 · all-reduce + 2 · all-gather(wte's bucket)",
             zero3_bytes, 3 * wire_bytes("all_reduce", zero3_opt.total_bytes, grid.dp) // 2
             + 2 * wire_bytes("all_gather", wte, grid.dp))

# %% [markdown]
# ## What to take away
#
# * Each ZeRO stage cuts one more piece of a parameter's state into d owned slices: the optimizer state (1),
#   the gradients (2), the parameters (3). In the ZeRO paper's bytes 16 → 4 + 12/d → 2 + 14/d → 16/d; in Megatron's
#   bf16 recipe 18 → 6 + 12/d → 2 + 16/d → 18/d; Figure 1's 7.5 B parameters on 64 GPUs: 120, 31.4, 16.6, 1.9 GB.
# * The cut is the same at every stage: a bucket padded to ⌈n/d⌉·d, rank r owning [r·n_pad/d, (r + 1)·n_pad/d),
#   through parameter boundaries; the padding is the end of the last slices.
# * ZeRO-1 and ZeRO-2 send DDP's bytes (a reduce-scatter and an all-gather are an all-reduce); ZeRO-3 gathers
#   the parameters twice, before the forward and before the backward: 1.5 times, with two pieces in flight.
# * With TP, each TP rank's shard is sharded over its DP group: t·d GPUs, 1/(t·d) of the sharded state each.
# * Live, ZeRO-1 over TP 2 × DP 2 equals plain DP × TP to 1e-12, with 1/d of the optimizer state; ZeRO-2
#   equals ZeRO-1 bit for bit, sends its bytes, and holds only its owned slices of the gradients; ZeRO-3 holds
#   only its slices of the parameters too, gathers one layer at a time, and sends 1.5 times (plus the tied head).
#
# Exercise: `ex21_zero_stages.py`: `tpsim lesson start 21` copies it into your work folder (`tpsim-work/`), then
# `tpsim check 21`.

# %%
lesson.takeaways()
lesson.finish()
