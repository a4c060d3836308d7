# %% [markdown]
# # Lesson 16 — Planning a real run
#
# Runs on **1 rank**: `mpirun -n 1 python lessons/16_planning_a_real_run.py` (or `tpsim lesson run 16`).
#
# The question researchers bring to tensor parallelism is at real size: *will Llama-3-70B fit on 64 H100s at
# TP 8, and what will the communication cost?* `tpsim plan` answers it with pure arithmetic — the same formula
# modules every live run in these lessons is checked against. This lesson takes one plan apart term by term:
# the model state per parameter, the parameters one GPU holds, one layer's activations, the micro-batches a
# pipeline keeps in flight, the bytes each group sends, and what ZeRO-1 saves; then it runs a tiny model for
# real and watches the per-layer terms come out exactly as the planner says.
#
# It puts together what earlier lessons measured on live ranks: lesson 10's sequence parallelism and the split
# of Table 2's activations it buys; lesson 11's α-β pricing of a collective; lesson 12's KV heads, split by TP
# or replicated when TP exceeds them; lesson 14's bytes-per-parameter table and ZeRO-1; lesson 15's bf16 run,
# 2-byte weights with 4-byte main gradients.
#
# Sources: Megatron-LM's distributed-optimizer table (docs/source/api-guide/dist_optimizer.md); Korthikanti et
# al. 2022, "Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198, §4.2.2 and
# Table 2; Rajbhandari et al. 2019, "ZeRO", arXiv:1910.02054, §3.1; Narayanan et al. 2021, "Efficient
# Large-Scale Language Model Training on GPU Clusters", arXiv:2104.04473, §2.2 and Appendix; Shoeybi et al.
# 2019, "Megatron-LM", arXiv:1909.08053.

# %%
RANKS = 1

from dataclasses import replace

import numpy as np

from tpsim.plan.comm import links
from tpsim.gpus import gpu
from tpsim.plan.layout import Layout
from tpsim.plan.memory import (activation_bytes_per_layer, stage_param_elements, state_bytes_per_param,
                               total_params)
from tpsim.plan.models import PRESETS, gpt
from tpsim.plan.planner import plan
from tpsim.plan.published import zero_paper_example
from tpsim.plan.report import format_plan, format_search
from tpsim.plan.schedule import actions, grid as schedule_grid, idle, in_flight
from tpsim.plan.search import search
from tpsim.teach.runtime import Lesson, table

lesson = Lesson("16", RANKS)
LLAMA = PRESETS["llama3-70b"]
LAYOUT = Layout(tp=8, pp=4, dp=2, sp=True, recompute="selective", seq_len=8192, global_batch=256)

# %% [markdown]
# ## Model state: bytes per parameter
#
# Mixed-precision Adam keeps, per parameter: the 16-bit weight, its gradient, and the optimizer's fp32 state —
# a master copy of the weight and the two moments. Megatron-LM's table (lesson 14): with bf16 weights and fp32
# gradients 2 + 4 + 12 = 18 bytes (lesson 15's run: 2-byte weights, 4-byte main gradients); in fp32
# 4 + 4 + 8 = 16. The table's fp16 row keeps a 16-bit gradient beside an fp32 main one (2 + 2 + 16 = 20), but
# fp16 runs accumulate their gradients in fp32 as bf16 runs do (Megatron-LM's
# `--accumulate-allreduce-grads-in-fp32`, and Korthikanti et al. 2022 count it so), so the planner gives fp16
# the bf16 row's 18. The distributed
# optimizer (ZeRO stage 1) splits only the optimizer column over the d data-parallel replicas: 18 → 6 + 12/d.
# The ZeRO paper counts 2 + 2 + 12 = 16 (it keeps no fp32 gradient copy), so its 7.5 B example is 120 GB a GPU,
# 31.4 GB with the optimizer states sharded over 64.

# %%
lesson.section("Model state: bytes per parameter")
lesson.expect("18 for bf16 and for fp16 (fp32 gradients), 16 for fp32; ZeRO-1 over d = 8 leaves 6 + 12/8")
lesson.equal("bytes per parameter, bf16 / fp16 / fp32", tuple(state_bytes_per_param(d)["total"]
                                                              for d in ("bf16", "fp16", "fp32")), (18, 18, 16))
lesson.equal("bf16 with ZeRO-1 over d = 8", state_bytes_per_param("bf16", zero=1, dp=8)["total"], 6 + 12 / 8)
z = zero_paper_example()
lesson.expect("the ZeRO paper's example: 120 GB, then 31.4 GB with optimizer states sharded over 64 GPUs")
lesson.equal("ZeRO paper, 7.5 B parameters: GB before and after sharding",
             (round(z["baseline_gb"], 1), round(z["os_sharded_gb"], 1)), (120.0, 31.4))

# %% [markdown]
# ## Parameters on one GPU
#
# Llama-3-70B: h = 8192, 80 layers, 64 query heads of 128 and 8 KV heads, a SwiGLU MLP of 28672 columns, a
# 128256-token vocabulary, an untied LM head. A layer's matrices — q and o (h × h each), k and v (h × 1024 each:
# 8 KV heads of 128, one per rank at TP 8, lesson 12), gate, up and down (h × 28672 each) — are split by TP; its
# two RMSNorm weights (h each) are not. With PP 4 a stage holds 20 layers, and the first one the embedding too
# (V/t rows of h).

# %%
lesson.section("Parameters on one GPU")
h, f, kv = LLAMA.hidden, LLAMA.ffn, LLAMA.kv_heads * LLAMA.head_dim
layer = (2 * h * h + 2 * h * kv + 3 * h * f) // 8 + 2 * h
by_hand = LLAMA.layers // 4 * layer + LLAMA.vocab // 8 * h
lesson.expect("20 layers at TP 8 plus one eighth of the embedding: the planner's count for stage 0, exactly")
lesson.equal("stage 0's parameters per GPU, by hand vs the planner", by_hand, stage_param_elements(LLAMA, 8, 4, 0))
lesson.expect("the whole model is Meta's released count to the parameter: 70,553,706,496")
lesson.equal("Llama-3-70B parameters", total_params(LLAMA), 70_553_706_496)

# %% [markdown]
# ## One layer's activations
#
# Korthikanti et al. count what a GPT layer keeps for its backward, in bytes with 16-bit activations and 1-byte
# dropout masks (Table 2): with TP, sbh(10 + 24/t + 5as/(ht)) — the 10 is the LayerNorm and dropout region every
# rank holds whole; with SP that region is split too, sbh/t·(34 + 5as/h) (lesson 10); selective recompute drops
# the attention scores, the 5as/h term, which grows with the sequence. At GPT-3's layer (s 2048, h 12288, a 96,
# t 8) the scores are 5as/(ht) = 10 of the TP line's 23, less than half; in the TP + SP line the scores are most
# of it, 80 of 114. tpsim's own layers keep one more small term, LayerNorm's rstd, shown apart.

# %%
lesson.section("One layer's activations")
g3 = PRESETS["gpt3-175b"]
s, b, hh, a, t = 2048, 1, g3.hidden, g3.heads, 8
table2 = {"TP": s * b * hh * (10 + 24 / t + 5 * a * s / (hh * t)), "TP + SP": s * b * hh / t * (34 + 5 * a * s / hh),
          "TP + SP, selective": s * b * hh * 34 / t}
planner = {"TP": Layout(tp=t, seq_len=s), "TP + SP": Layout(tp=t, sp=True, seq_len=s),
           "TP + SP, selective": Layout(tp=t, sp=True, recompute="selective", seq_len=s)}
lesson.expect("the planner's GPT layer is Korthikanti Table 2's row, for each of the three")
for name, lay in planner.items():
    lesson.close(f"GPT-3 layer, {name}: planner vs Table 2 (bytes)", activation_bytes_per_layer(g3, lay)["paper"],
                 table2[name], tol=1e-3)
scores_tp, rest_tp, scores_sp = 5 * a * s / (hh * t), 10 + 24 / t, 5 * a * s / hh
lesson.expect("the scores: less than half of the TP line (10 of 23), most of the TP + SP line (80 of 114)")
lesson.check("scores vs the rest, TP line (x sbh)", f"{scores_tp:.0f} vs {rest_tp:.0f}", scores_tp < rest_tp)
lesson.check("scores vs the rest, TP + SP line (x sbh/t)", f"{scores_sp:.0f} vs 34", scores_sp > 34)

# %% [markdown]
# ## Llama's layer, and tpsim's own terms
#
# No paper gives Llama's row, so the planner derives it from the architecture in Megatron's way of counting, in
# 2-byte elements with r = t under SP (else 1), d = 128 the head size and g_t the KV heads a rank holds (g/t, or
# 1 when they are replicated): 4sbh/r (both RMSNorms' inputs and outputs) + 2sbh/t (q after RoPE, the attention
# context) + 2·s·b·d·g_t (k and v after RoPE) + 3sbf/t (gate, up and their product, down's input) + a·s²·b/t
# (the softmax output, which selective recompute drops). No dropout, so no masks.
#
# tpsim's NumPy layers keep four more things their hand-written backward reads, shown apart as "tpsim's own
# terms": each RMSNorm's saved 1/rms, one number a token (2bs/r); k and v repeated to each of the rank's a/t
# query heads (2sbh/t − 2·s·b·d·g_t beyond the KV heads themselves); SiLU's output kept beside the product
# (sbf/t); and RoPE's cos and sin tables, [s, d] each (2sd). The plan's memory counts the paper's layer only.

# %%
lesson.section("Llama's layer, and tpsim's own terms")
s, b, d, t = LAYOUT.seq_len, LAYOUT.micro_batch, LLAMA.head_dim, LAYOUT.tp
sbh, sbf, g_t = s * b * h, s * b * f, max(LLAMA.kv_heads // t, 1)
terms = {"4sbh/r  RMSNorm inputs, outputs": 4 * sbh // t, "2sbh/t  q after RoPE, context": 2 * sbh // t,
         "2sbd g_t  k, v after RoPE": 2 * s * b * d * g_t, "3sbf/t  gate, up, product": 3 * sbf // t}
own = {"2bs/r  RMSNorms' 1/rms": 2 * b * s // t, "2sbh/t - 2sbd g_t  k, v repeated": 2 * sbh // t - 2 * s * b * d * g_t,
       "sbf/t  SiLU output": sbf // t, "2sd  RoPE cos, sin": 2 * s * d}
rows = [["Llama-3-70B layer, TP 8 + SP, selective", "elements"]]
rows += [[k, f"{v:,}"] for k, v in terms.items()] + [["  tpsim's own: " + k, f"{v:,}"] for k, v in own.items()]
lesson.say(table(rows, right=(1,)))
llama_layer = activation_bytes_per_layer(LLAMA, LAYOUT)
lesson.expect("2 bytes x the four terms is the plan's 0.28 GB a layer; 2 x tpsim's four is its 92,278,784 B apart")
lesson.equal("Llama layer, paper terms x 2 B vs the planner", 2 * sum(terms.values()), llama_layer["paper"])
lesson.equal("tpsim's own terms x 2 B vs the planner", 2 * sum(own.values()), llama_layer["tpsim_extra"])

# %% [markdown]
# ## A pipeline keeps micro-batches in flight
#
# Under the 1F1B schedule (Narayanan et al. 2021, §2.2.1) stage i of p runs p − i − 1 warm-up forwards, then
# alternates one forward and one backward, then drains the backwards left. So stage i has run p − i forwards when
# its first backward comes and holds min(p − i, m) micro-batches' activations: the first stage is the busiest
# and holds p of them — L/p layers × p micro-batches, as many layers' worth as the whole model. Every stage is
# busy m·(t_f + t_b) and waits (p − 1)·(t_f + t_b), the time a micro-batch takes to fill the pipe and to drain it:
# the bubble is (p − 1)/m of the compute. `tpsim.plan.schedule` simulates the schedule from its dependencies
# alone (a forward waits for the stage before, a backward for the stage after) — here p = 4, m = 6, a backward
# twice as long as a forward, one column per unit of time:

# %%
lesson.section("A pipeline keeps micro-batches in flight")
P, M, TF, TB = 4, 6, 1, 2
lesson.say(*schedule_grid(P, M, TF, TB))
first_b = [[kind for kind, _ in order].index("B") for order in actions(P, M)]
lesson.expect("stage i runs p - i forwards before its first backward and holds at most min(p - i, m) micro-batches")
lesson.equal("forwards before the first backward, stages 0-3", first_b, [P - i for i in range(P)])
lesson.equal("micro-batches in flight, stages 0-3", in_flight(P, M), [min(P - i, M) for i in range(P)])
lesson.expect("every stage idles (p - 1)(t_f + t_b) = 9 units of its 18 busy ones: (p - 1)/m = 3/6")
lesson.equal("idle units per stage, simulated", idle(P, M, TF, TB), [(P - 1) * (TF + TB)] * P)

# %% [markdown]
# The plan of the opening question, with `tpsim plan --model llama3-70b --tp 8 --pp 4 --dp 2 --sp --recompute
# selective --seq-len 8192 --global-batch 256`: 128 micro-batches a replica, 4 in flight on stage 0. The planner
# runs the same 1F1B lists on the virtual clock, each stage costing its own kernels: stage 3 also has the LM head
# (2·h·V FLOPs a token, about one more layer) and the loss, so it sets the pace and the others wait — a bubble
# above the formula's
# (p − 1)/(m + p − 1) = 3/131 of the step, which holds for equal stages.

# %%
p70 = plan(LLAMA, LAYOUT)
lesson.say(format_plan(p70))
per_layer = llama_layer["paper"]
lesson.expect("stage 0: 20 layers x 4 micro-batches of one layer's activations (the first stage has no logits)")
lesson.close("stage 0's activations vs 20 x 4 x one layer (bytes)", p70.per_gpu["memory_bytes"]["activations"],
             20 * 4 * per_layer, tol=1.0)  # the paper's layer: tpsim's own extra terms are not a real run's
lesson.expect(f"a tpsim run would keep 20 x 4 x {llama_layer['tpsim_extra']:,.0f} B more there: 7.38 GB")
lesson.equal("tpsim's own terms on stage 0, GB", round(20 * 4 * llama_layer["tpsim_extra"] / 1e9, 2), 7.38)
bubble, busy = p70.pipeline["bubble_fraction"], [r["busy_s"] for r in p70.pipeline["ranks"]]
lesson.expect("the formula's bubble is 3/131 of the step; measured, it is larger: the last stage is the busiest")
lesson.close("the plan's formula bubble vs 3/131", bubble["formula"], 3 / 131)
lesson.check("measured > formula, the busiest rank the last", f"{bubble['measured']:.4f} > {bubble['formula']:.4f}",
             bubble["measured"] > bubble["formula"] and max(busy) == busy[3] > busy[0])

# %% [markdown]
# ## What the communication costs
#
# The second half of the question. The plan's wire bytes are stage 0's own: what one of its GPUs sends in a
# step. TP, per layer and micro-batch under SP (lesson 10): an all-gather before attention and before the MLP and
# a reduce-scatter after each, forward; their conjugates and a re-gather of each column-parallel input, backward
# — 10 collectives of a [s, b, h] bf16 activation, each sending (t − 1)/t of it — plus the two norms' [h]
# gradient all-reduces. Stage 0 adds the embedding (an all-reduce forward, an all-gather backward) and the
# token ids, b·s int64 broadcast over TP (tpsim broadcasts ids and labels together; a pipeline's first stage
# needs the ids, its last the labels); the last stage has the LM head and the loss instead, and no GPU has both.
# Once a step comes the gradient norm's one-number all-reduce. DP all-reduces the stage's fp32 gradients once a
# step; PP sends one [s/t, b, h] activation a micro-batch forward (stage 0 sends no gradient back: nothing
# precedes it).
#
# TP sends over 300 times DP's bytes, and it sits between a layer's matmuls, where nothing hides it. Priced by
# lesson 11's α-β model, on NVLink (450 GB/s each way) it costs seconds a step; spread over two nodes it runs on
# InfiniBand (50 GB/s per GPU, a ninth of the bandwidth, with a longer α assumed), over 8 times as long. That
# is why TP stays inside a node and DP and PP take the links between nodes: `figures/plan_tp_placement.png`
# (`make figures`) draws it for three models.

# %%
lesson.section("What the communication costs")
m, act, t = LAYOUT.microbatches, s * b * h * 2, LAYOUT.tp
norm_sync = 2 * (t - 1) * (2 * h) // t
tp_layer = 10 * (t - 1) * act // t + 2 * norm_sync
tp_stage0 = m * (20 * tp_layer + 3 * (t - 1) * act // t + b * s * 8) + 2 * (t - 1) * 8 // t  # + clip's fp64
n0 = stage_param_elements(LLAMA, 8, 4, 0)
wire = p70.per_gpu["wire_bytes_per_step"]
lesson.expect("stage 0's bytes by hand: m x (20 layers + embedding + ids) + the clip norm; n x 4 B; m [s/t, b, h]")
lesson.check("TP bytes per step, by hand vs the plan", f"{tp_stage0:,} B", tp_stage0 == wire["tp"])
lesson.check("DP bytes: fp32 gradients all-reduced over 2", f"{n0 * 4:,} B", n0 * 4 == wire["dp"])
lesson.check("PP bytes: 128 activations forward", f"{m * act // t:,} B", m * act // t == wire["pp"])
lesson.expect("TP sends more than 300 x DP's bytes; over InfiniBand it takes more than 8 x its NVLink time")
lesson.check("TP bytes / DP bytes", f"{wire['tp'] / wire['dp']:.0f}", wire["tp"] > 300 * wire["dp"])
two_nodes = replace(LAYOUT, gpus_per_node=4)  # the same TP 8 group, 4 GPUs a node
spread = plan(LLAMA, two_nodes)
for lay, q in ((LAYOUT, p70), (two_nodes, spread)):
    lesson.say(f"TP on {links(lay, gpu(lay.gpu))['tp'].name}: {q.time_s['tp']:.2f} s a step")
lesson.check("TP time over two nodes / in one node", f"{spread.time_s['tp'] / p70.time_s['tp']:.2f}",
             spread.time_s["tp"] > 8 * p70.time_s["tp"])

# %% [markdown]
# ## ZeRO-1: the optimizer split over DP
#
# Lesson 14's distributed optimizer at this size: `tpsim plan ... --zero 1`. Each of the 2 DP replicas keeps
# the fp32 master weights and moments of half its stage's parameters, so the optimizer's 12 bytes a parameter
# become 6 and its 27.25 GB halves exactly; weights and gradients stay. The gradient sync becomes a
# reduce-scatter of the fp32 gradients and an all-gather of the bf16 weights: 4 + 2 bytes a parameter half sent,
# against the all-reduce's 4.

# %%
lesson.section("ZeRO-1: the optimizer split over DP")
z1 = plan(LLAMA, replace(LAYOUT, zero=1))
mem0, mem1 = p70.per_gpu["memory_bytes"], z1.per_gpu["memory_bytes"]
rows = [["stage 0, GB", "ZeRO-0", "ZeRO-1"]]
rows += [[k, f"{mem0[k] / 1e9:,.2f}", f"{mem1[k] / 1e9:,.2f}"] for k in ("params", "grads", "optimizer", "total")]
rows += [["DP wire per step", f"{wire['dp'] / 1e9:,.2f}", f"{z1.per_gpu['wire_bytes_per_step']['dp'] / 1e9:,.2f}"]]
lesson.say(table(rows, right=(1, 2)))
lesson.expect("the optimizer 27.25 -> 13.62 GB (12 -> 6 bytes a parameter), the rest unchanged; DP sends 3n, not 4n")
lesson.equal("optimizer bytes, ZeRO-1 vs n x 12 / 2", mem1["optimizer"], n0 * 12 // 2)
lesson.equal("params + grads, unchanged", (mem1["params"], mem1["grads"]), (mem0["params"], mem0["grads"]))
lesson.equal("total, GB: ZeRO-0 -> ZeRO-1 (13.62 GB less)",
             (round(mem0["total"] / 1e9, 2), round(mem1["total"] / 1e9, 2)), (63.36, 49.73))
lesson.equal("DP bytes: fp32 reduce-scatter + bf16 all-gather over 2", z1.per_gpu["wire_bytes_per_step"]["dp"],
             n0 * 4 // 2 + n0 * 2 // 2)

# %% [markdown]
# ## Searching the layouts
#
# `--search` tries every tp × pp × dp = N (tp inside a node, divisibility of heads, KV heads, layers and batch),
# drops what does not fit, and ranks the rest by estimated step time — the pipeline's virtual clock at real size,
# each layer's kernels from their shapes, TP, DP and PP on α-β links (lesson 19 takes that clock apart). The
# ranking is an estimate on nominal links, a way to compare layouts, not a measurement.
#
# "Fits" means at most what the card reports less a reserve: nvidia-smi reports an H100 80GB as 81,559 MiB
# (85.52·10⁹ bytes, more than the datasheet's "80 GB"), and the planner keeps 1 GiB of it back for the CUDA
# context, the communication library's buffers and cuBLAS's workspaces — an estimate, not a measurement of them.

# %%
lesson.section("Searching the layouts")
plans = search(LLAMA, LAYOUT, 64)
lesson.say(format_search(plans, 64))
capacity = gpu("h100-80gb").usable_bytes
lesson.expect("every layout listed fits in 81,559 MiB - 1 GiB and they come fastest first")
steps = [q.time_s["step"] for q in plans]
lesson.check("layouts that fit, sorted by step time", f"{len(plans)} layouts",
             bool(plans) and steps == sorted(steps) and all(q.per_gpu["memory_bytes"]["total"] <= capacity
                                                            for q in plans))
lesson.expect("the planner's H100 holds 81,559 MiB - 1 GiB = 84.45·10⁹ B of tensors")
lesson.equal("planner's usable bytes vs 81,559 MiB - 1 GiB", capacity, 81_559 * 2 ** 20 - 2 ** 30)
lesson.equal("in 10⁹ B", round(capacity / 1e9, 2), 84.45)

# %% [markdown]
# ## The per-layer terms, measured
#
# The planner's terms are only as good as their check. Build a tiny GPT (vocabulary 37, h 24, 4 heads,
# sequence 16, float64, dropout 0.1), run one forward and backward here, and measure one layer's cache and the
# model state held — weights, gradients, AdamW's two moments: the planner, asked about the same model at float64,
# must give the same bytes exactly. `tpsim plan --validate` does the same on real ranks for the cases printed
# below (`tpsim.plan.validate.CASES`), DP and ZeRO-1's gradient bytes on the wire included.

# %%
lesson.section("The per-layer terms, measured")
from tpsim.comm import ProcessGrid  # noqa: E402
from tpsim.models.build import build_gpt  # noqa: E402
from tpsim.arch.gpt2 import GPTConfig  # noqa: E402
from tpsim.nn.dropout import DropoutPlan  # noqa: E402
from tpsim.plan.validate import CASES  # noqa: E402
from tpsim.tp.random import ExactDropoutRNG  # noqa: E402
from tpsim.trace.measure import measure_activations, measure_memory  # noqa: E402
from tpsim.train import AdamW, compute_grads  # noqa: E402

grid = ProcessGrid(tp=1)
toy_cfg = GPTConfig(vocab_size=37, n_positions=16, n_embd=24, n_layer=2, n_head=4, dropout=0.1)
toy = gpt("toy", 37, 24, 2, 4, 16)
model = build_gpt(toy_cfg, grid.tp_group, seed=16)
ids = np.random.default_rng(16).integers(0, 37, (2, 16))
_, cache = model.forward(ids, np.roll(ids, -1, axis=1), DropoutPlan(ExactDropoutRNG(16), 0))
compute_grads(model, grid, None, ids, np.roll(ids, -1, axis=1), plan=DropoutPlan(ExactDropoutRNG(16), 0))
measured = measure_activations(cache.transformer.h[0])
predicted = activation_bytes_per_layer(toy, Layout(seq_len=16, micro_batch=2), dtype="fp64")
lesson.expect("one layer's floats and masks = Table 2's elements at 8 bytes a float + tpsim's rstd, exactly")
lesson.equal("transformer.h.0's cache in bytes vs the planner", measured["activations"] + measured["masks"],
             predicted["total"])
held = measure_memory(model, AdamW(model), cache)
lesson.expect("weights + gradients + AdamW state = the planner's count x (8 + 8 + 16) bytes, float64")
lesson.equal("params, grads, optimizer bytes vs the planner", (held.params, held.grads, held.optimizer),
             tuple(stage_param_elements(toy, 1, 1, 0) * k for k in (8, 8, 16)))
lesson.say("tpsim plan --validate runs: " + "; ".join(c.name for c in CASES))

# %% [markdown]
# ## What to take away
#
# * Model state is bytes per parameter × parameters per GPU: 18 with bf16 and Adam, 6 + 12/d with ZeRO-1.
# * A layer's activations grow with s·b·h and, through the attention scores, with s²: SP splits the rest by t,
#   selective recompute removes the scores.
# * Under 1F1B stage i holds min(p − i, m) micro-batches, so the first holds as many layers' activations as the
#   whole model; with equal stages the bubble is (p − 1)/m of the compute, and a heavier last stage adds to it.
# * TP sends hundreds of times DP's bytes between matmuls: keep it on the node's links.
# * The per-layer terms are checked against live runs; the pipeline terms come from the schedule on the virtual
#   clock, the time terms from each layer's kernels (fitted once on published runs: `tpsim plan --published`)
#   and nominal links.
#
# Exercise: `ex16_planning_a_real_run.py`: `tpsim lesson start 16` copies it into your work folder (`tpsim-work/`),
# then `tpsim check 16`.

# %%
lesson.takeaways()
lesson.finish()
