"""The pure arithmetic of experts: the fold the formulas assume (``tpsim.predict.moe_comm.Fold``) is the grid's
(``tpsim.comm.expert_grid``); the serial twin's capacity groups (``tpsim.config.experts.token_groups``) cut the batch
into every rank's tokens, each token once, in the rank's own order; the all-to-all totals on a hand-made routing."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.comm.expert_grid import expert_grid
from tpsim.config.experts import token_groups
from tpsim.cp.layout import positions
from tpsim.phases import BACKWARD, FORWARD
from tpsim.predict.moe_comm import Fold, alltoall_totals


@pytest.mark.parametrize("stage, pp, ep, etp", [(8, 1, 4, 1), (8, 1, 2, 2), (8, 2, 2, 1), (4, 2, 1, 4), (6, 1, 3, 2)])
def test_the_formulas_fold_is_the_grids(stage, pp, ep, etp):
    grid, fold = expert_grid(stage, pp, ep, etp), Fold(ep, etp, stage)
    for r in range(stage * pp):
        assert tuple(fold.ep_group(r)) == grid.group(r, "ep")
        assert tuple(fold.etp_group(r)) == grid.group(r, "etp")
        assert fold.coords(r)[:2] == (grid.coords(r)["etp"], grid.coords(r)["ep"])


@pytest.mark.parametrize("dp, m, tp, sp, cp, layout", [(2, 2, 2, True, 1, "zigzag"), (1, 1, 1, False, 2, "zigzag"),
                                                        (2, 1, 2, True, 2, "contiguous"), (4, 1, 2, False, 1, "zigzag")])
def test_the_capacity_groups_are_every_ranks_tokens_once(dp, m, tp, sp, cp, layout):
    batch, seq = 8, 16
    groups = token_groups(batch, seq, dp=dp, microbatches=m, tp=tp, sp=sp, cp=cp, cp_layout=layout)
    assert len(groups) == dp * m * cp * (tp if sp else 1)
    flat = np.sort(np.concatenate(groups))
    assert np.array_equal(flat, np.arange(batch * seq))  # a partition of the batch
    first = groups[0]  # DP rank 0, micro-batch 0, CP rank 0, TP rank 0: its rows x its positions, row-major
    rows = batch // dp // m
    mine = positions(layout, 0, cp, seq) if cp > 1 else np.arange(seq)
    mine = mine[:len(mine) // (tp if sp else 1)]
    assert np.array_equal(first, (np.arange(rows)[:, None] * seq + mine[None, :]).ravel())


def test_alltoall_totals_on_a_hand_made_routing():
    """Two ranks, EP 2, E 4 (experts 0, 1 on rank 0; 2, 3 on rank 1), rows of R = 10 bytes. Rank 0 kept (3, 1, 2, 0)
    assignments, rank 1 (0, 4, 1, 1): rank 0 sends 6 rows, keeps 4; receives 4 + 4 = 8 rows back to combine."""
    counts = np.array([[[[3, 1, 2, 0]]], [[[0, 4, 1, 1]]]])
    t = alltoall_totals(counts, [[0, 1]], Fold(2, 1, 2), 10)
    # rank 0: dispatch 60 (wire 20), combine recv 8 rows 80 (wire 40); rank 1: dispatch 60 (wire 40: keeps 2),
    # combine 2 + 2 = 4 rows 40 (wire 20)
    assert t[(0, FORWARD, "all_to_all_v", "ep")] == [4, 60 + 80 + 60 + 40, 20 + 40 + 40 + 20]
    assert t[(0, BACKWARD, "all_to_all_v", "ep")] == t[(0, FORWARD, "all_to_all_v", "ep")]
    assert t[(0, FORWARD, "all_to_all", "ep")] == [2, 2 * 32, 2 * 16]
