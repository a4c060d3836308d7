"""The expert-parallel mixture of experts (``tpsim.ep``) against the serial layer built from the same weights.

Every layout the world holds — tp 1 and 2 (with sequence parallelism), ep 1, 2, 4 (8 at world 8), etp 1 and 2,
both dispatchers — on the three routers (Mixtral's, Qwen2-MoE's with its gated shared expert and capacity
dropping, DeepSeek-V3's sigmoid with a selection bias and shared experts) and a layer whose expert 5 gets no
token. The serial twin applies the capacity to the same groups of tokens (each rank's own), so outputs, input
gradients, every gradient (the router's and shared experts' averaged over DP — summed over TP under SP by the
layer's own all-reduce — the
experts' summed over expert-DP and divided by dp), the auxiliary losses and the dropped count all equal it
(float64, 1e-12). The traced all-to-all-v bytes equal the routing counts × h × 8.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.comm import ProcessGrid
from tpsim.ep.moe import ExpertParallelMoE
from tpsim.errors import ConfigError
from tpsim.nn.moe import MoE
from tpsim.partition import take_shard

from _util import assert_close
from conftest import WORLD

H, F, E, K = 6, 4, 8, 2
B_LOCAL, S_LOCAL = 2, 4
_GRIDS: dict = {}


def layouts() -> list[tuple[int, int, int]]:
    n = WORLD.Get_size()
    return [(tp, ep, etp) for tp in (1, 2) for ep in (1, 2, 4, 8) for etp in (1, 2)
            if n % tp == 0 and n % (ep * etp) == 0]


def grid_for(tp: int, ep: int, etp: int) -> ProcessGrid:
    if (tp, ep, etp) not in _GRIDS:
        _GRIDS[tp, ep, etp] = ProcessGrid(tp=tp, ep=ep, etp=etp)
    grid = _GRIDS[tp, ep, etp]
    grid.tracer.reset()
    grid.tracer.enabled = True
    return grid


CASES = {
    "mixtral": dict(router="softmax", aux_coef=0.01, z_coef=0.001),
    "qwen2-moe": dict(router="softmax_plain", shared_experts=1, shared_ffn=4, shared_gate=True,
                      capacity_factor=1.0, aux_coef=0.01),
    "deepseek": dict(router="sigmoid", shared_experts=2, shared_ffn=4, z_coef=0.001),
    "idle-expert": dict(router="sigmoid", capacity_factor=0.5),
}


def serial_layer(case: str, tp: int) -> MoE:
    moe = MoE(H, F, E, K, rng=np.random.default_rng(3), std=0.6, **CASES[case])
    if case == "deepseek":
        moe.router.bias = np.random.default_rng(4).standard_normal(E) * 0.3
    if case == "idle-expert":
        moe.router.bias[5] = -10.0  # a selection bias below every score's range: expert 5 gets no token
    return moe


def rank_tokens(grid: ProcessGrid, s: int) -> np.ndarray:
    """This rank's tokens as rows of the flat [B, s] batch, in its own order (DP splits sequences, SP positions)."""
    b = np.arange(grid.dp_rank * B_LOCAL, (grid.dp_rank + 1) * B_LOCAL)
    pos = np.arange(grid.tp_rank * S_LOCAL, (grid.tp_rank + 1) * S_LOCAL)
    return (b[:, None] * s + pos[None, :]).ravel()


def reduce_grad(grid: ProcessGrid, name: str, g: np.ndarray, layer: ExpertParallelMoE) -> np.ndarray:
    """A gradient as the data-parallel step leaves it (the layer's docstring)."""
    if name.startswith("experts."):
        return grid.group("edp").all_reduce(g) / grid.dp
    return grid.dp_group.all_reduce(g) / grid.dp  # dense: TP shards, or replicated and summed over TP in-layer


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tp, ep, etp", layouts())
def test_expert_parallel_layer_equals_serial(tp, ep, etp, case, dispatcher):
    grid = grid_for(tp, ep, etp)
    B, s = B_LOCAL * grid.dp, S_LOCAL * tp
    serial = serial_layer(case, tp)
    layer = ExpertParallelMoE(serial, grid, dispatcher)
    groups = [None] * WORLD.Get_size()
    for r in range(WORLD.Get_size()):  # every rank's tokens, as the serial twin's capacity groups
        d, t = divmod(r % (grid.tp * grid.dp), grid.tp)
        b = np.arange(d * B_LOCAL, (d + 1) * B_LOCAL)
        groups[r] = (b[:, None] * s + np.arange(t * S_LOCAL, (t + 1) * S_LOCAL)[None, :]).ravel()
    serial.groups = lambda shape: groups
    rng = np.random.default_rng(7)
    x, dy = rng.standard_normal((B, s, H)), rng.standard_normal((B, s, H))
    y_s, c_s = serial.forward(x)
    serial.zero_grad()
    dx_s = serial.backward(dy, c_s)

    mine = rank_tokens(grid, s)
    local = lambda a: a.reshape(B * s, H)[mine].reshape(B_LOCAL, S_LOCAL, H)  # noqa: E731
    y, cache = layer.forward(local(x))
    layer.zero_grad()
    dx = layer.backward(local(dy) * grid.dp, cache)  # this rank's loss: its tokens' mean, dp times the serial
    assert_close(y, local(y_s), what="output")
    assert_close(dx / grid.dp, local(dx_s), what="input gradient")
    ref = dict(serial.named_grads())
    for name, g in layer.named_grads():
        assert_close(reduce_grad(grid, name, g, layer), shard_of(layer, name, ref[name]),
                     what=f"gradient of {name}")
    dp_mean = lambda v: float(grid.dp_group.all_reduce(np.array([v]))[0]) / grid.dp  # noqa: E731
    assert abs(dp_mean(cache.router.aux_loss) - c_s.router.aux_loss) <= 1e-12
    assert abs(dp_mean(cache.router.z_loss) - c_s.router.z_loss) <= 1e-12
    assert int(grid.world.all_reduce(np.array([cache.dropped]))[0]) == c_s.dropped
    assert (grid.world.all_reduce(cache.load) == np.array([len(r) for r in c_s.rows])).all()
    if case == "idle-expert":
        assert len(c_s.rows[5]) == 0
    if case == "qwen2-moe":
        assert c_s.dropped > 0
    if dispatcher == "alltoall":
        sent = [e for e in grid.tracer.events if e.op == "all_to_all_v"]
        assert len(sent) == 4  # dispatch and combine, forward and backward
        per_rank = cache.load.reshape(ep, -1).sum(axis=1)
        want_bytes = int(per_rank.sum()) * H * 8
        want_wire = want_bytes - int(per_rank[grid.ep_rank]) * H * 8
        assert (sent[0].bytes, sent[0].wire_bytes) == (want_bytes, want_wire)


def shard_of(layer: ExpertParallelMoE, name: str, master: np.ndarray) -> np.ndarray:
    """The part of a serial gradient that ``name`` holds on this rank (its Partition, if any)."""
    module_path, param = name.rsplit(".", 1)
    module = dict(layer.named_modules())[module_path]
    return take_shard(master, module.partition.get(param))


def test_bad_expert_layouts_are_refused_in_one_sentence():
    n = WORLD.Get_size()
    with pytest.raises(ConfigError, match="does not divide the"):
        ProcessGrid(tp=1, ep=3 * n, etp=1)
    if n >= 2:
        grid = grid_for(1, 2, 1)
        with pytest.raises(ConfigError, match="3 experts do not divide over ep 2"):
            ExpertParallelMoE(MoE(H, F, 3, 1), grid)
    with pytest.raises(ConfigError, match="top-k 9 must be in 1 .. experts"):
        MoE(H, F, E, 9)
    if n >= 2:
        from tpsim.tp.regions import TP_REGION
        with pytest.raises(ConfigError, match="experts with tp 2 need sequence parallelism"):
            ExpertParallelMoE(MoE(H, F, E, K), grid_for(2, 1, 1), region=TP_REGION)
    with pytest.raises(ConfigError, match="dispatcher 'ring'"):
        ExpertParallelMoE(MoE(H, F, E, K), grid_for(1, 1, 1), "ring")


@pytest.mark.parametrize("dtype", [np.float64, "bfloat16"])
def test_variable_collectives_move_uneven_pieces_and_trace_their_bytes(dtype):
    """Rank r sends r + j rows (of 3 values) to rank j, rank 0 nothing to itself: each piece arrives whole, in
    source order; the record holds the rows sent and, on the wire, those sent off-rank. all_gather_v and
    reduce_scatter_v of n_r = r + 1 rows are the concatenation and the sum's rows."""
    import ml_dtypes

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    grid = grid_for(1, 1, 1)
    world, p, r = grid.world, WORLD.Get_size(), WORLD.Get_rank()
    piece = lambda src, dst: np.full((src + dst, 3), 10 * src + dst, dtype=dt)  # noqa: E731
    x = np.concatenate([piece(r, j) for j in range(p)])
    grid.tracer.reset()
    got, counts = world.all_to_all_v(x, [r + j for j in range(p)])
    assert counts.tolist() == [src + r for src in range(p)]
    assert np.array_equal(got, np.concatenate([piece(src, r) for src in range(p)]))
    (count_ex, moved) = grid.tracer.events
    assert count_ex.op == "all_to_all" and moved.op == "all_to_all_v"
    assert (moved.bytes, moved.wire_bytes) == (x.nbytes, x.nbytes - piece(r, r).nbytes)
    mine = np.full((r + 1, 3), r + 1.0).astype(dt)
    gathered, sizes = world.all_gather_v(mine)
    assert sizes.tolist() == list(range(1, p + 1))
    assert np.array_equal(gathered, np.concatenate([np.full((q + 1, 3), q + 1.0) for q in range(p)]).astype(dt))
    summed = world.reduce_scatter_v(gathered, sizes)
    assert np.array_equal(summed, (p * mine.astype(np.float64)).astype(dt))
    with pytest.raises(ValueError, match="send_counts"):
        world.all_to_all_v(x, [len(x) + 1] + [0] * (p - 1))  # counts that do not sum to the rows
