"""ZeRO's stages as data (``tpsim.zero_stage``): each stage's fields as Rajbhandari et al. (2019, §5) state them,
and a stage that does not exist refused in one line."""

from __future__ import annotations

import pytest

from tpsim.config import Parallelism
from tpsim.errors import ConfigError
from tpsim.zero_stage import ZERO_STAGES, zero_stage

# stage: (P_os, P_g, P_p, reduce-scatter every micro-batch, gather after the step, gather around units, unit buckets)
PAPER = {
    0: (False, False, False, False, False, False, False),  # plain DP: all-reduce once, nothing gathered
    1: (True, False, False, False, True, False, False),  # P_os: reduce-scatter once, all-gather after the step
    2: (True, True, False, True, True, False, False),  # P_os+g: reduce-scatter each bucket in every backward
    3: (True, True, True, True, False, True, True),  # P_os+g+p: gather each unit around its forward and backward
}
FIELDS = ("shards_optimizer", "shards_grads", "shards_params", "reduces_every_microbatch", "gathers_after_step",
          "gathers_around_units", "buckets_at_units")


@pytest.mark.parametrize("n", sorted(PAPER))
def test_each_stage_is_what_the_paper_says(n):
    stage = zero_stage(n)
    got = tuple(getattr(stage, f) for f in FIELDS)
    assert got == PAPER[n], f"ZeRO-{n}: " + ", ".join(f"{f}={g} (want {w})" for f, g, w in zip(FIELDS, got, PAPER[n])
                                                      if g != w)
    assert stage.stage == n and ZERO_STAGES[n] is stage
    assert stage.grad_collective == ("reduce_scatter" if n else "all_reduce")
    assert stage.overlap_grad_reduce_applies == (n in (0, 1))  # 2 and 3 reduce inside the backward already
    assert stage.overlap_param_gather_applies == (n in (1, 2))  # 0 gathers nothing, 3 gathers around the units


def test_each_stage_shards_what_the_one_before_does_and_one_thing_more():
    sharded = [sum((s.shards_optimizer, s.shards_grads, s.shards_params)) for s in ZERO_STAGES.values()]
    assert list(ZERO_STAGES) == [0, 1, 2, 3] and sharded == [0, 1, 2, 3]


@pytest.mark.parametrize("bad", [4, -1, True, "2"])
def test_a_stage_that_does_not_exist_is_one_line(bad):
    with pytest.raises(ConfigError) as err:
        zero_stage(bad)
    assert str(err.value) == f"--zero {bad}: the ZeRO stages here are 0, 1, 2, 3"


def test_the_run_chooses_its_stage_once():
    assert Parallelism(dp=2, zero=2).zero_stage is ZERO_STAGES[2]
    with pytest.raises(ConfigError, match="--zero 5"):
        Parallelism(dp=2, zero=5).check()
