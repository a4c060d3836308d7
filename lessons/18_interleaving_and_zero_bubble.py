# %% [markdown]
# # Lesson 18 — Interleaving and zero bubble
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/18_interleaving_and_zero_bubble.py` (or `tpsim lesson run 18`;
# as a notebook on as many engines: `tpsim lesson notebook 18`).
#
# The SenseParrots article (§1.1) names pipeline parallelism, parallelism between layers, as one answer to the
# memory of a deeper model, and sets it aside in §3; lesson 17 took it up and found its price: with p
# stages and m micro-batches every stage idles (p − 1)/(m + p − 1) of the step, for GPipe's schedule and 1F1B
# alike, and only more micro-batches shrink that. This lesson takes two ways to a smaller bubble at the same m.
# *Interleaving* gives every rank v small chunks of layers instead of one block, so the pipe fills and drains v
# times faster — paid for in messages and in activations held. *Zero bubble* cuts every backward in two, the
# input gradient that the stage before waits for and the weight gradient that nobody waits for, and moves the
# second half into the idle slots. Both run live on 4 ranks here, beside the MPI-free clock of their lists.
#
# Sources: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM", arXiv:2104.04473, §2.2.2 (the interleaved schedule, its bubble (1/v)·(p − 1)/m, v times the
# communication, m a multiple of p); Megatron-LM's `pipeline_parallel/schedules.py` (the interleaved warm-up
# count (p − i − 1)·2 + (v − 1)·p); Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
# Transformer Models", arXiv:2205.05198, §4 (activation memory: interleaving multiplies the first stage's by
# 1 + (p − 1)/(pv), their m being our v); Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241,
# §2 (the backward as B and W; §2.1 the handcrafted ZB-H1 schedule, its bubble and its memory).

# %%
RANKS = 4

import numpy as np

from tpsim.arch import GPTConfig, architecture_of
from tpsim.comm import ProcessGrid
from tpsim.errors import ConfigError
from tpsim.nn.dropout import DropoutPlan
from tpsim.nn.linear import linear_backward, linear_forward
from tpsim.partition import take_shard
from tpsim.pipeline.actions import COMPUTE, RECVS, SENDS, Schedule, with_messages
from tpsim.pipeline.clock import simulate
from tpsim.pipeline.figure import draw_stacked
from tpsim.pipeline.grid import format_grid
from tpsim.pipeline.interleaved import table as virtual_microbatches, warmup
from tpsim.pipeline.schedules import build, compute_orders
from tpsim.live_pipeline.build import pipeline_from_serial
from tpsim.live_pipeline.clock import bubble_measured
from tpsim.live_pipeline.executor import Executor
from tpsim.live_pipeline.split import split_layers
from tpsim.live_pipeline.step import pipeline_grads
from tpsim.predict.pipeline import bubble_fraction, p2p_bytes
from tpsim.teach.notebook import show_inline
from tpsim.teach.runtime import Lesson, table
from tpsim.tp.random import ExactDropoutRNG

lesson = Lesson("18", RANKS)
P = RANKS
grid = ProcessGrid(tp=1, pp=P)
lesson.say(grid.table(), "")


def everywhere(values, op: str = "sum") -> np.ndarray:
    """``values`` combined over the 4 ranks, the same on every rank; untraced (the lesson's own bookkeeping is
    not pipeline traffic)."""
    with grid.tracer.paused():
        return grid.world.all_reduce(np.array(values, dtype=np.float64), op=op)


def per_stage(value: float) -> list[float]:
    """Every rank's ``value`` in rank order, on every rank."""
    mine = np.zeros(P)
    mine[grid.pp_rank] = value
    return everywhere(mine).tolist()


def compute_of(actions) -> list[str]:
    """A rank's compute actions as the grid writes them: ``F3``, ``B0.1``, ``W2``."""
    return [f"{a.op}{a.microbatch}" + (f".{a.chunk}" if a.chunk else "") for a in actions if a.op in COMPUTE]


# %% [markdown]
# ## Chunks instead of stages
#
# Lesson 17's pipeline gave rank i one block of consecutive layers. Interleaving cuts the model into p·v smaller
# pieces, *virtual stages*, and deals them out round the ranks: rank i holds v *model chunks*, chunk c being
# virtual stage c·p + i (Megatron-LM's layout). A micro-batch then goes round the ranks v times, each visit
# 1/v of lesson 17's stage. A GPT of 16 layers on 4 ranks: v = 1 is lesson 17's cut (4 layers a rank, in one
# block), v = 2 gives every rank two chunks of 2 layers, v = 4 four chunks of one layer. Every rank cuts its
# chunks from the same serial master weights (`tpsim.live_pipeline.build.pipeline_from_serial`), so each pipeline starts
# from the serial model.

# %%
lesson.section("Chunks instead of stages")
SEED, B, S, M = 18, 2, 8, 8  # b sequences of s tokens a micro-batch; m micro-batches a step
cfg = GPTConfig(vocab_size=19, n_positions=S, n_embd=12, n_layer=16, n_head=2, dropout=0.1)
H, VS = cfg.hidden, (1, 2, 4)
serial = architecture_of(cfg).serial(cfg, seed=SEED)
shards = {v: pipeline_from_serial(architecture_of(cfg).serial(cfg, seed=SEED), grid,
                                  split_layers(cfg.layers, P * v, vp=v)) for v in VS}
held = lesson.gather({v: [(c.stage, [b.path.rsplit(".", 1)[1] for b in c.blocks]) for c in shards[v].chunks]
                      for v in VS})
layout_ok = True
if lesson.rank == 0:
    rows = [["rank", "v = 1: stage (layers)", "v = 2: virtual stages (layers)", "v = 4"]]
    for r, mine in enumerate(held):
        rows.append([str(r)] + [", ".join(f"{s} ({'-'.join(dict.fromkeys([ls[0], ls[-1]]))})" for s, ls in mine[v])
                                for v in VS])
        layout_ok &= all([s for s, _ in mine[v]] == [c * P + r for c in range(v)] for v in VS)
    lesson.say(table(rows))
    layers_once = all(sorted(int(n) for mine in held for _, ls in mine[v] for n in ls) == list(range(cfg.layers))
                      for v in VS)
    layout_ok &= layers_once
lesson.expect("rank i holds virtual stages i, p + i, ..., (v - 1)·p + i; every layer on exactly one rank, for v = 1, 2, 4")
lesson.check("chunk c of rank i is virtual stage c·p + i; the 16 layers each once", "v = 1, 2, 4", layout_ok)

# %% [markdown]
# ## The interleaved order, as data
#
# With v chunks a rank has v·m forwards and v·m backwards to order. Megatron-LM takes the forwards in groups
# of p micro-batches, each group through chunk 0, then through chunk 1, and so on — forward k of a rank is
# (micro-batch, chunk) `virtual_microbatches(p, m, v)[k]` — and the backwards in the same order with the chunks
# reversed, since a gradient enters at the last chunk. Rank i runs (p − i − 1)·2 + (v − 1)·p warm-up
# forwards, then one forward and one backward at a time, then the backwards left: the same loop as 1F1B, longer
# warm-ups, because the first gradient now comes back only after micro-batch 0 has gone round all p·v virtual
# stages. Below, the rule written out from those two pieces, and the grid of unit costs (a stage's F = 1 and
# B = 2, so a chunk's F = 1/2 and B = 1 at v = 2; `F3.1` is micro-batch 3 on chunk 1).

# %%
lesson.section("The interleaved order, as data")
lesson.say("forward k of every rank at p 4, m 8, v 2 (micro-batch, chunk): " +
           " ".join(f"{j}.{c}" for j, c in virtual_microbatches(P, M, 2)))


def interleaved_order(p: int, m: int, v: int) -> list[list[tuple[str, int, int]]]:
    """Every rank: its warm-up forwards, then (F, B) pairs, then the backwards left, in Megatron-LM's table order.
    No check of m: the section on m below runs it where Megatron-LM refuses to."""
    forward = [("F", j, c) for j, c in virtual_microbatches(p, m, v)]
    backward = [("B", j, v - 1 - c) for j, c in virtual_microbatches(p, m, v)]
    ranks = []
    for i in range(p):
        warm = warmup(p, i, m, v)
        steady = [a for k in range(v * m - warm) for a in (forward[warm + k], backward[k])]
        ranks.append(forward[:warm] + steady + backward[v * m - warm:])
    return ranks


def as_schedule(name: str, p: int, m: int, v: int, orders) -> Schedule:
    return Schedule(name, p, m, v, tuple(with_messages(p, v, r, order) for r, order in enumerate(orders)))


schedules = {v: build("interleaved", P, M, vp=v) for v in VS}
lesson.expect("the rule above, written here, is tpsim's interleaved schedule, action for action, at v = 2 and 4")
same = all(as_schedule("interleaved", P, M, v, interleaved_order(P, M, v)).ranks == schedules[v].ranks for v in (2, 4))
lesson.check("interleaved_order vs build('interleaved', vp=v)", "the same lists" if same else "different lists", same)
timelines = {v: simulate(s) for v, s in schedules.items()}
lesson.say("interleaved, p 4, m 8, v 2 (unit costs; a column is 1/2):", *format_grid(timelines[2], width=120))
first = {v: [[x[0] for x in compute_of(r)].index("B") for r in s.ranks] for v, s in schedules.items()}
lesson.expect("before its first backward rank i runs its warm-up and one forward more: 2(p - i - 1) + (v - 1)·p + 1 "
              "= 11, 9, 7, 5 at v = 2 (lesson 17's p - i at v = 1)")
lesson.equal("forwards before the first backward, ranks 0-3, v = 2", first[2],
             [2 * (P - i - 1) + P + 1 for i in range(P)])
lesson.equal("the same at v = 1 (1F1B) and v = 4", (first[1], first[4]),
             ([P - i for i in range(P)], [2 * (P - i - 1) + 3 * P + 1 for i in range(P)]))

# %% [markdown]
# ## Interleaving on live ranks
#
# The lists run for real: `tpsim.live_pipeline.executor.Executor` walks rank i's actions, running the forward or
# backward of the chunk each one names, receiving its input from the rank of the virtual stage before and sending its
# output to the one after — rank 3's chunk 0 sends to rank 0's chunk 1. Dropout uses the exact RNG (lesson 07), so the
# loss and every gradient must be the serial model's whatever the schedule, and each chunk's cache lives from its
# F to its B, so the executor's peak of caches is the schedule's own count of (micro-batch, chunk) pairs in flight.

# %%
lesson.section("Interleaving on live ranks")
rng = np.random.default_rng(SEED)
ids = rng.integers(0, cfg.vocab, (B * M, S))
labels = np.roll(ids, -1, axis=1)
loss_serial = serial.loss_and_grads(ids, labels, DropoutPlan(ExactDropoutRNG(SEED), 0))
grads_serial = dict(serial.named_grads())


def live(sch: Schedule, shard):
    """One step of ``sch`` on the 4 ranks: ``(loss, ExecutorResult, this rank's traced events)``."""
    executor = Executor(sch, shard.chunks, grid.pp_group, (B, S, H), np.float64)
    grid.tracer.reset()
    loss, _, result = pipeline_grads(shard, executor, grid, None, ids, labels, rows=np.arange(B * M),
                                     rng=ExactDropoutRNG(SEED), step=0)
    return loss, result, list(grid.tracer.events)


runs = {}
for v in VS:
    loss, result, events = live(schedules[v], shards[v])
    runs[v] = result, events
    entries = list(shards[v].named_entries())
    lesson.expect(f"v = {v}: the ranks ran their lists; the loss and every gradient = serial")
    lesson.check(f"v = {v}: compute actions run = the list, on every rank",
                 f"rank 0 ran {' '.join(r.removesuffix('.0') for r in result.ran[:6])} ...",
                 [r.removesuffix(".0") for r in result.ran] == compute_of(schedules[v].ranks[grid.pp_rank]))
    lesson.close(f"v = {v}: loss vs serial", loss, loss_serial)
    lesson.close(f"v = {v}: every gradient of every rank vs serial (max |difference|)",
                 np.concatenate([e.grad.ravel() for e in entries]),
                 np.concatenate([take_shard(grads_serial[e.name], e.partition).ravel() for e in entries]))
peaks = {v: [int(x) for x in per_stage(runs[v][0].peak_in_flight)] for v in VS}
want = {v: [min(P - i, M) if v == 1 else min(2 * (P - i - 1) + (v - 1) * P + 1, v * M) for i in range(P)] for v in VS}
lesson.expect("the live peak of (micro-batch, chunk) caches on rank i: min(p - i, m) at v = 1, "
              "min(2(p - i - 1) + (v - 1)·p + 1, v·m) interleaved: the forwards before the first backward")
lesson.equal("live peaks of caches held, ranks 0-3, v = 1, 2, 4", [peaks[v] for v in VS], [want[v] for v in VS])

# %% [markdown]
# ## The bubble: (p − 1)/(v·m + p − 1)
#
# Every rank keeps a virtual clock (`tpsim.live_pipeline.clock`, lesson 17): a chunk's F moves it by 1/v, its B by 2/v,
# a message carries its sender's time and a receive waits for it. A rank does the same work at every v,
# m·(t_f + t_b) = 24 units; what shrinks is the fill and the drain. In lesson 17 micro-batch 0 needed p − 1
# whole stages' forwards to reach the last rank and p − 1 backwards to come back; now each of those hops is a
# chunk, 1/v of a stage, so the idle time of a rank is (p − 1)(t_f + t_b)/v and the idle share of the step
# (p − 1)/(v·m + p − 1) — Narayanan et al.'s (1/v)·(p − 1)/m, with the idle time put over the step instead of
# over the busy time.

# %%
lesson.section("The bubble: (p − 1)/(v·m + p − 1)")
rows = [["v", "step (units)", "busy a rank", "idle a rank", "bubble (live clock)", "(p-1)/(v·m+p-1)"]]
clock_ok = True
for v in VS:
    result = runs[v][0]
    ends, busy = per_stage(result.clock.time), per_stage(result.clock.busy)
    step, measured = bubble_measured(list(zip(ends, busy)))
    rows.append([str(v), f"{step:g}", f"{busy[0]:g}", f"{step - busy[0]:g}", f"{measured:.6f}",
                 f"{bubble_fraction('interleaved', P, M, v):.6f}"])
    lesson.expect(f"v = {v}: T = m·3 + (p - 1)·3/v = {M * 3 + (P - 1) * 3 / v:g}; busy 24 on every rank; "
                  f"bubble (p - 1)/(v·m + p - 1) = 3/{v * M + P - 1}")
    lesson.equal(f"v = {v}: step time and busy units per rank (live clocks)", (step, busy),
                 (M * 3 + (P - 1) * 3 / v, [M * 3.0] * P))
    lesson.close(f"v = {v}: bubble {measured:.6f} - (p - 1)/(v·m + p - 1)", measured,
                 bubble_fraction("interleaved", P, M, v), tol=1e-9)
    clock_ok &= (step, busy) == (timelines[v].step, timelines[v].busy)
lesson.say(table(rows, right=(1, 2, 3, 4, 5)))
lesson.expect("the live clocks are the MPI-free simulator's timelines of the same lists (the grid above)")
lesson.check("(step, busy per rank), live vs tpsim.pipeline.clock, v = 1, 2, 4", "equal" if clock_ok else "differ",
             clock_ok)

# %% [markdown]
# ## The price in messages
#
# A plain pipeline has p − 1 cuts; p·v virtual stages have v·p − 1, and every cut carries each micro-batch's
# activation forward and its gradient back, each between two ranks (rank p − 1's chunk c sends to rank 0's
# chunk c + 1). So a step sends 2·m·(v·p − 1) boundary tensors of [b, s, h], 2·m·(v·p − 1)·b·s·h·e
# bytes (e = 8 here, float64): about v times lesson 17's, whatever the number of layers.

# %%
lesson.section("The price in messages")
rows = [["v", "messages sent", "2m(vp-1)", "bytes sent", "bytes received", "2m(vp-1)·bshe"]]
bytes_ok = True
for v in VS:
    events = runs[v][1]
    sends = [e for e in events if e.op == "send"]
    recvs = [e for e in events if e.op == "recv"]
    n_send, sent, received = (int(x) for x in everywhere([len(sends), sum(e.bytes for e in sends),
                                                          sum(e.bytes for e in recvs)]))
    formula = p2p_bytes("interleaved", P, M, v, micro_batch=B, seq_len=S, hidden=H, bytes_per_element=8)
    rows.append([str(v), str(n_send), str(2 * M * (v * P - 1)), f"{sent:,}", f"{received:,}", f"{formula:,.0f}"])
    bytes_ok &= (n_send, sent, received) == (2 * M * (v * P - 1), formula, formula) and \
        {e.shape for e in sends + recvs} <= {(B, S, H)}
lesson.say(table(rows, right=(1, 2, 3, 4, 5)))
lesson.expect("traced: 2·m·(v·p - 1) messages of one [b, s, h] tensor each, 48, 112, 240; the bytes of "
              "tpsim.predict.pipeline.p2p_bytes, sent and received")
lesson.check("messages and bytes, traced vs 2·m·(v·p - 1)·b·s·h·e, v = 1, 2, 4", "see the table", bytes_ok)

# %% [markdown]
# ## The price in activations
#
# A chunk holds 1/v of lesson 17's stage, so a (micro-batch, chunk) pair in flight holds 1/v of a micro-batch's
# activations of that stage: 16/(p·v) layers' worth. Counted in layers, rank 0 of 1F1B holds p micro-batches of
# 4 layers, the 16 layers' worth Korthikanti et al. call L; interleaved it holds 2(p − 1) + (v − 1)·p + 1 pairs
# of 4/v layers, p + (p − 1)/v micro-batches' worth, 1 + (p − 1)/(p·v) times as much: more than 1F1B, but less
# the more chunks there are. Below, each live peak above times the layers of a chunk.

# %%
lesson.section("The price in activations")
layers_held = {v: [k * cfg.layers // (P * v) for k in peaks[v]] for v in VS}
rows = [["v", "layers per chunk", "peak pairs, rank 0", "layers' worth held, ranks 0-3", "rank 0 / L",
         "1 + (p-1)/(pv)"]]
for v in VS:
    rows.append([str(v), str(cfg.layers // (P * v)), str(peaks[v][0]), str(layers_held[v]),
                 f"{layers_held[v][0] / cfg.layers:.4f}", f"{1 + (P - 1) / (P * v):.4f}" if v > 1 else "-"])
lesson.say(table(rows, right=(1, 2, 4, 5)))
lesson.expect("1F1B's rank 0 holds L = 16 layers' worth; interleaved, 16·(1 + (p - 1)/(p·v)) = 22 at v = 2 and 19 at v = 4")
lesson.equal("1F1B: layers' worth held on rank 0 (live)", layers_held[1][0], cfg.layers)
lesson.close("v = 2 and 4: rank 0's layers' worth / L - (1 + (p - 1)/(p·v)), worse of the two",
             [layers_held[v][0] / cfg.layers for v in (2, 4)], [1 + (P - 1) / (P * v) for v in (2, 4)], tol=1e-12)

# %% [markdown]
# ## Why m must be a multiple of p
#
# Megatron-LM's interleaved schedule takes the micro-batches in groups of p, and Narayanan et al. require m to be
# a multiple of p: tpsim refuses the rest in one line. What the rule avoids shows when the same table is run
# with a last group of fewer than p: at m = 6, its last 2 micro-batches go round the chunks in a group too short to
# keep 4 ranks busy, and the ranks wait on each other instead of working.

# %%
lesson.section("Why m must be a multiple of p")
try:
    build("interleaved", P, 6, vp=2)
    refused = "accepted"
except ConfigError as err:
    refused = str(err)
lesson.expect("build('interleaved', p = 4, m = 6, vp = 2) is refused before any work, naming the multiple to take")
lesson.check("m = 6 at v = 2 refused", refused, "must be a multiple of --pp 4" in refused and "try 8" in refused)
short = simulate(as_schedule("interleaved, m 6", P, 6, 2, interleaved_order(P, 6, 2)))
plain = simulate(build("1f1b", P, 6))
lesson.say(f"the table at m = 6, v = 2, run anyway: step {short.step:g} units, bubble {short.bubble_fraction:.4f}; "
           f"(p - 1)/(v·m + p - 1) would be {3 / 15:.4f}, 1F1B's at m = 6 is {plain.bubble_fraction:.4f}")
lesson.expect("run anyway, the lists still check (no deadlock) but the bubble is worse than even 1F1B's at m = 6")
lesson.check("m = 6, v = 2: bubble above 1F1B's (p - 1)/(m + p - 1) = 3/9",
             f"{short.bubble_fraction:.4f} > {plain.bubble_fraction:.4f}", short.bubble_fraction > plain.bubble_fraction)

# %% [markdown]
# ## The backward in two: B and W
#
# Every layer's backward computes two kinds of gradient. For y = x·W: the input gradient dX = dY·Wᵀ, which the
# layer below needs next — so the stage before in the pipeline waits for it — and the weight gradient
# dW = xᵀ·dY, which nothing needs before the optimizer step, after the whole pipeline has drained. Qi et al. call
# them B and W. B needs only dY and the weight; W needs dY and the layer's input x, kept from the forward: so a
# micro-batch's activations are held until its W, not its B. tpsim's own linear layer computes them apart:

# %%
lesson.section("The backward in two: B and W")
x, w = rng.standard_normal((B, S, H)), rng.standard_normal((H, 4 * H))
y, cache = linear_forward(x, w, None)
dy = rng.standard_normal(y.shape)
dx, dw, _ = linear_backward(dy, cache)
lesson.expect("linear_backward's dx is dY·Wᵀ (B: no x needed) and its dW is xᵀ·dY (W: x from the forward), to rounding")
lesson.close("dx vs dY·Wᵀ (B)", dx, dy @ w.T)
lesson.close("dW vs xᵀ·dY summed over the b·s rows (W)", dw, x.reshape(-1, H).T @ dy.reshape(-1, 4 * H))
zb = build("zb-h1", P, M)
quiet = all(prev.op in ("F", "B") for r in zb.ranks for prev, a in zip(r, r[1:]) if a.op in SENDS) and \
    all(nxt.op in ("F", "B") for r in zb.ranks for a, nxt in zip(r, r[1:]) if a.op in RECVS)
lesson.expect("in ZB-H1's lists every send follows the F or B that made it and every receive feeds an F or B: "
              "no W sends or waits for anything")
lesson.check("no message around a W, ZB-H1, p 4, m 8", f"{sum(a.op == 'W' for r in zb.ranks for a in r)} W's, "
             f"{sum(a.op in SENDS for r in zb.ranks for a in r)} sends", quiet)

# %% [markdown]
# Three steps from 1F1B to ZB-H1, at t_F = t_B = t_W = 1 (1F1B's backward is B and W in one, 2 units), m = 8:
#
# 1. *Split, nothing moved*: each W right after its own B. The gradient now crosses a stage in t_B = 1 instead
#    of 2, so the drain is shorter: every rank idles 2(p − 1) units instead of 3(p − 1).
# 2. *Every W at the end of its rank's list*: still a legal schedule — nothing waits for a W — and no slower,
#    but now every stage holds all m micro-batches until its W's come: AFAB's memory.
# 3. *ZB-H1*: stage i keeps 1F1B's F's and B's and runs, after each B from micro-batch i on, the oldest W it
#    owes; the i W's left run at the end — in the slots where 1F1B's early stages sit idle through the drain.

# %%


def w_after_b(orders) -> list[list[tuple[str, int, int]]]:
    """1F1B's orders with each backward cut into B and W, the W right after its B."""
    return [[x for a in o for x in ([a] if a[0] == "F" else [a, ("W", a[1], 0)])] for o in orders]


def w_last(orders) -> list[list[tuple[str, int, int]]]:
    """Every rank's W's moved to the end of its list, in their order."""
    return [[a for a in o if a[0] != "W"] + [a for a in o if a[0] == "W"] for o in orders]


one_f_one_b = compute_orders("1f1b", P, M)
steps = {"1F1B (backward whole, 2)": simulate(build("1f1b", P, M)),
         "split, W right after B": simulate(as_schedule("split", P, M, 1, w_after_b(one_f_one_b))),
         "split, every W at the end": simulate(as_schedule("w last", P, M, 1, w_last(w_after_b(one_f_one_b)))),
         "ZB-H1": simulate(zb)}
rows = [["schedule", "step (units)", "idle a rank", "bubble", "held at most, ranks 0-3"]]
for name, t in steps.items():
    rows.append([name, f"{t.step:g}", f"{t.idle[0]:g}", f"{t.bubble_fraction:.4f}", str(t.peak_in_flight)])
lesson.say(table(rows, right=(1, 2, 3)))
idle = {name: t.idle for name, t in steps.items()}
lesson.expect("idle a rank: 3(p - 1) = 9, then 2(p - 1) = 6 split, 6 with the W's last, p - 1 = 3 under ZB-H1")
lesson.equal("idle units per rank, the four lists", list(idle.values()),
             [[9.0] * P, [6.0] * P, [6.0] * P, [3.0] * P])
held_at_most = [t.peak_in_flight for t in steps.values()]
lesson.expect("held: 1F1B's min(p - i, m) split or not; every W last holds m = 8; ZB-H1 min(p, m) = 4 on every rank")
lesson.equal("peaks in flight, the four lists", held_at_most,
             [[P - i for i in range(P)]] * 2 + [[M] * P, [P] * P])

# %% [markdown]
# ## ZB-H1, as data
#
# The schedule's own lists (`tpsim.pipeline.zero_bubble`, `build("zb-h1", p, m)`): rank i's F's and B's in 1F1B's
# order, and from micro-batch i on the W of micro-batch j right after the B of j + i. The grid at unit costs, and
# the three schedules one under the other on one time scale: the hatched rank-time is the bubble.

# %%
lesson.section("ZB-H1, as data")
lesson.say("zb-h1, p 4, m 8 (t_F = t_B = t_W = 1):", *format_grid(steps["ZB-H1"], width=None))
placed = True
for i, actions in enumerate(zb.ranks):
    order = compute_of(actions)
    placed &= [x for x in order if x[0] != "W"] == compute_of(build("1f1b", P, M).ranks[i])
    placed &= all(order[order.index(f"B{j + i}") + 1] == f"W{j}" for j in range(M - i))
    placed &= order[-i:] == [f"W{j}" for j in range(M - i, M)] if i else True
lesson.expect("on rank i: 1F1B's F's and B's; W j right after B j + i; the last i W's at the end")
lesson.check("ZB-H1's W's where the rule puts them, every rank", "rank 1: " + " ".join(compute_of(zb.ranks[1])[:10])
             + " ...", placed)
if lesson.rank == 0:
    lesson.out.mkdir(parents=True, exist_ok=True)
    path = draw_stacked([steps["1F1B (backward whole, 2)"], timelines[2], steps["ZB-H1"]],
                        lesson.out / f"18_1f1b_interleaved_zbh1_pp{P}_m{M}.png",
                        titles=[f"1F1B: bubble {timelines[1].bubble_fraction:.4f}",
                                f"interleaved, v 2: bubble {timelines[2].bubble_fraction:.4f}",
                                f"ZB-H1 (F = B = W = 1): bubble {steps['ZB-H1'].bubble_fraction:.4f}"])
    lesson.say(f"wrote {path}")
    if lesson.notebook:
        show_inline(path)

# %% [markdown]
# ## The ZB-H1 bubble: (p − 1)/(3m + p − 1)
#
# With m ≥ p, every rank of ZB-H1 is idle only before its first B — p − 1 units, a third of 1F1B's 3(p − 1) —
# and busy 3m, so the step is 3m + p − 1 and the idle share (p − 1)/(3m + p − 1). Memory: a micro-batch is held
# from its F to its W; rank i's warm-up is i forwards shorter than rank 0's and its W's lag its B's by i
# micro-batches, so every rank holds min(p, m) — what 1F1B's rank 0 holds, and so the same peak over the pipeline (the later ranks
# hold more than under 1F1B, never more than rank 0).

# %%
lesson.section("The ZB-H1 bubble: (p − 1)/(3m + p − 1)")
t, ref = steps["ZB-H1"], steps["1F1B (backward whole, 2)"]
lesson.expect("step 3m + p - 1 = 27; idle p - 1 = 3 a rank, a third of 1F1B's 9; bubble 3/27")
lesson.equal("ZB-H1: step, idle per rank", (t.step, t.idle), (3 * M + P - 1, [P - 1.0] * P))
lesson.close(f"ZB-H1: bubble {t.bubble_fraction:.6f} - (p - 1)/(3m + p - 1)", t.bubble_fraction,
             (P - 1) / (3 * M + P - 1), tol=1e-9)
lesson.close("ZB-H1's idle per rank / 1F1B's - 1/3", np.array(t.idle) / np.array(ref.idle), np.full(P, 1 / 3))
lesson.expect("the most any rank holds: min(p, m) = 4 for both")
lesson.equal("peak over the ranks, ZB-H1 and 1F1B", (max(t.peak_in_flight), max(ref.peak_in_flight)), (P, P))

# %% [markdown]
# ## Fewer micro-batches than stages
#
# ZB-H1 hides the drain behind W's, and a rank has m of them. With m < p there are too few: the last rank
# alternates F and B and ends its last B at p + 2m − 1, that gradient needs p − 1 more units to reach rank 0,
# whose last W closes the step at 2m + 2p − 1. Each rank idles 2p − 1 − m of it, and the bubble is
# (2p − 1 − m)/(2m + 2p − 1): above (p − 1)/(3m + p − 1), still below 1F1B's (p − 1)/(m + p − 1). At m = p the
# two formulas meet.

# %%
lesson.section("Fewer micro-batches than stages")
rows = [["m", "step", "idle a rank", "bubble zb-h1", "(2p-1-m)/(2m+2p-1)", "(p-1)/(3m+p-1)", "1f1b"]]
small_ok, worst = True, 0.0
for m in range(1, P + 1):
    t, plain = simulate(build("zb-h1", P, m)), simulate(build("1f1b", P, m))
    formula = (2 * P - 1 - m) / (2 * m + 2 * P - 1)
    rows.append([str(m), f"{t.step:g}", f"{t.idle[0]:g}", f"{t.bubble_fraction:.6f}", f"{formula:.6f}",
                 f"{(P - 1) / (3 * m + P - 1):.6f}", f"{plain.bubble_fraction:.6f}"])
    worst = max(worst, abs(t.bubble_fraction - formula))
    small_ok &= t.step == 2 * m + 2 * P - 1 and t.idle == [2 * P - 1.0 - m] * P
    small_ok &= plain.bubble_fraction > t.bubble_fraction >= (P - 1) / (3 * m + P - 1) - 1e-12
    small_ok &= (t.bubble_fraction > (P - 1) / (3 * m + P - 1) + 1e-12) == (m < P)
lesson.say(table(rows, right=(0, 1, 2, 3, 4, 5, 6)))
lesson.expect("m = 1..4: step 2m + 2p - 1, idle 2p - 1 - m; the bubble (2p - 1 - m)/(2m + 2p - 1)")
lesson.check("bubble vs (2p - 1 - m)/(2m + 2p - 1), worst over m = 1..4", f"{worst:.1e} (tolerance 1e-09)",
             worst <= 1e-9)
lesson.expect("below 1F1B's at every m; above (p - 1)/(3m + p - 1) exactly when m < p")
lesson.check("step, idle and the order of the three bubbles, m = 1..4", "see the table", small_ok)

# %% [markdown]
# ## What changes with m
#
# All four bubbles on the clock for m up to 32 (interleaved only where m is a multiple of p), against their
# formulas, and drawn: interleaving divides the fill and drain by v, ZB-H1 by 3 in rank-time at m ≥ p, and all
# of them still fall only as 1/m. m·b is the batch the optimizer sees, so these are the ways to a small bubble
# that leave the batch alone.

# %%
lesson.section("What changes with m")
curves = {"1f1b": ("1f1b", 1), "interleaved v 2": ("interleaved", 2), "interleaved v 4": ("interleaved", 4),
          "zb-h1": ("zb-h1", 1)}
measured = {name: {} for name in curves}
worst = 0.0
for name, (schedule, v) in curves.items():
    for m in range(1, 33):
        if schedule == "interleaved" and m % P:
            continue
        got = simulate(build(schedule, P, m, vp=v)).bubble_fraction
        measured[name][m] = got
        worst = max(worst, abs(got - bubble_fraction(schedule, P, m, v)))
rows = [["m"] + list(curves)] + [[str(m)] + [f"{measured[n][m]:.4f}" if m in measured[n] else "-" for n in curves]
                                  for m in (1, 2, 4, 8, 16, 32)]
lesson.say(table(rows, right=(0, 1, 2, 3, 4)))
lesson.expect("every measured bubble = its formula (tpsim.predict.pipeline.bubble_fraction), m = 1..32")
lesson.check("bubble vs formula, four schedules, worst over m", f"{worst:.1e} (tolerance 1e-09)", worst <= 1e-9)
order_ok = all(measured["zb-h1"][m] < measured["interleaved v 2"][m] < measured["1f1b"][m]
               and measured["interleaved v 4"][m] < measured["interleaved v 2"][m] for m in measured["interleaved v 2"])
lesson.expect("at every m where all run: ZB-H1 < interleaved v 2 < 1F1B, and v 4 < v 2")
lesson.check("the order of the bubbles, m = 4, 8, ..., 32", "see the table", order_ok)
if lesson.rank == 0:
    plt = lesson.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in measured.items():
        ms = sorted(points)
        ax.plot(ms, [points[m] for m in ms], marker="o", markersize=3, label=f"{name} (virtual clock)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble: idle share of the step")
    ax.set_title(f"bubble vs m, p = {P}, unit costs")
    ax.legend(fontsize=8)
    lesson.save(fig, f"18_bubble_vs_m_pp{P}.png")

# %% [markdown]
# ## ZB-H1 on live ranks
#
# Running B and W apart means keeping, after a B, what its W still needs: every layer with weights hands its
# weight gradient to `Module.weight_grad`, which inside `tpsim.nn.module.deferred_weight_grads` queues it with
# exactly the tensors it reads (a linear's input x and its dY) instead of adding it. The executor runs a B under
# that deferral and sends its dX at once; the W action runs the queue — the dW matmuls really happen there — and
# only then is the micro-batch's memory free. The same 4 ranks run `build("zb-h1", 4, 8)`: the loss and every
# gradient must still be the serial model's, each rank must hold min(p, m) micro-batches at most, and the live
# clocks must give the schedule's bubble, 3/27.

# %%
lesson.section("ZB-H1 on live ranks")
loss_zb, result_zb, events_zb = live(zb, shards[1])
entries = list(shards[1].named_entries())
lesson.expect("the ranks ran ZB-H1's list, W's included; the loss and every gradient = serial")
lesson.check("ZB-H1: compute actions run = the list, on every rank",
             f"rank 0 ran ... {' '.join(r.removesuffix('.0') for r in result_zb.ran[-6:])}",
             [r.removesuffix(".0") for r in result_zb.ran] == compute_of(zb.ranks[grid.pp_rank]))
lesson.close("ZB-H1: loss vs serial", loss_zb, loss_serial)
lesson.close("ZB-H1: every gradient of every rank vs serial (max |difference|)",
             np.concatenate([e.grad.ravel() for e in entries]),
             np.concatenate([take_shard(grads_serial[e.name], e.partition).ravel() for e in entries]))
peaks_zb = [int(x) for x in per_stage(result_zb.peak_in_flight)]
lesson.expect("a micro-batch is held from its F to its W: min(p, m) = 4 on every rank")
lesson.equal("ZB-H1: live peaks of micro-batches held, ranks 0-3", peaks_zb, [min(P, M)] * P)
ends, busy = per_stage(result_zb.clock.time), per_stage(result_zb.clock.busy)
step_zb, measured_zb = bubble_measured(list(zip(ends, busy)))
t_zb = simulate(zb)
lesson.expect(f"the live clocks = the simulator's: step 3m + p - 1 = {3 * M + P - 1}, busy 3m = {3 * M} a rank, "
              f"bubble (p - 1)/(3m + p - 1) = 3/{3 * M + P - 1}")
lesson.equal("ZB-H1: step time and busy units per rank (live clocks)", (step_zb, busy), (t_zb.step, t_zb.busy))
lesson.close(f"ZB-H1: bubble {measured_zb:.6f} - (p - 1)/(3m + p - 1)", measured_zb,
             bubble_fraction("zb-h1", P, M), tol=1e-9)
p2p_zb = everywhere([sum(e.bytes for e in events_zb if e.op == "send")])[0]
p2p_1f1b = everywhere([sum(e.bytes for e in runs[1][1] if e.op == "send")])[0]
lesson.expect("the W's send nothing: ZB-H1 moves 1F1B's bytes, 2·m·(p - 1)·b·s·h·e")
lesson.equal("ZB-H1 p2p bytes = 1F1B's (live traces)", p2p_zb, p2p_1f1b)

# %% [markdown]
# ## What to take away
#
# * Interleaving gives each rank v chunks, virtual stages c·p + i: the fill and drain shrink v times, the bubble
#   is (p − 1)/(v·m + p − 1) on the clock, and the loss and gradients are still the serial model's.
# * It costs messages, 2·m·(v·p − 1)·b·s·h·e bytes a step instead of 2·m·(p − 1)·b·s·h·e, and activations:
#   rank 0 holds 1 + (p − 1)/(p·v) times 1F1B's; Megatron-LM's table needs m to be a multiple of p.
# * Zero bubble splits the backward into B (dX, which the stage before waits for) and W (dW, which nothing
#   waits for); ZB-H1 slides the W's into the drain: p − 1 idle units a rank, a third of 1F1B's, bubble
#   (p − 1)/(3m + p − 1) at m ≥ p, with 1F1B's peak of min(p, m) micro-batches.
# * With m < p there are too few W's to fill the drain: (2p − 1 − m)/(2m + 2p − 1).
# * On live ranks the split is real: B sends dX at once, W runs the queued dW matmuls later, and the
#   loss, the gradients, the peak and the bubble come out as the serial model and the clock say.
#
# Exercise: `ex18_interleaving_and_zero_bubble.py`: `tpsim lesson start 18` copies it into your work folder
# (`tpsim-work/`), then `tpsim check 18`.

# %%
lesson.takeaways()
lesson.finish()
