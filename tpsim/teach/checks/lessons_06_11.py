"""The checks of exercises 06–11: the parallel softmax, the TP grad norm, the DP average, partial FC's
reduce-scatter, ḡ, and the ring's wire bytes. Values (with the symptoms of typical mistakes) before rules."""

from __future__ import annotations

import numpy as np

from tpsim.cost import wire_bytes
from tpsim.models.build import build_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.nn.module import Partition
from tpsim.teach.checks.lessons_01_05 import OWN_PARTIAL
from tpsim.teach.checks.registry import exercise, ops
from tpsim.teach.verdict import Report, describe_events

LOCAL_MAX = "each rank normalised by its own maximum, not the group's"
OFF_SLICE = "targets outside this rank's slice picked a logit"


def nll_symptoms(logits: np.ndarray, targets: np.ndarray, p: int, rank: int) -> dict:
    """What exercise 06's typical mistakes return on rank ``rank`` for these logits (all of them, [tokens, V])."""
    per = logits.shape[1] // p
    blocks = [logits[:, q * per:(q + 1) * per] for q in range(p)]
    rows = np.arange(len(targets))
    with np.errstate(all="ignore"):
        m = logits.max(axis=1)
        log_z = m + np.log(np.exp(logits - m[:, None]).sum(axis=1))
        m_own = blocks[rank].max(axis=1)
        mixed = sum(np.exp(b - b.max(axis=1)[:, None]).sum(axis=1) for b in blocks)  # terms scaled by different maxima
        own_z = m + np.log(np.exp(blocks[rank] - m[:, None]).sum(axis=1))
        no_offset = sum(np.where(targets < per, b[rows, np.minimum(targets, per - 1)], 0.0) for b in blocks)
        wrapped = sum(b[rows, (targets - q * per) % per] for q, b in enumerate(blocks))
    return {f"{LOCAL_MAX}: the ranks' Σ exp(z − max) terms were scaled by different maxima":
            m_own + np.log(mixed) - logits[rows, targets],
            f"{OWN_PARTIAL}: each rank's log Σ exp covers only its own vocabulary slice":
            own_z - logits[rows, targets],
            f"{OFF_SLICE}: a target id t was read as column t of every rank's own slice (vocab_start left out)":
            log_z - no_offset,
            f"{OFF_SLICE}: every rank read a column for every token, wrapping ids that are not its own":
            log_z - wrapped}


def vocab_case(seed, tokens: int, vocab: int, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(logits [tokens, V], targets [tokens], log Z [tokens])``, the same on every rank; ×1000 logits make
    exp overflow without the max-trick."""
    rng = np.random.default_rng(seed)
    logits = scale * rng.standard_normal((tokens, vocab))
    targets = rng.integers(0, vocab, size=tokens)
    m = logits.max(axis=1)
    return logits, targets, m + np.log(np.exp(logits - m[:, None]).sum(axis=1))


@exercise("06", "vocab_parallel_nll",
          vocab_parallel_nll=("loss = log Σ_c exp(z_c) − z_target: which of these terms does one rank know, and "
                              "which need the whole row of logits?",
                              "the SenseParrots article's eq. (4) first — the max over every rank's columns — "
                              "then eq. (3)'s Σ exp(z − max) over every rank's columns; ids are global, columns "
                              "local: column c of this rank is id vocab_start + c",
                              "three all-reduces of [tokens]: MAX of the local row maxima, SUM of the local "
                              "Σ exp(z − max), SUM of the target logit (the owner sends it, everyone else 0); "
                              "then loss = max + log(sum) − target logit"))
def check_06(r: Report) -> None:
    group = r.grid().tp_group
    p = group.size
    for case, (tokens, per_rank, scale) in enumerate([(7, 3, 1.0), (5, 4, 1000.0), (1, 1, 1.0)]):
        vocab = per_rank * p
        logits, targets, log_z = vocab_case([6, case], tokens, vocab, scale)
        expected = log_z - logits[np.arange(tokens), targets]
        start = group.rank * per_rank
        got = r.call("vocab_parallel_nll", logits[:, start:start + per_rank].copy(), targets.copy(), start, group)
        r.compare(f"vocab_parallel_nll for {tokens} tokens, vocabulary {vocab}, logits x{scale:g}", got, expected,
                  tol=1e-9 * scale, symptoms=nll_symptoms(logits, targets, p, group.rank))
        shapes = [(e.op, e.shape) for e in r.events]
        r.require(shapes == [("all_reduce", (tokens,))] * 3, "communication",
                  f"the parallel softmax needs three all_reduce calls of [tokens] = [{tokens}] and nothing else "
                  f"(never the [tokens, V] logits); yours issued {describe_events(r.events)}")


@exercise("07", "tp_grad_norm",
          tp_grad_norm=("the serial norm counts every element of every gradient exactly once: which elements does "
                        "this rank hold that no other rank holds, and which does every rank hold?",
                        "every rank adds the squares of its shards; a replicated gradient (partition None) is the "
                        "same on every rank, so exactly one rank of the group may add it",
                        "only tp_rank 0 adds the replicated ones; one all-reduce (sum) of that one number, then "
                        "the square root"))
def check_07(r: Report) -> None:
    group = r.grid().tp_group
    p, rank = group.size, group.rank
    for case in range(3):
        rng = np.random.default_rng([7, case])  # the serial model's gradients, the same on every rank
        full = {"c_fc.weight": rng.standard_normal((5, 3 * p)), "c_fc.bias": rng.standard_normal(3 * p),
                "c_proj.weight": rng.standard_normal((2 * p, 5)), "c_proj.bias": rng.standard_normal(5),
                "ln.weight": 3.0 * rng.standard_normal(5)}
        cols, rows = np.arange(3 * p)[rank::p], np.arange(2 * p)[rank::p]  # strided shards: any layout works
        entries = [("c_fc.weight", full["c_fc.weight"][:, cols], Partition(1, cols, 3 * p)),
                   ("c_fc.bias", full["c_fc.bias"][cols], Partition(0, cols, 3 * p)),
                   ("c_proj.weight", full["c_proj.weight"][rows], Partition(0, rows, 2 * p)),
                   ("c_proj.bias", full["c_proj.bias"].copy(), None), ("ln.weight", full["ln.weight"].copy(), None)]
        sq = {name: float(np.sum(g * g)) for name, g in full.items()}
        replicated = sq["c_proj.bias"] + sq["ln.weight"]
        shards = sum(sq.values()) - replicated
        mine = sum(float(np.sum(g * g)) for _, g, part in entries if part is not None)
        got = r.call("tp_grad_norm", entries, group)
        r.compare(f"tp_grad_norm of {len(entries)} gradients (2 replicated) on tp={p}", got,
                  np.sqrt(shards + replicated),
                  symptoms={f"the replicated gradients counted once per rank, {p} times":
                            np.sqrt(shards + p * replicated),
                            "the replicated gradients are left out": np.sqrt(shards),
                            f"{OWN_PARTIAL}: each rank's own norm": np.sqrt(mine + replicated),
                            "the square root is missing: that is the sum of squares": shards + replicated})
        r.require(ops(r) == ["all_reduce"], "communication", f"the norm needs one all_reduce of one number; yours "
                                                             f"issued {describe_events(r.events)}")


@exercise("08", "average_gradients",
          average_gradients=("which ranks hold the same parameters as this one? Only they average together",
                             "a sum over dp_group, divided by its size — and the optimizer keeps your arrays, not "
                             "the ones you return",
                             "all-reduce (sum) every gradient over dp_group, then divide by dp_group.size, in "
                             "place: write the result back into the arrays you were given (g[...] = ..., or /=)"))
def check_08(r: Report) -> None:
    tp = max(1, r.world_size // 2)
    grid = r.grid(tp)
    shapes = [(4, 3), (5,), (2, 2, 3)]

    def grads_of(rank: int) -> list[np.ndarray]:
        rng = np.random.default_rng([8, rank])
        return [rng.standard_normal(s) for s in shapes]

    peers = grid.dp_groups[grid.tp_rank]  # the ranks holding the same shards as this one
    expected = [np.mean([grads_of(q)[i] for q in peers], axis=0) for i in range(len(shapes))]
    grads, before = grads_of(grid.rank), grads_of(grid.rank)
    r.call("average_gradients", grads, grid.dp_group)
    for i, (g, e) in enumerate(zip(grads, expected)):
        r.compare(f"grads[{i}] {g.shape} after average_gradients (in place), DP group {peers}", g, e, tol=1e-12,
                  symptoms={"your grads are unchanged: the result never went back into the arrays you were given":
                            before[i],
                            f"the DP group's sum, not its mean ({len(peers)} × too large)": e * len(peers)})
    r.require(all(e.group == "dp" for e in r.events) and r.events, "communication",
              f"average over the DP group only (ranks {peers}, the twins of this shard); yours issued "
              f"{describe_events(r.events)}")


@exercise("09", "embedding_grad_reduce_scatter",
          embedding_grad_reduce_scatter=("the forward all-gathered the embeddings: what is an all-gather's "
                                         "backward?",
                                         "the sum over the ranks, each keeping its own block of rows — one "
                                         "collective does both, for half the bytes of an all-reduce",
                                         "group.reduce_scatter(d_emb_partial, axis=0): the sum over the class "
                                         "slices, and rank r keeps rows [r·N/p, (r+1)·N/p) — all_gather's "
                                         "conjugate"))
def check_09(r: Report) -> None:
    group = r.grid().tp_group
    p = group.size
    for n, emb in [(3, 5), (1, 7)]:
        partials = [np.random.default_rng([9, n, q]).standard_normal((n * p, emb)) for q in range(p)]
        expected = sum(partials)[group.rank * n:(group.rank + 1) * n]
        got = r.call("embedding_grad_reduce_scatter", partials[group.rank].copy(), group)
        r.compare(f"embedding_grad_reduce_scatter(d_emb_partial {partials[0].shape}) = my rows", got, expected,
                  symptoms={f"{OWN_PARTIAL} (this rank's rows of its own d_emb_partial)":
                            partials[group.rank][group.rank * n:(group.rank + 1) * n]})
        sent = sum(e.wire_bytes for e in r.events)
        budget = wire_bytes("reduce_scatter", partials[0].nbytes, p)
        r.require(sent <= budget, "communication",
                  f"your collectives send {sent} bytes per rank ({describe_events(r.events)}); "
                  f"a reduce_scatter sends {budget}: all_reduce then slicing moves twice the bytes")


@exercise("10", "g_bar_forward", "g_bar_backward",
          g_bar_forward=("plain TP's g sums the partials on every rank; under SP each rank keeps only s/p "
                         "positions of that sum",
                         "one collective both sums over the ranks and splits the result along the sequence axis",
                         "group.reduce_scatter(partial, axis=1): the sum over the ranks, rank r keeping positions "
                         "[r·s/p, (r+1)·s/p) — an all-reduce and a slice give the same numbers for twice the "
                         "bytes"),
          g_bar_backward=("every term of a sum receives the sum's whole gradient; which positions of it does this "
                          "rank hold?",
                          "group.all_gather(dy_shard, axis=1): every rank's block of positions side by side, in "
                          "rank order — the same collective as f̄'s forward"))
def check_10(r: Report) -> None:
    group = r.grid().tp_group
    p, me = group.size, group.rank
    for b, chunk, h in [(3, 5, 7), (2, 1, 4), (1, 3, 11)]:  # s = chunk·p positions, chunk per rank
        s = chunk * p
        partials = [np.random.default_rng([10, b, q]).standard_normal((b, s, h)) for q in range(p)]
        got = r.call("g_bar_forward", partials[me].copy(), group)
        mine = slice(me * chunk, (me + 1) * chunk)
        r.compare(f"g_bar_forward(partial {(b, s, h)}) = the sum at positions {me * chunk}–{(me + 1) * chunk - 1}",
                  got, sum(partials)[:, mine], symptoms={f"{OWN_PARTIAL} at this rank's positions":
                                                         partials[me][:, mine]})
        r.require(ops(r) == ["reduce_scatter"], "communication", f"ḡ's forward is one collective that moves "
                                                                 f"(p−1)/p of the bytes; yours issued "
                                                                 f"{describe_events(r.events)}")
        shards = [np.random.default_rng([11, b, q]).standard_normal((b, chunk, h)) for q in range(p)]
        got = r.call("g_bar_backward", shards[me].copy(), group)
        r.compare(f"g_bar_backward(dy_shard {(b, chunk, h)}) = every rank's shard along the sequence", got,
                  np.concatenate(shards, axis=1))
        r.require(ops(r) == ["all_gather"], "communication", f"ḡ's backward is one collective along the sequence; "
                                                             f"yours issued {describe_events(r.events)}")


def ring_symptoms(op: str, nbytes: int, p: int) -> dict:
    """Exercise 11's typical slips, as the number each gives."""
    symptoms = {"your value is the logical bytes: the ring's (p − 1)/p factor is missing": float(nbytes),
                "p − 1 whole tensors: every ring step sends one chunk of B/p, not all of B": float((p - 1) * nbytes)}
    if op == "all_reduce":
        symptoms["(p − 1)/p of the logical bytes: one pass of the ring, and an all-reduce makes two"] = \
            float((p - 1) * nbytes // p)
    return symptoms


@exercise("11", "ring_wire_bytes", "block_forward_wire_bytes",
          ring_wire_bytes=("in a ring of p ranks the tensor travels in p chunks of B/p: how many steps does each "
                           "collective take, and how many chunks does a rank send per step?",
                           "an all-gather and a reduce-scatter take p − 1 steps; an all-reduce is one of each",
                           "all_reduce 2(p−1)/p·B (a reduce-scatter then an all-gather), all_gather and "
                           "reduce_scatter (p−1)/p·B, broadcast B (a pipelined chain); nothing when p = 1"),
          block_forward_wire_bytes=("how many collectives does one block's forward issue, and of what tensor?",
                                    "two B = b·s·h·itemsize tensors per block forward (attention, MLP): plain TP "
                                    "one all-reduce each, SP an all-gather and a reduce-scatter each"))
def check_11(r: Report) -> None:
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        for p in (1, 2, 3, 4, 8):
            for nbytes in (24, 24 * 1000):  # divisible by every p here
                got = r.call("ring_wire_bytes", op, nbytes, p)
                r.compare(f"ring_wire_bytes({op!r}, nbytes={nbytes}, p={p})", got, float(wire_bytes(op, nbytes, p)),
                          tol=0.5, symptoms=ring_symptoms(op, nbytes, p))
    b, s = 3, 8
    for tp, sp, dtype in [(2, False, np.float64), (2, True, np.float64), (4, False, np.float64),
                          (4, True, np.float32)]:
        grid = r.grid(tp)
        cfg = GPTConfig(vocab_size=11, n_positions=s, n_embd=12, n_layer=1, n_head=4)
        model = build_gpt(cfg, grid.tp_group, seed=11, dtype=dtype, sequence_parallel=sp)
        ids = np.random.default_rng(11).integers(0, cfg.vocab_size, (b, s))
        r.tracer.reset()
        model.loss_and_grads(ids, np.roll(ids, -1, axis=1))
        traced = list(r.tracer.events)
        for e in {(e.op, e.bytes, e.group_size): e for e in traced}.values():  # the trace's own wire_bytes column
            got = r.call("ring_wire_bytes", e.op, e.bytes, e.group_size)
            r.compare(f"ring_wire_bytes({e.op!r}, {e.bytes}, p={e.group_size}) for a {e.scope} {e.phase} record",
                      got, float(e.wire_bytes), tol=0.5, symptoms=ring_symptoms(e.op, e.bytes, e.group_size))
        block = sum(e.wire_bytes for e in traced if e.scope.startswith("transformer.h.0.") and e.phase == "forward")
        got = r.call("block_forward_wire_bytes", b, s, cfg.n_embd, np.dtype(dtype).itemsize, tp, sp)
        r.compare(f"block_forward_wire_bytes(b={b}, s={s}, h={cfg.n_embd}, itemsize={np.dtype(dtype).itemsize}, "
                  f"p={tp}, sequence_parallel={sp}) vs the traced forward of transformer.h.0", got, float(block),
                  tol=0.5)
