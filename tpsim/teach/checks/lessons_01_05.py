"""The checks of exercises 01–05: block splits, f and g's backward, row-parallel, the MLP's forward, qkv columns.

Each compares the learner's value first, with the symptoms of the typical mistakes (what that mistake returns
on the same inputs), and only then the rules about communication.
"""

from __future__ import annotations

import numpy as np

from tpsim.nn import MLP, Linear, gelu_forward
from tpsim.partition import shard_range
from tpsim.teach.checks.registry import exercise
from tpsim.teach.returned import as_numbers
from tpsim.teach.verdict import Report, describe_events
from tpsim.tp import CopyToTPRegion, ParallelMLP, ReduceFromTPRegion, RowParallelLinear, head_columns

OWN_PARTIAL = "your result is each rank's own partial sum, not the group's"


@exercise("01", "column_parallel_matmul", "row_parallel_matmul",
          column_parallel_matmul=("each block of A alone gives some of the output's columns: what shape is x · A_i?",
                                  "the p products x · A_i, laid side by side along the last axis, are x · A",
                                  "np.concatenate([x @ a for a in a_blocks], axis=-1)"),
          row_parallel_matmul=("what shape is Y_i · B_i, and how does it relate to Y · B?",
                               "the product of a row block of B and the matching column block of Y is a partial "
                               "sum of the answer: add them all up"))
def check_01(r: Report) -> None:
    rng = np.random.default_rng(1)
    for tokens, inner, out, p in [(5, 6, 8, 2), (13, 17, 11, 3), (4, 11, 7, 4)]:
        x, a = rng.standard_normal((tokens, inner)), rng.standard_normal((inner, out))
        got = r.call("column_parallel_matmul", x.copy(), [blk.copy() for blk in np.array_split(a, p, axis=1)])
        r.compare(f"column_parallel_matmul(x {x.shape}, {p} column blocks of a {a.shape})", got, x @ a)
        y, b = rng.standard_normal((tokens, inner)), rng.standard_normal((inner, out))
        y_blocks, b_blocks = np.array_split(y, p, axis=1), np.array_split(b, p, axis=0)
        got = r.call("row_parallel_matmul", [blk.copy() for blk in y_blocks], [blk.copy() for blk in b_blocks])
        r.compare(f"row_parallel_matmul({p} column blocks of y {y.shape}, {p} row blocks of b {b.shape})", got, y @ b,
                  symptoms={"your result is the first block's partial product only, not the sum of all p":
                            y_blocks[0] @ b_blocks[0]})


@exercise("02", "g_backward", "f_backward",
          g_backward=("write g's forward as a formula: y = y_1 + … + y_p. How does y change when y_r changes?",
                      "g's forward added the ranks' partial results; the gradient of a sum with respect to each of "
                      "its terms is the upstream gradient itself: no communication"),
          f_backward=("in the forward every rank used the same x in its own branch; in the backward each rank "
                      "holds only its branch's share of x's gradient",
                      "x's gradient is the sum of the branches' shares — over the whole TP group",
                      "one group.all_reduce(dy): f's backward is g's forward, the conjugate pair"))
def check_02(r: Report) -> None:
    group = r.grid().tp_group
    p = group.size
    same = np.random.default_rng(2)  # g's output is replicated, so its upstream gradient is the same on every rank
    own = np.random.default_rng([2, group.rank])  # f's: each rank's branch gives a different share
    for shape in [(3, 5), (2, 4, 7), (13,)]:
        dy = same.standard_normal(shape)
        got = r.call("g_backward", dy.copy(), group)
        r.compare(f"g_backward(dy) for dy of shape {shape}, the same dy on every rank", got,
                  ReduceFromTPRegion.backward(dy, group),
                  symptoms={f"your result is the sum of dy over the {p} ranks: {p} × the gradient that every rank "
                            f"already holds whole (f's and g's backward swapped?)": p * dy,
                            f"your result is dy / {p}: the gradient shared out over the ranks": dy / p})
        r.require(not r.events, "communication", f"g's backward has all it needs on this rank; yours issued "
                                                 f"{describe_events(r.events)}")
        dy = own.standard_normal(shape)
        got = r.call("f_backward", dy.copy(), group)
        events, total = list(r.events), CopyToTPRegion.backward(dy, group)
        r.compare(f"f_backward(dy) for dy of shape {shape}, a different dy on every rank", got, total,
                  symptoms={f"{OWN_PARTIAL} (f's backward left dy as it was)": dy,
                            f"your result is the group's mean, 1/{p} of the group's sum": total / p})
        r.require([e.op for e in events] == ["all_reduce"], "communication",
                  f"f's backward is one collective; yours issued {describe_events(events)}")


@exercise("03", "row_parallel_forward",
          row_parallel_forward=("y_shard · weight_shard has the full output shape [tokens, out]: is it the answer?",
                                "each rank's product is one term of the SenseParrots article's eq. (2); the group "
                                "must add the terms up",
                                "multiply your shard, all-reduce the partial sums, then add the bias once: added on "
                                "every rank before the all-reduce it is counted tp times"))
def check_03(r: Report) -> None:
    group = r.grid().tp_group
    p = group.size
    for case, (tokens, inner, out) in enumerate([(5, 2 * p, 6), (13, 3 * p, 11), (1, p, 17)]):
        rng = np.random.default_rng([3, case])  # the same master weights and input on every rank
        serial = Linear(inner, out, rng=rng, std=1.0, bias_value=rng.standard_normal(out))
        layer = RowParallelLinear.from_serial(serial, group, input_is_parallel=True)
        y = rng.standard_normal((tokens, inner))
        y_shard = y[:, shard_range(inner, p, group.rank)]
        weight, bias = layer.params["weight"], layer.params["bias"]
        got = r.call("row_parallel_forward", y_shard.copy(), weight.copy(), bias.copy(), group)
        events, z = list(r.events), serial.forward(y)[0]
        r.compare(f"row_parallel_forward(y_shard {y_shard.shape}, weight_shard {weight.shape}) = z {(tokens, out)}",
                  got, z, symptoms={f"{OWN_PARTIAL} (plus the bias)": y_shard @ weight + bias,
                                    f"the bias counted {p} times: added on every rank before the ranks' sum":
                                    z + (p - 1) * bias,
                                    "the bias is missing": z - bias})
        r.require([e.op for e in events] == ["all_reduce"], "communication",
                  f"the forward is one collective of the [tokens, out] partial sums; yours issued "
                  f"{describe_events(events)}")


def mlp_pair(rng: np.random.Generator, hidden: int, ffn: int, group) -> tuple[MLP, ParallelMLP]:
    """A serial MLP with random (non-zero) biases and its ParallelMLP twin sharded from the same master weights."""
    serial = MLP(hidden, ffn, rng=rng, std=0.5)
    for lin in (serial.c_fc, serial.c_proj):
        lin.params["bias"][...] = rng.standard_normal(lin.params["bias"].shape)
    return serial, ParallelMLP.from_serial(serial, group)


@exercise("04", "parallel_mlp_forward",
          parallel_mlp_forward=("which of the two linears needs the whole of its input, and which one only its "
                                "shard?",
                                "c_fc's column shard needs no communication and GeLU works element by element on "
                                "it; c_proj's row shard gives each rank a partial sum",
                                "c_fc, GeLU, c_proj without its bias, one all-reduce, then c_proj's bias once"))
def check_04(r: Report) -> None:
    group = r.grid().tp_group
    p = group.size
    for case, (tokens, hidden, ffn) in enumerate([(5, 6, 4 * p), (9, 11, 8 * p)]):
        rng = np.random.default_rng([4, case])
        serial, mlp = mlp_pair(rng, hidden, ffn, group)
        x = rng.standard_normal((tokens, hidden))
        fc, proj = mlp.c_fc.params, mlp.c_proj.params
        got = r.call("parallel_mlp_forward", x.copy(), fc["weight"].copy(), fc["bias"].copy(),
                     proj["weight"].copy(), proj["bias"].copy(), group)
        events, z = list(r.events), serial.forward(x)[0]
        full_fc, full_proj = serial.c_fc.params, serial.c_proj.params
        no_gelu = (x @ full_fc["weight"] + full_fc["bias"]) @ full_proj["weight"] + full_proj["bias"]
        partial = _gelu(x @ fc["weight"] + fc["bias"]) @ proj["weight"] + proj["bias"]
        r.compare(f"parallel_mlp_forward(x {x.shape}) = z, hidden {hidden}, ffn {ffn}", got, z,
                  symptoms={OWN_PARTIAL: partial,
                            f"c_proj's bias counted {p} times: added on every rank before the ranks' sum":
                            z + (p - 1) * proj["bias"],
                            "no GeLU between c_fc and c_proj": no_gelu,
                            "c_proj's bias is missing": z - proj["bias"]})
        r.require([e.op for e in events] == ["all_reduce"], "communication",
                  f"the parallel MLP's forward needs exactly one collective; yours issued {describe_events(events)}")


def _gelu(h: np.ndarray) -> np.ndarray:
    return gelu_forward(h)[0]


def qkv_symptoms(got, expected: np.ndarray, hidden: int, tp: int, tp_rank: int) -> dict:
    """The layout mistakes of exercise 05, as the columns each one picks."""
    width = hidden // tp
    symptoms = {
        "a contiguous block of c_attn's 3·hidden columns: the right split if c_attn were stored interleaved per "
        "head ([heads, 3, hd], Megatron's layout), but this c_attn is GPT-2's [q | k | v], where such a block "
        "mixes q of some heads with k of others (the layout trap)":
            np.arange(tp_rank * 3 * width, (tp_rank + 1) * 3 * width),
        "only the q part: k and v are missing": expected[:width]}
    read = as_numbers(got)  # whatever the learner returned: numbers, or a sentence saying why not
    if not isinstance(read, str) and np.array_equal(np.sort(read[0].ravel()), np.sort(expected)):  # a permutation: the set is right, the order is not
        symptoms["the right columns in the wrong order: all of q's first, then k's, then v's, each ascending"] = got
    return symptoms


@exercise("05", "qkv_columns",
          qkv_columns=("draw c_attn's 3·hidden columns for hidden = 8, heads = 2 under GPT-2's [q | k | v]: where do "
                       "head 0's q, k and v columns sit?",
                       "a rank's heads own hidden/tp columns in each of the three parts, at the same offset inside "
                       "each part",
                       "q's block of this rank, then hidden + that block, then 2·hidden + that block"))
def check_05(r: Report) -> None:
    rank, p = r.rank, r.world_size
    for hidden, heads, tp in [(48, 8, p), (64, 4 * p, p), (24, 6, 2), (12, 3, 1)]:
        got = r.call("qkv_columns", hidden, heads, tp, rank % tp)
        expected = head_columns(hidden, heads, tp, rank % tp)
        r.compare(f"qkv_columns(hidden={hidden}, heads={heads}, tp={tp}, tp_rank={rank % tp})", got, expected,
                  symptoms=qkv_symptoms(got, expected, hidden, tp, rank % tp), layout="set")
