"""How a run lays out its experts: the ``Experts`` part of ``RunConfig`` (``--ep``, ``--etp``, ``--dispatcher``).

The model's own MoE sizes (experts, top-k, router, capacity, shared experts, dense layers) live in its config
(``tpsim.arch.mixtral``); this part says where the experts go. Parallel Folding: the tp × cp × dp ranks of a
stage are also etp × ep × expert-dp, so ep · etp must divide them. Checked with the rest of the run, before any
work. Pure arithmetic, no MPI.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpsim.errors import ConfigError

DISPATCHERS = ("alltoall", "allgather")  # Megatron-LM's two token dispatchers (tpsim.ep.dispatch)


@dataclass(frozen=True)
class Experts:
    """``ep`` ranks trade tokens, ``etp`` ranks share one expert's columns, ``dispatcher`` moves the tokens."""

    ep: int = 1
    etp: int = 1
    dispatcher: str = "alltoall"

    def check(self, par, model, precision, pipeline=None) -> "Experts":
        """``ConfigError`` naming the first thing this layout cannot do with ``model`` on ``par``."""
        for name in ("ep", "etp"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.dispatcher not in DISPATCHERS:
            raise ConfigError(f"--dispatcher {self.dispatcher!r}: one of {', '.join(DISPATCHERS)}")
        moe = has_experts(model)
        if not moe:
            if (self.ep, self.etp, self.dispatcher) != (1, 1, "alltoall"):
                raise ConfigError("--ep, --etp and --dispatcher lay out experts: they need a mixture-of-experts "
                                  "architecture (--arch mixtral)")
            return self
        stage = par.tp * par.cp * par.dp
        if stage % (self.ep * self.etp):
            raise ConfigError(f"--ep {self.ep} x --etp {self.etp} does not divide the {stage} ranks of a stage "
                              f"(tp x cp x dp = {par.tp} x {par.cp} x {par.dp}): the MoE layers fold those ranks "
                              "into etp x ep x expert-dp")
        if model.num_local_experts % self.ep:
            raise ConfigError(f"--experts {model.num_local_experts} is not divisible by --ep {self.ep} (each EP rank "
                              "holds experts / ep of them)")
        if model.intermediate_size % self.etp:
            raise ConfigError(f"the expert width {model.intermediate_size} is not divisible by --etp {self.etp}")
        if par.tp > 1 and not par.sp:
            raise ConfigError(f"experts with --tp {par.tp} need --sequence-parallel: the ranks of a TP group must "
                              "hold different tokens to route (Megatron-LM's rule)")
        if precision.loss_scaling:
            raise ConfigError("--dtype float16 with experts: the routers' auxiliary-loss gradients are not loss-"
                              "scaled yet; use bfloat16 or float32")
        if pipeline is not None and pipeline.clock != "unit":
            raise ConfigError(f"--clock {pipeline.clock} prices the step with the planner's costs, which do not price "
                              "experts yet (the issue \"Experts in the planner\"); use the unit clock")
        if par.zero_stage.shards_optimizer:
            raise ConfigError(f"--zero {par.zero} with experts is not built yet: ZeRO would shard the expert state "
                              "over expert-DP (issue 38 leaves it for later); use --zero 0")
        return self


def has_experts(model) -> bool:
    """Does ``model``'s config describe a mixture of experts?"""
    return getattr(model, "num_local_experts", 0) > 0


def token_groups(batch: int, seq: int, *, dp: int, microbatches: int, tp: int, sp: bool, cp: int,
                 cp_layout: str) -> list:
    """Every rank's tokens in each micro-batch, as rows of the flat [batch, seq] batch in the rank's own order:
    the groups a serial twin drops within (``tpsim.nn.moe``). DP takes consecutive rows, a micro-batch
    consecutive rows of those, CP its positions (``tpsim.cp.layout``), SP a contiguous part of them."""
    import numpy as np

    from tpsim.cp.layout import positions

    local, out = batch // dp // microbatches, []
    split = tp if sp else 1
    for d in range(dp):
        for j in range(microbatches):
            rows = np.arange(d * batch // dp + j * local, d * batch // dp + (j + 1) * local)
            for c in range(cp):
                mine = positions(cp_layout, c, cp, seq) if cp > 1 else np.arange(seq)
                for part in np.split(mine, split):
                    out.append((rows[:, None] * seq + part[None, :]).ravel())
    return out


def tell_groups(model, run):
    """``model`` (``run``'s serial model) told each rank's tokens, where a mixture of experts' capacity drops."""
    if not has_experts(run.model) or run.model.capacity_factor is None:
        return model
    par, sch = run.parallel, run.schedule
    groups = token_groups(sch.batch_size, sch.seq_len, dp=par.dp, microbatches=run.pipeline.microbatches, tp=par.tp,
                          sp=par.sp, cp=par.cp, cp_layout=par.cp_layout)
    for layer in model.moe_layers():
        layer.groups = lambda shape, g=groups: g
    return model
