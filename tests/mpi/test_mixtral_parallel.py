"""The expert-parallel Mixtral vs the serial one drawn from the same seed: loss, every gradient, training.

Parallel Folding layouts the world holds — attention TP 1 or 2 (with SP) × DP, experts ETP 1 or 2 × EP × EDP
over the same ranks — with a dense first layer, capacity dropping (the serial twin told each rank's tokens),
shared experts and the sigmoid router. Step 0: the language-model loss, and every gradient after the data-
parallel sync (``FoldedGradSync``: dense over DP, experts over expert-DP ÷ dp) equals the serial model's shard
(float64, 1e-10), and the norm (``folded_grad_norm``) the serial norm. Then two steps of AdamW with clipping.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.arch.mixtral import MixtralConfig
from tpsim.comm import ProcessGrid
from tpsim.ep.params import expert_param_names
from tpsim.models.mixtral import parallel_mixtral, serial_mixtral
from tpsim.partition import take_shard
from tpsim.train import AdamW, dp_slice, train_step
from tpsim.train.clip import grad_entries
from tpsim.train.expert_norm import folded_grad_norm
from tpsim.train.expert_sync import FoldedGradSync

from _util import assert_close
from conftest import WORLD

TOL = 1e-10
SEQ = 8
_GRIDS: dict = {}


def layouts() -> list[tuple[int, int, int]]:
    n = WORLD.Get_size()
    return [(tp, ep, etp) for tp in (1, 2) for ep in (1, 2, 4, 8) for etp in (1, 2)
            if n % tp == 0 and n % (ep * etp) == 0 and (ep > 1 or etp > 1 or tp > 1)]


def grid_for(tp, ep, etp) -> ProcessGrid:
    if (tp, ep, etp) not in _GRIDS:
        _GRIDS[tp, ep, etp] = ProcessGrid(tp=tp, ep=ep, etp=etp)
    grid = _GRIDS[tp, ep, etp]
    grid.tracer.reset()
    return grid


CASES = {
    "mixtral": {},
    "dropping": dict(capacity_factor=1.0, first_dense_layers=1),
    "deepseek": dict(router="sigmoid", router_aux_loss_coef=0.0, router_z_loss_coef=0.01, shared_experts=1),
}


def config(case: str) -> MixtralConfig:
    return MixtralConfig(vocab_size=37, hidden_size=16, intermediate_size=8, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16, rope_theta=100.0,
                         initializer_range=0.3, num_local_experts=8, num_experts_per_tok=2,
                         **{"router_aux_loss_coef": 0.02, **CASES[case]})


def rank_groups(grid: ProcessGrid, b_local: int, s: int) -> list[np.ndarray]:
    """Every rank's tokens as rows of the flat [B, s] batch: the serial twin's capacity groups."""
    s_local, out = s // grid.tp, []
    for r in range(grid.tp * grid.dp):
        d, t = divmod(r, grid.tp)
        rows = np.arange(d * b_local, (d + 1) * b_local)
        out.append((rows[:, None] * s + np.arange(t * s_local, (t + 1) * s_local)[None, :]).ravel())
    return out


def twins(case, tp, ep, etp, b_local=2):
    grid = grid_for(tp, ep, etp)
    cfg = config(case)
    serial = serial_mixtral(cfg, seed=3)
    groups = rank_groups(grid, b_local, SEQ)
    for m in serial.moe_layers():
        m.groups = lambda shape: groups
    par = parallel_mixtral(serial_mixtral(cfg, seed=3), grid.tp_group, grid=grid, sequence_parallel=tp > 1)
    rng = np.random.default_rng(1)
    B = b_local * grid.dp
    ids, labels = rng.integers(0, cfg.vocab_size, (B, SEQ)), rng.integers(0, cfg.vocab_size, (B, SEQ))
    return grid, serial, par, ids, labels, dp_slice(B, grid.dp, grid.dp_rank)


def assert_grads_match(par, serial, tol=TOL):
    ref = dict(serial.named_grads())
    for name, part in par.named_partitions():
        assert_close(dict(par.named_grads())[name], take_shard(ref[name], part), tol, f"gradient of {name}")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tp, ep, etp", layouts())
def test_step_zero_equals_serial(tp, ep, etp, case):
    grid, serial, par, ids, labels, rows = twins(case, tp, ep, etp)
    loss_s = serial.loss_and_grads(ids, labels)
    sync = FoldedGradSync(par, grid, expert_param_names(par), bucket_cap_bytes=4096)
    loss_local = par.loss_and_grads(ids[rows], labels[rows])
    sync.sync()
    loss = float(grid.dp_group.all_reduce(np.array([loss_local]))[0]) / grid.dp
    assert abs(loss - loss_s) <= TOL * loss_s
    assert_grads_match(par, serial)
    norm_s = float(np.sqrt(sum(np.vdot(g, g) for _, g in serial.named_grads())))
    norm = folded_grad_norm(grad_entries(par), expert_param_names(par), grid)
    assert abs(norm - norm_s) <= TOL * norm_s
    kinds = {e.group for e in grid.tracer.events if e.scope.startswith("ddp.")}
    assert kinds == ({"dp"} if grid.dp > 1 else set()) | ({"edp"} if grid.edp > 1 else set())


@pytest.mark.parametrize("tp, ep, etp", layouts())
def test_training_with_clipping_equals_serial(tp, ep, etp):
    grid, serial, par, ids, labels, rows = twins("mixtral", tp, ep, etp)
    opt_s, opt_p = AdamW(serial, lr=1e-2), AdamW(par, lr=1e-2)
    sync = FoldedGradSync(par, grid, expert_param_names(par), bucket_cap_bytes=4096)
    seen = []  # compared after the loop: a rank that stopped early would leave the others in a collective
    for step in range(2):
        loss_s = serial.loss_and_grads(ids, labels)
        norm_s = float(np.sqrt(sum(np.vdot(g, g) for _, g in serial.named_grads())))
        for _, g in serial.named_grads():
            g *= (norm_s / 2) / (norm_s + 1e-6)
        opt_s.step()
        result = train_step(par, opt_p, grid, sync, ids[rows], labels[rows], clip=norm_s / 2)
        seen.append((step, result.loss, loss_s, result.grad_norm, norm_s))
    for step, loss, loss_s, norm, norm_s in seen:
        assert abs(loss - loss_s) <= TOL * loss_s, f"step {step}: loss {loss} vs {loss_s}"
        assert abs(norm - norm_s) <= TOL * norm_s, f"step {step}: norm {norm} vs {norm_s}"
    ref = dict(serial.named_parameters())
    for name, part in par.named_partitions():
        assert_close(dict(par.named_parameters())[name], take_shard(ref[name], part), TOL, f"parameter {name}")
