# %% [markdown]
# # Lesson 14 — ZeRO-1 × TP: who owns which slice of the optimizer
#
# Runs on **8 ranks**: `mpirun -n 8 python lessons/14_zero1_with_tp.py` (or `tpsim lesson run 14`;
# as a notebook on as many engines: `tpsim lesson notebook 14`).
#
# Under data parallelism every DP replica runs the same AdamW step on the same averaged gradients, so every
# replica keeps the same exp_avg and exp_avg_sq — d copies of the largest piece of model state. ZeRO stage 1
# (Rajbhandari et al. 2019) keeps the step and splits its work: each DP rank receives the averaged 1/d slice
# of the gradients (the full gradient buffer stays on every rank), updates only the parameters of that slice,
# and keeps optimizer state only for it. Megatron-LM's *distributed optimizer* is exactly this, on top of
# tensor parallelism:
#
#     grads  ── reduce-scatter over DP ──▶ my 1/d slice, averaged
#     AdamW on my slice (m and v for 1/d of the parameters)
#     params ◀── all-gather over DP ──── every rank's updated slice
#
# The SenseParrots article sets TP beside ZeRO (its reference 1) as the two ways to fit a bigger model. This
# lesson runs both together on a TP(2) × DP(4) grid: the owned slices of a padded gradient buffer, the bytes
# (a reduce-scatter plus an all-gather is an all-reduce; in bf16 mixed precision 3/4 of one), equality with
# plain DP × TP, and memory per rank.
#
# Sources: Rajbhandari et al. 2019, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
# arXiv:1910.02054, §5 (stages 1–3: P_os, P_os+g, P_os+g+p) and Figure 1; Megatron-LM's
# `docs/source/api-guide/dist_optimizer.md` (the bytes-per-parameter table); Shoeybi et al. 2019, "Megatron-LM",
# arXiv:1909.08053; the SenseParrots article, §3.1 (DP + TP the Megatron way).

# %%
RANKS = 8

import numpy as np

from fractions import Fraction

from tpsim.comm import ProcessGrid
from tpsim.cost import wire_bytes
from tpsim.data import ReverseTask
from tpsim.demo.tour_parts import read_batch
from tpsim.models.build import build_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.nn.precision import bfloat16
from tpsim.plan.comm import dp_wire_bytes
from tpsim.plan.layout import Layout
from tpsim.teach.runtime import Lesson, table
from tpsim.predict.memory import param_elements
from tpsim.predict.model_state import MEGATRON_LAYOUTS, StateLayout, format_formula, zero_optimizer_bytes
from tpsim.partition import owned_range, owned_segments, padded_length
from tpsim.train import AdamW, GradSync, mixed_precision, train_step
from tpsim.train.zero import DistributedOptimizer

lesson = Lesson("14", RANKS)
grid = ProcessGrid(tp=2, dp=4)
lesson.say(grid.table(), "")

# %% [markdown]
# ## Who owns which slice
#
# The gradients of one TP rank are packed, last layer first, into flat buckets (as DDP packs them). A bucket is
# closed before a parameter that would push it past the cap, so a parameter larger than the cap gets a bucket
# of its own (here each MLP weight shard: 288 float64 elements, 2,304 bytes against a 2,000-byte cap). A
# bucket of `n` elements is padded with zeros to `n_pad = ⌈n/d⌉·d` so that a reduce-scatter can split it
# evenly, and DP rank r owns positions `[r·n_pad/d, (r+1)·n_pad/d)`. Every range here is `[start, stop)`: the
# stop is excluded, as in a Python slice and in exercise 14. The slices ignore parameter boundaries: a parameter
# can straddle two owners, and each updates its own piece (AdamW is element-wise, so a piece is as good as the
# whole). `owned_segments` says which piece of which parameter falls in a slice; the padding is the end of the
# last rank's slice, owned like any other element but belonging to no parameter.

# %%
lesson.section("Who owns which slice")
config = GPTConfig(vocab_size=19, n_positions=8, n_embd=12, n_layer=2, n_head=4)  # odd sizes: padding
SEED, BATCH, STEPS, CLIP, CAP = 5, 8, 4, 0.5, 2000  # CAP bytes: several buckets, some weights larger than it


def adamw(model):
    return AdamW(model, lr=1e-2, weight_decay=0.1, no_decay=lambda n: n.endswith("bias"))


def short(name: str) -> str:
    """``transformer.h.1.attn.c_proj.weight`` -> ``h.1.attn.c_proj.weight``: attn's c_proj, not mlp's."""
    return name.removeprefix("transformer.")


model = build_gpt(config, grid.tp_group, seed=SEED)
zero = DistributedOptimizer(adamw(model), grid, bucket_cap_bytes=CAP)
sizes = {name: p.size for name, p in model.named_parameters()}
elements = [sum(sizes[name] for name in b.names) for b in zero.buckets]
rows = [["bucket", "parameters", "gradient elements", "bytes", "padded elements", f"DP rank {grid.dp_rank} owns"]]
for b, (bucket, n) in enumerate(zip(zero.buckets, elements)):
    names = [short(name) for name in bucket.names]
    rows.append([str(b), names[0] if len(names) == 1 else f"{len(names)}: {names[0]} … {names[-1]}", str(n),
                 f"{n * 8:,}", str(len(zero.buffers[b])), f"[{zero.owned[b].start}, {zero.owned[b].stop})"])
lesson.say(f"TP rank {grid.tp_rank}'s buckets (cap {CAP:,} bytes, float64):", table(rows), "")
alone = [len(b.names) == 1 for b, n in zip(zero.buckets, elements) if n * 8 > CAP]
lesson.expect("a parameter larger than the cap sits alone in its bucket; every other bucket stays under the cap")
lesson.check("buckets over the cap hold one parameter, the rest fit", f"{len(alone)} buckets over the cap",
             len(alone) > 0 and all(alone) and all(n * 8 <= CAP for b, n in zip(zero.buckets, elements)
                                                   if len(b.names) > 1))

padded_first = [b for b, n in enumerate(elements) if n % grid.dp]
first = (padded_first or [0])[0]  # a bucket that needs padding, to see it
bucket, n = zero.buckets[first], elements[first]
n_pad, shard = padded_length(n, grid.dp), padded_length(n, grid.dp) // grid.dp
bounds = np.cumsum([0] + [sizes[name] for name in bucket.names])  # parameter i: bucket [bounds[i], bounds[i+1])


def bucket_picture() -> list[str]:
    """The bucket as text: one letter per parameter, · for padding, | between the DP ranks' slices."""
    per = 2 if all(int(x) % 2 == 0 for x in (*bounds, shard)) else 1  # elements per character, to scale
    cells = "".join(chr(65 + i) * sizes[name] for i, name in enumerate(bucket.names)) + "·" * (n_pad - n)
    slices = [cells[r * shard:(r + 1) * shard:per] for r in range(grid.dp)]
    width = shard // per
    ruler = "".join(f"{r * shard:<{width + 1}}" for r in range(grid.dp)) + str(n_pad)
    return [f"bucket {first} of TP rank {grid.tp_rank}, one character = {per} element{'s' if per > 1 else ''}:",
            "  " + " " + " ".join(f" DP rank {r} ".center(width, "─") for r in range(grid.dp)),
            "  |" + "|".join(slices) + "|", "  " + ruler, *[
                f"  {chr(65 + i)}  {short(name):<28} bucket [{bounds[i]}, {bounds[i + 1]})"
                for i, name in enumerate(bucket.names)], f"  ·  {'padded elements':<28} bucket [{n}, {n_pad})"]


def slice_text(r: int) -> str:
    pieces = [f"{short(bucket.names[s.index])} [{s.start}, {s.stop})"
              for s in owned_segments([sizes[name] for name in bucket.names], grid.dp, r)]
    pad = max(0, min(n_pad, (r + 1) * shard) - max(n, r * shard))
    return ", ".join(pieces + ([f"padded elements [{n_pad - pad}, {n_pad}) of the bucket"] if pad else []))


rows = [["DP rank", "owns of the bucket", "pieces: [start, stop) counted inside each parameter"]]
rows += [[str(r), f"[{owned_range(n, grid.dp, r).start}, {owned_range(n, grid.dp, r).stop})", slice_text(r)]
         for r in range(grid.dp)]
lesson.say(*bucket_picture(), "", f"{n} gradient elements + {n_pad - n} padded elements = {n_pad}, "
           f"{grid.dp} slices of {shard}:", table(rows), "")
if lesson.rank == 0:
    plt = lesson.pyplot()
    fig, ax = plt.subplots(figsize=(10, 2.6))
    palette = ["#4C72B0", "#55A868", "#C44E52", "#8172B2", "#CCB974", "#64B5CD", "#DD8452"]
    for i, name in enumerate(bucket.names):
        ax.barh(0, sizes[name], left=bounds[i], height=0.6, color=palette[i % len(palette)], edgecolor="white")
        label = short(name) if sizes[name] > 0.2 * n_pad else "\n.".join(short(name).rsplit(".", 1))
        ax.text((bounds[i] + bounds[i + 1]) / 2, 0, label, ha="center", va="center", fontsize=7, color="white")
    ax.barh(0, n_pad - n, left=n, height=0.6, color="#DDDDDD", hatch="///", edgecolor="#888888")
    ax.annotate(f"padded elements [{n}, {n_pad})", (n + (n_pad - n) / 2, -0.3), (n_pad - 2, -0.75), ha="right",
                fontsize=8, arrowprops={"arrowstyle": "->", "color": "#555555"})
    for r in range(grid.dp):
        ax.axvline(r * shard, color="black", lw=1.5)
        ax.text((r + 0.5) * shard, 0.5, f"DP rank {r}\nowns [{r * shard}, {(r + 1) * shard})", ha="center",
                va="bottom", fontsize=8)
    ax.axvline(n_pad, color="black", lw=1.5)
    ax.set_xlim(0, n_pad)
    ax.set_ylim(-1, 1.2)
    ax.set_yticks([])
    ticks = {*bounds, *range(0, n_pad + 1, shard)} - ({n} if n_pad - n < 4 else set())  # 126 would hide 128
    ax.set_xticks(sorted(int(x) for x in ticks))
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("position in the bucket (parameter boundaries and slice boundaries)", fontsize=8)
    ax.set_title(f"ZeRO-1: bucket {first} of TP rank {grid.tp_rank}, {n} gradient elements padded to {n_pad}, "
                 f"cut into d = {grid.dp} owned slices", fontsize=9)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    lesson.save(fig, "14_zero1_bucket.png")

ranges = grid.dp_group.gather_objects([(r.start, r.stop) for r in zero.owned])
lesson.expect("the DP ranks' slices tile every padded bucket exactly once, in rank order")
tiles = ranges is None or all([ranges[r][b] for r in range(grid.dp)] ==
                              [(r * len(buf) // grid.dp, (r + 1) * len(buf) // grid.dp) for r in range(grid.dp)]
                              for b, buf in enumerate(zero.buffers))
lesson.check("owned ranges of every bucket, gathered over the DP group", f"{len(zero.buckets)} buckets", tiles)
live = [(p.name, p.start, p.start + p.param.size) for p in zero.slices[first]]
table_rows = [(bucket.names[s.index], s.start, s.stop)
              for s in owned_segments([sizes[name] for name in bucket.names], grid.dp, grid.dp_rank)]
padding = grid.dp_group.gather_objects(len(zero.buffers[first][zero.owned[first].start:zero.owned[first].stop])
                                       - sum(p.param.size for p in zero.slices[first]))
lesson.expect("the table's pieces are the ones each DP rank's optimizer updates, and only the last slice holds "
              "the padding")
lesson.check(f"bucket {first}: the live optimizer's pieces vs the table, on every rank",
             f"{len(live)} pieces on this rank", live == table_rows)
lesson.equal(f"bucket {first}: owned elements that belong to no parameter, per DP rank",
             padding if padding is not None else [0] * (grid.dp - 1) + [n_pad - n],
             [0] * (grid.dp - 1) + [n_pad - n])

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
# them — on the reduced slice. When gradients and parameters share a dtype (float64 here: both halves move
# 8-byte elements) it therefore sends exactly what DDP sends; the buffer is only larger by the padding. In bf16
# mixed precision the two halves carry different dtypes, and ZeRO-1 sends 3/4 of DDP's bytes (next section).

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
# ## ZeRO-1 in mixed precision: 3/4 of the bytes
#
# Megatron's bf16 recipe (the table's `bf16 params, fp32 grads` row below; lesson 15) keeps bfloat16
# parameters and float32 main gradients. DDP all-reduces the float32 gradients: `2(d−1)/d · 4` bytes per
# element. The distributed optimizer reduce-scatters the same float32 buckets (`(d−1)/d · 4`), steps the
# float32 main parameters of its slice, rounds them to bfloat16 and all-gathers those (`(d−1)/d · 2`): 6 bytes
# against 8, **3/4 of DDP's**, times the padding. tpsim's planner prices ZeRO-1 the same way
# (`tpsim.plan.comm.dp_collectives`: the reduce-scatter at the gradients' bytes, the all-gather at the
# parameters'). One step of the same model in bfloat16, each way, traced:

# %%
lesson.section("ZeRO-1 in mixed precision: 3/4 of the bytes")


def one_bf16_step(use_zero: bool):
    """One clipped AdamW step of the GPT in bfloat16: (the gradient sync, this rank's traced gradient and
    parameter collectives over DP; the loss normaliser's 16-byte all-reduce is left out, as above)."""
    m = build_gpt(config, grid.tp_group, seed=SEED, dtype=bfloat16)
    if use_zero:
        opt = sync = DistributedOptimizer(adamw(m), grid, bucket_cap_bytes=CAP)
    else:
        opt, sync = mixed_precision(m, adamw, grid.world), GradSync(m, grid.dp_group, bucket_cap_bytes=CAP)
    grid.tracer.reset()
    ids, labels, _ = read_batch(grid, task, SEED, 0, BATCH)
    train_step(m, opt, grid, sync, ids, labels, clip=CLIP)
    return sync, [e for e in grid.tracer.events if e.group == "dp" and e.scope.startswith(("ddp", "zero"))]


ddp16, ddp16_events = one_bf16_step(use_zero=False)
zero16, zero16_events = one_bf16_step(use_zero=True)


def per_element(e) -> int:
    return e.bytes // int(np.prod(e.shape))


rows = [["one bf16 step, this rank", "dtype", "bytes per element", "calls", "bytes", "wire bytes"]]
for label, events, op in (("DDP all-reduce (fp32 grads)", ddp16_events, "all_reduce"),
                          ("ZeRO-1 reduce-scatter (fp32 grads)", zero16_events, "reduce_scatter"),
                          ("ZeRO-1 all-gather (bf16 params)", zero16_events, "all_gather")):
    mine = [e for e in events if e.op == op]
    rows.append([label, ", ".join(sorted({e.dtype for e in mine})), ", ".join(sorted({str(per_element(e))
                 for e in mine})), str(len(mine)), f"{sum(e.bytes for e in mine):,}",
                 f"{sum(e.wire_bytes for e in mine):,}"])
lesson.say(table(rows), "")
kinds = sorted({(e.op, e.dtype, per_element(e)) for e in ddp16_events + zero16_events})
lesson.expect("DDP and the reduce-scatter move float32 gradients (4 bytes an element), the all-gather bfloat16 "
              "parameters (2)")
lesson.equal("(op, dtype, bytes per element) of the DP collectives", kinds,
             [("all_gather", "bfloat16", 2), ("all_reduce", "float32", 4), ("reduce_scatter", "float32", 4)])
ddp_wire = sum(e.wire_bytes for e in ddp16_events)
zero_wire = sum(e.wire_bytes for e in zero16_events)
ddp_elements = sum(len(b) for b in ddp16.buffers)
zero_elements = sum(len(b) for b in zero16.buffers)  # padded to multiples of d
lesson.expect("ZeRO-1 sends 3/4 of DDP's wire bytes, up to the padding: exactly 3/4 of a ring all-reduce of the "
              "padded float32 buckets")
lesson.equal("4 × ZeRO-1 wire bytes = 3 × all-reduce wire bytes of the padded buckets",
             4 * zero_wire, 3 * sum(wire_bytes("all_reduce", len(b) * 4, grid.dp) for b in zero16.buffers))
lesson.check("ZeRO-1 / DDP wire bytes = 3/4 × padded / unpadded elements",
             f"{zero_wire:,} / {ddp_wire:,} = {zero_wire / ddp_wire:.4f} = 3/4 × {zero_elements:,} / {ddp_elements:,}",
             4 * zero_wire * ddp_elements == 3 * ddp_wire * zero_elements)
layout = dict(tp=grid.tp, dp=grid.dp, dtype="bfloat16")
lesson.expect("the planner's DP bytes (tpsim.plan.comm) for these elements are the traced ones")
lesson.equal("dp_wire_bytes(zero 0, bfloat16), dp_wire_bytes(zero 1, bfloat16) vs the trace",
             (dp_wire_bytes(Layout(zero=0, **layout), ddp_elements), dp_wire_bytes(Layout(zero=1, **layout),
                                                                                    zero_elements)),
             (ddp_wire, zero_wire))

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
# As d grows the sharded part vanishes and what is left is what ZeRO-1 does not touch: the parameters and
# gradients in their training dtypes (2 + 4 bytes in bf16, 4 + 4 in fp32, 2 + 2 in fp16). ZeRO-2 shards the
# gradients too and ZeRO-3 the parameters as well (Rajbhandari et al.'s P_os+g and P_os+g+p; `--zero 2` and
# `--zero 3`, lesson 21): per parameter, in the bf16 row, ZeRO-1 leaves 6 + 12/d bytes, ZeRO-2 2 + 16/d, ZeRO-3 18/d.
# The same arithmetic with the paper's fp16 bytes (2 + 2, K = 12) gives its Figure 1 (7.5 B parameters,
# d = 64). Tensor parallelism divides nearly all of the model state by t (LayerNorms and row-parallel biases
# stay whole) and most activations (all of them with sequence parallelism, lessons 10 and 16) — which is why
# the two are used together.

# %%


def zero_stage_bytes(row: StateLayout, stage: int, d: int) -> Fraction:
    """Bytes per parameter under ZeRO stage 1, 2 or 3: what the stage keeps whole, plus the rest ÷ d."""
    kept = {1: row.param + row.grad, 2: row.param, 3: 0}[stage]
    return kept + Fraction(row.replicated + row.sharded - kept, d)


bf16_row = MEGATRON_LAYOUTS[1]
rows = [[f"{bf16_row.name}, bytes per parameter", *[f"d = {d}" for d in (1, 4, 64)]]]
rows += [[f"ZeRO-{stage}", *[f"{float(zero_stage_bytes(bf16_row, stage, d)):g}" for d in (1, 4, 64)]]
         for stage in (1, 2, 3)]
lesson.say(table(rows), "")
lesson.expect("bf16 row: ZeRO-1 = the table's 6 + 12/d, ZeRO-2 = 2 + 16/d, ZeRO-3 = 18/d; all 18 at d = 1")
formulas = [zero_stage_bytes(bf16_row, stage, d) == kept + Fraction(rest, d)
            for stage, kept, rest in ((1, 6, 12), (2, 2, 16), (3, 0, 18)) for d in (1, 2, 4, 8, 64)]
lesson.check("ZeRO-1, 2, 3 at d = 1, 2, 4, 8, 64 vs 6 + 12/d, 2 + 16/d, 18/d (exact fractions)",
             f"{sum(formulas)} of {len(formulas)} equal", all(formulas))
lesson.equal("ZeRO-1 at d = 4 for the three rows vs the distributed optimizer's formula above",
             [float(zero_stage_bytes(row, 1, 4)) for row in MEGATRON_LAYOUTS],
             [float(row.bytes_per_parameter(4, distributed=True)) for row in MEGATRON_LAYOUTS])
paper = StateLayout("ZeRO paper: fp16 params and grads, K = 12", 2, 2, 0, 0, 12)
gb = [round(7.5e9 * float(zero_stage_bytes(paper, stage, 64) if stage else paper.bytes_per_parameter()) / 1e9, 1)
      for stage in (0, 1, 2, 3)]
lesson.expect("Rajbhandari et al.'s Figure 1 (7.5 B parameters, d = 64): 120, 31.4, 16.6 and 1.9 GB")
lesson.equal("GB per GPU: baseline, ZeRO-1, ZeRO-2, ZeRO-3", gb, [120.0, 31.4, 16.6, 1.9])

# %% [markdown]
#
# ## What to take away
#
# * ZeRO-1 = reduce-scatter (dp_sync) → the optimizer on my 1/d slice → all-gather (optimizer): the same
#   result as DDP, 1/d of the optimizer state, and DDP's bytes when gradients and parameters share a dtype —
#   in bf16 mixed precision (fp32 gradients, bf16 parameters) 3/4 of them.
# * Buckets are padded to a multiple of d; rank r owns `[r·n_pad/d, (r+1)·n_pad/d)`, whatever parameters
#   that cuts through; the padding is the end of the last rank's slice.
# * The clip norm sums every rank's slices over the world, counting TP-replicated parameters on TP rank 0.
# * Bytes per parameter: fp32 16 → 8 + 8/d; bf16 params + fp32 grads 18 → 6 + 12/d; fp16 20 → 4 + 16/d.
#   ZeRO-2 and ZeRO-3 shard the gradients and then the parameters too: 2 + 16/d and 18/d in the bf16 row.
#
# Exercise: `owned_range` and `owned_pieces` in `ex14_zero1_with_tp.py`: `tpsim lesson start 14` copies it into your
# work folder (`tpsim-work/`), then `tpsim check 14`.

# %%
lesson.takeaways()
lesson.finish()
