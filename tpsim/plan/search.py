"""``--search``: every tp × pp × dp = N / cp layout that is valid and fits, ranked by estimated step time.

Context parallelism is not searched: ``--cp`` (default 1), its variant and layout stay as given, and the other
N / cp GPUs are laid out (CP pays only at long sequences, where the user knows to ask for it). tp runs over the
divisors of N / cp up to a node (``--gpus-per-node``: TP across nodes is never faster on these links, and
Megatron-LM keeps it inside — Narayanan et al. 2021, §3.2); pp over the divisors of N / (cp·tp) that divide the
layers; dp is what is left. The rules of ``tpsim.plan.layout.problems`` (heads, KV heads, layers, batch,
sequence under SP, the schedule's: layers a multiple of pp·vp, interleaved's m a multiple of pp) drop the rest;
memory drops what does not fit. Every layout runs ``base``'s schedule (``--schedule``, default 1f1b; one stage
takes vp 1); stages are equal. Ties keep the smaller tp, then pp.
"""

from __future__ import annotations

from dataclasses import replace

from tpsim.errors import ConfigError
from tpsim.plan.layout import Layout, problems
from tpsim.plan.models import ModelSpec
from tpsim.plan.planner import Plan, plan


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(model: ModelSpec, base: Layout, gpus: int) -> list[Layout]:
    """Valid layouts of ``gpus`` GPUs (``base`` gives everything but tp, pp, dp; its cp is kept)."""
    out, rest = [], gpus // base.cp
    for tp in divisors(rest):
        if tp > base.gpus_per_node:
            break
        for pp in divisors(rest // tp):
            lay = replace(base, tp=tp, pp=pp, dp=rest // (tp * pp), vp=base.vp if pp > 1 else 1)
            if not problems(model, lay):
                out.append(lay)
    return out


def search(model: ModelSpec, base: Layout, gpus: int, keep_all: bool = False) -> list[Plan]:
    """Plans of the valid layouts that fit (all of them with ``keep_all``), fastest step first."""
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus}: must be >= 1")
    if base.cp < 1 or gpus % base.cp:
        raise ConfigError(f"--gpus {gpus} is not divisible by --cp {base.cp}")
    plans = [plan(model, lay) for lay in candidates(model, base, gpus)]
    kept = plans if keep_all else [p for p in plans if p.fits]
    return sorted(kept, key=lambda p: (p.time_s["step"], p.layout["tp"], p.layout["pp"]))
