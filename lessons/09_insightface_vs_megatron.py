# %% [markdown]
# # Lesson 09 — Partial FC (InsightFace) vs the Megatron way
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/09_insightface_vs_megatron.py` (or `tpsim lesson run 09`;
# as a notebook on as many engines: `tpsim lesson notebook 09`).
#
# Face recognition trains a classifier over every identity in the data set — millions of classes. The
# classifier `W: [E, C]` (embedding size E, classes C) then dwarfs the backbone that computes the embeddings,
# and must be split. The vocab-parallel cross-entropy of lesson 06 does that part in both designs below; they
# differ in what they do with the backbone:
#
# * **The Megatron way** puts the whole model in one tensor-parallel group: rank 0 reads the batch and
#   broadcasts it, *every* rank runs the (replicated) backbone on *all* N samples, then a column-parallel
#   classifier and the parallel cross-entropy. The backbone work is done p times.
# * **The InsightFace way** ("partial FC") runs the backbone *data-parallel*: rank r embeds only its own N/p
#   samples, the embeddings are all-gathered so every rank scores every sample against its class slice, and
#   in the backward a **reduce-scatter** — the all-gather's conjugate — hands each rank the gradient of its own
#   embeddings. The backbone's gradients are then all-reduced, as in DDP.
#
# The two designs are §3.1 and §3.2 of the SenseParrots article; the InsightFace way is the model parallelism
# of An et al. 2021, "Partial FC" (without its sampling of negative classes). Both are implemented in
# `tpsim.models.partial_fc` and must equal the serial model. We compare the bytes they move and the FLOPs they
# spend.
#
# Sources: the SenseParrots article, §3.1 and §3.2; An et al. 2021, "Partial FC: Training 10 Million
# Identities on a Single Machine", arXiv:2010.05222; Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3.

# %%
RANKS = 4

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.models.partial_fc import (FaceConfig, MegatronFaceModel, PartialFCModel, SerialFaceModel, backbone_flops,
                                     local_rows, loss_and_grads, redundant_flops, step_flops, synthetic_batch)
from tpsim.teach.runtime import Lesson, shard_error, table
from tpsim.trace import summarize
from tpsim.table import human_bytes

lesson = Lesson("09", RANKS)
grid = ProcessGrid(tp=RANKS)
world, tracer = grid.world, grid.tracer  # both ways use all ranks as one group
SEED, N = 9, 16
cfg = FaceConfig(features=32, hidden=64, emb_dim=16, classes=31)  # 31 classes: slices of 8, 8, 8, 7
serial = SerialFaceModel(cfg, rng=np.random.default_rng(SEED))
x, labels = synthetic_batch(SEED, N, cfg)
loss_ref, d_emb_ref = loss_and_grads(serial, x, labels)  # the reference: no ranks involved
serial_grads = dict(serial.named_grads())
lesson.say(f"face model: features {cfg.features} -> hidden {cfg.hidden} -> embedding {cfg.emb_dim}, "
           f"{cfg.classes} classes, global batch {N}, {RANKS} ranks", "")

# %% [markdown]
# ## Both ways equal the serial model
#
# The Megatron way gets the global batch on rank 0 (the broadcast delivers it to the others); the InsightFace
# way gets each rank's own N/p samples. One forward and backward each, traced separately. The gradient of the
# embeddings is the interesting difference: the Megatron way ends with all N rows on every rank (f's
# all-reduce in the classifier), the InsightFace way with each rank's own N/p rows (the reduce-scatter).

# %%
lesson.section("Both ways equal the serial model")
mine = local_rows(N, world)
models = {"Megatron": MegatronFaceModel(serial, world), "InsightFace": PartialFCModel(serial, world)}
batches = {"Megatron": (x, labels) if world.rank == 0 else (np.zeros_like(x), np.zeros_like(labels)),
           "InsightFace": (x[mine], labels[mine])}
expected_d_emb = {"Megatron": d_emb_ref, "InsightFace": d_emb_ref[mine]}
events = {}
for way, model in models.items():
    tracer.reset()
    loss, d_emb = loss_and_grads(model, *batches[way])
    events[way] = [e.as_dict() for e in tracer.events]
    lesson.expect(f"{way}: the serial loss, the serial ∂L/∂embeddings rows this rank owns "
                  f"({'all N' if way == 'Megatron' else 'its N/p'}), and every gradient as serial")
    lesson.close(f"{way}: |loss − serial loss {loss_ref:.6f}|", loss, loss_ref)
    lesson.close(f"{way}: ∂L/∂embeddings {d_emb.shape} vs the serial rows", d_emb, expected_d_emb[way])
    lesson.close(f"{way}: every gradient (backbone, classifier slice) vs serial", shard_error(model, serial_grads),
                 0.0)

# %% [markdown]
# ## What moved
#
# Per rank, by phase and collective (this rank's own trace; every rank sends the same amounts):

# %%
lesson.section("What moved")
summaries = {way: {row.key: row for row in summarize(ev, keys=("phase", "op"), ranks=1)} for way, ev in events.items()}
keys = list(dict.fromkeys(k for s in summaries.values() for k in s))
rows = [["phase", "op"] + [f"{way} {col}" for way in summaries for col in ("calls", "bytes")]]
for key in keys:
    rows.append(list(key) + [cell for s in summaries.values() for cell in
                             ((f"{s[key].calls:g}", human_bytes(s[key].bytes)) if key in s else ("-", "-"))])
rows.append(["total", "wire"] + [cell for s in summaries.values() for cell in
                                 ("", human_bytes(sum(r.wire_bytes for r in s.values())))])
lesson.say(table(rows, right=tuple(range(2, 6))), "")


def moved(way: str, phase: str, op: str) -> int:
    return sum(e["bytes"] for e in events[way] if e["phase"] == phase and e["op"] == op)


E, F, f8 = cfg.emb_dim, cfg.features, 8
backbone_bytes = sum(p.nbytes for _, p in serial.backbone.named_parameters())
lesson.expect("Megatron: rank 0 broadcasts the whole batch, inputs and labels, to the other ranks")
lesson.equal("Megatron: broadcast of the batch = N·F·8 (inputs) + N·8 (labels)", moved("Megatron", "data", "broadcast"),
             N * F * f8 + N * 8)
lesson.expect("Megatron: f's all-reduce in the classifier sums ∂L/∂embeddings for all N samples")
lesson.equal("Megatron: backward all-reduce of ∂L/∂embeddings = N·E·8", moved("Megatron", "backward", "all_reduce"),
             N * E * f8)
lesson.expect("InsightFace: every rank gathers all N embeddings to score them against its classes")
lesson.equal("InsightFace: all-gather of the embeddings = N·E·8", moved("InsightFace", "forward", "all_gather"),
             N * E * f8)
lesson.expect("InsightFace: the all-gather's conjugate sums the N rows' gradients and keeps each rank's N/p")
lesson.equal("InsightFace: reduce-scatter of ∂L/∂embeddings = N·E·8",
             moved("InsightFace", "backward", "reduce_scatter"), N * E * f8)
lesson.expect("InsightFace: the data-parallel backbone averages its gradients, DDP-style: its whole size")
lesson.equal("InsightFace: DP all-reduce of the backbone's gradients = its parameter bytes",
             moved("InsightFace", "dp_sync", "all_reduce"), backbone_bytes)
lesson.expect("the cross-entropy is the same in both: lesson 06's three [N] all-reduces")
lesson.equal("both: the cross-entropy's three [N] all-reduces", [moved(w, "forward", "all_reduce") for w in models],
             [3 * N * 8, 3 * N * 8])

# %% [markdown]
# The Megatron way ships the *inputs* (N·F numbers — for images, F = 3·112·112 = 37 632) and all-reduces
# the embeddings' gradient (N·E, with E = 512); the InsightFace way ships embeddings (N·E) twice, plus one
# all-reduce of the backbone's gradients. Which moves fewer bytes depends on the sizes. What does not depend
# on them is the computation.
#
# ## Redundant FLOPs
#
# A matmul `[m, k]·[k, n]` costs `2·m·k·n` FLOPs and its backward about twice that. In the Megatron way each
# rank runs the backbone forward and backward on all N samples, though only a 1/p share of that is new work;
# the InsightFace way runs it on N/p samples per rank, with no repetition. `tpsim.models.partial_fc` counts:

# %%
lesson.section("Redundant FLOPs")
flops = {way: [step_flops(cfg, N, RANKS, r, key) for r in range(RANKS)]
         for way, key in (("Megatron", "megatron"), ("InsightFace", "partial_fc"))}
rows = [["way", "backbone (useful)", "backbone (redundant)", "classifier", "total per rank"]]
rows += [[way, f"{f[0].backbone_useful:,}", f"{f[0].backbone_redundant:,}", f"{f[0].classifier:,}",
          f"{f[0].total:,}"] for way, f in flops.items()]
lesson.say("FLOPs of rank 0 per step:", table(rows), "")
one_pass = backbone_flops(N, cfg)
lesson.expect("Megatron repeats the whole backbone on p − 1 ranks too many; InsightFace repeats nothing")
lesson.equal("Megatron: redundant backbone FLOPs over all ranks = (p − 1) · one backbone pass",
             redundant_flops(cfg, N, RANKS, "megatron"), (RANKS - 1) * one_pass)
lesson.equal("InsightFace: redundant backbone FLOPs", redundant_flops(cfg, N, RANKS, "partial_fc"), 0)

# %% [markdown]
# At a realistic scale (8 ranks, 128 images of 3·112·112 each per rank, E = 512, a backbone of 25 M
# parameters, fp32) the byte counts, from the same formulas:

# %%
p, n_total, feat, emb, backbone_params = 8, 8 * 128, 3 * 112 * 112, 512, 25_000_000
real = [["what moves per step", "Megatron way", "InsightFace way"],
        ["the batch (broadcast)", human_bytes(n_total * feat * 4), "-"],
        ["embeddings (all-gather)", "-", human_bytes(n_total * emb * 4)],
        ["∂L/∂embeddings", human_bytes(n_total * emb * 4) + " (all-reduce)", human_bytes(n_total * emb * 4) +
         " (reduce-scatter)"],
        ["backbone gradients (DP all-reduce)", "-", human_bytes(backbone_params * 4)],
        ["backbone passes computed", f"{p} × the batch", "1 × the batch"]]
lesson.say(table(real, right=()), "")

# %%
if lesson.rank == 0:
    from tpsim.demo.partial_fc import plot  # the demo's figure: bytes by op, FLOPs per rank, per way

    path = lesson.out / "09_partial_fc.png"
    plot(path, {key: summaries[way] for way, key in (("Megatron", "megatron"), ("InsightFace", "partial_fc"))},
         {key: flops[way] for way, key in (("Megatron", "megatron"), ("InsightFace", "partial_fc"))}, RANKS)
    lesson.say(f"wrote {path}")

# %% [markdown]
# ## What to take away
#
# * Both designs split the classifier and use the vocab-parallel cross-entropy; they differ in the backbone.
# * Megatron's way replicates the backbone's work p times and broadcasts the inputs; partial FC keeps the
#   backbone data-parallel, all-gathers the embeddings, and reduce-scatters their gradient back.
# * All-gather forward, reduce-scatter backward: another conjugate pair, like f and g.
#
# Exercise: the reduce-scatter in `ex09_insightface_vs_megatron.py`: `tpsim lesson start 09` copies it into your
# work folder (`tpsim-work/`), then `tpsim check 09`.

# %%
lesson.takeaways()
lesson.finish()
