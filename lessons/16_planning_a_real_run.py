# %% [markdown]
# # Lesson 16 — Planning a real run
#
# Runs on **1 rank**: `mpirun -n 1 python lessons/16_planning_a_real_run.py` (or `tpsim lesson run 16`).
#
# The question researchers bring to tensor parallelism is at real size: *will Llama-3-70B fit on 64 H100s at
# TP 8, and what will the communication cost?* `tpsim plan` answers it with pure arithmetic — the same formula
# modules every live run in these lessons is checked against. This lesson takes one plan apart term by term:
# the model state per parameter, the parameters one GPU holds, one layer's activations, the micro-batches a
# pipeline keeps in flight, and the step time; then it runs a tiny model for real and watches the per-layer
# terms come out exactly as the planner says.
#
# Sources: Megatron-LM's distributed-optimizer table (docs/source/api-guide/dist_optimizer.md); Korthikanti et
# al. 2022, "Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198, Table 2;
# Rajbhandari et al. 2019, "ZeRO", arXiv:1910.02054, §3.1; Narayanan et al. 2021, "Efficient Large-Scale
# Language Model Training on GPU Clusters", arXiv:2104.04473, §2.2 and Appendix; Shoeybi et al. 2019,
# "Megatron-LM", arXiv:1909.08053.

# %%
RANKS = 1

import numpy as np

from tpsim.plan.layout import Layout
from tpsim.plan.memory import (activation_bytes_per_layer, stage_param_elements, state_bytes_per_param,
                               total_params)
from tpsim.plan.models import PRESETS, gpt
from tpsim.plan.planner import plan
from tpsim.plan.published import zero_paper_example
from tpsim.plan.report import format_plan, format_search
from tpsim.plan.search import search
from tpsim.teach.runtime import Lesson

lesson = Lesson("16", RANKS)
LLAMA = PRESETS["llama3-70b"]
LAYOUT = Layout(tp=8, pp=4, dp=2, sp=True, recompute="selective", seq_len=8192, global_batch=256)

# %% [markdown]
# ## Model state: bytes per parameter
#
# Mixed-precision Adam keeps, per parameter: the 16-bit weight, its gradient, and the optimizer's fp32 state —
# a master copy of the weight and the two moments. Megatron-LM's table: with bf16 weights and fp32 gradients
# 2 + 4 + 12 = 18 bytes; with fp16 weights and gradients 2 + 2 + 16 = 20 (an fp32 main-gradient buffer too);
# in fp32 4 + 4 + 8 = 16. The distributed optimizer (ZeRO stage 1) splits only the optimizer column over the d
# data-parallel replicas: 18 → 6 + 12/d. The ZeRO paper counts 2 + 2 + 12 = 16 (it converts gradients on the
# fly), so its 7.5 B example is 120 GB a GPU, 31.4 GB with the optimizer states sharded over 64.

# %%
lesson.section("Model state: bytes per parameter")
lesson.expect("Megatron's rows: 18 for bf16, 20 for fp16, 16 for fp32; ZeRO-1 over d = 8 leaves 6 + 12/8")
lesson.equal("bytes per parameter, bf16 / fp16 / fp32", tuple(state_bytes_per_param(d)["total"]
                                                              for d in ("bf16", "fp16", "fp32")), (18, 20, 16))
lesson.equal("bf16 with ZeRO-1 over d = 8", state_bytes_per_param("bf16", zero=1, dp=8)["total"], 6 + 12 / 8)
z = zero_paper_example()
lesson.expect("the ZeRO paper's example: 120 GB, then 31.4 GB with optimizer states sharded over 64 GPUs")
lesson.equal("ZeRO paper, 7.5 B parameters: GB before and after sharding",
             (round(z["baseline_gb"], 1), round(z["os_sharded_gb"], 1)), (120.0, 31.4))

# %% [markdown]
# ## Parameters on one GPU
#
# Llama-3-70B: h = 8192, 80 layers, 64 query heads of 128 and 8 KV heads, a SwiGLU MLP of 28672 columns, a
# 128256-token vocabulary, an untied LM head. A layer's matrices — q and o (h × h each), k and v (h × 1024 each),
# gate, up and down (h × 28672 each) — are split by TP; its two RMSNorm weights (h each) are not. With PP 4 a
# stage holds 20 layers, and the first one the embedding too (V/t rows of h).

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
# rank holds whole; with SP that region is split too, sbh/t·(34 + 5as/h); selective recompute drops the
# attention scores, the 5as/h term, which grows with the sequence. At GPT-3's layer (s 2048, h 12288, a 96,
# t 8) the scores are most of it. tpsim's own layers keep one more small term, LayerNorm's rstd, shown apart.

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
lesson.expect("the attention scores are more than half of the TP + SP layer at s = 2048")
lesson.check("5as/h vs 34 at GPT-3's layer", f"{5 * a * s / hh:.0f} vs 34", 5 * a * s / hh > 34)

# %% [markdown]
# ## A pipeline keeps micro-batches in flight
#
# Under the 1F1B schedule (Narayanan et al. 2021, §2.2) stage i starts the backward of its first micro-batch
# after p − i forwards, so it holds min(p − i, m) micro-batches' activations: the first stage is the busiest and
# holds p of them — L/p layers × p micro-batches, as many layers' worth as the whole model. The idle time at the
# start and end of a step, the bubble, is (p − 1)/m of the compute.

# %%
lesson.section("A pipeline keeps micro-batches in flight")
p70 = plan(LLAMA, LAYOUT)
lesson.say(format_plan(p70))
per_layer = activation_bytes_per_layer(LLAMA, LAYOUT)["paper"]
lesson.expect("stage 0: 20 layers x 4 micro-batches of one layer's activations (the first stage has no logits)")
lesson.close("stage 0's activations vs 20 x 4 x one layer (bytes)", p70["per_gpu"]["memory_bytes"]["activations"],
             20 * 4 * per_layer, tol=1.0)  # the paper's layer: tpsim's own extra terms are not a real run's
lesson.expect("bubble = (p - 1)/m of compute = 3/128 here")
lesson.close("bubble / compute", p70["time_s"]["bubble"] / p70["time_s"]["compute"], 3 / 128)

# %% [markdown]
# ## Searching the layouts
#
# `--search` tries every tp × pp × dp = N (tp inside a node, divisibility of heads, KV heads, layers and batch),
# drops what does not fit, and ranks the rest by estimated step time — compute at peak × MFU, TP, DP and PP on
# α-β links, and the bubble. The ranking is an estimate on nominal links, a way to compare layouts, not a
# measurement.

# %%
lesson.section("Searching the layouts")
plans = search(LLAMA, LAYOUT, 64)
lesson.say(format_search(plans, 64))
lesson.expect("every layout listed fits in 80 GB and they come fastest first")
steps = [q["time_s"]["step"] for q in plans]
lesson.check("layouts that fit, sorted by step time", f"{len(plans)} layouts",
             bool(plans) and steps == sorted(steps) and all(q["fits"] for q in plans))

# %% [markdown]
# ## The per-layer terms, measured
#
# The planner's terms are only as good as their check. Build a tiny GPT (vocabulary 37, h 24, 4 heads,
# sequence 16, float64, dropout 0.1), run one forward and backward here, and measure one layer's cache and the
# model state held: the planner, asked about the same model at float64, must give the same bytes exactly.
# `tpsim plan --validate` does the same at TP 2, TP 2 + SP and DP 2 on real ranks.

# %%
lesson.section("The per-layer terms, measured")
from tpsim.comm import ProcessGrid  # noqa: E402
from tpsim.models.build import build_gpt  # noqa: E402
from tpsim.arch.gpt2 import GPTConfig  # noqa: E402
from tpsim.nn.dropout import DropoutPlan  # noqa: E402
from tpsim.tp.random import ExactDropoutRNG  # noqa: E402
from tpsim.trace.measure import measure_activations  # noqa: E402
from tpsim.train import AdamW  # noqa: E402

grid = ProcessGrid(tp=1)
toy_cfg = GPTConfig(vocab_size=37, n_positions=16, n_embd=24, n_layer=2, n_head=4, dropout=0.1)
toy = gpt("toy", 37, 24, 2, 4, 16)
model = build_gpt(toy_cfg, grid.tp_group, seed=16)
ids = np.random.default_rng(16).integers(0, 37, (2, 16))
_, cache = model.forward(ids, np.roll(ids, -1, axis=1), DropoutPlan(ExactDropoutRNG(16), 0))
measured = measure_activations(cache.transformer.h[0])
predicted = activation_bytes_per_layer(toy, Layout(seq_len=16, micro_batch=2), dtype="fp64")
lesson.expect("one layer's floats and masks = Table 2's elements at 8 bytes a float + tpsim's rstd, exactly")
lesson.equal("transformer.h.0's cache in bytes vs the planner", measured["activations"] + measured["masks"],
             predicted["total"])
state = AdamW(model).state_bytes() + sum(p_.nbytes for _, p_ in model.named_parameters())
lesson.expect("parameters + AdamW state = the planner's count x (8 + 16) bytes")
lesson.equal("params + optimizer bytes vs the planner", state, stage_param_elements(toy, 1, 1, 0) * (8 + 16))

# %% [markdown]
# ## What to take away
#
# * Model state is bytes per parameter × parameters per GPU: 18 with bf16 and Adam, 6 + 12/d with ZeRO-1.
# * A layer's activations grow with s·b·h and, through the attention scores, with s²: SP splits the rest by t,
#   selective recompute removes the scores.
# * Under 1F1B the first stage holds p micro-batches: as many layers' activations as the whole model.
# * The per-layer terms are checked against live runs; pipeline and time terms come from the papers.
#
# Exercise: `lessons/exercises/ex16_planning_a_real_run.py`, then `tpsim check 16`.

# %%
lesson.takeaways()
lesson.finish()
