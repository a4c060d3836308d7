# %% [markdown]
# # Lesson 17 — Pipelines: stages, AFAB and 1F1B, the bubble
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/17_pipelines.py` (or `tpsim lesson run 17`;
# as a notebook on as many engines: `tpsim lesson notebook 17`).
#
# Tensor parallelism splits every matmul and pays collectives inside every layer: lesson 16 found it sending
# hundreds of times DP's bytes, which is why it stays on a node's fast links. Pipeline parallelism cuts the
# model the other way: the stack of layers is cut into p *stages*, stage i on its own GPU, and between two
# stages only the activation at the cut travels — forward to the next stage, its gradient back. The price is
# time: a stage can only work when a micro-batch is there for it. This lesson runs a GPT cut into 4 stages on
# 4 ranks, under GPipe's schedule and under 1F1B, and measures what the papers derive: how many micro-batches
# each stage holds, how long it waits (the *bubble*), and how many bytes cross between stages.
#
# Sources: Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism",
# arXiv:1811.06965, §2.2–2.3 (micro-batches, the bubble (K − 1)/(M + K − 1)); Narayanan et al. 2021,
# "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", arXiv:2104.04473, §2.2
# (§2.2.1 the PipeDream-Flush or 1F1B schedule and its memory, §2.2.2 interleaving); Megatron-LM's
# `pipeline_parallel/schedules.py` (the warm-up count p − i − 1); Qi et al. 2023, "Zero Bubble Pipeline
# Parallelism", arXiv:2401.10241, §2.1.

# %%
RANKS = 4

import numpy as np

from tpsim.arch import GPTConfig, architecture_of
from tpsim.comm import ProcessGrid
from tpsim.nn.dropout import DropoutPlan
from tpsim.partition import take_shard
from tpsim.pipeline.actions import COMPUTE, SENDS, Schedule, with_messages
from tpsim.pipeline.clock import simulate
from tpsim.pipeline.figure import draw
from tpsim.pipeline.grid import format_grid
from tpsim.pipeline.schedules import build
from tpsim.live_pipeline.build import pipeline_from_serial
from tpsim.live_pipeline.clock import bubble_measured
from tpsim.live_pipeline.executor import Executor
from tpsim.live_pipeline.split import split_layers
from tpsim.live_pipeline.step import pipeline_grads
from tpsim.predict.pipeline import bubble_fraction
from tpsim.teach.notebook import show_inline
from tpsim.teach.runtime import Lesson, table
from tpsim.tp.random import ExactDropoutRNG

lesson = Lesson("17", RANKS)
P = RANKS
grid = ProcessGrid(tp=1, pp=P)
lesson.say(grid.table(), "")


def everywhere(values, op: str = "sum") -> np.ndarray:
    """``values`` combined over the 4 ranks, the same on every rank; untraced (the lesson's own bookkeeping is
    not pipeline traffic)."""
    with grid.tracer.paused():
        return grid.world.all_reduce(np.array(values, dtype=np.float64), op=op)


def per_stage(value: float) -> list[float]:
    """Every stage's ``value`` in stage order, on every rank (stage i puts its value at position i)."""
    mine = np.zeros(P)
    mine[grid.pp_rank] = value
    return everywhere(mine).tolist()


# %% [markdown]
# ## Layers across GPUs
#
# A GPT of 8 layers, cut into 4 stages of 2 layers each (`tpsim.live_pipeline.split`: an even split, as Megatron-LM
# does without uneven stages). Stage 0 also holds the embedding, the last stage the final LayerNorm, the LM head
# and the loss; every rank draws the whole serial model from the same seed and keeps its stage
# (`tpsim.live_pipeline.build.pipeline_from_serial`), so the pipeline starts from exactly the serial model's weights.
# GPT-2 ties the LM head to the word embedding, so that one matrix lives on the first *and* the last stage, and
# its two gradients are summed over the two (Megatron's embedding group): lesson 08's replicas, on two ranks.
#
# What crosses from stage i to stage i + 1 is one tensor: the activation after stage i's last layer, [b, s, h]
# for a micro-batch of b sequences of s tokens; in the backward its gradient, the same shape, comes back.

# %%
lesson.section("Layers across GPUs")
SEED, B, S = 17, 2, 8  # b sequences of s tokens a micro-batch
cfg = GPTConfig(vocab_size=19, n_positions=S, n_embd=12, n_layer=8, n_head=2, dropout=0.1)
H = cfg.hidden
stages = split_layers(cfg.layers, P)
shard = pipeline_from_serial(architecture_of(cfg).serial(cfg, seed=SEED), grid, stages)
mine = {e.name: e.param.size for e in shard.named_entries()}
held = lesson.gather(mine)
serial_names = set(cfg.param_shapes())
names_ok = True
if lesson.rank == 0:
    rows = [["stage (rank)", "layers", "also", "parameters", "elements"]]
    for i, names in enumerate(held):
        ends = (["embedding"] if i == 0 else []) + (["ln_f, LM head (tied), loss"] if i == P - 1 else [])
        rows.append([f"{i} ({grid.pp_group.ranks[i]})", f"h.{stages[i][0]}-h.{stages[i][-1]}", ", ".join(ends) or "-",
                     str(len(names)), f"{sum(names.values()):,}"])
    lesson.say(table(rows, right=(3, 4)))
    twice = sorted({n for i, a in enumerate(held) for b in held[i + 1:] for n in set(a) & set(b)})
    names_ok = set().union(*held) == serial_names and twice == ["transformer.wte.weight"]
    lesson.say(f"held by two stages: {', '.join(twice)}")
lesson.expect("the stages hold every serial parameter once, but the tied word embedding: on stage 0 and stage 3")
lesson.check("every parameter on one stage, wte on the first and the last", f"{len(serial_names)} parameters",
             names_ok)

# %% [markdown]
# ## Two schedules, as data
#
# One batch through one stage at a time would leave p − 1 of the p GPUs idle. GPipe (Huang et al. 2019) cuts
# the batch into m *micro-batches* and sends them through one behind the other, so that stage i works on
# micro-batch j while stage i + 1 works on j − 1. Its schedule, *all forwards, all backwards* (AFAB), runs the m
# forwards, then the m backwards: every stage keeps the activations of all m micro-batches (or, recomputing
# them as GPipe does, their inputs) until their backwards come.
#
# *1F1B* (PipeDream-Flush, Narayanan et al. 2021 §2.2.1; Megatron-LM's schedule without interleaving) starts the
# backwards as early as it can: stage i runs p − i − 1 *warm-up* forwards, then alternates one forward and one
# backward, then drains the backwards left. At its first backward it has run p − i forwards (the warm-up and one
# more), and from then on every forward it adds is matched by a backward that frees one: it never holds more than
# p − i micro-batches — m if m is smaller. The same steps, in another order.
#
# In tpsim a schedule is data: every rank's list of actions, forwards F, backwards B and the sends and receives
# they imply (`tpsim.pipeline`; `SEND_F0→2` posts micro-batch 0's activation to rank 2, `RECV_B0←2` waits for its
# gradient from there), checked before anything runs (every send its receive, no deadlock). Timed on
# unit costs — a forward takes 1, a backward 2, messages are free — it is the picture of every pipeline paper: a
# row per stage, a column per unit of time, `F3` the forward of micro-batch 3, `.` idle.

# %%
lesson.section("Two schedules, as data")
M = 8
schedules = {name: build(name, P, M) for name in ("afab", "1f1b")}
timelines = {name: simulate(s) for name, s in schedules.items()}  # simulate checks the lists first
for name, t in timelines.items():
    lesson.say(f"{name}, p = {P}, m = {M}:", *format_grid(t, width=None), "")
lesson.say("stage 1's 1F1B list with its messages: " + " ".join(map(str, schedules["1f1b"].ranks[1][:12])) + " ...")


def forwards_before_first_backward(actions) -> int:
    ops = [a.op for a in actions if a.op in COMPUTE]
    return ops.index("B")


first = {name: [forwards_before_first_backward(r) for r in s.ranks] for name, s in schedules.items()}
lesson.expect("before its first backward, 1F1B's stage i runs p - i forwards (its p - i - 1 warm-ups and one); AFAB m")
lesson.equal("1F1B: forwards before the first backward, stages 0-3", first["1f1b"], [P - i for i in range(P)])
lesson.equal("AFAB: forwards before the first backward, stages 0-3", first["afab"], [M] * P)
if lesson.rank == 0:
    lesson.out.mkdir(parents=True, exist_ok=True)
    for name, t in timelines.items():
        path = draw(t, lesson.out / f"17_{name}_pp{P}_m{M}.png",
                    title=f"{name}: p {P}, m {M}, F 1, B 2 (unit costs); hatched: idle")
        lesson.say(f"wrote {path}")
        if lesson.notebook:
            show_inline(path)

# %% [markdown]
# ## Why p − i − 1 warm-up forwards
#
# Another way to say 1F1B: stage i runs a forward whenever it holds fewer than p − i micro-batches, and a
# backward otherwise. Cap each stage one lower (the last stays at 1: it holds the micro-batch it works on), and
# the stages run out of work before the gradients come back: every one of them waits longer. Cap it one higher,
# and the step is no shorter — the gradient of micro-batch 0 cannot come back sooner — but every stage holds one
# micro-batch more. `capped` writes such a list for any caps; the virtual clock times it.

# %%
lesson.section("Why p − i − 1 warm-up forwards")


def capped(caps: list[int], m: int) -> Schedule:
    """Stage i: a forward while it holds fewer than ``caps[i]`` micro-batches (and forwards are left), else the
    oldest backward."""
    compute = []
    for cap in caps:
        order, held, f, b = [], 0, 0, 0
        while b < m:
            if f < m and held < cap:
                order, held, f = order + [("F", f, 0)], held + 1, f + 1
            else:
                order, held, b = order + [("B", b, 0)], held - 1, b + 1
        compute.append(order)
    return Schedule("capped", len(caps), m, 1, tuple(with_messages(len(caps), 1, r, c) for r, c in enumerate(compute)))


caps = [P - i for i in range(P)]
lesson.expect("capping stage i at p - i is 1F1B, action for action")
same = capped(caps, M).ranks == schedules["1f1b"].ranks
lesson.check("capped at p - i vs build('1f1b')", "the same lists" if same else "different lists", same)
lower, higher = simulate(capped([max(c - 1, 1) for c in caps], M)), simulate(capped([c + 1 for c in caps], M))
rows = [["caps", "step (units)", "bubble", "held at most, stages 0-3"]]
for label, t in (("p - i - 1, at least 1", lower), ("p - i (1F1B)", timelines["1f1b"]), ("p - i + 1", higher)):
    rows.append([label, f"{t.step:g}", f"{t.bubble_fraction:.4f}", str(t.peak_in_flight)])
lesson.say(table(rows, right=(1, 2)))
lesson.expect("one lower: a longer step; one higher: the same step, one more micro-batch held on every stage")
lesson.check("caps one lower: longer step", f"{lower.step:g} vs {timelines['1f1b'].step:g} units",
             lower.step > timelines["1f1b"].step)
lesson.check("caps one higher: the same step, one more held",
             f"{higher.step:g} units, held {higher.peak_in_flight}",
             higher.step == timelines["1f1b"].step
             and higher.peak_in_flight == [k + 1 for k in timelines["1f1b"].peak_in_flight])

# %% [markdown]
# ## The pipeline on live ranks
#
# Now the lists run for real: on each rank `tpsim.live_pipeline.executor.Executor` reads its stage's actions one by one
# — receive micro-batch j's activation, run the stage's forward on it and keep the cache, send the output on;
# later receive its gradient, run the backward and free that cache at once. So the number of caches a rank holds
# is the schedule's, and the executor records its peak. Gradients add up over the micro-batches; the loss is the
# mean over every token of the m·b sequences, as the serial model computes it on the whole batch
# (`tpsim.live_pipeline.step`), dropout with the exact RNG (lesson 07) so that every mask is the serial model's. The
# grids above name ranks; here rank i is stage i.

# %%
lesson.section("The pipeline on live ranks")
rng = np.random.default_rng(SEED)


def batch(m: int) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(0, cfg.vocab, (B * m, S))
    return ids, np.roll(ids, -1, axis=1)


def live(name: str, m: int, ids: np.ndarray, labels: np.ndarray):
    """One step of schedule ``name`` with m micro-batches on the 4 ranks: ``(schedule, loss, ExecutorResult)``."""
    sch = build(name, P, m)
    executor = Executor(sch, shard.chunks, grid.pp_group, (B, S, H), np.float64)
    grid.tracer.reset()
    loss, _, result = pipeline_grads(shard, executor, grid, None, ids, labels, rows=np.arange(B * m),
                                     rng=ExactDropoutRNG(SEED), step=0)
    return sch, loss, result


serial = architecture_of(cfg).serial(cfg, seed=SEED)
ids, labels = batch(M)
loss_serial = serial.loss_and_grads(ids, labels, DropoutPlan(ExactDropoutRNG(SEED), 0))
grads_serial = dict(serial.named_grads())
runs, traced = {}, {}
for name in ("afab", "1f1b"):
    sch, loss, result = live(name, M, ids, labels)
    entries = list(shard.named_entries())
    runs[name], traced[name] = result, list(grid.tracer.events)
    lesson.expect(f"{name}: the stage ran its list's compute actions in order; the loss and every gradient = serial")
    planned = [f"{a.op}{a.microbatch}.{a.chunk}" for a in sch.ranks[grid.pp_rank] if a.op in COMPUTE]
    lesson.check(f"{name}: compute actions run = the list, on every stage",
                 f"stage 0 ran {' '.join(r.removesuffix('.0') for r in result.ran[:6])} ...", result.ran == planned)
    lesson.close(f"{name}: loss vs serial", loss, loss_serial)
    lesson.close(f"{name}: every gradient of every stage vs serial (max |difference|)",
                 np.concatenate([e.grad.ravel() for e in entries]),
                 np.concatenate([take_shard(grads_serial[e.name], e.partition).ravel() for e in entries]))
    peaks = per_stage(result.peak_in_flight)
    want = [M] * P if name == "afab" else [min(P - i, M) for i in range(P)]
    lesson.expect(f"{name}: the caches held at once on stage i peak at " +
                  ("m = 8 on every stage" if name == "afab" else "min(p - i, m): 4, 3, 2, 1"))
    lesson.equal(f"{name}: live peak of micro-batches held, stages 0-3", [int(x) for x in peaks], want)

# %% [markdown]
# ## The bubble, on the virtual clock
#
# Wall-clock time cannot show a bubble here: 4 ranks share this machine's cores, and a waiting rank hands its core
# to a working one. So every rank also keeps a *virtual clock* (`tpsim.live_pipeline.clock`): a forward moves it by 1, a
# backward by 2, a message carries its sender's clock, and a receive sets the receiver's to the later of the two —
# waiting for a message is idle time. The data still moves through real MPI; only time is modelled, the same on
# any machine.
#
# With equal stages the step takes T = (m + p − 1)(t_f + t_b): m micro-batches' work on one stage, plus p − 1
# forwards and p − 1 backwards of filling and draining the pipe. Every stage is busy m(t_f + t_b) of it and idle
# (p − 1)(t_f + t_b), so the idle share of the pipeline's time is (p − 1)/(m + p − 1) — GPipe's bubble, for AFAB
# and 1F1B alike (the order of a stage's work changes what it holds, not how long it waits). Narayanan et al.
# write the same idle time over the busy time instead: (p − 1)/m.

# %%
lesson.section("The bubble, on the virtual clock")
for name, result in runs.items():
    ends, busy = per_stage(result.clock.time), per_stage(result.clock.busy)
    step, measured = bubble_measured(list(zip(ends, busy)))
    idle = [step - b for b in busy]
    lesson.say(f"{name}: step {step:g} units; busy per stage {busy}, idle {idle}")
    lesson.expect(f"{name}: T = (m + p - 1)·3 = 33; each stage busy m·3 = 24, idle (p - 1)·3 = 9; "
                  "bubble (p - 1)/(m + p - 1) = 3/11; idle/busy (p - 1)/m")
    lesson.equal(f"{name}: step time on the virtual clock (units)", step, (M + P - 1) * 3)
    lesson.equal(f"{name}: busy and idle units per stage", (busy, idle), ([M * 3.0] * P, [(P - 1) * 3.0] * P))
    lesson.close(f"{name}: bubble {measured:.6f} - (p - 1)/(m + p - 1)", measured, bubble_fraction("1f1b", P, M),
                 tol=1e-9)
    lesson.close(f"{name}: idle / busy - (p - 1)/m", idle[0] / busy[0], (P - 1) / M, tol=1e-9)
    t = timelines[name]
    lesson.expect(f"{name}: the live clocks are the simulator's timeline (what the grid above drew)")
    lesson.equal(f"{name}: (step, busy per stage), live vs tpsim.pipeline.clock", (step, busy),
                 (t.step, t.busy))

# %% [markdown]
# ## Bytes between stages
#
# Every message went through the tracer, recorded once by its sender (`send`) and once by its receiver
# (`recv`). Each of the p − 1 cuts carries m activations forward and m gradients back, each one micro-batch's
# [b, s, h] tensor of e bytes an element (8 here, float64): 2·m·(p − 1)·b·s·h·e bytes a step, however many layers
# a stage holds — where TP sends collectives inside every layer (lesson 11). Besides the messages, two calls cross
# between ranks once a step: the tied word embedding's gradient, [V, h], all-reduced between stage 0 and stage 3,
# and the step's loss with its token count, [2], broadcast from the last stage to every stage so that all report
# it. (The layers' TP calls run on groups of one rank here, tp = 1, and move nothing.)

# %%
lesson.section("Bytes between stages")
for name, events in traced.items():
    sends = [e for e in events if e.op == "send"]
    recvs = [e for e in events if e.op == "recv"]
    shapes = {e.shape for e in sends + recvs}
    mine = {(e.op, e.shape, e.group) for e in events if e.op not in ("send", "recv") and e.group_size > 1}
    gathered = lesson.gather(mine)  # every rank takes part; rank 0 gets the list
    others = sorted(set().union(*gathered)) if lesson.rank == 0 else None
    n_send, sent, received = everywhere([len(sends), sum(e.bytes for e in sends), sum(e.bytes for e in recvs)])
    want = 2 * M * (P - 1) * B * S * H * 8
    lesson.expect(f"{name}: 2·m·(p - 1) = {2 * M * (P - 1)} messages of [b, s, h] = [{B}, {S}, {H}]; "
                  f"2·m·(p - 1)·b·s·h·e = {want:,} bytes, sent and received")
    lesson.check(f"{name}: every message is one [b, s, h] tensor", f"shapes {sorted(shapes)}",
                 shapes <= {(B, S, H)})
    lesson.equal(f"{name}: messages sent by the 4 stages", int(n_send), 2 * M * (P - 1))
    lesson.equal(f"{name}: bytes sent, bytes received (traced)", (int(sent), int(received)), (want, want))
    lesson.expect(f"{name}: besides them, only the tied embedding's all-reduce (stages 0, 3) and the loss broadcast")
    between = [("all_reduce", (cfg.vocab, H), "embedding"), ("broadcast", (2,), "pp")]
    lesson.check(f"{name}: other calls between ranks, all stages (op, shape, group)", f"{others}",
                 lesson.rank != 0 or others == between)  # the stages' calls are gathered on rank 0

# %% [markdown]
# ## What changes with m
#
# More micro-batches shrink the bubble: (p − 1)/(m + p − 1) goes from 3/4 at m = 1 (one batch, one stage at a
# time) to 3/35 at m = 32. GPipe (§2.3) found it negligible in practice from m ≥ 4p, partly because its
# recomputation fills some of the idle time; on the unit clock, at m = 4p = 16 it is still 3/19. And m·b is the
# batch the optimizer sees, so m cannot grow for free; under AFAB every stage holds all m micro-batches, under
# 1F1B stage 0 holds min(p, m) of them, never more than p however large m grows. The same live pipeline, one step
# per m and schedule:

# %%
lesson.section("What changes with m")
rows = [["m", "step (units)", "bubble, afab", "bubble, 1f1b", "(p-1)/(m+p-1)", "stage 0 holds, afab", "1f1b"]]
worst, peaks_ok = 0.0, True
for m in (1, 2, 4, 8, 16, 32):
    ids, labels = batch(m)
    row = {}
    for name in ("afab", "1f1b"):
        _, _, result = live(name, m, ids, labels)
        step, measured = bubble_measured(list(zip(per_stage(result.clock.time), per_stage(result.clock.busy))))
        peaks = per_stage(result.peak_in_flight)
        row[name] = (step, measured, int(peaks[0]))
        worst = max(worst, abs(measured - bubble_fraction("1f1b", P, m)))
        peaks_ok &= peaks == ([m] * P if name == "afab" else [min(P - i, m) for i in range(P)])
    rows.append([str(m), f"{row['1f1b'][0]:g}", f"{row['afab'][1]:.6f}", f"{row['1f1b'][1]:.6f}",
                 f"{bubble_fraction('1f1b', P, m):.6f}", str(row["afab"][2]), str(row["1f1b"][2])])
lesson.say(table(rows, right=(0, 1, 2, 3, 4, 5, 6)))
lesson.expect("at every m both bubbles are (p - 1)/(m + p - 1); AFAB holds m on every stage, 1F1B min(p - i, m)")
lesson.check("bubble vs (p - 1)/(m + p - 1), worst over the table", f"{worst:.1e} (tolerance 1e-09)", worst <= 1e-9)
lesson.check("peaks: AFAB m, 1F1B min(p - i, m), every m and stage", "see the table", peaks_ok)

# %% [markdown]
# ## What comes next
#
# Two ideas make the bubble smaller without more micro-batches, and a later lesson runs them live. *Interleaving*
# (Narayanan et al. 2021 §2.2.2) gives each rank v smaller chunks of layers instead of one — rank i holds virtual
# stages i, p + i, … — so the pipe fills and drains in 1/v of the time: (p − 1)/(v·m + p − 1), at the price of
# more messages, 2m(v·p − 1) a step instead of 2m(p − 1): every boundary between virtual stages is a cut.
# *Zero bubble* schedules (Qi et al. 2023) split each backward into the input gradient B,
# which the stage before waits for, and the weight gradient W, which nobody waits for, and slide the W's into the
# idle slots; their ZB-H1 (B = W = 1, F = 1) leaves (p − 1)/(3m + p − 1). The same schedule lists, on the
# virtual clock:

# %%
lesson.section("What comes next")
later = {"interleaved": simulate(build("interleaved", P, M, vp=2)), "zb-h1": simulate(build("zb-h1", P, M))}
lesson.say(f"interleaved (v 2) and zb-h1, p {P}, m {M}: bubble {later['interleaved'].bubble_fraction:.6f} and "
           f"{later['zb-h1'].bubble_fraction:.6f}, against 1F1B's {timelines['1f1b'].bubble_fraction:.6f}")
lesson.expect("interleaved: (p - 1)/(2m + p - 1) = 3/19; ZB-H1: (p - 1)/(3m + p - 1) = 3/27; both below 1F1B's 3/11")
lesson.check("both below 1F1B's bubble at the same p and m", f"{later['interleaved'].bubble_fraction:.4f}, "
             f"{later['zb-h1'].bubble_fraction:.4f} < {timelines['1f1b'].bubble_fraction:.4f}",
             max(t.bubble_fraction for t in later.values()) < timelines["1f1b"].bubble_fraction)
lesson.close("interleaved v = 2, minus (p - 1)/(v·m + p - 1)", later["interleaved"].bubble_fraction,
             bubble_fraction("interleaved", P, M, 2), tol=1e-9)
lesson.close("zb-h1, minus (p - 1)/(3m + p - 1)", later["zb-h1"].bubble_fraction, (P - 1) / (3 * M + P - 1), tol=1e-9)
sends = {name: sum(a.op in SENDS for r in t.schedule.ranks for a in r)
         for name, t in (*later.items(), ("1f1b", timelines["1f1b"]))}
lesson.expect("messages a step: interleaved 2m(v·p - 1) = 112, 1F1B and ZB-H1 2m(p - 1) = 48")
lesson.equal("sends a step: interleaved, zb-h1, 1f1b", (sends["interleaved"], sends["zb-h1"], sends["1f1b"]),
             (2 * M * (2 * P - 1), 2 * M * (P - 1), 2 * M * (P - 1)))

# %% [markdown]
# ## What to take away
#
# * A pipeline cuts the layers into p stages; between stages only a [b, s, h] activation and its gradient move:
#   2·m·(p − 1)·b·s·h·e bytes a step.
# * AFAB (GPipe) and 1F1B have the same bubble, (p − 1)/(m + p − 1) of the step at equal stages; for both it
#   shrinks only with more micro-batches, and m·b is the batch.
# * 1F1B's p − i − 1 warm-up forwards cap stage i at min(p − i, m) micro-batches in flight, where AFAB holds m:
#   the same time for far less memory.
# * A virtual clock makes the bubble a number on live ranks, the same on any machine.
#
# Exercise: `ex17_pipelines.py`: `tpsim lesson start 17` copies it into your work folder (`tpsim-work/`),
# then `tpsim check 17`.

# %%
lesson.takeaways()
lesson.finish()
