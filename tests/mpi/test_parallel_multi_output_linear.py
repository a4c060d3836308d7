"""The multi-output column-parallel linear vs its serial twin built from the same master weights, at every TP size.

Story: draw a serial MultiOutputLinear (three parts of awkward widths reading one input), shard it with the TP
region and with the SP region, run both on the same input and upstream gradients, and compare every output,
the input gradient and every part's gradient shard. Its collectives are one linear's: one f for all parts
(one all-reduce backward; under SP one all-gather forward, one backward and one reduce-scatter). A part held
alike by several ranks (a replicated KV head) sums its weight gradient over them, in one message.
"""

from __future__ import annotations

import numpy as np
import pytest

from _util import assert_close, randn
from tpsim.nn import Linear, MultiOutputLinear
from tpsim.tp import SP_REGION, TP_REGION, MultiOutputColumnParallelLinear

TOL = 1e-12
PATH = "model.layers.0.self_attn"
WIDTHS = {"q_proj": 7, "k_proj": 3, "v_proj": 5}  # per rank: out_j = width · tp


def serial_twin(tp: int, bias: bool, seed: int = 3) -> MultiOutputLinear:
    rng = np.random.default_rng(seed)
    return MultiOutputLinear({name: Linear(11, w * tp, bias=bias, rng=rng, std=0.5) for name, w in WIDTHS.items()})


@pytest.mark.parametrize("region", [TP_REGION, SP_REGION], ids=["tp", "sp"])
@pytest.mark.parametrize("bias", [False, True])
def test_multi_output_column_parallel_equals_serial(grid, region, bias):
    g, p, r = grid.tp_group, grid.tp, grid.tp_rank
    serial = serial_twin(p, bias).set_path(PATH)
    layer = MultiOutputColumnParallelLinear.from_serial(serial, g, region=region).set_path(PATH)
    chunk = 2  # positions per rank under SP
    mine = slice(r * chunk, (r + 1) * chunk) if region is SP_REGION else slice(None)
    x = randn(1, 3, chunk * p, 11)
    douts = [randn(2 + j, 3, chunk * p, w * p) for j, w in enumerate(WIDTHS.values())]

    outs_ref, caches_ref = serial.forward(x)
    dx_ref = serial.backward(douts, caches_ref)
    outs, caches = layer.forward(x[:, mine])
    cols = [slice(w * r, w * (r + 1)) for w in WIDTHS.values()]
    dx = layer.backward([dy[..., c] for dy, c in zip(douts, cols)], caches)

    for name, y, y_ref, c in zip(WIDTHS, outs, outs_ref, cols):
        assert_close(y, y_ref[..., c], TOL, f"{name} output")
        part, twin = getattr(layer, name), getattr(serial, name)
        assert_close(part.grads["weight"], twin.grads["weight"][:, c], TOL, f"{name}.weight grad shard")
        if bias:
            assert_close(part.grads["bias"], twin.grads["bias"][c], TOL, f"{name}.bias grad shard")
    assert_close(dx, dx_ref[:, mine], TOL, "input grad")
    assert [n for n, _ in layer.named_parameters()] == [n for n, _ in serial.named_parameters()]

    full = (3, chunk * p, 11)
    expected = ([("all_reduce", "backward", full)] if region is TP_REGION else
                [("all_gather", "forward", full), ("all_gather", "backward", full),
                 ("reduce_scatter", "backward", full)])  # one f (f̄) for the three parts, not three
    assert [(e.op, e.phase, e.shape) for e in grid.tracer.events] == expected
    assert {e.scope for e in grid.tracer.events} == {PATH}, "inline: the collectives carry the parent's scope"


def test_replicated_part_sums_its_gradient_over_the_ranks_holding_it(grid):
    """k_proj held whole by every TP rank (one KV head on all of them): each rank's dW_k is a partial sum."""
    g, p, r = grid.tp_group, grid.tp, grid.tp_rank
    serial = serial_twin(p, bias=False, seed=5)
    copies = g.split(0, "kv")  # every TP rank holds the same copy
    k_width = WIDTHS["k_proj"] * p
    layer = MultiOutputColumnParallelLinear.from_serial(
        serial, g, columns={"k_proj": np.arange(k_width)}, replica_group=copies, replicated=("k_proj",))
    layer.set_path(PATH)
    assert layer.k_proj.partition["weight"].replica == r and layer.q_proj.partition["weight"].replica == 0
    x = randn(1, 2, 3, 11)
    dq, dv = randn(2, 2, 3, WIDTHS["q_proj"] * p), randn(3, 2, 3, WIDTHS["v_proj"] * p)
    dk_per_rank = [randn(10 + s, 2, 3, k_width) for s in range(p)]  # each rank's share of k's upstream gradient

    dx_ref = serial.backward([dq, sum(dk_per_rank), dv], serial.forward(x)[1])
    q_cols, v_cols = (slice(WIDTHS[n] * r, WIDTHS[n] * (r + 1)) for n in ("q_proj", "v_proj"))
    dx = layer.backward([dq[..., q_cols], dk_per_rank[r], dv[..., v_cols]], layer.forward(x)[1])

    assert_close(dx, dx_ref, TOL, "input grad")
    assert_close(layer.k_proj.grads["weight"], serial.k_proj.grads["weight"], TOL, "replicated k_proj.weight grad")
    assert_close(layer.q_proj.grads["weight"], serial.q_proj.grads["weight"][:, q_cols], TOL, "q_proj.weight grad")
    got = [(e.op, e.phase, e.scope, e.group, e.shape) for e in grid.tracer.events]
    assert got == [("all_reduce", "backward", PATH, "tp", x.shape),
                   ("all_reduce", "backward", PATH, "kv", (1, 11, k_width))]


def test_parts_must_share_group_region_and_layout(grid):
    from tpsim.tp import ColumnParallelLinear

    g = grid.tp_group
    tp_part = ColumnParallelLinear(4, 2 * grid.tp, g, gather_output=False)
    with pytest.raises(ValueError, match="one group and one region"):
        MultiOutputColumnParallelLinear({"a": tp_part, "b": ColumnParallelLinear(4, 2 * grid.tp, g,
                                                                                 gather_output=False,
                                                                                 region=SP_REGION)})
    with pytest.raises(ValueError, match="gather_output=False"):
        MultiOutputColumnParallelLinear({"a": ColumnParallelLinear(4, 2 * grid.tp, g)})
    with pytest.raises(ValueError, match="need a replica_group"):
        MultiOutputColumnParallelLinear({"a": tp_part}, replicated=("a",))
