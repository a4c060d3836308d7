# %% [markdown]
# # Lesson 08 — Data × tensor parallelism: the rank grid, the broadcasts, DDP
#
# Runs on **8 ranks**: `mpirun -n 8 python lessons/08_data_times_tensor_parallel.py` (or `tpsim lesson run 08`;
# as a notebook on as many engines: `tpsim lesson notebook 08`).
#
# Tensor parallelism splits one model over a few devices; data parallelism runs several copies of that split
# model on different rows of the batch. With 8 ranks: 2 replicas (DP = 2), each a model split 4 ways (TP = 4).
# This lesson builds the grid, shows how §3.1 of the SenseParrots article ("the Megatron way") keeps all
# copies equal — parameters broadcast once, the batch broadcast inside each TP group every step — averages the
# gradients over the DP groups the way PyTorch's DDP does, and trains a tiny GPT that stays equal to the
# serial model.
#
# Sources: the SenseParrots article, §3.1; Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3 (model
# and data parallelism combined); Narayanan et al. 2021, arXiv:2104.04473 (TP inside a server, DP across
# servers); Li et al. 2020, "PyTorch Distributed", arXiv:2006.15704 (DDP's gradient buckets).

# %%
RANKS = 8

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.data import ReverseTask
from tpsim.models.build import build_gpt, serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.teach.runtime import Lesson, shard_error
from tpsim.train import (AdamW, GradSync, broadcast_batch, broadcast_params, check_replicas, compute_grads,
                         dp_slice, train_step)

lesson = Lesson("08", RANKS)

# %% [markdown]
# ## The grid is one reshape
#
# Megatron puts the ranks of a TP group next to each other (inside one node, on the fast links). Then the
# whole grid is `arange(8).reshape(dp, tp)`: row i is TP group i, column j is DP group j, and every rank's
# coordinates are `tp_rank = rank % tp`, `dp_rank = rank // tp`. A DP group holds the ranks that own *the
# same shard* in different replicas — those are the ones whose gradients must be averaged.

# %%
lesson.section("The grid is one reshape")
grid = ProcessGrid(tp=4, dp=2)
tracer = grid.tracer
lesson.say(grid.table(), "")
lesson.say(*(lesson.gather(f"  {grid.describe()}:  TP group {list(grid.tp_group.ranks)}, "
                           f"DP group {list(grid.dp_group.ranks)}") or []), "")
lesson.expect("rows of arange(8).reshape(2, 4) are the TP groups, columns the DP groups")
lesson.equal("TP groups", grid.tp_groups, [[0, 1, 2, 3], [4, 5, 6, 7]])
lesson.expect("a DP group is a column: the ranks that hold the same shard in the two replicas")
lesson.equal("DP groups", grid.dp_groups, [[0, 4], [1, 5], [2, 6], [3, 7]])
lesson.expect("each rank's coordinates fall out of its number: the remainder and the quotient by tp")
lesson.equal("(tp_rank, dp_rank) = (rank % 4, rank // 4) on every rank", (grid.tp_rank, grid.dp_rank),
             (grid.rank % 4, grid.rank // 4))

# %% [markdown]
# ## Start equal — broadcast the parameters (the SenseParrots article, §3.1)
#
# Every rank draws its model from a seed. Suppose replica 1 was started from another seed, and one rank's
# LayerNorm drifted. `check_replicas` compares a hash of every parameter: replicated parameters across each
# TP group, all parameters across each DP group. Averaging gradients cannot repair a difference in the
# *weights*, so `broadcast_params` first copies TP rank 0's replicated parameters over its TP group, then
# DP rank 0's parameters over each DP group.

# %%
lesson.section("Start equal — broadcast the parameters (the SenseParrots article, §3.1)")
config = GPTConfig(vocab_size=13, n_positions=8, n_embd=16, n_layer=1, n_head=4)
SEED = 1234
model = build_gpt(config, grid.tp_group, seed=SEED + grid.dp_rank)  # replica 1 drew different weights
if grid.tp_rank == 2:
    model.transformer.ln_f.params["weight"] += 1e-3  # and rank 2 (and 6) let a LayerNorm drift
report = check_replicas(model, grid)
lesson.say(f"before: {len(report.mismatches)} mismatches, e.g. "
           f"{'; '.join(f'{m.name} in {m.group.upper()} group {list(m.ranks)}' for m in report.mismatches[:2])}")
lesson.expect("the drifted LayerNorm shows in a TP group, the other seed in every DP group")
lesson.equal("mismatched groups found before the broadcasts", sorted({m.group for m in report.mismatches}),
             ["dp", "tp"])

tracer.reset()
broadcast_params(model, grid)
params = list(model.named_partitions())
n_replicated = sum(part is None for _, part in params)
lesson.expect("one TP broadcast per replicated parameter, one DP broadcast per parameter — and then no mismatch")
lesson.equal("TP-group broadcasts = replicated parameters",
             len(tracer.select(phase="init", op="broadcast", group="tp")), n_replicated)
lesson.equal("DP-group broadcasts = all parameters", len(tracer.select(phase="init", op="broadcast", group="dp")),
             len(params))
report = check_replicas(model, grid)
lesson.say(f"after: {report.summary()}", "")
lesson.expect("after the broadcasts every replicated parameter agrees over TP and every parameter over DP")
lesson.equal("replicas consistent after the broadcasts", report.ok, True)

# %% [markdown]
# ## §3.1 of the SenseParrots article again: the batch
#
# Every rank of a TP group must see the same rows (they compute slices of the same activations), and the DP
# replicas must see different rows. Megatron reads the data on TP rank 0 only and broadcasts it over the TP
# group; DP rank d takes rows `[d·B/dp, (d+1)·B/dp)` of the global batch.

# %%
lesson.section("§3.1 of the SenseParrots article again: the batch")
task = ReverseTask(config.vocab_size, 8)
BATCH = 8


def read_batch(step: int):
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    if grid.tp_rank == 0:  # the only rank that "reads from disk"
        ids, labels = (t[rows] for t in task.batch(SEED, step, BATCH))
    else:  # only the shape matters: the broadcast fills it
        ids = labels = np.zeros((BATCH // grid.dp, task.seq_len), np.int64)
    return broadcast_batch(grid, ids, labels)


ids, labels = read_batch(0)
global_ids, global_labels = task.batch(SEED, 0, BATCH)
lesson.expect("what TP rank 0 read reached its whole TP group; DP rank d holds rows [d·B/dp, (d+1)·B/dp)")
lesson.equal("every rank holds its DP replica's rows of the global batch",
             bool(np.array_equal(ids, global_ids[dp_slice(BATCH, grid.dp, grid.dp_rank)])), True)

# %% [markdown]
# ## DDP on the DP group, in buckets
#
# After backward, each replica holds the gradient of *its* rows. The replicas must all apply the gradient of
# the *global* batch: an all-reduce (sum) over the DP group, divided by dp. Each rank averages only its own
# shards, with their twins in the other replica. Like PyTorch's DDP, `GradSync` packs the gradients into a few
# flat **buckets** (last layers first, as backward produces them), so the all-reduces are few and large
# instead of one per tensor. A small cap (4 KiB) makes several buckets here.

# %%
lesson.section("DDP on the DP group, in buckets")
sync = GradSync(model, grid.dp_group, bucket_cap_bytes=4096)
lesson.say(sync.describe(), "")
tracer.reset()
loss, tokens = compute_grads(model, grid, sync, ids, labels)

serial = serial_gpt(config, seed=SEED)
loss_serial = serial.loss_and_grads(global_ids, global_labels)
lesson.expect("after the DP average the replicas hold the global batch's loss and gradients: serial, to rounding")
lesson.close(f"loss of the global batch vs serial {loss_serial:.6f}", loss, loss_serial)
lesson.expect("each rank's gradient shard, averaged with its DP twin, is the slice of the serial gradient")
lesson.close("every gradient shard after the DP average vs the serial gradients",
             shard_error(model, dict(serial.named_grads())), 0.0)

ddp_calls = [e for e in tracer.select(phase="dp_sync", op="all_reduce") if e.scope.startswith("ddp.")]
lesson.expect("one all-reduce per bucket, and together they carry every local gradient exactly once")
lesson.equal("DP all-reduces = buckets", len(ddp_calls), len(sync.buckets))
lesson.expect(f"the buckets together carry all {sync.total_bytes} bytes of local gradients, none twice")
lesson.equal("bytes all-reduced = every local gradient once", sum(e.bytes for e in ddp_calls), sync.total_bytes)
lesson.say(f"(one all-reduce per tensor would have been {len(params)} calls instead of {len(sync.buckets)})", "")

# %% [markdown]
# ## Training stays equal to serial
#
# Three steps of AdamW with gradient clipping, on every rank, against the same three steps of the serial model
# on the global batch. The replicas must still agree bit for bit, and every shard must still be a slice of the
# serial model's parameters.

# %%
lesson.section("Training stays equal to serial")
optimizer = AdamW(model, lr=1e-2, weight_decay=0.0)
serial_optimizer = AdamW(serial, lr=1e-2, weight_decay=0.0)
for step in range(3):
    ids, labels = read_batch(step)
    train_step(model, optimizer, grid, sync, ids, labels, clip=1.0)
    serial.loss_and_grads(*task.batch(SEED, step, BATCH))
    norm = float(np.sqrt(sum(np.sum(g * g) for _, g in serial.named_grads())))
    for _, g in serial.named_grads():  # the serial model's clip: the same rule, no ranks
        g *= min(1.0, 1.0 / (norm + 1e-6))
    serial_optimizer.step()

lesson.expect("after 3 steps the replicas still agree bit for bit and every shard is the serial slice")
lesson.equal("replicas consistent after 3 steps", check_replicas(model, grid).ok, True)
lesson.expect("three AdamW steps with clipping later, every shard is still the serial parameter's slice")
lesson.close("after 3 steps, every parameter shard vs the serial model's",
             shard_error(model, dict(serial.named_parameters()), grads=False), 0.0, tol=1e-10)

# %% [markdown]
# ## A picture of the grid

# %%
lesson.section("A picture of the grid")
if lesson.rank == 0:
    plt = lesson.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 2.8))
    ax.imshow(grid.layout // grid.tp, cmap="Pastel1", vmin=0, vmax=8)  # one colour per TP group
    for (i, j), r in np.ndenumerate(grid.layout):
        ax.text(j, i, f"rank {r}\ntp {j}, dp {i}", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(grid.tp), [f"DP group {j}" for j in range(grid.tp)])
    ax.set_yticks(range(grid.dp), [f"TP group {i}" for i in range(grid.dp)])
    ax.set_title("TP(4) × DP(2): rows split the model, columns average the gradients", fontsize=10)
    fig.tight_layout()
    lesson.save(fig, "08_grid.png")

# %% [markdown]
# ## What to take away
#
# * The grid is `arange(world).reshape(dp, tp)`: TP groups are rows, DP groups are columns.
# * Broadcast parameters once (replicated ones in TP, all in DP) and the batch every step (in TP).
# * Average each shard's gradient over its DP group — in buckets — and the replicas never drift.
#
# Exercise: `average_gradients` in `ex08_data_times_tensor_parallel.py`: `tpsim lesson start 08` copies it into your
# work folder (`tpsim-work/`), then `tpsim check 08`.

# %%
lesson.takeaways()
lesson.finish()
