# %% [markdown]
# # Lesson 20 — Context parallelism: the sequence cut over ranks
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/20_context_parallelism.py` (or `tpsim lesson run 20`;
# as a notebook on as many engines: `tpsim lesson notebook 20`).
#
# Sequence parallelism (lesson 10) cut the sequence over the TP ranks only where a layer works token by token,
# and gathered it back for attention. At 128k tokens the activations of one sequence no longer fit even cut t
# ways: context parallelism (CP) keeps the sequence cut over C ranks in *every* layer. Every layer but one works
# token by token, so it runs on its shard as it is; attention is the one layer whose queries need the other
# shards' keys. This lesson takes that one layer apart: why it alone needs the others; how two partial
# attentions over disjoint keys merge exactly — the online softmax, which is the SenseParrots article's parallel
# softmax (lesson 06) again; why a contiguous cut of a causal sequence leaves the last rank most of the work and
# how the zigzag layout balances it; what ring attention, an all-gather and Ulysses each send and hold; and last
# a ring over the 4 ranks, equal to serial attention and its gradients, and a whole GPT on CP 2 × TP 2 equal to
# the serial model.
#
# Sources: the SenseParrots article, eqs. (3) and (4) (the parallel softmax: a global max, a global sum of
# exponentials); Liu, Zaharia and Abbeel 2023, "Ring Attention with Blockwise Transformers for Near-Infinite
# Context", arXiv:2310.01889 (K/V around a ring, blockwise attention); Milakov and Gimelshein 2018, "Online
# normalizer calculation for softmax", arXiv:1805.02867 (the merge by log-sum-exp); Dao et al. 2022,
# "FlashAttention", arXiv:2205.14135 (the backward from O and lse); Jacobs et al. 2023, "DeepSpeed Ulysses",
# arXiv:2309.14509 (all-to-all to head shards); Dubey et al. 2024, "The Llama 3 Herd of Models",
# arXiv:2407.21783, §3.3.2 (context parallelism by all-gathered K/V, the sequence in 2·CP chunks for balance);
# Korthikanti et al. 2022, arXiv:2205.05198 (sequence parallelism, lesson 10).

# %%
RANKS = 4

from collections import Counter
from types import SimpleNamespace

import numpy as np

from tpsim.arch import GPTConfig
from tpsim.comm import ProcessGrid
from tpsim.cp.blocks import block_forward, merge
from tpsim.cp.choice import check_sizes
from tpsim.cp.context import ContextParallel
from tpsim.cp.layout import causal_pairs, positions
from tpsim.compare import shard_differences
from tpsim.config import RunConfig
from tpsim.errors import ConfigError
from tpsim.nn import attention_core_backward, attention_core_forward, gelu_forward, layernorm_forward
from tpsim.nn.dropout import DropoutPlan
from tpsim.phases import BACKWARD, FORWARD
from tpsim.predict.cp_comm import cp_layer_bytes, cp_messages
from tpsim.table import human_bytes
from tpsim.teach.runtime import Lesson, table
from tpsim.tp.random import ExactDropoutRNG
from tpsim.train import GradSync, compute_grads

lesson = Lesson("20", RANKS)
grid = ProcessGrid(tp=1, cp=RANKS)  # one replica, its 4 ranks one CP group
C, rank, tracer = grid.cp, grid.cp_rank, grid.tracer
lesson.say(f"{grid.describe()}; the CP group: world ranks {list(grid.cp_group.ranks)}")

# %% [markdown]
# ## Every layer but attention works token by token
#
# A transformer layer is LayerNorm, attention, a residual add, LayerNorm, the MLP, a residual add. LayerNorm
# normalises each token's vector alone; the MLP multiplies each token's vector by the same weights; the residual
# adds a token to itself; dropout draws a mask per element. So a rank that holds tokens at positions P computes,
# for them, exactly the rows P of the serial result — with no message at all. Attention is different: the query
# of token i mixes the values of every token j ≤ i, wherever those live. Below, a sequence of 32 tokens cut over
# the 4 ranks (the zigzag layout of the section after next: 8 tokens a rank): LayerNorm and a GeLU MLP on the
# shard equal the serial rows; attention over the shard's own keys does not.

# %%
lesson.section("Every layer but attention works token by token")
SEQ, B, H, KV, D = 32, 2, 8, 4, 8  # heads and KV heads divide by 4: Ulysses can cut them too
rng = np.random.default_rng(20)  # the same master tensors on every rank
hidden = 12
x = rng.standard_normal((B, SEQ, hidden))
gamma, beta = 1 + 0.1 * rng.standard_normal(hidden), 0.1 * rng.standard_normal(hidden)
w1, w2 = rng.standard_normal((hidden, 4 * hidden)) / 4, rng.standard_normal((4 * hidden, hidden)) / 7
mine = positions("zigzag", rank, C, SEQ)


def per_token(x: np.ndarray) -> np.ndarray:
    """LayerNorm, then a GeLU MLP: every row of the output depends on its own row of ``x`` only."""
    y, _ = layernorm_forward(np.ascontiguousarray(x), gamma, beta)  # x[:, positions] is a strided copy
    return gelu_forward(y @ w1)[0] @ w2


q, dout = rng.standard_normal((B, H, SEQ, D)), rng.standard_normal((B, H, SEQ, D))
k, v = rng.standard_normal((B, KV, SEQ, D)), rng.standard_normal((B, KV, SEQ, D))
REP = H // KV
serial_out, serial_cache = attention_core_forward(q, np.repeat(k, REP, 1), np.repeat(v, REP, 1))
lesson.say(f"rank 0 holds positions {positions('zigzag', 0, C, SEQ).tolist()}")
lesson.expect("LayerNorm + MLP on the shard's 8 tokens = the serial rows at its positions, to rounding")
lesson.close("max |per_token(shard) − per_token(whole)[positions]|", per_token(x[:, mine]), per_token(x)[:, mine])
alone, _ = block_forward(q[:, :, mine], k[:, :, mine], v[:, :, mine], mine, mine)
lesson.expect("causal attention over the shard's own keys only is not the serial rows: on every rank some queries "
              "miss earlier tokens of the other shards")
lesson.apart("max |attention over own keys − serial attention's rows|", alone, serial_out[:, :, mine], 1e-2)
whole, _ = block_forward(q[:, :, mine], k, v, mine, np.arange(SEQ))
lesson.expect("the shard's queries against every key of the sequence (by absolute position) = the serial rows")
lesson.close("max |attention of the shard's queries over all keys − serial rows|", whole, serial_out[:, :, mine])

# %% [markdown]
# ## The merge is the parallel softmax
#
# Cut the keys into blocks j. For one query row, block j alone gives a partial attention O_j (normalised over
# its own keys) and its log-sum-exp lse_j = m_j + log l_j, where m_j is the row's largest score in the block and
# l_j = Σ exp(s − m_j) over it. The SenseParrots article's parallel softmax (eqs. (3) and (4), lesson 06) puts
# such parts together: a global max M = max_j m_j, a global sum of exponentials L = Σ_j exp(m_j − M)·l_j — each
# part rescaled to the global max — and the softmax is each part's exponentials divided by L. The attention
# output is then the parts' outputs, each weighted by its share of L:
#
#     lse = M + log L = log Σ_j exp(lse_j)         O = Σ_j exp(lse_j − lse) · O_j
#
# Here each rank holds one K/V block (its shard) and every rank the same queries, all 32: three all-reduces over
# the CP group — a MAX, then two SUMs — give every query's attention over the whole sequence: the max and the sum
# of exponentials of lesson 06's vocab-parallel softmax, and a third sum for the outputs, each weighted. (The
# shift here is the largest lse_j, not the largest score: any common shift gives the same result — lesson 06's
# loss did not depend on it either — and lse_j is what a block hands over.) Two parts at a time, the same rule is
# `tpsim.cp.blocks.merge`, the online softmax that ring attention applies as each block comes by. The scores once
# as they come, once with the queries ×1000, where an exp of a raw lse overflows.

# %%
lesson.section("The merge is the parallel softmax")
group = grid.cp_group
everything = np.arange(SEQ)
for scale in (1.0, 1000.0):
    qs = q * scale
    want, want_lse = block_forward(qs, k, v, everything, everything)
    o_j, lse_j = block_forward(qs, k[:, :, mine], v[:, :, mine], everything, mine)
    tracer.reset()
    top = group.all_reduce(lse_j.copy(), op="max")  # (4) the global max; a row that sees no key here: −∞
    share = np.exp(lse_j - top)  # this block's sum of exponentials, rescaled to the global max
    total = group.all_reduce(share.copy())  # (3) the global sum
    out = group.all_reduce(share[..., None] * o_j) / total[..., None]
    calls = [(e.op, e.reduce_op) for e in tracer.events]
    lesson.expect(f"queries ×{scale:g}: three all-reduces (max, sum, sum) give serial attention and its lse")
    lesson.close(f"×{scale:g}: max |parallel softmax over 4 blocks − serial attention|", out, want,
                 tol=1e-12 * scale)
    lesson.close(f"×{scale:g}: max |M + log L − serial lse|", top + np.log(total), want_lse, tol=1e-12 * scale)
    lesson.equal(f"×{scale:g}: the traced calls on the cp group", calls,
                 [("all_reduce", "max"), ("all_reduce", "sum"), ("all_reduce", "sum")])
    parts = lesson.gather((o_j, lse_j))
    if lesson.rank == 0:
        folded = parts[0]
        for o_b, lse_b in parts[1:]:
            folded = merge(*folded, o_b, lse_b)
        with np.errstate(over="ignore"):
            raw = int(np.isinf(np.exp(lse_j)).sum())
        lesson.say(f"×{scale:g}: largest lse {float(np.max(want_lse)):.1f}; exp(lse) overflows in {raw} of "
                   f"{lse_j.size} rows of rank 0's block")
        err = float(np.max(np.abs(folded[0] - want)))
    else:
        err = 0.0
    lesson.expect("folding the 4 parts two at a time with merge (the ring's online softmax) gives the same")
    lesson.check(f"×{scale:g}: merge(merge(merge(p0, p1), p2), p3) vs serial", f"{err:.1e} (tolerance 1e-12)",
                 err <= 1e-12 * scale)

# %% [markdown]
# ## The causal work: contiguous and zigzag
#
# Under the causal mask a query at position p sees p + 1 keys. Cut a sequence of s tokens contiguously over C
# ranks, n = s/C tokens each: rank r holds positions rn … rn + n − 1, and its queries see
#
#     Σ_{i<n} (rn + i + 1) = n²·r + n(n + 1)/2      (query, key) pairs,
#
# growing with r: the last rank does about 2C − 1 times the first one's work, and a ring waits for its slowest
# member at every step. The zigzag layout (Llama 3's and TransformerEngine's) cuts the sequence into 2C chunks
# of c = s/(2C) and gives rank r chunks r and 2C − 1 − r, one early and one late: its pairs are
# c²·r + c(c+1)/2 + c²·(2C − 1 − r) + c(c+1)/2 = c²(2C − 1) + c(c + 1), the same for every rank.
# `tpsim.cp.layout.causal_pairs` counts them from the positions.

# %%
lesson.section("The causal work: contiguous and zigzag")
S_WORK = 64
rows = [["rank", "contiguous positions", "pairs", "zigzag positions", "pairs"]]
cont = [causal_pairs("contiguous", r, C, S_WORK) for r in range(C)]
zig = [causal_pairs("zigzag", r, C, S_WORK) for r in range(C)]


def spans(pos: np.ndarray) -> str:
    cuts = np.flatnonzero(np.diff(pos) != 1) + 1
    return ", ".join(f"{p[0]}–{p[-1]}" for p in np.split(pos, cuts))


for r in range(C):
    rows.append([str(r), spans(positions("contiguous", r, C, S_WORK)), str(cont[r]),
                 spans(positions("zigzag", r, C, S_WORK)), str(zig[r])])
lesson.say(table(rows, right=(2, 4)))
n, c = S_WORK // C, S_WORK // (2 * C)
lesson.expect("contiguous: rank r computes n²·r + n(n + 1)/2 pairs (n = s/C = 16)")
lesson.equal("contiguous pairs per rank", cont, [n * n * r + n * (n + 1) // 2 for r in range(C)])
lesson.expect("zigzag: every rank c²(2C − 1) + c(c + 1) (c = s/2C = 8)")
lesson.equal("zigzag pairs per rank", zig, [c * c * (2 * C - 1) + c * (c + 1)] * C)
lesson.expect("both layouts compute the whole causal triangle, s(s + 1)/2 pairs, between them")
lesson.equal("Σ pairs (contiguous, zigzag)", (sum(cont), sum(zig)), (S_WORK * (S_WORK + 1) // 2,) * 2)
long = [causal_pairs("contiguous", r, C, 4096) for r in (0, C - 1)]
lesson.expect("at s = 4096 the contiguous last rank does close to 2C − 1 = 7 times the first one's work")
lesson.check("last / first, contiguous, s = 4096", f"{long[1] / long[0]:.3f}", abs(long[1] / long[0] - 7) < 0.01)

if lesson.rank == 0:
    plt = lesson.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    for ax, layout in zip(axes[:2], ("contiguous", "zigzag")):
        owner = np.full((S_WORK, S_WORK), np.nan)
        for r in range(C):
            for p in positions(layout, r, C, S_WORK):
                owner[p, :p + 1] = r
        ax.imshow(owner, cmap="viridis", vmin=0, vmax=C - 1, interpolation="nearest")
        ax.set_title(f"{layout}: query rows by rank")
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
    width = 0.38
    axes[2].bar(np.arange(C) - width / 2, cont, width, label="contiguous")
    axes[2].bar(np.arange(C) + width / 2, zig, width, label="zigzag")
    axes[2].set_xticks(range(C))
    axes[2].set_xlabel("CP rank")
    axes[2].set_ylabel("(query, key) pairs")
    axes[2].set_title(f"causal work, s = {S_WORK}, C = {C}")
    axes[2].legend()
    fig.tight_layout()
    lesson.save(fig, "20_causal_work.png")

# %% [markdown]
# ## Ring, all-gather, Ulysses: what each sends and holds
#
# Three ways to give every query the keys it needs (`--cp-comm`, `tpsim.predict.cp_comm`), per attention layer
# and rank, with kv = b·kv_heads·(s/C)·d·e the bytes of one K (or V) shard and q = b·heads·(s/C)·d·e of a Q:
#
# * **ring** (Liu et al.): the K/V block moves one rank on at each of C − 1 steps while the queries stay;
#   forward (C − 1)·2kv sent, backward the blocks again plus their gradients, C more messages; a rank holds its
#   own block and the one arriving: 2 blocks.
# * **all-gather** (Llama 3): gather every rank's K and V before attention, reduce-scatter their gradients
#   after: the same (C − 1)·2kv forward, in one call; a rank holds the whole sequence's K and V, C blocks.
# * **Ulysses**: all-to-all Q, K and V from sequence shards to head shards (each rank then holds the whole
#   sequence for heads/C of the heads), ordinary attention, and all-to-all the output back: (C − 1)/C·(2q + 2kv)
#   each way; it holds the K and V of the whole sequence for kv_heads/C heads, one shard's worth, but needs the
#   heads and the KV heads divisible by C.
#
# At a real size — a Llama-3-8B layer (32 query heads, 8 KV heads of 128) on one TP rank, one sequence of 128k
# tokens in bfloat16, C = 8:

# %%
lesson.section("Ring, all-gather, Ulysses: what each sends and holds")
REAL = dict(b=1, s=131072, heads=32, kv_heads=8, head_dim=128, e=2)
CP_REAL = 8
kv_shard = REAL["b"] * REAL["kv_heads"] * REAL["s"] // CP_REAL * REAL["head_dim"] * REAL["e"]
q_shard = kv_shard * REAL["heads"] // REAL["kv_heads"]
sent = {comm: cp_layer_bytes(comm, CP_REAL, **REAL) for comm in ("ring", "allgather", "ulysses")}
held = {"ring": 2 * 2 * kv_shard, "allgather": CP_REAL * 2 * kv_shard, "ulysses": 2 * kv_shard}  # Q: q in each
rows = [["--cp-comm", "forward sent", "backward sent", "K and V held at once"]]
for comm, nbytes in sent.items():
    rows.append([comm, human_bytes(nbytes[FORWARD]), human_bytes(nbytes[BACKWARD]), human_bytes(held[comm])])
lesson.say(f"one K (or V) shard: {human_bytes(kv_shard)}, one Q shard: {human_bytes(q_shard)} (held by every "
           "way: the ring's and the all-gather's stay home, Ulysses' are the whole sequence's for heads/C heads)",
           table(rows))
messages = {comm: [m for m in cp_messages(comm, CP_REAL, **REAL) if m[0] == FORWARD] for comm in held}
from_messages = {"ring": 2 * next(n for _, op, _, n in messages["ring"] if op == "recv"),  # its own + the arriving
                 "allgather": next(n for _, op, _, n in messages["allgather"] if op == "all_gather"),
                 "ulysses": sum(n for _, _, _, n in messages["ulysses"][1:3])}  # its K and V all-to-alls' results
lesson.expect("what each holds is what its forward messages carry: the ring 2 received-size blocks, the all-gather "
              "its gathered buffer, Ulysses its K and V all-to-alls' results")
lesson.equal("K and V held vs cp_messages' forward sizes (ring, allgather, ulysses)",
             tuple(from_messages.values()), tuple(held.values()))
lesson.expect("ring and all-gather send the same (C − 1)·2kv forward: the ring is the all-gather cut into steps")
lesson.equal("forward bytes: ring, allgather vs (C − 1)·2kv", (sent["ring"][FORWARD], sent["allgather"][FORWARD]),
             ((CP_REAL - 1) * 2 * kv_shard,) * 2)
lesson.expect("the ring's backward sends the blocks again and their gradients home: (C − 1)·2kv + C·2kv")
lesson.equal("ring backward bytes", sent["ring"][BACKWARD], (CP_REAL - 1) * 2 * kv_shard + CP_REAL * 2 * kv_shard)
lesson.expect("Ulysses sends (C − 1)/C·(2q + 2kv) each way: with 4 query heads a KV head, 5/8 of the ring's forward")
lesson.equal("Ulysses forward bytes vs (C − 1)/C·(2q + 2kv); ratio to the ring's",
             (sent["ulysses"][FORWARD], sent["ulysses"][FORWARD] / sent["ring"][FORWARD]),
             ((CP_REAL - 1) * (2 * q_shard + 2 * kv_shard) // CP_REAL, 0.625))
par = SimpleNamespace(cp=16, cp_layout="zigzag", cp_comm="ulysses", sp=False, tp=1)
try:
    check_sizes(par, SimpleNamespace(heads=32, kv_heads=8), REAL["s"])
    refused = ""
except ConfigError as err:
    refused = str(err)
lesson.say(f"Ulysses at C = 16: {refused or 'accepted'}")
lesson.expect("Ulysses cannot go past the KV heads: at C = 16 the 8 KV heads do not divide, and it is refused")
lesson.check("Ulysses at C = 16 with 8 KV heads", "refused" if refused else "accepted", "divide by cp 16" in refused)

# %% [markdown]
# ## A ring over four ranks
#
# Now the real thing, `tpsim.cp.context.ContextParallel` over the 4 ranks' CP group: each rank holds the Q, K
# and V of its 8 tokens (grouped-query: 8 query heads, 4 KV heads), and the ring's forward passes K/V blocks
# round while each rank merges its partial results; its backward passes them again, with their gradient
# accumulators, and sends each block's dK, dV home. It must give the serial attention's rows at the rank's
# positions, and the rows of the serial dQ, dK, dV, to 1e-12; its traced messages must be `cp_messages`, one for
# one; and the work each rank does (its `head_pairs`) must be the causal pairs of its layout. Then the same for
# the all-gather and for Ulysses, and for the ring on the contiguous layout.

# %%
lesson.section("A ring over four ranks")
dq_s, dk_s, dv_s = attention_core_backward(dout, serial_cache)
fold = (B, KV, REP, SEQ, D)
want = (serial_out, dq_s, dk_s.reshape(fold).sum(2), dv_s.reshape(fold).sum(2))
for comm, layout in (("ring", "zigzag"), ("allgather", "zigzag"), ("ulysses", "zigzag"), ("ring", "contiguous")):
    cp_attn = ContextParallel(group, comm, layout)
    here = cp_attn.positions(SEQ // C)
    tracer.reset()
    with tracer.region(scope="attn", phase=FORWARD):
        out, cache = cp_attn.forward(*(t[:, :, here].copy() for t in (q, k, v)))
    with tracer.region(scope="attn", phase=BACKWARD):
        grads = cp_attn.backward(dout[:, :, here].copy(), cache)
    worst = max(float(np.max(np.abs(g - w[:, :, here]))) for g, w in zip((out, *grads), want))
    lesson.expect(f"{comm}, {layout}: output, dQ, dK, dV = the serial rows at this rank's positions")
    lesson.close(f"{comm} ({layout}): max |CP − serial| over out, dq, dk, dv", worst, 0.0)
    traced = Counter((e.phase, e.op, e.bytes) for e in tracer.events if e.group == "cp")
    predicted = Counter()
    for phase, op, calls, nbytes in cp_messages(comm, C, b=B, s=SEQ, heads=H, kv_heads=KV, head_dim=D, e=8):
        predicted[(phase, op, nbytes)] += calls
    lesson.expect(f"{comm}: every traced message (phase, op, bytes) is one of cp_messages', as many times")
    lesson.check(f"{comm} ({layout}): traced messages vs cp_messages",
                 f"{sum(traced.values())} messages, {sum(n * b for (_, _, b), n in traced.items()):,} bytes",
                 traced == predicted)
    if comm == "ring":
        pairs = causal_pairs(layout, rank, C, SEQ) * H
        work = lesson.gather(cp_attn.head_pairs)
        lesson.expect(f"ring, {layout}: this rank's head_pairs = its causal pairs × the heads"
                      + (" — the same on every rank" if layout == "zigzag" else " — growing with the rank"))
        lesson.check(f"ring ({layout}): head_pairs per rank", str(work), cp_attn.head_pairs == pairs)

# %% [markdown]
# ## A whole GPT on CP 2 × TP 2
#
# The same attention inside a whole model: a GPT-2 of 2 layers (dropout 0.1, the exact RNG, so every mask is
# drawn at the token's absolute position) on the 4 ranks as TP 2 × CP 2 (`RunConfig.of(..., tp=2, cp=2)`,
# `build_model(tp_group, cp_group)`): each CP rank reads the tokens of its zigzag shard, its learned position
# rows are those of its absolute positions, each TP rank holds half the heads, and the ring runs over the CP
# group of each TP rank's heads. The loss is the mean over all the sequence's tokens (the normaliser summed over
# DP × CP), and a weight gradient is a sum over the tokens, so it is all-reduced over DP × CP. Step 0's loss and
# every gradient shard must be the serial model's, and each attention layer's traced forward sends on the CP
# group the ring's (C − 1)·2kv at the TP rank's heads.

# %%
lesson.section("A whole GPT on CP 2 × TP 2")
GPT_B, GPT_S, GPT_SEED = 4, 16, 20
gpt = GPTConfig(vocab_size=19, n_positions=GPT_S, n_embd=16, n_layer=2, n_head=4, dropout=0.1)
grid22 = ProcessGrid(tp=2, cp=2)
run = RunConfig.of(gpt, tp=2, dp=grid22.dp, cp=2, cp_comm="ring", batch_size=GPT_B, seq_len=GPT_S, seed=GPT_SEED)
model = run.build_model(grid22.tp_group, grid22.cp_group)
ids = np.random.default_rng(GPT_SEED).integers(0, gpt.vocab, (GPT_B, GPT_S + 1))
ids, labels = ids[:, :-1], ids[:, 1:]
here = model.body().core.positions(GPT_S // 2)
grid22.tracer.reset()
loss, _ = compute_grads(model, grid22, GradSync(model, grid22.dp_group), ids[:, here], labels[:, here],
                        plan=DropoutPlan(ExactDropoutRNG(GPT_SEED), 0, np.arange(GPT_B)))
serial = run.serial_model()
want_loss = serial.loss_and_grads(ids, labels, DropoutPlan(ExactDropoutRNG(GPT_SEED), 0))
worst = shard_differences(model, dict(serial.named_grads()))
lesson.say(f"{grid22.describe()}; tokens {here.tolist()}")
lesson.expect("the loss of the whole batch, every rank, = the serial model's")
lesson.close(f"|CP 2 × TP 2 loss − serial loss| (serial {want_loss:.6f})", loss, want_loss)
lesson.expect("every gradient shard (embeddings, LayerNorms, attention, MLP) = its slice of the serial gradient")
lesson.close(f"max over {len(worst)} gradients of |CP × TP − serial|", max(worst.values()), 0.0)
sends = [e for e in grid22.tracer.events if e.group == "cp" and e.op == "send" and e.phase == FORWARD]
per_layer = Counter(e.scope for e in sends)
ring_fwd = cp_layer_bytes("ring", 2, b=GPT_B, s=GPT_S, heads=gpt.n_head // 2, kv_heads=gpt.n_head // 2,
                          head_dim=gpt.n_embd // gpt.n_head, e=8)[FORWARD]
lesson.expect(f"each of the {gpt.n_layer} attention layers' forward sends (C − 1)·2kv = {ring_fwd} bytes on the "
              "CP group, at this TP rank's 2 heads")
lesson.check("forward CP sends by layer (scope: bytes)",
             ", ".join(f"{s}: {sum(e.wire_bytes for e in sends if e.scope == s)}" for s in sorted(per_layer)),
             len(per_layer) == gpt.n_layer and all(sum(e.wire_bytes for e in sends if e.scope == s) == ring_fwd
                                                    for s in per_layer))
synced = [e for e in grid22.tracer.events if e.group == "dp" and e.op == "all_reduce"]
lesson.expect("the gradients are all-reduced over DP × CP, here the 2 CP ranks of each TP rank (DP is 1)")
lesson.check("the gradient all-reduces: calls, group size", f"{len(synced)} calls over "
             f"{sorted({e.group_size for e in synced})} ranks, group {synced[0].group_ranks if synced else ()}",
             bool(synced) and all(e.group_size == 2 for e in synced)
             and set(synced[0].group_ranks) == set(grid22.cp_group.ranks))

# %% [markdown]
# ## What to take away
#
# * Every layer but attention works token by token: on a shard of the sequence it gives the serial rows, with
#   no message. Attention's queries need the earlier keys of every shard, by absolute position.
# * Partial attentions over disjoint keys merge exactly: lse = log Σ exp(lse_j), O = Σ exp(lse_j − lse)·O_j —
#   the SenseParrots article's parallel softmax (a global max, a global sum of exponentials, each part rescaled),
#   three all-reduces for all blocks at once, or two parts at a time as ring attention's online softmax.
# * Cut contiguously, rank r of a causal sequence computes n²·r + n(n + 1)/2 pairs, the last rank about 2C − 1
#   times the first; the zigzag layout (chunks r and 2C − 1 − r of 2C) gives every rank c²(2C − 1) + c(c + 1).
# * Ring and all-gather send the same (C − 1)·2kv forward (the ring holds 2 blocks, the all-gather C); Ulysses
#   sends (C − 1)/C·(2q + 2kv) each way and holds a shard's worth of K/V, but only while C divides the KV heads.
# * A ring over 4 ranks equals serial attention and its gradients to 1e-12, and its messages are cp_messages'.
# * A whole GPT on CP 2 × TP 2 (dropout, learned positions at the absolute places) equals the serial model's
#   loss and gradients: only attention talks over the CP group, and the gradients sum over DP × CP.
#
# Exercise: `ex20_context_parallelism.py`: `tpsim lesson start 20` copies it into your work folder
# (`tpsim-work/`), then `tpsim check 20`.

# %%
lesson.takeaways()
lesson.finish()
