"""The three cases of bench/bench_vs_torch.py, each built twice from one master: tpsim's layers and torch_tp's.

A case gives a ``tpsim_step`` and a ``torch_step`` (one forward + backward, or one training step, each starting
from zeroed gradients as a training loop would) and a ``check`` that runs both once on the same inputs and
returns the largest relative difference of outputs and gradients, ``max |torch − tpsim| / max |tpsim|`` per
tensor. Tolerances: float32 1e-4 — the two sides sum in different orders (OpenBLAS vs torch's GEMM blocking,
MPICH vs gloo reductions), which leaves a few ulp × √(k) ≈ 1e-6..1e-5 of the largest value for k up to 4096,
so 1e-4 passes every honest run with a 10× margin and still catches any wrong term; float64 1e-10 (the demo's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

import torch_tp
from gemm_limit import Gemm, block_gemms, gpt_gemms, mlp_gemms
from tpsim.compare import relative_difference
from tpsim.models.gpt import Block
from tpsim.nn import MLP
from tpsim.nn.attention import CausalSelfAttention
from tpsim.nn.dropout import DropoutPlan
from tpsim.nn.layernorm import LayerNorm
from tpsim.tp import ParallelMLP
from tpsim.tp.attention import ParallelSelfAttention

TOLERANCE = {"float32": 1e-4, "float64": 1e-10}


@dataclass
class Case:
    name: str
    description: str
    shape: dict
    dtype: str
    tp: int
    dp: int
    gemms: list[Gemm]
    tpsim_step: Callable[[], object] | None = None  # None on a rank outside the case
    torch_step: Callable[[], object] | None = None
    check: Callable[[], tuple[float, str]] | None = None
    kinds: Callable[[], tuple[dict, int] | None] | None = None  # after the timing: where one traced step's time goes
    extra: dict = field(default_factory=dict)

    @property
    def ranks(self) -> int:
        return self.tp * self.dp

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype]


def worst(pairs: dict) -> tuple[float, str]:
    """(largest relative difference, its name) over ``{name: (torch tensor, numpy array)}``."""
    diffs = {n: relative_difference(t.detach().numpy(), a, floor=1e-30) for n, (t, a) in pairs.items()}
    name = max(diffs, key=diffs.get)
    return diffs[name], name


def layer_case(case: Case, module, torch_fn: Callable, x: np.ndarray, dy: np.ndarray) -> Case:
    """tpsim ``module`` and ``torch_fn(P, x)`` on the same input and output gradient; forward + backward each."""
    P = torch_tp.leaf_tensors(module)
    xt, dyt = torch.tensor(x, requires_grad=True), torch.tensor(dy)

    def tpsim_step():
        module.zero_grad()
        y, cache = module.forward(x)
        return y, module.backward(dy, cache)

    def torch_step():
        for p in (xt, *P.values()):
            p.grad = None
        y = torch_fn(P, xt)
        y.backward(dyt)
        return y

    def check():
        y, dx = tpsim_step()
        yt = torch_step()
        return worst({"output": (yt, y), "dx": (xt.grad, dx),
                      **{f"d{n}": (P[n].grad, g) for n, g in module.named_grads()}})

    case.tpsim_step, case.torch_step, case.check = tpsim_step, torch_step, check
    return case


def mlp_case(args, tp: int, tp_group=None, torch_group=None) -> Case:
    """a. ParallelMLP h → 4h → h on ``args.tokens`` tokens, float32 (issue 12's first table)."""
    h, T = args.hidden, args.tokens
    case = Case("mlp", f"MLP h {h} -> {4 * h} -> {h}, {T} tokens, fwd+bwd", {"hidden": h, "tokens": T},
                "float32", tp, 1, mlp_gemms(T, h, 4 * h, tp))
    if tp_group is None:
        return case
    f32 = np.float32
    par = ParallelMLP.from_serial(MLP(h, rng=np.random.default_rng(0), dtype=f32), tp_group).set_path("mlp")
    rng = np.random.default_rng(1)
    x, dz = (rng.standard_normal((T, h)).astype(f32) for _ in range(2))
    return layer_case(case, par, lambda P, xt: torch_tp.mlp(P, "", xt, torch_group), x, dz)


def block_case(args, tp: int, tp_group=None, torch_group=None) -> Case:
    """b. one pre-LN GPT-2 block, attention split by heads + MLP, float32."""
    h, nh, b, s = args.hidden, args.heads, args.batch, args.seq
    case = Case("block", f"GPT-2 block h {h}, {nh} heads, batch {b} x seq {s}, fwd+bwd",
                {"hidden": h, "heads": nh, "batch": b, "seq": s}, "float32", tp, 1, block_gemms(b, s, h, nh, tp))
    if tp_group is None:
        return case
    f32, rng = np.float32, np.random.default_rng(0)
    attn = ParallelSelfAttention.from_serial(CausalSelfAttention(h, nh, rng=rng, dtype=f32), tp_group)
    mlp = ParallelMLP.from_serial(MLP(h, rng=rng, dtype=f32), tp_group)
    blk = Block(LayerNorm(h, dtype=f32), attn, LayerNorm(h, dtype=f32), mlp).set_path("h.0")
    for _, p in blk.named_parameters():  # LayerNorms off their ones/zeros, so their gradients are checked too
        p += (0.1 * rng.standard_normal(p.shape)).astype(f32) if p.ndim == 1 else 0
    x, dy = (rng.standard_normal((b, s, h)).astype(f32) for _ in range(2))
    case.kinds = lambda: traced_split(blk, x, dy, tp_group)
    return layer_case(case, blk, lambda P, xt: torch_tp.block(P, "", xt, nh // tp, torch_group), x, dy)


def traced_split(block: Block, x: np.ndarray, dy: np.ndarray, group) -> tuple[dict, int] | None:
    """One forward + backward of ``block`` traced (sub-layer spans, kind marks, collectives), split per layer by
    ``tpsim.trace.kind_split`` on group rank 0 (``({layer: {kind: s}}, ranks)``; None elsewhere)."""
    from tpsim.models.gpt import attach_tracer
    from tpsim.trace.kind_split import kind_split

    tracer = group.tracer
    tracer.reset()
    tracer.enabled, tracer.step = True, 0
    attach_tracer(block, tracer)
    block.zero_grad()
    with tracer.span(block.path, "forward"):
        _, cache = block.forward(x)
    with tracer.span(block.path, "backward"):
        block.backward(dy, cache)
    attach_tracer(block, None)
    tracer.enabled = False  # the gather below is bookkeeping, and the timed steps ran untraced
    mine = ([e.as_dict() for e in tracer.events], [s.as_dict() for s in tracer.span_events()])
    tracer.reset()
    every = group.gather_objects(mine)
    if every is None:
        return None
    return kind_split([s for _, spans in every for s in spans], [r for recs, _ in every for r in recs], 0)


def demo_case(grid, torch_groups, world: int) -> Case:
    """c. the demo's training step at its defaults (``python -m tpsim.demo``), TP 4 x DP world/4."""
    from tpsim.data import ReverseTask
    from tpsim.demo.cli import parse
    from tpsim.models.build import build_gpt
    from tpsim.tp.random import make_dropout_rng
    from tpsim.train import AdamW, GradSync, apply_update, compute_grads, dp_slice, train_step

    # the demo's own defaults (whatever `python -m tpsim.demo` trains) at TP 4, except dropout: PyTorch cannot
    # draw the exact RNG's masks, so neither side drops anything
    run = parse(["--tp", "4", "--dp", str(world // 4), "--dropout", "0"]).run
    cfg, sch, settings = run.model, run.schedule, run.optimizer
    tp, dp, batch, seq = run.parallel.tp, run.parallel.dp, sch.batch_size, sch.seq_len
    padded = tp * -(-cfg.vocab_size // tp)
    case = Case("demo", f"demo training step: GPT {cfg.n_layer} layers h {cfg.n_embd}, {cfg.n_head} heads, vocab "
                f"{cfg.vocab_size}, batch {batch} x seq {seq}, AdamW, clip {settings.clip}",
                {"layers": cfg.n_layer, "hidden": cfg.n_embd, "heads": cfg.n_head, "vocab": cfg.vocab_size,
                 "batch": batch, "seq": seq}, run.precision.dtype, tp, dp,
                gpt_gemms(batch // dp, seq, cfg.n_embd, cfg.n_head, cfg.n_layer, padded, tp),
                extra={"tracing": "on, as in the demo", "data": "one fixed batch, outside the timing"})
    if grid is None:
        return case
    model = build_gpt(cfg, grid.tp_group, seed=sch.seed, dtype=run.precision.numpy)
    grad_sync = GradSync(model, grid.dp_group, bucket_cap_bytes=settings.bucket_cap_bytes)
    opt = AdamW(model, lr=settings.lr, weight_decay=settings.weight_decay,
                no_decay=lambda n: n.endswith("bias") or ".ln_" in n)
    rows = dp_slice(batch, dp, grid.dp_rank)
    ids, labels = (a[rows] for a in ReverseTask(cfg.vocab_size, seq).batch(sch.seed, 0, batch))
    plan = DropoutPlan(make_dropout_rng(sch.dropout_rng, sch.seed, grid.tp_rank), 0, np.arange(batch)[rows])
    clip = settings.max_norm

    P = torch_tp.leaf_tensors(model)
    sharded = {n for n, part in model.named_partitions() if part is not None}
    trainer = torch_tp.Trainer(P, sharded, grid.tp_rank, *torch_groups, lr=settings.lr, clip=clip)
    ids_t, labels_t = torch.tensor(ids), torch.tensor(labels)
    n_local = int(np.count_nonzero(labels != model.loss.ignore_index))
    start = model.transformer.wte.vocab_start

    def torch_loss():
        return torch_tp.gpt_loss(P, ids_t, labels_t, cfg, cfg.n_head // tp, start, torch_groups[0]), n_local

    def tpsim_step():
        grid.tracer.reset()  # the demo keeps its records; here one step's worth, so the list never grows
        return train_step(model, opt, grid, grad_sync, ids, labels, plan=plan, clip=clip)

    def torch_step():
        trainer.grads(torch_loss)
        trainer.update()

    def check():
        loss, _ = compute_grads(model, grid, grad_sync, ids, labels, plan=plan)
        loss_t = trainer.grads(torch_loss)
        diff = worst({"loss": (torch.tensor(loss_t, dtype=torch.float64), np.array(loss)),
                      **{f"d{n}": (P[n].grad, g) for n, g in model.named_grads()}})
        apply_update(model, opt, grid, clip)
        trainer.update()
        return diff

    case.tpsim_step, case.torch_step, case.check = tpsim_step, torch_step, check
    return case
