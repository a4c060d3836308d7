"""The PyTorch side of bench/bench_vs_torch.py: Megatron TP written by hand over gloo, from tpsim's own shards.

Only the benchmark imports this (tpsim never imports torch). The world is the mpirun world: rank and size come
from mpi4py, MASTER_ADDR/MASTER_PORT are set from a port rank 0 picks and broadcasts, so both sides run in the
same processes with the same placement. f and g are the two ``autograd.Function`` s of Shoeybi et al. 2019
(arXiv:1909.08053, §3, Fig. 3): f identity forward / all-reduce backward, g the converse.

Parameters are copied from a tpsim module's ``named_parameters()`` (its local shards, by GPT-2 name), so both
sides start from the same master weights with the same q | k | v head layout.
"""

from __future__ import annotations

import math
import os
import socket

import torch
import torch.distributed as dist
import torch.nn.functional as F


def init_world(comm) -> None:
    """gloo over the MPI world's ranks; one torch thread per rank (the same as tpsim's one BLAS thread)."""
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(comm.bcast(port, root=0))
    dist.init_process_group("gloo", init_method="env://", rank=comm.Get_rank(), world_size=comm.Get_size())


def new_groups(layout) -> tuple:
    """(my TP group, my DP group) for a [dp, tp] rank layout; every world rank must call it (new_group is global).

    A rank outside ``layout`` (a smaller case on part of the world) gets ``(None, None)``.
    """
    me, tp_mine, dp_mine = dist.get_rank(), None, None
    for row in layout.tolist():
        g = dist.new_group(row)
        tp_mine = g if me in row else tp_mine
    for col in layout.T.tolist():
        g = dist.new_group(col)
        dp_mine = g if me in col else dp_mine
    return tp_mine, dp_mine


class CopyToTP(torch.autograd.Function):
    """f: forward identity, backward all-reduce over the TP group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        dy = dy.clone(memory_format=torch.contiguous_format)  # autograd may hand the same tensor to a residual
        dist.all_reduce(dy, group=ctx.group)
        return dy, None


class ReduceFromTP(torch.autograd.Function):
    """g: forward all-reduce over the TP group, backward identity."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        ctx.mark_dirty(x)  # reduced in place: x is a fresh product no other node saved
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, dy):
        return dy, None


def leaf_tensors(module) -> dict:
    """{GPT-2 name: a torch leaf copy of tpsim's local shard}, requiring grad."""
    return {name: torch.tensor(p).requires_grad_() for name, p in module.named_parameters()}


def mlp(P: dict, prefix: str, x, group):
    """Column-parallel c_fc → GeLU (tanh) → row-parallel c_proj; bias of c_proj once, after g."""
    a = F.gelu(CopyToTP.apply(x, group) @ P[prefix + "c_fc.weight"] + P[prefix + "c_fc.bias"], approximate="tanh")
    return ReduceFromTP.apply(a @ P[prefix + "c_proj.weight"], group) + P[prefix + "c_proj.bias"]


def attention(P: dict, prefix: str, x, heads_local: int, group):
    """Causal attention on this rank's heads: c_attn holds [q | k | v] of whole heads, c_proj their rows."""
    b, s, _ = x.shape
    qkv = CopyToTP.apply(x, group) @ P[prefix + "c_attn.weight"] + P[prefix + "c_attn.bias"]
    q, k, v = (t.reshape(b, s, heads_local, -1).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    future = torch.ones(s, s, dtype=torch.bool).triu_(1)
    ctx = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
    ctx = ctx.transpose(1, 2).reshape(b, s, -1)
    return ReduceFromTP.apply(ctx @ P[prefix + "c_proj.weight"], group) + P[prefix + "c_proj.bias"]


def block(P: dict, prefix: str, x, heads_local: int, group, eps: float = 1e-5):
    """Pre-LN GPT-2 block: x + attn(ln_1(x)), then + mlp(ln_2(x))."""
    h = x.shape[-1]
    ln = (lambda t, n: F.layer_norm(t, (h,), P[prefix + n + ".weight"], P[prefix + n + ".bias"], eps))
    x = x + attention(P, prefix + "attn.", ln(x, "ln_1"), heads_local, group)
    return x + mlp(P, prefix + "mlp.", ln(x, "ln_2"), group)


def vocab_parallel_embedding(W, ids, vocab_start: int, group):
    """Rows [vocab_start, vocab_start + V/tp) of the table here; others' ids give zeros; g sums the ranks."""
    local = ids - vocab_start
    mine = (local >= 0) & (local < W.shape[0])
    e = F.embedding(torch.where(mine, local, 0), W) * mine.unsqueeze(-1)
    return ReduceFromTP.apply(e, group)


def vocab_parallel_cross_entropy(logits, labels, vocab_start: int, vocab_size: int, group, ignore_index=-100):
    """Mean CE over valid labels from logits [b, s, V/tp] split by vocabulary (the max, then g on two sums)."""
    n_local = logits.shape[-1]
    if vocab_start + n_local > vocab_size:  # padding columns take no part in the softmax
        pad = torch.arange(vocab_start, vocab_start + n_local) >= vocab_size
        logits = logits.masked_fill(pad, float("-inf"))
    with torch.no_grad():
        m = logits.max(dim=-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    z = logits - m.unsqueeze(-1)
    sum_exp = ReduceFromTP.apply(z.exp().sum(dim=-1), group)
    local = labels - vocab_start
    mine = (local >= 0) & (local < n_local)
    picked = z.gather(-1, torch.where(mine, local, 0).unsqueeze(-1)).squeeze(-1) * mine
    picked = ReduceFromTP.apply(picked, group)
    valid = labels != ignore_index
    return ((sum_exp.log() - picked) * valid).sum() / valid.sum().clamp(min=1)


def gpt_loss(P: dict, ids, labels, cfg, heads_local: int, vocab_start: int, group):
    """The tpsim GPT's forward in torch: embeddings, blocks, ln_f, tied vocab-parallel head and loss."""
    wte = P["transformer.wte.weight"]
    x = vocab_parallel_embedding(wte, ids, vocab_start, group) + P["transformer.wpe.weight"][:ids.shape[1]]
    for i in range(cfg.n_layer):
        x = block(P, f"transformer.h.{i}.", x, heads_local, group, cfg.layer_norm_epsilon)
    x = F.layer_norm(x, (x.shape[-1],), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"],
                     cfg.layer_norm_epsilon)
    logits = CopyToTP.apply(x, group) @ wte.t()
    return vocab_parallel_cross_entropy(logits, labels, vocab_start, cfg.vocab_size, group)


class Trainer:
    """The demo's step in torch: loss normaliser and grads, DP mean (one flat all-reduce), TP-aware clip, AdamW."""

    def __init__(self, P: dict, sharded: set, tp_rank: int, tp_group, dp_group, *, lr: float, clip: float | None):
        self.P, self.tp_group, self.dp_group, self.clip = P, tp_group, dp_group, clip
        self.dp = dist.get_world_size(dp_group)
        # clip_grad_norm under TP: shards count on every rank, replicated tensors on TP rank 0 only
        self.counted = [p for n, p in P.items() if n in sharded or tp_rank == 0]
        no_decay = [p for n, p in P.items() if n.endswith("bias") or ".ln_" in n]
        decay = [p for n, p in P.items() if not (n.endswith("bias") or ".ln_" in n)]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                      {"params": no_decay, "weight_decay": 0.0}], lr=lr)

    def grads(self, loss_fn) -> float:
        """zero_grad → forward → all-reduce (n, n·L) over DP → backward(dloss) → DP mean of every gradient."""
        self.opt.zero_grad()
        loss, n = loss_fn()
        total = torch.tensor([n, n * loss.item()], dtype=torch.float64)
        dist.all_reduce(total, group=self.dp_group)
        (loss * (n * self.dp / total[0].item())).backward()
        grads = [p.grad for p in self.P.values()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.dp_group)
        flat /= self.dp
        offset = 0  # the copy-back a DDP bucket does
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        return float(total[1] / total[0])

    def update(self) -> None:
        if self.clip is not None:
            sq = torch.stack([p.grad.double().pow(2).sum() for p in self.counted]).sum()
            dist.all_reduce(sq, group=self.tp_group)
            coef = self.clip / (float(sq.sqrt()) + 1e-6)
            if coef < 1.0:
                for p in self.P.values():
                    p.grad.mul_(coef)
        self.opt.step()
