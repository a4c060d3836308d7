# %% [markdown]
# # Lesson 19 — Where the time goes
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/19_where_the_time_goes.py` (or `tpsim lesson run 19`;
# as a notebook on as many engines: `tpsim lesson notebook 19`).
#
# The SenseParrots article combines data and tensor parallelism the Megatron way (§3.1, lesson 08); lessons 11
# and 16 priced what such a run sends, and lessons 17 and 18 put its layers on a pipeline whose clock counted
# idle time. This lesson asks where a step's seconds go on a GPU: into the kernels, into collectives on the
# critical path, into the bubble, into the gradient sync at the end — and which of them could run *beside* the
# compute instead of after it. First live pipelines on 4 ranks, their virtual clocks charging the planner's own
# GPU costs, every second of the step accounted for; then the arithmetic of hiding the data-parallel sync under
# the backward, and why tensor parallelism's collectives cannot hide that way; then the bubble of lessons 17–18
# at real size; last, one published run taken apart by the planner and held to its measured step time.
#
# Sources: the Ultra-Scale Playbook (Hugging Face, 2025: DP's all-reduce overlaps the backward and hides when the
# backward compute covers it, t_compute_backward ≥ t_comm in its simple form; plain TP's collectives sit on the
# critical path); Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM", arXiv:2104.04473 (§2.2 the schedules and their bubble, §4.1 the scatter/gather of messages,
# Table 1 the published runs); Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
# Models", arXiv:2205.05198 (sequence parallelism, selective recompute, Table 5 the published step times); Qi et
# al. 2023, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241, §2.1 (ZB-H1's bubble (p − 1)(T_F + T_B − T_W));
# Megatron-LM's `--overlap-grad-reduce`, `--overlap-param-gather` and `--tp-comm-overlap`.

# %%
RANKS = 4


import numpy as np

from tpsim.arch import GPTConfig
from tpsim.comm import ProcessGrid
from tpsim.config import Pipeline, RunConfig
from tpsim.pipeline.actions import COMPUTE, SENDS
from tpsim.pipeline.clock import Timeline
from tpsim.pipeline.figure import draw_on
from tpsim.pipeline.schedules import build
from tpsim.pipeline.stage_clock import ROUNDING
from tpsim.plan.comm import dp_collectives, links, ring_seconds
from tpsim.gpus import gpu
from tpsim.plan.kernel_time import (GEMM_EFFICIENCY, HBM_EFFICIENCY, head_seconds, kernel_seconds, layer_seconds,
                                    optimizer_seconds)
from tpsim.plan.kernels import layer as layer_kernels
from tpsim.plan.layout import virtual_stage_layers
from tpsim.plan.memory import ACT_BYTES, layer_param_elements, stage_param_elements
from tpsim.plan.of_run import clock_costs, model_spec, run_layout
from tpsim.plan.pipeline import pipeline_terms, simulate as plan_simulate, stage_costs
from tpsim.plan.pipeline_comm import stage_comm, start_times
from tpsim.plan.planner import plan
from tpsim.plan.published import compare, format_published, load, row_layout, row_model
from tpsim.plan.timing import step_times
from tpsim.live_pipeline.build import build_pipeline
from tpsim.live_pipeline.data import stage_batch
from tpsim.live_pipeline.executor import Executor
from tpsim.live_pipeline.step import pipeline_grads
from tpsim.predict.pipeline import bubble_fraction
from tpsim.teach.runtime import Lesson, table
from tpsim.tp.random import ExactDropoutRNG
from tpsim.plan.live_pipeline import dp_sync
from tpsim.pipeline.overlap import BucketSpec, EMBEDDING, HEAD, layer
from tpsim.live_pipeline.buckets import bucket_specs

lesson = Lesson("19", RANKS)
US = 1e6  # seconds -> microseconds, for printing


def relative(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# %% [markdown]
# ## A step on the GPU clock
#
# A GPT-2 of 4 layers on a pipeline of 2 stages, each stage replicated twice (PP 2 × DP 2), 1F1B over m = 4
# micro-batches. Its virtual clock (lesson 17) charges not units but the planner's own prices for this layout on
# an H100 (`--clock GPU`, `tpsim.plan.of_run.clock_costs`): each F and B its layers' kernels (and the LM head's
# and the loss's on the last stage) on the H100's roofline (`tpsim.plan.kernel_time`: a matmul its FLOPs or its
# bytes, whichever takes longer, a memory-bound pass its bytes), each message α + β·bytes on NVLink; before the
# last stage's loss normalizer (its valid tokens summed over DP, `tpsim.live_pipeline.step`), after it the loss's
# collectives, the tied embedding's all-reduce and the DP gradient sync, each at its group's latest clock plus its
# α-β cost. The DP
# sync is `tpsim.train.GradSync` with small buckets (48 KiB, so that there are several: lesson 08), and it
# starts when the schedule is over — nothing is overlapped. The planner, handed the same buckets
# (`pipeline_terms(..., dp_buckets=...)`), must land on the same step time, to the rounding.

# %%
lesson.section("A step on the GPU clock")
SEED, M, CAP = 19, 4, 48 * 1024
cfg = GPTConfig(vocab_size=50, n_positions=16, n_embd=32, n_layer=4, n_head=4, dropout=0.1)


def live_step(tp: int, dp: int, overlap: bool = False):
    """One traced step of the GPT on PP 2 × TP tp × DP dp, the clock at an H100's costs, the DP sync overlapped
    with the last backward when ``overlap`` (``--overlap-grad-reduce``): ``(run, grid, result, sync, events)``,
    this rank's."""
    run = RunConfig.of(cfg, tp=tp, dp=dp, pp=2, dtype="float64", batch_size=2 * dp * M,
                       pipeline=Pipeline("1f1b", M, clock="h100"), overlap_grad_reduce=overlap,
                       bucket_mb=CAP / 2 ** 20)
    grid = ProcessGrid(tp=tp, dp=dp, pp=2)
    shard = build_pipeline(run, grid)
    schedule = build("1f1b", 2, M)
    boundary = (run.micro_batch, run.schedule.seq_len, cfg.hidden)
    executor = Executor(schedule, shard.chunks, grid.pp_group, boundary, np.float64,
                        costs=clock_costs(run, schedule, boundary, np.float64))
    sync = dp_sync(shard, grid, run) if dp > 1 else None  # GradSync at CAP, the tied embedding's bucket held
    rows, s = run.schedule.batch_size, run.schedule.seq_len
    ids = np.random.default_rng(SEED).integers(0, cfg.vocab, (rows, s))
    grid.tracer.reset()
    mine, labels, positions = stage_batch(grid, lambda: (ids, np.roll(ids, -1, axis=1)), rows, s)
    _, _, result = pipeline_grads(shard, executor, grid, sync, mine, labels, rows=positions,
                                  rng=ExactDropoutRNG(SEED), step=0)
    return run, grid, result, sync, list(grid.tracer.events)


def on_every_rank(grid: ProcessGrid, values: list[float]) -> list[list[float]]:
    """Every rank's list of numbers, in world-rank order, on every rank (untraced bookkeeping)."""
    with grid.tracer.paused():
        n = int(grid.world.all_reduce(np.array([len(values)], dtype=np.float64), op="max")[0])
        table_ = np.zeros((grid.world_size, n + 1))
        table_[grid.rank, 0], table_[grid.rank, 1:len(values) + 1] = len(values), values
        table_ = grid.world.all_reduce(table_)
    return [row[1:1 + int(row[0])].tolist() for row in table_]


def of_replica_0(grid: ProcessGrid, values: list[float]) -> list[list[float]]:
    """``values`` of pipeline ranks 0 and 1 of DP replica 0, TP rank 0, on every rank."""
    every = on_every_rank(grid, [grid.pp_rank, grid.dp_rank, grid.tp_rank, *values])
    mine = {int(v[0]): v[3:] for v in every if v[1] == 0 and v[2] == 0}
    return [mine[0], mine[1]]


run_dp, grid_dp, result_dp, sync_dp, _ = live_step(tp=1, dp=2)
model_dp, lay_dp = model_spec(run_dp.model), run_layout(run_dp)
G = gpu(lay_dp.gpu)
buckets = of_replica_0(grid_dp, [b.nbytes for b in sync_dp.buckets])
terms_dp = pipeline_terms(model_dp, lay_dp, G, dp_buckets=buckets)
steps = on_every_rank(grid_dp, [result_dp.clock.time, result_dp.clock.schedule_end])
live_step_s, live_makespan = max(s[0] for s in steps), max(s[1] for s in steps)
rows = [["pipeline rank", "action", "start (µs)", "end (µs)"]]
spans_dp = of_replica_0(grid_dp, [x for span in result_dp.clock.spans for x in (span.start, span.end)])
names_dp = lesson.gather([span.op for span in result_dp.clock.spans])
microbatches = lesson.gather([span.microbatch for span in result_dp.clock.spans])
if lesson.rank == 0:
    for r in (0, 1):
        world = grid_dp.pp_group.ranks[r]
        for name, j, (a, b) in zip(names_dp[world], microbatches[world], np.reshape(spans_dp[r], (-1, 2))):
            rows.append([str(r), name + (str(j) if j >= 0 else ""), f"{a * US:.4f}", f"{b * US:.4f}"])
    lesson.say("replica 0's clock, one line a span (RECV: the wait for a message; after the schedule its "
               "collectives):", table(rows, right=(2, 3)))
    lesson.say(f"GradSync over DP(2): {', '.join(str(len(b)) for b in buckets)} buckets on stages 0, 1; "
               f"{sum(buckets[0]):,.0f} and {sum(buckets[1]):,.0f} bytes")
lesson.expect("the live step (the latest clock after the DP sync) = the planner's step_s for this layout and "
              "these buckets, and the schedule's end = its makespan, to 1e-12 relative")
lesson.check("live step time vs pipeline_terms(..., dp_buckets)['step_s']",
             f"{live_step_s * US:.6f} µs vs {terms_dp['step_s'] * US:.6f} µs",
             relative(live_step_s, terms_dp["step_s"]) <= ROUNDING)
lesson.check("live end of the schedule vs pipeline_terms' makespan_s",
             f"{live_makespan * US:.6f} µs vs {terms_dp['makespan_s'] * US:.6f} µs",
             relative(live_makespan, terms_dp["makespan_s"]) <= ROUNDING)

# %% [markdown]
# The planner splits that critical path into parts that add up to it (`tpsim.plan.timing.step_times`):
# compute (the ranks' mean time in kernels), tp (in TP collectives inside the actions), the bubble, pp (what the
# messages add), the loss's collectives, the embedding's all-reduce, dp. The DP sync is all exposed: it starts
# after the loss broadcast and the embedding's all-reduce, and the clock of the stage that ends last moves by
# exactly the α-β time of its buckets, one all-reduce after the other (`ring_seconds`, lesson 11). At this toy
# size a layer's kernels take nanoseconds on an H100 and every message or collective pays microseconds of α:
# the step is almost all latency — which is why the second half of this lesson goes to real size.

# %%
parts = step_times(terms_dp, 0.0, 0.0)  # no optimizer: the live clock ends with the DP sync
shown = {k: parts[k] for k in ("compute", "tp", "bubble", "pp", "loss", "embedding", "dp")}
lesson.say(table([["part"] + list(shown), ["µs"] + [f"{v * US:.4f}" for v in shown.values()],
                  ["share"] + [f"{v / parts['step']:.1%}" for v in shown.values()]], right=tuple(range(1, 8))))
lesson.expect("the parts add up to the live step time (1e-12 relative)")
lesson.check("Σ parts vs the live step", f"{sum(shown.values()) * US:.6f} µs vs {live_step_s * US:.6f} µs",
             relative(sum(shown.values()), live_step_s) <= ROUNDING)
link_dp = links(lay_dp, G)["dp"]
sync_span = [s for s in result_dp.clock.spans if s.op == "DP sync"]
alone = sum(ring_seconds("all_reduce", b.nbytes, 2, link_dp) for b in sync_dp.buckets)
lesson.expect("on every rank the DP sync span lasts the α-β time of its own buckets, Σ_k (2α + bytes_k·β) at "
              "DP 2, and ends the step of the stage: nothing ran beside it")
lesson.check("DP sync span = Σ ring_seconds of the rank's buckets; nothing after it",
             f"rank 0: {(sync_span[0].end - sync_span[0].start) * US:.4f} µs for {len(sync_dp.buckets)} buckets",
             len(sync_span) == 1 and result_dp.clock.spans[-1] is sync_span[0]
             and relative(sync_span[0].end - sync_span[0].start, alone) <= ROUNDING)

# %% [markdown]
# ## TP's collectives inside the actions
#
# The same GPT on PP 2 × TP 2: no DP sync now, but every F and B runs its layers' TP collectives (lesson 04: one
# all-reduce forward and one backward per attention and per MLP; the embedding's and the loss's on the end
# stages), and the live clock charges each traced call at its α-β price on NVLink, inside the action that issued
# it. So an action lasts its kernels plus its collectives, the planner's `stage_costs` plus `stage_comm`, and
# the clock's collective time per rank is the planner's `collectives_s`.

# %%
lesson.section("TP's collectives inside the actions")
run_tp, grid_tp, result_tp, _, events_tp = live_step(tp=2, dp=1)
model_tp, lay_tp = model_spec(run_tp.model), run_layout(run_tp)
terms_tp = pipeline_terms(model_tp, lay_tp, G)
kernels_tp, comm_tp = stage_costs(model_tp, lay_tp, G), stage_comm(model_tp, lay_tp, G, False)
steps = on_every_rank(grid_tp, [result_tp.clock.time, result_tp.clock.comm, result_tp.clock.busy, grid_tp.pp_rank])
live_tp_step = max(s[0] for s in steps)
lesson.expect("the live step = the planner's step_s; each rank's collective time = its collectives_s")
lesson.check("PP 2 × TP 2: live step vs pipeline_terms' step_s",
             f"{live_tp_step * US:.6f} µs vs {terms_tp['step_s'] * US:.6f} µs",
             relative(live_tp_step, terms_tp["step_s"]) <= ROUNDING)
lesson.check("each rank's clock.comm vs the planner's collectives_s of its stage",
             "stage 0: " + f"{terms_tp['ranks'][0]['collectives_s'] * US:.4f} µs, stage 1: "
             f"{terms_tp['ranks'][1]['collectives_s'] * US:.4f} µs",
             all(relative(s[1], terms_tp["ranks"][int(s[3])]["collectives_s"]) <= ROUNDING for s in steps))
durations_ok = all(relative(span.end - span.start, kernels_tp[grid_tp.pp_rank, 0, "FB".index(span.op)]
                            + comm_tp[grid_tp.pp_rank, 0, "FB".index(span.op)]) <= ROUNDING
                   for span in result_tp.clock.spans if span.op in ("F", "B"))
kernels_ns = [(s[2] - s[1]) * 1e9 for s in steps]
lesson.expect("every live F and B lasts stage_costs + stage_comm of its stage: here almost all collectives")
lesson.check("every action's span = its kernels + its TP collectives",
             f"a rank's kernels {min(kernels_ns):.0f}–{max(kernels_ns):.0f} ns of its "
             f"{min(s[2] for s in steps) * US:.0f}–{max(s[2] for s in steps) * US:.0f} µs busy", durations_ok)
per_layer_fwd = sum(1 for e in events_tp if e.op == "all_reduce" and e.group == "tp" and e.phase == "forward"
                    and ".h." in e.scope)
n_layers = virtual_stage_layers(model_tp, lay_tp)[grid_tp.pp_rank]
lesson.expect("the trace: 2 TP all-reduces in each layer's forward (attention's g and the MLP's g), per micro-batch")
lesson.equal("TP all-reduces traced in the layers' forwards ÷ (layers × m)", per_layer_fwd / (n_layers * M), 2.0)

# %% [markdown]
# Both timelines drawn, replica 0 (TP rank 0), with lessons 17–18's figure (`tpsim.pipeline.figure`: a row per
# rank, F and B as boxes with their micro-batch, idle hatched), the live spans as its timeline; on top, the dark
# band in each box is the share its TP collectives take (drawn at its end: the clock charges them inside the
# action), and around the schedule the loss's, the embedding's and the DP sync's collectives.

# %%
spans_tp = of_replica_0(grid_tp, [x for span in result_tp.clock.spans for x in (span.start, span.end)])
names_tp = lesson.gather([span.op for span in result_tp.clock.spans])


def live_timeline(names: list[list[str]], spans: list[list[float]]) -> Timeline:
    """The schedule's ``Timeline`` from the live spans of its two ranks: each compute action and receive takes the
    next span of its kind, a send takes no time, the collectives around the schedule are left out."""
    schedule, out = build("1f1b", 2, M), []
    for actions, ops, flat in zip(schedule.ranks, names, spans):
        mine = iter([(a, b) for op, (a, b) in zip(ops, np.reshape(flat, (-1, 2))) if op in COMPUTE
                     or op.startswith("RECV")])
        rank, now = [], 0.0
        for action in actions:
            span = (now, now) if action.op in SENDS else next(mine)
            now = span[1]
            rank.append(span)
        out.append(tuple(rank))
    return Timeline(schedule, tuple(out), 0)


if lesson.rank == 0:
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    plt = lesson.pyplot()
    colours = {"loss": "#DD8452", "embedding": "#C9A227", "DP sync": "#C44E52"}
    fig, axes = plt.subplots(2, 1, figsize=(11, 5.4))
    panels = ((axes[0], spans_dp, names_dp, grid_dp, None,
               "PP 2 × DP 2: the DP sync after the schedule (the kernels' nanoseconds too thin to see)"),
              (axes[1], spans_tp, names_tp, grid_tp, comm_tp, "PP 2 × TP 2: TP collectives inside F and B"))
    for ax, spans, names, g, comm, title in panels:
        ops = [names[g.pp_group.ranks[r]] for r in (0, 1)]
        end = max(spans[0][-1], spans[1][-1])
        timeline = live_timeline(ops, spans)
        for r in (0, 1):  # the idle background to the step's end, under draw_on's (which ends with the schedule)
            ax.broken_barh([(0, end)], (r - 0.4, 0.8), facecolor="white", edgecolor="#999999", hatch="///",
                           linewidth=0)
        draw_on(ax, timeline, title, step=end)
        if max(b - a for actions, rank in zip(timeline.schedule.ranks, timeline.spans)
               for x, (a, b) in zip(actions, rank) if x.op in COMPUTE) < 0.01 * end:
            for text in list(ax.texts):  # the micro-batch numbers of boxes too thin to see: they only overlap
                text.remove()
        pairs = [dict(zip(ops[r], np.reshape(spans[r], (-1, 2)))) for r in (0, 1)]
        both = {n: max(pairs[0][n][0], pairs[1][n][0]) for n in ("loss broadcast", "embedding all-reduce")
                if n in pairs[0] and n in pairs[1]}  # a collective of both stages starts when the later one comes
        for r in (0, 1):
            for name, (a, b) in zip(ops[r], np.reshape(spans[r], (-1, 2))):
                kind = "loss" if "loss" in name else "embedding" if "embedding" in name else \
                    "DP sync" if name == "DP sync" else None
                a = both.get(name, a)  # the wait for the other stage is idle, not the collective
                if kind is not None and b > a:
                    ax.broken_barh([(a, b - a)], (r - 0.4, 0.8), facecolor=colours[kind], edgecolor="black",
                                   linewidth=0.4)
            for action, (a, b) in zip(timeline.schedule.ranks[r], timeline.spans[r]):
                if comm is not None and action.op in COMPUTE:
                    c = comm[r, 0, "FB".index(action.op)]
                    ax.broken_barh([(b - c, c)], (r - 0.4, 0.2), facecolor="black", linewidth=0)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x * US:g}"))
        ax.set_xlabel("virtual time (µs, H100 costs)")
        ax.set_yticks([0, 1], ["stage 0", "stage 1"])
        handles = list(ax.get_legend().legend_handles)
        handles += [Patch(facecolor=c, label=k) for k, c in colours.items()
                    if any(k.split()[0].lower() in n.lower() for n in ops[0] + ops[1])]
        handles += [Patch(facecolor="black", label="TP collectives (share)")] * (comm is not None)
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=len(handles), fontsize=7,
                  frameon=False)
    fig.tight_layout()
    lesson.save(fig, "19_step_timelines_pp2.png")

# %% [markdown]
# ## Exposed communication, and when it hides
#
# `--overlap-grad-reduce` (Megatron-LM; PyTorch DDP does the same) starts a bucket's all-reduce as soon as the
# backward has produced every gradient in it, on a second stream, while the backward goes on. The arithmetic of
# one backward: bucket k is ready at r_k and its all-reduce lasts d_k (its α-β time); the communication stream
# runs them in order, one at a time, so
#
#     start_k = max(r_k, end_{k−1}),    end_k = start_k + d_k,    exposed = max(0, end_last − compute_end)
#
# where compute_end is when the backward's last kernel ends. Unrolled, end_last = max_k (r_k + d_k + … + d_last):
# the stream finishes by compute_end exactly when, for every bucket k, the compute left after it is ready covers
# its own all-reduce and all those queued behind it, compute_end − r_k ≥ d_k + … + d_last. That is the Ultra-Scale
# Playbook's condition t_compute_backward ≥ t_comm read bucket by bucket; the simple form, taken once for the
# whole backward, is the k = 0 case. The last bucket of a GPT holds the embeddings, whose gradients are done only
# when the backward is — so at least its all-reduce is always exposed.

# %%
lesson.section("Exposed communication, and when it hides")


def comm_stream(ready, durations):
    """Each bucket's all-reduce end on an in-order communication stream (the formula above)."""
    ends, end = [], -np.inf
    for r, d in zip(ready, durations):
        end = max(r, end) + d
        ends.append(end)
    return ends


def exposed_dp(ready, durations, compute_end) -> float:
    return max(0.0, comm_stream(ready, durations)[-1] - compute_end) if len(ready) else 0.0


def hides_fully(ready, durations, compute_end) -> bool:
    """The Playbook's inequality bucket by bucket: the compute left after bucket k is ready covers the
    all-reduces of k and of every bucket after it."""
    return all(compute_end - ready[k] >= sum(durations[k:]) for k in range(len(ready)))


def simple_form(ready, durations, compute_end) -> bool:
    """The simple form: the backward after the first bucket is ready covers all of the communication."""
    return compute_end - ready[0] >= sum(durations)


CASES = {"ready early, short all-reduces": ([1.0, 2.0, 3.0], [0.5, 0.5, 0.5], 5.0),
         "exactly covered": ([1.0, 2.0, 3.0], [1.0, 1.0, 2.0], 5.0),
         "the last bucket at the end": ([1.0, 2.0, 5.0], [0.5, 0.5, 0.5], 5.0),
         "one long all-reduce queues the rest": ([0.0, 1.0, 2.0], [3.0, 1.0, 1.0], 4.0),
         "simple form holds, a late bucket does not hide": ([0.0, 3.5, 4.0], [1.0, 1.0, 1.0], 4.5)}
rows, decides = [["case (ready; durations; compute end)", "exposed", "hides (every k)", "simple form"]], True
for name, (ready, durations, end) in CASES.items():
    e = exposed_dp(ready, durations, end)
    rows.append([f"{name}: {ready}; {durations}; {end:g}", f"{e:g}", str(hides_fully(ready, durations, end)),
                 str(simple_form(ready, durations, end))])
    decides &= hides_fully(ready, durations, end) == (e == 0)
lesson.say(table(rows, right=(1,)))
lesson.expect("the inequality for every k holds exactly where the computed exposure is 0 (it hides in two cases "
              "and not in three)")
lesson.check("hides_fully == (exposed == 0), five cases", "see the table", decides
             and [hides_fully(*c) for c in CASES.values()] == [True, True, False, False, False])
last = CASES["simple form holds, a late bucket does not hide"]
lesson.expect(f"the simple form alone is not enough: it holds in the last case, where {exposed_dp(*last):g} stays "
              "exposed (the bucket ready at 3.5 waits for none, the one at 4 waits for it)")
lesson.check("simple form true, exposure > 0", f"exposed {exposed_dp(*last):g}",
             simple_form(*last) and exposed_dp(*last) > 0)

# %% [markdown]
# ### The live overlapped run
#
# The same PP 2 × DP 2 step with `--overlap-grad-reduce`. Stage i's gradients are final only in its last
# micro-batch's backward (1F1B accumulates over the m micro-batches), so that backward is the window: it runs the
# head first on the last stage, then the layers from the top down, each at its planner cost, and a bucket's
# all-reduce is issued — a non-blocking MPI call, traced like the blocking one — as soon as the piece that wrote
# its last gradient is done (the tied embedding's waits for the embedding group's sum, which must come first for
# the same bits). The live clock puts those all-reduces on a second stream. Three things must hold: the numbers
# are the same bits as without the overlap; the live exposure is exactly the in-order rule above applied to the
# live stream's ready times and durations; and the planner, handed the same buckets, gets the same exposure.

# %%
run_ov, grid_ov, result_ov, sync_ov, _ = live_step(tp=1, dp=2, overlap=True)
same = all(np.array_equal(a, b) for a, b in zip(sync_dp.buffers, sync_ov.buffers))
lesson.expect("the overlapped step's averaged gradients equal the plain step's bit for bit, on every rank")
lesson.check("gradients with --overlap-grad-reduce == without, bit for bit", f"{len(sync_ov.buffers)} buckets",
             grid_ov.world.all_true(same))
stream = result_ov.clock.dp
ready = [b.ready for b in stream.spans]
durations = [b.end - b.start for b in stream.spans]
me = grid_ov.pp_rank
lesson.say(f"stage {me}: {len(durations)} all-reduces of {min(durations) * US:.2f}–{max(durations) * US:.2f} µs, "
           f"the backward ends at {stream.compute_end * US:.4f} µs; exposed {stream.exposed * US:.4f} µs of "
           f"{stream.comm * US:.4f} µs")
lesson.expect("the live exposure = the in-order rule on the live stream's own ready times and durations")
lesson.check("live exposed DP vs exposed_dp(ready, durations, compute end)", f"{stream.exposed * US:.6f} µs",
             relative(exposed_dp(ready, durations, stream.compute_end) + 1e-300, stream.exposed + 1e-300)
             <= ROUNDING)
lesson.expect("and hides_fully says no exactly when something stays exposed")
lesson.check("hides_fully(...) == (exposed == 0)", str(hides_fully(ready, durations, stream.compute_end)),
             hides_fully(ready, durations, stream.compute_end) == (stream.exposed == 0))


def spec_numbers(spec: BucketSpec) -> list[float]:
    """A bucket as numbers, to share it with every rank: bytes, stage, piece (layer i, head −1, embedding −2)."""
    piece = -1 if spec.piece == HEAD else -2 if spec.piece == EMBEDDING else spec.piece[1]
    return [spec.nbytes, spec.stage, piece, float(spec.held)]


def spec_of(numbers: list[float]) -> BucketSpec:
    nbytes, stage, piece, held = (int(x) for x in numbers)
    key = {-1: HEAD, -2: EMBEDDING}.get(piece, layer(piece))
    return BucketSpec(nbytes, stage, key, bool(held), (stage, key))


flat = [x for spec in bucket_specs(build_pipeline(run_ov, grid_ov), sync_ov, held=True) for x in spec_numbers(spec)]
specs_ov = [[spec_of(v[k:k + 4]) for k in range(0, len(v), 4)] for v in of_replica_0(grid_ov, flat)]
terms_ov = pipeline_terms(model_dp, run_layout(run_ov), G, dp_buckets=specs_ov)
want = terms_ov["after_schedule"]["dp_streams"][me]["exposed_s"]
lesson.expect("the planner, handed these buckets, exposes the same seconds (1e-12 of the step), and the same step")
live_ov = max(v[0] for v in on_every_rank(grid_ov, [result_ov.clock.time]))
lesson.check("live exposed DP vs the planner's dp_streams; the step", f"{want * US:.6f} µs; {live_ov * US:.6f} µs",
             abs(stream.exposed - want) <= ROUNDING * terms_ov["step_s"]
             and relative(live_ov, terms_ov["step_s"]) <= ROUNDING)
lesson.expect("at this size only part hides: the all-reduces (mostly α) take longer than the backward left "
              "after the first is ready, and the embeddings' bucket is ready only at the end")
lesson.check("part of the DP sync hidden, part exposed; backward after the first ready < Σ all-reduces",
             f"{1 - stream.exposed / stream.comm:.2%} hidden, {stream.after_first_ready * US:.2f} µs < "
             f"{stream.comm * US:.2f} µs", 0 < stream.exposed < stream.comm and stream.after_first_ready < stream.comm)

# %% [markdown]
# At real size the window is long. Narayanan et al.'s 1.7B GPT (Table 1: 24 layers, h 2304, DP 32 on 32
# A100s, one micro-batch of 16 sequences a GPU, full recompute) has no pipeline and no TP: its one backward runs
# the head, then 24 layers of recompute + B + W (after its forward, and after the loss normalizer's all-reduce that
# starts the last stage's clock), and its gradients cross InfiniBand. Cut into one bucket a layer
# (and the embeddings' last; our choice, as an example — Megatron-LM cuts by a number of parameters), the same
# arithmetic: the planner's step without overlap, and what `--overlap-grad-reduce` would leave exposed.

# %%
row = next(r for r in load() if r["name"] == "N21-1.7B")
model_r, lay_r = row_model(row), row_layout(row)
G_r = gpu(lay_r.gpu)
costs_r = stage_costs(model_r, lay_r, G_r)[0, 0]
per_r, head_r = layer_seconds(model_r, lay_r, G_r), head_seconds(model_r, lay_r, G_r)
L = model_r.layers
per_layer_params = layer_param_elements(model_r, lay_r.tp)
all_params = stage_param_elements(model_r, lay_r.tp, 1, 0, L)
bucket_bytes = [dp_collectives(lay_r, per_layer_params)[0][1]] * L
bucket_bytes.append(dp_collectives(lay_r, all_params - L * per_layer_params)[0][1])
link_r = links(lay_r, G_r)["dp"]
d_r = [ring_seconds("all_reduce", n, lay_r.dp, link_r) for n in bucket_bytes]
b_start = start_times(lay_r, G_r)[0] + costs_r[0]  # the clock starts after the loss normalizer's all-reduce
b_end = b_start + costs_r[1]
ready_r = [b_start + head_r["B"] + head_r["W"] + (k + 1) * (per_r["B"] + per_r["W"]) for k in range(L)] + [b_end]
terms_r = pipeline_terms(model_r, lay_r, G_r, dp_buckets=[bucket_bytes])
exposed_r = exposed_dp(ready_r, d_r, b_end)
lesson.say(f"backward {(b_end - b_start) * 1e3:.1f} ms (of a {terms_r['makespan_s'] * 1e3:.1f} ms schedule); "
           f"{len(d_r)} all-reduces of {d_r[0] * 1e3:.2f} ms (a layer) and {d_r[-1] * 1e3:.2f} ms (embeddings) "
           f"over DP {lay_r.dp} on {link_r.name}: {sum(d_r) * 1e3:.1f} ms in all")
lesson.expect("the backward's layer by layer ready times end where the planner's backward ends; Σ d_k is the "
              "planner's DP sync for these buckets")
lesson.check("last layer's bucket ready = the planner's B end; Σ d_k = pipeline_terms' dp_s",
             f"{ready_r[L - 1] * 1e3:.3f} ms, {sum(d_r) * 1e3:.3f} ms",
             relative(ready_r[L - 1], b_end) <= ROUNDING and relative(b_end, terms_r["makespan_s"]) <= ROUNDING
             and relative(sum(d_r), terms_r["after_schedule"]["dp_s"][0]) <= ROUNDING)
lesson.expect("overlapped, the layers' all-reduces hide: only the tail stays exposed, the embeddings' at least")
lesson.check("exposed with overlap: between the embeddings' d and Σ d_k, and not hidden fully",
             f"{exposed_r * 1e3:.2f} ms of {sum(d_r) * 1e3:.1f} ms exposed",
             d_r[-1] <= exposed_r < sum(d_r) and not hides_fully(ready_r, d_r, b_end))
ends_r = comm_stream(ready_r, d_r)
waits = sum(1 for k in range(1, len(d_r)) if ready_r[k] > ends_r[k - 1])
lesson.say(f"the stream waits for the backward before {waits} of its {len(d_r) - 1} later buckets: a layer's "
           f"all-reduce ({d_r[0] * 1e3:.2f} ms) is shorter than its backward ({(per_r['B'] + per_r['W']) * 1e3:.2f} "
           "ms)")

# %% [markdown]
# ### Why TP's all-reduce cannot hide, and DP's can
#
# Overlap needs work that does not depend on the collective. Write one layer's forward under plain TP as its ops
# and what each reads, and ask, for each all-reduce, which ops are neither before it (it needs them) nor after it
# (they need it): those could run beside it. For TP's two all-reduces the answer is none — the output of g is the
# residual add's input, whose output is the next LayerNorm's. In the backward of a DP replica, the all-reduce of
# layer k's weight gradient is read by nothing until the optimizer step, so the input gradients and weight
# gradients of every layer below k are independent of it.

# %%
TP_FORWARD = {"ln_1": ["x"], "qkv (column)": ["ln_1"], "attention": ["qkv (column)"], "proj (row)": ["attention"],
              "g all-reduce 1": ["proj (row)"], "residual 1": ["x", "g all-reduce 1"], "ln_2": ["residual 1"],
              "fc1 (column)": ["ln_2"], "gelu": ["fc1 (column)"], "fc2 (row)": ["gelu"],
              "g all-reduce 2": ["fc2 (row)"], "residual 2": ["residual 1", "g all-reduce 2"]}
DP_BACKWARD = {}
for k in (2, 1, 0):  # the backward of three layers, top down: dX feeds the layer below, dW its all-reduce
    above = f"dX {k + 1}" if k < 2 else "dY"
    DP_BACKWARD |= {f"dX {k}": [above], f"dW {k}": [above], f"all-reduce dW {k}": [f"dW {k}"]}


def independent(graph: dict, op: str) -> list[str]:
    """The ops of ``graph`` (op -> the ops it reads) neither before nor after ``op``."""
    def reach(start, step):
        seen, todo = set(), [start]
        while todo:
            for nxt in step(todo.pop()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen
    before = reach(op, lambda o: graph.get(o, []))
    after = reach(op, lambda o: [x for x, reads in graph.items() if o in reads])
    return [o for o in graph if o != op and o not in before | after]


tp_free = {op: independent(TP_FORWARD, op) for op in TP_FORWARD if "all-reduce" in op}
dp_free = {op: independent(DP_BACKWARD, op) for op in DP_BACKWARD if "all-reduce" in op}
for op, free in (*tp_free.items(), *dp_free.items()):
    lesson.say(f"  beside {op!r}: {', '.join(free) or 'nothing'}")
lesson.expect("TP's all-reduces: nothing independent; DP's of layer 2 and 1: the layers below's dX and dW")
lesson.check("independent ops beside each all-reduce", f"TP {[len(v) for v in tp_free.values()]}, DP "
             f"{[len(v) for v in dp_free.values()]}", all(not v for v in tp_free.values())
             and set(dp_free["all-reduce dW 2"]) >= {"dX 1", "dW 1", "dX 0", "dW 0"}
             and set(dp_free["all-reduce dW 1"]) >= {"dX 0", "dW 0"})
lesson.expect("the graph's 2 all-reduces a layer are the live trace's (the count checked above)")
lesson.equal("g all-reduces in the graph of one layer", len(tp_free), int(per_layer_fwd / (n_layers * M)))

# %% [markdown]
# Sequence parallelism changes that picture. Its all-gather before a column-parallel GEMM and its reduce-scatter
# after a row-parallel one act on sequence chunks, and a GEMM on the first chunk of the sequence needs only that
# chunk: cut the all-gather into t pieces, and the GEMM of piece i runs while piece i + 1 is on the wire — the
# idea of Megatron-LM's `--tp-comm-overlap` (Transformer Engine's communication–GEMM overlap), which leaves
# exposed only what the GEMM chunks do not cover. tpsim runs it live under `--sequence-parallel --tp-comm-overlap`
# (bit for bit the run without it; its cost rule, exposed = max(0, a − (t − 1)·g/t) per collective, is
# `tpsim.plan.tp_overlap`, and `tpsim plan --validate` checks it on live ranks); the planner prices TP without it
# here. What is at stake, in the run taken apart below: its TP collectives are the second largest part of the step.

# %% [markdown]
# ## The bubble at real size
#
# Korthikanti et al.'s 175B GPT (96 layers, h 12288) on PP 8 × TP 8, m = 64 micro-batches of one sequence of 2,048
# tokens: the planner times the schedules of lessons 17 and 18 at their real per-stage costs. With equal stages —
# every stage its 12 layers, the LM head and the messages left out — 1F1B and interleaved give exactly their unit
# formulas: the bubble depends only on p, m and v while F and B cost the same on every stage. ZB-H1 gives
# Qi et al.'s (p − 1)(T_F + T_B − T_W) idle a rank, which is the unit formula only when T_F = T_B = T_W. Then the
# planner's stages: the last one also runs the LM head, a [2048, 12288] × [12288, 6400] matmul a micro-batch on
# each GPU (its F, B and W), so it is slower, and the others wait for it: the bubble is larger. The planner's
# whole timeline adds the TP collectives inside every action and the messages, which the stages wait for too.

# %%
lesson.section("The bubble at real size")
row = next(r for r in load() if r["name"] == "K22-175B-seqsel")
model_k = row_model(row)
rows = [["schedule", "equal stages", "formula", "+ LM head", "planner (+ TP, messages)"]]
equal_ok, head_ok, order_ok = True, True, True
for schedule, vp in (("1f1b", 1), ("interleaved", 3), ("zb-h1", 1)):
    lay = row_layout(row, schedule=schedule, vp=vp)
    g = gpu(lay.gpu)
    per, head = layer_seconds(model_k, lay, g), head_seconds(model_k, lay, g)
    p, m = lay.pp, lay.microbatches
    split = build(schedule, p, m, vp=vp).splits_backward  # ZB-H1 times B and W apart
    quiet = np.zeros((p * vp, 2))  # no messages
    equal = np.zeros((p, vp, 3))
    for s, n in enumerate(virtual_stage_layers(model_k, lay)):
        f, b, w = (n * per[op] for op in "FBW")
        equal[s % p, s // p] = (f, b, w) if split else (f, b + w, 0.0)
    eq = plan_simulate(lay, equal, quiet)
    got = eq["bubble_fraction"]["measured"]
    want = bubble_fraction(schedule, p, m, vp)
    if schedule == "zb-h1":
        f, b, w = equal[0, 0]
        idle = (p - 1) * (f + b - w)
        want = idle / (m * (f + b + w) + idle)
        equal_ok &= all(relative(r["idle_s"], idle) <= 1e-9 for r in eq["ranks"])
    equal_ok &= relative(got, want) <= 1e-9
    headed = plan_simulate(lay, stage_costs(model_k, lay, g), quiet)  # the planner's stages: the head on the last
    extra = headed["ranks"][-1]["busy_s"] - headed["ranks"][0]["busy_s"]
    head_ok &= relative(extra, m * sum(head.values())) <= 1e-9
    real = pipeline_terms(model_k, lay, g)
    order_ok &= got < headed["bubble_fraction"]["measured"] < real["bubble_fraction"]["measured"]
    rows.append([schedule + (f" v {vp}" if vp > 1 else ""), f"{got:.4f}", f"{want:.4f}",
                 f"{headed['bubble_fraction']['measured']:.4f}", f"{real['bubble_fraction']['measured']:.4f}"])
lesson.say(table(rows, right=(1, 2, 3, 4)))
lesson.expect("equal stages: 1F1B (p - 1)/(m + p - 1), interleaved (p - 1)/(v·m + p - 1), ZB-H1 "
              "(p - 1)(T_F + T_B - T_W) idle a rank over m(T_F + T_B + T_W) + that")
lesson.check("equal stages vs the formulas (1e-9 relative)", "see the table", equal_ok)
lesson.expect("with the head the last rank works m·(F + B + W of the head) more than rank 0, every schedule")
lesson.check("last rank's busy - rank 0's vs m × the head's seconds", f"{m * sum(head.values()):.3f} s a step",
             head_ok)
lesson.expect("so every bubble grows with the head, and again with the TP collectives and the messages")
lesson.check("equal < + head < the planner's, three schedules", "see the table", order_ok)

# %% [markdown]
# ## One published run, taken apart
#
# The same 175B run as Korthikanti et al. ran it (interleaved, v = 3, selective recompute + sequence parallelism,
# 64 A100s, fp16): their Table 5 gives 13.75 s a step. The planner's breakdown, part by part:
#
# * **compute**: every layer's kernels on the roofline (`tpsim.plan.kernel_time`). The big weight GEMMs run at
#   the fitted 70 % of the dense peak; attention's per-head products, [s, d] × [d, s] with d = 128, do some 110
#   FLOPs a byte, below the A100's ridge of about 153, so the roofline prices them by their bytes.
# * **tp**: the SP all-gathers and reduce-scatters of every layer, on NVLink, on the critical path (no overlap).
# * **bubble** and **pp**: the interleaved schedule's idle time at these costs, and what the messages add. Under
#   SP a message is already each TP rank's [s/t, b, h], so the planner's Megatron scatter/gather (Narayanan et
#   al. §4.1: plain TP's whole-tensor message sent as t pieces, all-gathered over NVLink) has nothing to split.
# * **optimizer**: each GPU updates only its share of the parameters — 1/64 of 175B, a little more on the
#   busiest stage, which also holds the embedding — at HBM speed: tens of milliseconds.
# * **dp**: zero — DP 1, no gradient sync.

# %%
lesson.section("One published run, taken apart")
lay = row_layout(row)
g = gpu(lay.gpu)
p_k = plan(model_k, lay)
t = p_k.time_s
parts = {k: t[k] for k in ("compute", "tp", "bubble", "pp", "loss", "embedding", "dp", "optimizer", "dp_gather")}
lesson.say(table([["part", "seconds", "share"]] + [[k, f"{v:.4f}", f"{v / t['step']:.1%}"] for k, v in parts.items()]
                 + [["step", f"{t['step']:.4f}", ""]], right=(1, 2)))
lesson.expect("the parts add up to the predicted step")
lesson.close("Σ parts - step (s)", sum(parts.values()), t["step"], tol=1e-9)
scores = next(k for k in layer_kernels(model_k, lay)["F"] if k.name == "scores")
e = ACT_BYTES[lay.dtype]
intensity = scores.flops / scores.matmul_bytes(e)
by_flops = scores.flops / (g.peak(lay.dtype) * GEMM_EFFICIENCY)
by_bytes = scores.matmul_bytes(e) / (g.hbm_bytes_per_s * HBM_EFFICIENCY)
lesson.expect("attention's scores product is memory-bound on the roofline: its time is its bytes' time")
lesson.check(f"scores: FLOPs a byte below the ridge, kernel_seconds = bytes / (HBM × {HBM_EFFICIENCY})",
             f"{intensity:.0f} FLOPs a byte vs ridge {g.peak(lay.dtype) / g.hbm_bytes_per_s:.0f}; "
             f"{kernel_seconds(scores, lay, g) * 1e6:.1f} µs",
             by_bytes > by_flops and relative(kernel_seconds(scores, lay, g), by_bytes) <= 1e-12)
params = p_k.per_gpu["params"]
lesson.expect("the optimizer part is the busiest stage's update at HBM speed plus the clip norm's all-reduce: "
              "under 1 % of the step")
lesson.check("optimizer part ≥ optimizer_seconds(params), < 1 % of the step",
             f"{parts['optimizer'] * 1e3:.1f} ms for {params:,} parameters",
             optimizer_seconds(params, lay, g) <= parts["optimizer"] < 0.01 * t["step"])
lesson.expect("the bubble part is the interleaved schedule's idle time: between 1 % and 10 % of the step")
lesson.check("bubble share", f"{parts['bubble'] / t['step']:.2%}", 0.01 < parts["bubble"] / t["step"] < 0.10)
published = compare()
mine = next(r for r in published["rows"] if r["name"] == "K22-175B-seqsel")
error = abs(mine["ratio"] - 1)
lesson.expect(f"predicted vs published {mine['published_s']} s: within the {error:.1%} printed by "
              "tpsim plan --published for this row, and within its worst")
lesson.check("K22-175B-seqsel: |predicted / published - 1|", f"{t['step']:.3f} s vs {mine['published_s']} s: "
             f"{abs(t['step'] / mine['published_s'] - 1):.2%}",
             abs(t["step"] / mine["published_s"] - 1) <= error + 1e-12 and error <= published["worst"])
lesson.say(format_published(published))
errors = sorted(abs(r["ratio"] - 1) for r in published["rows"])
mid = len(errors) // 2
median = errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2
lesson.expect("the table's median and worst are compare()'s: recomputed from its 18 rows, and printed under it")
lesson.check("median and worst |ratio - 1| over the published runs",
             f"{median:.1%}, {errors[-1]:.1%} over {len(errors)} runs",
             len(errors) == 18 and median == published["median"] and errors[-1] == published["worst"]
             and f"median {median:.1%}, worst {errors[-1]:.1%}" in format_published(published))

# %% [markdown]
# ## What to take away
#
# * On the GPU clock a live step is accounted for to the rounding: compute, TP collectives inside the actions,
#   the bubble, the messages, the loss's and the embedding's collectives and the DP sync add up to the planner's
#   step time for the same layout and buckets.
# * Without overlap the DP sync is all exposed. With an in-order communication stream, bucket k's all-reduce
#   starts at max(r_k, end_{k−1}); exposed = max(0, end_last − compute_end); it hides fully exactly when, for
#   every bucket k, compute_end − r_k ≥ d_k + … + d_last — the Playbook's t_compute_backward ≥ t_comm, bucket by
#   bucket. The embeddings' bucket, done last, is always exposed.
# * TP's all-reduce has nothing independent to run beside it (its output is the next op's input); DP's has the
#   whole rest of the backward. SP's all-gather and reduce-scatter can be pipelined with GEMM chunks
#   (`--tp-comm-overlap`).
# * At real size the bubble follows the unit formulas when the stages are equal; the LM head makes the last stage
#   slower and the bubble larger. ZB-H1 idles (p − 1)(T_F + T_B − T_W) a rank.
# * The planner's breakdown of Korthikanti et al.'s 175B run is within its printed error of the published step.
#
# Exercise: `ex19_where_the_time_goes.py`: `tpsim lesson start 19` copies it into your work folder
# (`tpsim-work/`), then `tpsim check 19`.

# %%
lesson.takeaways()
lesson.finish()
