"""The region a layer is built with picks its collectives: the same layer, built with TP_REGION or SP_REGION.

Story: shard one serial MLP twice from the same master weights, once per region; both equal the serial MLP
(the SP one on this rank's positions), and their traces are exactly (f, g) resp. (f̄, ḡ) plus f̄'s regather —
no flag consulted at call time (``tests/test_regions.py`` checks that no forward or backward in ``tpsim.tp``
asks which region it is in).
"""

from __future__ import annotations

import numpy as np
import pytest

from _util import assert_close, randn
from tpsim.nn import MLP
from tpsim.tp import SP_REGION, TP_REGION, ParallelMLP, RowParallelLinear, region_for

TOL = 1e-12


@pytest.mark.parametrize("region", [TP_REGION, SP_REGION], ids=["tp", "sp"])
def test_the_region_chosen_at_construction_picks_the_collectives(grid, region):
    g, p, r = grid.tp_group, grid.tp, grid.tp_rank
    serial = MLP(6, 4 * p, rng=np.random.default_rng(4), std=0.5)
    mlp = ParallelMLP.from_serial(serial, g, region=region).set_path("mlp")
    assert mlp.c_fc.region is region and mlp.c_proj.region is region
    mine = slice(2 * r, 2 * (r + 1)) if region is SP_REGION else slice(None)
    x, dz = randn(1, 3, 2 * p, 6), randn(2, 3, 2 * p, 6)
    z_ref, cache_ref = serial.forward(x)
    dx_ref = serial.backward(dz, cache_ref)
    z, cache = mlp.forward(x[:, mine])
    dx = mlp.backward(dz[:, mine], cache)
    assert_close(z, z_ref[:, mine], TOL, "output")
    assert_close(dx, dx_ref[:, mine], TOL, "input grad")

    got = [(e.scope, e.phase, e.op) for e in grid.tracer.events]
    if region is TP_REGION:  # g forward in c_proj, f backward in c_fc
        assert got == [("mlp.c_proj", "forward", "all_reduce"), ("mlp.c_fc", "backward", "all_reduce")]
    else:  # f̄ in, ḡ out; backward: ḡ's all-gather, c_fc's regather of its input, f̄'s reduce-scatter
        assert got == [("mlp.c_fc", "forward", "all_gather"), ("mlp.c_proj", "forward", "reduce_scatter"),
                       ("mlp.c_proj", "backward", "all_gather"), ("mlp.c_fc", "backward", "all_gather"),
                       ("mlp.c_fc", "backward", "reduce_scatter")]


def test_region_for_reads_the_switch_once_and_layers_check_their_layout(grid):
    assert region_for(False) is TP_REGION and region_for(True) is SP_REGION
    with pytest.raises(ValueError, match="needs input_is_parallel=True"):
        RowParallelLinear(4 * grid.tp, 4, grid.tp_group, input_is_parallel=False, region=SP_REGION)
    serial = MLP(4, 4 * grid.tp)
    tp = ParallelMLP.from_serial(serial, grid.tp_group)
    sp = ParallelMLP.from_serial(serial, grid.tp_group, region=SP_REGION)
    with pytest.raises(ValueError, match="same region"):
        ParallelMLP(tp.c_fc, sp.c_proj)
