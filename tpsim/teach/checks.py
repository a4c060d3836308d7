"""One check per exercise: the learner's function against tpsim's own layers, on real ranks, random inputs.

Each check builds the inputs (awkward sizes, float64), computes the expected answer independently — from the
serial math or from the tpsim layer the lesson teaches — and hands both to the ``Report`` (``tpsim.teach.verdict``),
which explains any difference. Rules about communication (how many collectives, of which kind, how many bytes)
are checked from the tracer, because the right numbers computed with the wrong collectives miss the point.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tpsim.cost import wire_bytes
from tpsim.models.build import build_gpt
from tpsim.models.config import GPTConfig
from tpsim.nn import MLP, Linear
from tpsim.nn.module import Partition
from tpsim.teach.verdict import Check, Report, describe_events
from tpsim.tp import CopyToTPRegion, ParallelMLP, ReduceFromTPRegion, RowParallelLinear, head_columns
from tpsim.partition import shard_range

CHECKS: dict[str, Check] = {}


def exercise(number: str, *functions: str, **hints: str) -> Callable:
    """Register ``fn(report)`` as the check of exercise ``number`` (functions in the order it calls them)."""
    def register(fn: Callable[[Report], None]) -> Callable[[Report], None]:
        CHECKS[number] = Check(number, functions, fn, hints)
        return fn
    return register


def ops(r: Report) -> list[str]:
    return [e.op for e in r.events]


@exercise("01", "column_parallel_matmul", "row_parallel_matmul",
          column_parallel_matmul="block i of the output is x · a_blocks[i]; lay the blocks side by side "
                                 "(np.concatenate along the last axis)",
          row_parallel_matmul="the product of a row block of B and the matching column block of Y is a partial "
                              "sum of the answer: add them all up")
def check_01(r: Report) -> None:
    rng = np.random.default_rng(1)
    for tokens, inner, out, p in [(5, 6, 8, 2), (13, 17, 11, 3), (4, 11, 7, 4)]:
        x, a = rng.standard_normal((tokens, inner)), rng.standard_normal((inner, out))
        got = r.call("column_parallel_matmul", x.copy(), [blk.copy() for blk in np.array_split(a, p, axis=1)])
        r.compare(f"column_parallel_matmul(x {x.shape}, {p} column blocks of a {a.shape})", got, x @ a)
        y, b = rng.standard_normal((tokens, inner)), rng.standard_normal((inner, out))
        got = r.call("row_parallel_matmul", [blk.copy() for blk in np.array_split(y, p, axis=1)],
                     [blk.copy() for blk in np.array_split(b, p, axis=0)])
        r.compare(f"row_parallel_matmul({p} column blocks of y {y.shape}, {p} row blocks of b {b.shape})", got, y @ b)


@exercise("02", "g_backward", "f_backward",
          g_backward="g's forward added the ranks' partial results; the gradient of a sum with respect to each of "
                     "its terms is the upstream gradient itself, so g's backward is the identity",
          f_backward="f handed the same x to every rank, so x's gradient is the sum of the ranks' partial "
                     "gradients: one group.all_reduce(dy)")
def check_02(r: Report) -> None:
    group = r.grid().tp_group
    rng = np.random.default_rng([2, group.rank])  # a different upstream gradient on every rank
    for shape in [(3, 5), (2, 4, 7), (13,)]:
        dy = rng.standard_normal(shape)
        got = r.call("g_backward", dy.copy(), group)
        r.compare(f"g_backward(dy) for dy of shape {shape}", got, ReduceFromTPRegion.backward(dy, group))
        r.require(not r.events, "communication", f"g's backward must not communicate; yours issued "
                                                 f"{describe_events(r.events)}")
        got = r.call("f_backward", dy.copy(), group)
        r.require(ops(r) == ["all_reduce"], "communication", f"f's backward is one all_reduce over the TP group; "
                                                             f"yours issued {describe_events(r.events)}")
        r.compare(f"f_backward(dy) for dy of shape {shape}", got, CopyToTPRegion.backward(dy, group))


@exercise("03", "row_parallel_forward",
          row_parallel_forward="multiply your shard, all-reduce the partial sums, then add the bias once: added "
                               "on every rank before the all-reduce it is counted tp times")
def check_03(r: Report) -> None:
    group = r.grid().tp_group
    p = group.size
    for case, (tokens, inner, out) in enumerate([(5, 2 * p, 6), (13, 3 * p, 11), (1, p, 17)]):
        rng = np.random.default_rng([3, case])  # the same master weights and input on every rank
        serial = Linear(inner, out, rng=rng, std=1.0, bias_value=rng.standard_normal(out))
        layer = RowParallelLinear.from_serial(serial, group, input_is_parallel=True)
        y = rng.standard_normal((tokens, inner))
        y_shard = y[:, shard_range(inner, p, group.rank)]
        got = r.call("row_parallel_forward", y_shard.copy(), layer.params["weight"].copy(),
                     layer.params["bias"].copy(), group)
        r.require(ops(r) == ["all_reduce"], "communication", f"the forward is one all_reduce of the [tokens, out] "
                                                             f"partial sums; yours issued {describe_events(r.events)}")
        r.compare(f"row_parallel_forward(y_shard {y_shard.shape}, weight_shard {layer.params['weight'].shape}) "
                  f"= z {(tokens, out)}", got, serial.forward(y)[0])


@exercise("04", "parallel_mlp_forward",
          parallel_mlp_forward="c_fc's column shard needs no communication and GeLU works element by element on "
                               "it; c_proj's row shard turns it into a partial sum: one all-reduce, then the bias")
def check_04(r: Report) -> None:
    group = r.grid().tp_group
    for case, (tokens, hidden, ffn) in enumerate([(5, 6, 4 * group.size), (9, 11, 8 * group.size)]):
        rng = np.random.default_rng([4, case])
        serial = MLP(hidden, ffn, rng=rng, std=0.5)
        for lin in (serial.c_fc, serial.c_proj):
            lin.params["bias"][...] = rng.standard_normal(lin.params["bias"].shape)
        mlp = ParallelMLP.from_serial(serial, group)
        x = rng.standard_normal((tokens, hidden))
        fc, proj = mlp.c_fc.params, mlp.c_proj.params
        got = r.call("parallel_mlp_forward", x.copy(), fc["weight"].copy(), fc["bias"].copy(),
                     proj["weight"].copy(), proj["bias"].copy(), group)
        r.require(ops(r) == ["all_reduce"], "communication", f"the parallel MLP's forward is one all_reduce; yours "
                                                             f"issued {describe_events(r.events)}")
        r.compare(f"parallel_mlp_forward(x {x.shape}) = z, hidden {hidden}, ffn {ffn}", got, serial.forward(x)[0])


@exercise("05", "qkv_columns",
          qkv_columns="c_attn's 3h columns are q | k | v; this rank's heads own hidden/tp columns in each of the "
                      "three parts, at the same offset: q's block, then h + that block, then 2h + that block")
def check_05(r: Report) -> None:
    rank, p = r.rank, r.world_size
    for hidden, heads, tp in [(48, 8, p), (64, 4 * p, p), (24, 6, 2), (12, 3, 1)]:
        got = r.call("qkv_columns", hidden, heads, tp, rank % tp)
        r.compare(f"qkv_columns(hidden={hidden}, heads={heads}, tp={tp}, tp_rank={rank % tp})", got,
                  head_columns(hidden, heads, tp, rank % tp))


@exercise("06", "vocab_parallel_nll",
          vocab_parallel_nll="three all-reduces of [tokens]: MAX of the local row maxima, SUM of the local "
                             "Σ exp(z − max), SUM of the target logit (the owner sends it, everyone else 0); "
                             "then loss = max + log(sum) − target logit")
def check_06(r: Report) -> None:
    group = r.grid().tp_group
    p = group.size
    for case, (tokens, per_rank, scale) in enumerate([(7, 3, 1.0), (5, 4, 1000.0), (1, 1, 1.0)]):
        rng = np.random.default_rng([6, case])
        vocab = per_rank * p
        logits = scale * rng.standard_normal((tokens, vocab))  # x1000: exp overflows without the max-trick
        targets = rng.integers(0, vocab, size=tokens)
        m = logits.max(axis=1)
        expected = m + np.log(np.exp(logits - m[:, None]).sum(axis=1)) - logits[np.arange(tokens), targets]
        start = group.rank * per_rank
        got = r.call("vocab_parallel_nll", logits[:, start:start + per_rank].copy(), targets.copy(), start, group)
        shapes = [(e.op, e.shape) for e in r.events]
        r.require(shapes == [("all_reduce", (tokens,))] * 3, "communication",
                  f"the parallel softmax needs three all_reduce calls of [tokens] = [{tokens}] and nothing else "
                  f"(never the [tokens, V] logits); yours issued {describe_events(r.events)}")
        r.compare(f"vocab_parallel_nll for {tokens} tokens, vocabulary {vocab}, logits x{scale:g}", got, expected,
                  tol=1e-9 * scale)


@exercise("07", "tp_grad_norm",
          tp_grad_norm="every rank adds the squares of its shards; a replicated gradient (partition None) is the "
                       "same on every rank, so only tp_rank 0 adds it; one all-reduce (sum), then the square root")
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
        expected = np.sqrt(sum(float(np.sum(g * g)) for g in full.values()))
        got = r.call("tp_grad_norm", entries, group)
        r.require(ops(r) == ["all_reduce"], "communication", f"the norm needs one all_reduce of one number; yours "
                                                             f"issued {describe_events(r.events)}")
        r.compare(f"tp_grad_norm of {len(entries)} gradients (2 replicated) on tp={p}", got, expected)


@exercise("08", "average_gradients",
          average_gradients="all-reduce (sum) every gradient over dp_group, then divide by dp_group.size, in "
                            "place: write the result back into the arrays you were given (g[...] = ..., or /=)")
def check_08(r: Report) -> None:
    tp = max(1, r.world_size // 2)
    grid = r.grid(tp)
    shapes = [(4, 3), (5,), (2, 2, 3)]

    def grads_of(rank: int) -> list[np.ndarray]:
        rng = np.random.default_rng([8, rank])
        return [rng.standard_normal(s) for s in shapes]

    peers = grid.dp_groups[grid.tp_rank]  # the ranks holding the same shards as this one
    expected = [np.mean([grads_of(q)[i] for q in peers], axis=0) for i in range(len(shapes))]
    grads = grads_of(grid.rank)
    r.call("average_gradients", grads, grid.dp_group)
    r.require(all(e.group == "dp" for e in r.events) and r.events, "communication",
              f"average over the DP group only (ranks {peers}, the twins of this shard); yours issued "
              f"{describe_events(r.events)}")
    for i, (g, e) in enumerate(zip(grads, expected)):
        r.compare(f"grads[{i}] {g.shape} after average_gradients (in place), DP group {peers}", g, e, tol=1e-12)


@exercise("09", "embedding_grad_reduce_scatter",
          embedding_grad_reduce_scatter="group.reduce_scatter(d_emb_partial, axis=0): the sum over the class "
                                        "slices, and rank r keeps rows [r·N/p, (r+1)·N/p) — all_gather's conjugate")
def check_09(r: Report) -> None:
    group = r.grid().tp_group
    p = group.size
    for n, emb in [(3, 5), (1, 7)]:
        partials = [np.random.default_rng([9, n, q]).standard_normal((n * p, emb)) for q in range(p)]
        expected = sum(partials)[group.rank * n:(group.rank + 1) * n]
        got = r.call("embedding_grad_reduce_scatter", partials[group.rank].copy(), group)
        r.compare(f"embedding_grad_reduce_scatter(d_emb_partial {partials[0].shape}) = my rows", got, expected)
        sent = sum(e.wire_bytes for e in r.events)
        budget = wire_bytes("reduce_scatter", partials[0].nbytes, p)
        r.require(sent <= budget, "communication",
                  f"your collectives send {sent} bytes per rank ({describe_events(r.events)}); "
                  f"a reduce_scatter sends {budget}: all_reduce then slicing moves twice the bytes")


@exercise("10", "g_bar_forward", "g_bar_backward",
          g_bar_forward="group.reduce_scatter(partial, axis=1): the sum over the ranks, rank r keeping positions "
                        "[r·s/p, (r+1)·s/p) — an all-reduce and a slice give the same numbers for twice the bytes",
          g_bar_backward="group.all_gather(dy_shard, axis=1): every rank's block of positions side by side, in rank "
                         "order — the same collective as f̄'s forward")
def check_10(r: Report) -> None:
    group = r.grid().tp_group
    p, me = group.size, group.rank
    for b, chunk, h in [(3, 5, 7), (2, 1, 4), (1, 3, 11)]:  # s = chunk·p positions, chunk per rank
        s = chunk * p
        partials = [np.random.default_rng([10, b, q]).standard_normal((b, s, h)) for q in range(p)]
        got = r.call("g_bar_forward", partials[me].copy(), group)
        r.require(ops(r) == ["reduce_scatter"], "communication", f"ḡ's forward is one reduce_scatter along the "
                                                                 f"sequence; yours issued {describe_events(r.events)}")
        r.compare(f"g_bar_forward(partial {(b, s, h)}) = the sum at positions {me * chunk}–{(me + 1) * chunk - 1}",
                  got, sum(partials)[:, me * chunk:(me + 1) * chunk])
        shards = [np.random.default_rng([11, b, q]).standard_normal((b, chunk, h)) for q in range(p)]
        got = r.call("g_bar_backward", shards[me].copy(), group)
        r.require(ops(r) == ["all_gather"], "communication", f"ḡ's backward is one all_gather along the sequence; "
                                                             f"yours issued {describe_events(r.events)}")
        r.compare(f"g_bar_backward(dy_shard {(b, chunk, h)}) = every rank's shard along the sequence", got,
                  np.concatenate(shards, axis=1))


@exercise("11", "ring_wire_bytes", "block_forward_wire_bytes",
          ring_wire_bytes="all_reduce 2(p−1)/p·B (a reduce-scatter then an all-gather), all_gather and "
                          "reduce_scatter (p−1)/p·B, broadcast B (a pipelined chain); nothing when p = 1",
          block_forward_wire_bytes="two B = b·s·h·itemsize tensors per block forward (attention, MLP): plain TP one "
                                   "all-reduce each, SP an all-gather and a reduce-scatter each")
def check_11(r: Report) -> None:
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        for p in (1, 2, 3, 4, 8):
            for nbytes in (24, 24 * 1000):  # divisible by every p here
                got = r.call("ring_wire_bytes", op, nbytes, p)
                r.compare(f"ring_wire_bytes({op!r}, nbytes={nbytes}, p={p})", got, float(wire_bytes(op, nbytes, p)),
                          tol=0.5)
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
                      got, float(e.wire_bytes), tol=0.5)
        block = sum(e.wire_bytes for e in traced if e.scope.startswith("transformer.h.0.") and e.phase == "forward")
        got = r.call("block_forward_wire_bytes", b, s, cfg.n_embd, np.dtype(dtype).itemsize, tp, sp)
        r.compare(f"block_forward_wire_bytes(b={b}, s={s}, h={cfg.n_embd}, itemsize={np.dtype(dtype).itemsize}, "
                  f"p={tp}, sequence_parallel={sp}) vs the traced forward of transformer.h.0", got, float(block),
                  tol=0.5)
