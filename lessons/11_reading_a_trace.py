# %% [markdown]
# # Lesson 11 — Reading a trace: records, formulas, timelines and what-ifs
#
# Runs on **8 ranks**: `mpirun -n 8 python lessons/11_reading_a_trace.py` (or `tpsim lesson run 11`;
# as a notebook on as many engines: `tpsim lesson notebook 11`).
#
# Every collective in tpsim goes through one traced layer, and every layer call of the GPT runs inside a timed
# compute span. This lesson trains a tiny GPT for a few steps on a TP(4) × DP(2) grid and reads what the
# tracer wrote, the way you would read a profile of a real run. TP is 4, not 2, on purpose: a ring all-reduce
# sends `2(p−1)/p` of its buffer, which at p = 2 is exactly 1, so a TP(2) trace shows the same number as
# "bytes" and as "wire bytes" and hides the difference this lesson is about.
#
# 1. the **records** (one per collective per rank) as a per-layer table, checked row by row against the
#    volumes of the Megatron-LM paper (`tpsim.predict.formulas.predict_step`);
# 2. the **wire bytes** of each record, recomputed from the ring algorithm;
# 3. the **timeline**: a Chrome trace (`timeline.json`, for ui.perfetto.dev) and a PNG of one step;
# 4. an **α-β what-if**: the step priced on NVLink and InfiniBand, and a GPT-2-medium-sized model priced from
#    the formulas alone — which is why tensor parallelism stays inside a node.
#
# Sources: Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3 (the collectives of a step); Narayanan
# et al. 2021, arXiv:2104.04473 (TP inside a server, DP across servers); the SenseParrots article, §3.1.

# %%
RANKS = 8

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.data import ReverseTask
from tpsim.demo.tour_parts import read_batch
from tpsim.demo.report import step_table
from tpsim.models.build import build_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.teach.runtime import Lesson, table
from tpsim.trace import gather_records, gather_spans, write_jsonl
from tpsim.table import human_bytes
from tpsim.cost import ring_steps
from tpsim.config import RunConfig
from tpsim.predict.formulas import predict_step
from tpsim.trace.formula_check import compare, format_comparison, formula_verdict
from tpsim.links import IB_NDR, NVLINK4_H100
from tpsim.predict.hardware import estimate_breakdown, estimate_step_time
from tpsim.trace.timeline import chrome_trace, plot_timeline, write_chrome_trace
from tpsim.train import AdamW, GradSync, apply_update, broadcast_params, compute_grads

lesson = Lesson("11", RANKS)
grid = ProcessGrid(tp=4, dp=2)
tracer = grid.tracer
lesson.say(grid.table(), "")

# %% [markdown]
# ## A few traced training steps
#
# The demo's training loop (`tpsim.demo.training_loop`) without its pipeline machinery, cut to its bones: TP
# rank 0 reads the batch and broadcasts it (the SenseParrots article, §3.1), `compute_grads` runs forward, the
# DP loss normaliser, backward and the DDP bucket all-reduce, and `apply_update` clips (one all-reduce of the
# squared norm over TP) and steps AdamW. `tracer.step` tags every record and span with the step it belongs to.

# %%
lesson.section("A few traced training steps")
config = GPTConfig(vocab_size=16, n_positions=8, n_embd=32, n_layer=2, n_head=4)
SEED, BATCH, STEPS, CLIP = 11, 8, 3, 1.0
task = ReverseTask(config.vocab_size, config.n_positions)
model = build_gpt(config, grid.tp_group, seed=SEED)
tracer.step = 0
broadcast_params(model, grid)  # phase "init": set-up, not part of any training step's volume
sync = GradSync(model, grid.dp_group)
optimizer = AdamW(model, lr=3e-3)
for step in range(STEPS):
    tracer.step = step
    ids, labels, _ = read_batch(grid, task, SEED, step, BATCH)
    loss, _ = compute_grads(model, grid, sync, ids, labels)
    with tracer.span("optimizer", "optimizer"):
        apply_update(model, optimizer, grid, CLIP)
    lesson.say(f"step {step}: loss {loss:.4f}")
LAST = STEPS - 1

mine = [e.as_dict() for e in tracer.events]  # this rank's records, before the gathers below add their own
my_spans = [s.as_dict() for s in tracer.spans]
tracer.step = STEPS  # the gathers are tagged after the training steps
records = gather_records(tracer, grid.world)  # every rank's records on rank 0 (None elsewhere)
spans = gather_spans(tracer, grid.world, last_steps=1)  # spans are many: keep the last step's
lesson.say("", f"rank 0 holds {len(records or [])} records and {len(spans or [])} spans from {RANKS} ranks", "")

# %% [markdown]
# ## The records, by layer
#
# One record is one collective call on one rank: `rank, step, phase, scope, op, group, group_size, shape,
# dtype, bytes, wire_bytes, start, duration` (the README's "communication record" lists them all).
# `bytes` is the logical tensor — the all-reduced buffer, the gathered output, the unreduced input of a
# reduce-scatter. Grouping the last step's records by layer (`layer_of(scope)`), phase, op and group, and
# dividing by the number of ranks, gives the story of one rank:

# %%
lesson.section("The records, by layer")
if lesson.rank == 0:
    lesson.say(step_table(records, LAST, RANKS), "")
lesson.expect("bytes is the logical tensor: its elements times the dtype's size, for every record")
lesson.check("every record's bytes = its shape's elements × the dtype's size",
             f"{len(mine)} records on each rank",
             all(r["bytes"] == int(np.prod(r["shape"])) * np.dtype(r["dtype"]).itemsize for r in mine))

# %% [markdown]
# ## Every row against the formulas
#
# `predict_step` writes down what §3 of the Megatron-LM paper (Shoeybi et al. 2019) says a step must issue:
# per block two all-reduces of `b·s·h` forward (g after attention and after the MLP) and two backward (f
# before them); the embedding's all-reduce, the LM head's in the backward, the loss's three `[b·s]`
# all-reduces; the batch broadcast, the DP loss normaliser, the DDP bucket, the clip all-reduce. `compare`
# lines the trace up against it: a row matches when the calls and the bytes per rank are *exactly* equal. A
# collective nobody predicted, or one that went missing, fails its row.

# %%
lesson.section("Every row against the formulas")
run = RunConfig.of(config, tp=grid.tp, dp=grid.dp, batch_size=BATCH)  # the run: model, grid, batch, float64
predicted = predict_step(run, clip=True, ddp_buckets=len(sync.buckets))
if lesson.rank == 0:
    rows = compare([r for r in records if r["step"] == LAST], predicted)
    lesson.say(format_comparison(rows, title=f"measured vs predicted, step {LAST}, per rank:"), "",
               formula_verdict(rows)[1], "")
verdicts = [formula_verdict(compare([r for r in mine if r["step"] == step], predicted)) for step in range(STEPS)]
lesson.expect("no collective more, none fewer, and the same bytes as the formulas, in every step")
lesson.check("every (layer, phase, op, group) row equals predict_step, in every step, on every rank",
             f"{len(predicted)} rows × {STEPS} steps", all(ok for ok, _ in verdicts))

# %% [markdown]
# ## Wire bytes from the ring
#
# `bytes` says how big the tensor is; `wire_bytes` says how much one rank *sends* for it under the
# bandwidth-optimal ring. Cut the tensor into p chunks of `B/p`. A ring reduce-scatter takes p − 1 steps,
# and in each one every rank sends one chunk to its neighbour (and adds the one it receives): `(p−1)·B/p`.
# An all-gather is the same walk without the additions: `(p−1)·B/p`. A ring all-reduce is the two in a row:
# `2(p−1)·B/p`. A broadcast is a pipelined chain: every rank but the last forwards the whole buffer, `B`.
# So, apart from the broadcast, wire bytes = the ring's latency steps (`ring_steps`) × one chunk. At TP 4 an
# all-reduce sends 1.5 times its bytes and an all-gather or reduce-scatter 0.75 times; over the DP pairs
# (p = 2) an all-reduce sends exactly its bytes:

# %%
def ring_wire(op: str, nbytes: int, p: int) -> int:
    if op == "broadcast":
        return nbytes if p > 1 else 0
    return ring_steps(op, p) * nbytes // p


lesson.section("Wire bytes from the ring")
lesson.expect("the ring formula reproduces every record's wire bytes")
lesson.check("every record's wire_bytes = ring_steps(op, p) × B/p (broadcast: B)", f"{len(mine)} records",
             all(r["wire_bytes"] == ring_wire(r["op"], r["bytes"], r["group_size"]) for r in mine))
ratios = sorted({(r["group"], r["op"], r["wire_bytes"] / r["bytes"]) for r in mine if r["op"] == "all_reduce"})
lesson.expect("wire / bytes of the all-reduces: 2(p−1)/p = 1.5 in the TP groups (p = 4), 1 in the DP pairs")
lesson.equal("(group, op, wire bytes / bytes) of this rank's all-reduces", ratios,
             [("dp", "all_reduce", 1.0), ("tp", "all_reduce", 1.5)])
last = [r for r in mine if r["step"] == LAST]
by_group = {g: sum(r["wire_bytes"] for r in last if r["group"] == g) for g in ("tp", "dp")}
lesson.say(f"wire bytes per step on this rank: TP {human_bytes(by_group['tp'])}, DP {human_bytes(by_group['dp'])}",
           "")

# %% [markdown]
# ## The timeline
#
# Spans and records share one clock per rank (and the ranks of one machine share `time.perf_counter`, so
# the common t0 taken after a barrier lines them up). `chrome_trace` turns them into the Chrome trace
# format: each rank is a process (`pid` = rank) with two threads, `compute` and `communication`; each span
# or collective is a complete event (`ph: "X"`, `ts`/`dur` in µs) whose `args` carry the scope, phase, bytes,
# group and shape. Viewers draw a thread's events as a stack, so they must **nest**: a child inside its
# parent, never half in and half out. The spans of one rank nest by construction (a layer's span opens
# before and closes after its children's) — we check that on the raw spans of every rank, on the file, and
# that every forward/backward collective happens inside the span of the layer that issued it.

# %%
def nests(intervals: list[tuple[float, float]]) -> bool:
    """True when no interval (start, end) partly overlaps another: each is inside or after the ones before."""
    ends: list[float] = []
    for start, end in sorted(intervals, key=lambda t: (t[0], -t[1])):
        while ends and ends[-1] <= start:
            ends.pop()
        if ends and end > ends[-1]:
            return False
        ends.append(end)
    return True


lesson.section("The timeline")
step_spans = [s for s in my_spans if s["step"] == LAST]
lesson.expect("spans open before and close after their children's, so each rank's spans nest")
lesson.check("the spans of every rank nest (raw times, last step)", f"{len(step_spans)} spans on each rank",
             nests([(s["start"], s["start"] + s["duration"]) for s in step_spans]))


def inside_its_layer(r: dict) -> bool:
    """A forward/backward collective lies within a span of its own layer (``transformer.h.0.attn`` for
    ``transformer.h.0.attn.c_proj``), same rank, same step, same phase."""
    return any(s["scope"] and (r["scope"] == s["scope"] or r["scope"].startswith(s["scope"] + "."))
               and s["phase"] == r["phase"] and s["start"] <= r["start"]
               and r["start"] + r["duration"] <= s["start"] + s["duration"] for s in step_spans)


model_calls = [r for r in last if r["phase"] in ("forward", "backward")]
lesson.expect("a layer's collectives happen while the layer runs: inside its span, same phase")
lesson.check("every forward/backward collective lies inside its layer's compute span",
             f"{len(model_calls)} collectives on each rank", all(inside_its_layer(r) for r in model_calls))

tracks_nest, n_events = True, 0
if lesson.rank == 0:
    trace = chrome_trace(spans, records, steps={LAST})
    lesson.out.mkdir(parents=True, exist_ok=True)
    lesson.say(f"wrote {write_chrome_trace(trace, lesson.out / 'timeline.json')}")
    tracks: dict[tuple[int, int], list] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            n_events += 1
            ns = round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)
            tracks.setdefault((e["pid"], e["tid"]), []).append(ns)
    tracks_nest = len(tracks) == 2 * RANKS and all(nests(t) for t in tracks.values())
    path = plot_timeline(spans, records, LAST, lesson.out / "11_timeline.png",
                         title=f"step {LAST} of a TP(4) x DP(2) GPT: compute spans above, collectives below")
    lesson.say(f"wrote {path}", "")
lesson.expect(f"the file has a compute and a communication track for each of the {RANKS} ranks, and they nest")
lesson.check("timeline.json: 2 tracks per rank (compute, communication), events nest on each",
             f"{n_events} complete events", tracks_nest)

# %% [markdown]
# **Opening it.** Go to <https://ui.perfetto.dev>, choose *Open trace file* and pick
# `tpsim-out/lessons/timeline.json` (or drag it onto the page; `chrome://tracing` works too). Each rank is a
# process row with a `compute` and a `communication` track. `W`/`S` zoom, `A`/`D` pan; click an event to see
# its `args` (scope, phase, op, group and its ranks, shape, bytes, wire bytes); select a range to sum the time
# of everything in it. Look for the DDP all-reduce after the backward on all eight ranks, and for how the TP
# groups (ranks 0–3, 4–7) leave each all-reduce together. A collective's duration includes the wait for the
# last rank to arrive: here eight ranks share two cores, so most of the communication lane is a rank waiting
# for a partner the operating system has not scheduled yet, not bytes moving. On a real machine the same
# picture shows a straggler, a slow link or an unbalanced split.
#
# **`tpsim report`.** The demo writes a run folder (`--out`): `comm.jsonl` (these records), `spans.jsonl`,
# `metrics.jsonl`, `timeline.json`. `tpsim report RUN_DIR` reads it back without MPI and prints one step's
# communication per module, forward and backward side by side, like PyTorch's `CommDebugMode` with bytes;
# `--by layer` or `--by op` flattens it, `--rank R` shows one rank, `--step N` another step; `tpsim plot RUN_DIR`
# redraws the figures. We write this run's records as a folder and report on it:

# %%
report_status = 0
if lesson.rank == 0:
    from tpsim.trace.cli import report_main

    run_dir = lesson.out / "11_run"
    write_jsonl(records, run_dir / "comm.jsonl")
    write_jsonl(spans, run_dir / "spans.jsonl")
    lesson.say(f"$ tpsim report {run_dir} --by layer")
    report_status = report_main([str(run_dir), "--by", "layer"])
    lesson.say("")
lesson.expect("tpsim report reads the folder back without MPI and exits 0")
lesson.equal("tpsim report reads the folder back (exit status)", report_status, 0)

# %% [markdown]
# ## What would this cost on real links? The α-β model
#
# One ring step costs a latency `α` plus the bytes it sends times `β = 1/bandwidth`, so a collective costs
# `ring_steps·α + wire_bytes·β` (`ring_time`). Summing that over a step's records prices the step's
# communication on a link, with nothing overlapped. `tpsim.links` has nominal presets: NVLink 4
# inside a node (450 GB/s each way per GPU, α 3 µs assumed) and InfiniBand NDR between nodes (50 GB/s per
# GPU, α 8 µs assumed) — vendor peaks and assumptions, not measurements. A TP × DP grid can put TP on either:

# %%
lesson.section("What would this cost on real links? The α-β model")
placements = {"TP in node (NVLink), DP across (IB)": {"tp": NVLINK4_H100, "dp": IB_NDR},
              "TP across nodes (IB), DP in node (NVLink)": {"tp": IB_NDR, "dp": NVLINK4_H100}}
step_records = [r for r in mine if r["step"] == LAST]
toy = {place: estimate_breakdown(step_records, links) for place, links in placements.items()}
rows = [["this step, priced", "TP µs", "DP µs", "total µs"]]
rows += [[place, f"{t.get('tp', 0) * 1e6:.1f}", f"{t.get('dp', 0) * 1e6:.1f}", f"{sum(t.values()) * 1e6:.1f}"]
         for place, t in toy.items()]
lesson.say(table(rows), f"(measured here, over shared memory: "
                        f"{sum(r['duration'] for r in step_records) * 1e6:.0f} µs in collectives on this rank)", "")
in_node, across = (sum(t.values()) for t in toy.values())
lesson.expect("pricing the records or the formulas gives the same seconds; TP on NVLink beats TP on InfiniBand")
lesson.close("the trace priced = the formulas priced (TP in node), seconds",
             estimate_step_time(step_records, placements["TP in node (NVLink), DP across (IB)"]),
             estimate_step_time(predicted, placements["TP in node (NVLink), DP across (IB)"]), tol=1e-12)
lesson.check("this step: TP in the node is cheaper than TP across nodes", f"{in_node * 1e6:.1f} vs "
             f"{across * 1e6:.1f} µs", in_node < across)

# %% [markdown]
# The toy's tensors are tiny, so its price is almost all α: fifteen TP collectives a step against two on
# DP. The formulas need no run at all, so the same question can be asked of a real model. GPT-2 medium
# (h 1024, 24 layers, 16 heads, vocabulary 50 257), 16-bit, 8 sequences of 1024 tokens per DP rank, TP 8 ×
# DP 8 on 8 nodes of 8 GPUs:

# %%
medium = GPTConfig(vocab_size=50257, n_positions=1024, n_embd=1024, n_layer=24, n_head=16)
tp8, dp8, rows_per_dp = 8, 8, 8
big = predict_step(RunConfig.of(medium, tp=tp8, dp=dp8, batch_size=rows_per_dp * dp8), clip=True, ddp_buckets=1,
                   itemsize=2)  # every tensor in 2 bytes, as a bf16 run would send it
priced = {place: estimate_breakdown(big, links) for place, links in placements.items()}
rows = [["GPT-2 medium, TP 8 × DP 8", "TP ms", "DP ms", "total ms"]]
rows += [[place, f"{t['tp'] * 1e3:.1f}", f"{t['dp'] * 1e3:.1f}", f"{sum(t.values()) * 1e3:.1f}"]
         for place, t in priced.items()]
tp_bytes = sum(r.wire_bytes for r in big if r.group == "tp")
dp_bytes = sum(r.wire_bytes for r in big if r.group == "dp")
lesson.say(table(rows), f"wire bytes per rank per step: TP {human_bytes(tp_bytes)}, DP {human_bytes(dp_bytes)}",
           "")
big_in, big_across = (sum(t.values()) for t in priced.values())
lesson.expect("GPT-2 medium: TP's activation traffic dwarfs DP's, so it needs the fast link even more")
lesson.check("GPT-2 medium: TP in the node is cheaper than TP across nodes",
             f"{big_in * 1e3:.1f} vs {big_across * 1e3:.1f} ms (×{big_across / big_in:.1f})", big_in < big_across)

# %% [markdown]
# TP moves activations — four `b·s·h` all-reduces per block per step, growing with the batch and the
# sequence — while DP moves each gradient once per step. TP's traffic is many times DP's here, and it sits
# on the critical path of every layer (DP's bucket all-reduce can overlap the backward), so it gets the
# fastest link: Megatron keeps the TP group inside the NVLink domain and lets data (and pipeline)
# parallelism cross the nodes.
#
# ## What to take away
#
# * A record is one collective on one rank: `bytes` the logical tensor, `wire_bytes` what the ring sends.
# * `predict_step` + `compare` check a trace row by row; the ring formulas check every record's wire bytes.
# * `timeline.json` opens in ui.perfetto.dev: a process per rank, compute and communication tracks, nested.
# * The α-β model prices a trace or a prediction on any link; for TP the fast link matters most.
#
# Exercise: `ring_wire_bytes` and `block_forward_wire_bytes` in `ex11_reading_a_trace.py`: `tpsim lesson start 11`
# copies it into your work folder (`tpsim-work/`), then `tpsim check 11`.

# %%
lesson.takeaways()
lesson.finish()
