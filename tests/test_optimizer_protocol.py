"""The optimizer protocol (tpsim.train.protocol): every optimizer implements all of it, nobody sniffs for it, and
the plain mixed-precision optimizer and ZeRO-1 step float16 exactly as the independent reference does
(tests/optimizer_reference_story.py tells the story; tests/mpi/test_optimizer_reference.py runs it on every rank).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from optimizer_reference_story import CFG, CLIP, INF_STEP, against_reference

from tpsim.comm import ProcessGrid
from tpsim.models.build import build_gpt
from tpsim.train import SGD, AdamW, mixed_precision
from tpsim.train.protocol import OptimizerProtocol
from tpsim.train.zero import DistributedOptimizer

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = ("zero_stage", "loss_scaler", "skipped", "rule", "loss_scale", "lr", "step_count", "unscale_grads",
           "grad_norm", "clip_grads", "step", "zero_grad", "state_slices", "state_dict", "load_state_dict",
           "state_bytes")


@pytest.fixture(scope="module")
def alone() -> ProcessGrid:
    return ProcessGrid(tp=1, comm=MPI.COMM_SELF)


def _optimizers(grid):
    def model(dtype):
        return build_gpt(CFG, grid.tp_group, seed=3, dtype=dtype)

    return {"AdamW": AdamW(model(np.float64)), "SGD": SGD(model(np.float32), 0.1, momentum=0.9),
            "MixedPrecisionOptimizer": mixed_precision(model(np.float16), AdamW, grid.world),
            "DistributedOptimizer": DistributedOptimizer(AdamW(model(np.float16)), grid)}


def test_every_optimizer_implements_the_whole_protocol(alone):
    for name, opt in _optimizers(alone).items():
        assert isinstance(opt, OptimizerProtocol), name
        missing = [m for m in MEMBERS if m not in dir(opt)]
        assert not missing, f"{name} lacks {missing}"
        assert opt.zero_stage == (name == "DistributedOptimizer"), name
        assert (opt.loss_scaler is not None) == (name == "MixedPrecisionOptimizer"), name  # float16 default
        assert opt.rule.lr == opt.lr and opt.unscale_grads().found is False, name


def test_no_caller_sniffs_an_optimizer():
    """What an optimizer can do is the protocol; what it is, ``zero_stage``: no getattr/hasattr/isinstance."""
    sniff = re.compile(r"\b(getattr|hasattr|isinstance)\(\s*(self\.)?(opt|optimizer|zero|grad_sync|sync)\b")
    found = [f"{p.relative_to(ROOT)}:{i}" for folder in ("tpsim", "lessons") for p in sorted((ROOT / folder).rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if sniff.search(line)]
    assert not found, found


@pytest.mark.parametrize("zero", [False, True], ids=["mixed-precision", "zero1"])
def test_float16_steps_equal_the_independent_reference(alone, zero):
    failures, norms = against_reference(alone, zero)
    assert not failures, "\n".join(failures)
    assert norms[INF_STEP] is None and any(n is not None and n > CLIP for n in norms), norms
