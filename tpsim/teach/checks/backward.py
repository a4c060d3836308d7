"""The harder backward exercises: 04b, the parallel MLP's backward; 06b, the vocab-parallel cross-entropy's.

The reference is tpsim's own ``ParallelMLP`` (its backward, its shards' gradients) and the serial softmax.
"""

from __future__ import annotations

import numpy as np

from tpsim.nn import MLP, gelu_backward, gelu_forward, linear_forward
from tpsim.nn.mlp import MLPCache
from tpsim.teach.checks.lessons_01_05 import OWN_PARTIAL, mlp_pair
from tpsim.teach.checks.lessons_06_11 import OFF_SLICE, vocab_case
from tpsim.teach.checks.registry import exercise
from tpsim.teach.returned import describe
from tpsim.teach.verdict import Report, describe_events

MLP_GRADS = ("dx", "d_fc_weight", "d_fc_bias", "d_proj_weight", "d_proj_bias")


def unpack(r: Report, got, names: tuple[str, ...]) -> tuple | None:
    """The learner's tuple of ``len(names)`` arrays, or ``None`` after recording why it is not one."""
    if isinstance(got, (tuple, list)) and len(got) == len(names):
        return tuple(got)
    r.require(False, "the return value", f"return a tuple of {len(names)} arrays ({', '.join(names)}); yours "
                                         f"returned {describe(got)}")
    return None


def mlp_symptoms(dz: np.ndarray, cache: MLPCache, p: int, serial: MLP) -> dict[str, dict]:
    """What the MLP backward's typical mistakes give, per returned gradient, on this rank (``serial``: the
    master weights, for the mistakes whose result is a sum over every rank's shard)."""
    h, x = cache.gelu.x, cache.c_fc.x
    da = dz @ cache.c_proj.w.T
    dh = gelu_backward(da, cache.gelu)
    no_gelu = dz @ serial.c_proj.params["weight"].T @ serial.c_fc.params["weight"].T
    return {"dx": {f"{OWN_PARTIAL}: this rank's share of dx, before the ranks' shares are added": dh @ cache.c_fc.w.T,
                   "GeLU's derivative is missing (dx as if GeLU were the identity)": no_gelu},
            "d_proj_weight": {"c_proj's weight gradient used GeLU's input, not its output (c_proj's input)": h.T @ dz},
            "d_proj_bias": {f"the group's sum of a gradient every rank already holds whole: {p} × too large":
                            p * dz.sum(axis=0)},
            "d_fc_weight": {"GeLU's derivative is missing": x.T @ da},
            "d_fc_bias": {"GeLU's derivative is missing": da.sum(axis=0)}}


@exercise("04b", "parallel_mlp_backward",
          parallel_mlp_backward=(
              "go backwards through the forward: c_proj, GeLU, c_fc — each has its serial backward "
              "(linear_backward, gelu_backward); which of their results are complete on this rank?",
              "every shard's weight and bias gradient is complete on its own rank: the rows of c_proj and the "
              "columns of c_fc touch only this rank's slice. c_proj's bias is replicated: its gradient is dz summed "
              "over the tokens, already whole on every rank",
              "x fed every rank's c_fc shard (that was f), so c_fc's dx on one rank is only that shard's share",
              "d_proj = c_proj backward of dz; dh = gelu_backward(da); c_fc backward of dh; then one "
              "group.all_reduce of c_fc's dx (f's backward) — and nothing else"))
def check_04b(r: Report) -> None:
    group = r.grid().tp_group
    p = group.size
    for case, (tokens, hidden, ffn) in enumerate([(5, 6, 4 * p), (13, 11, 6 * p)]):
        rng = np.random.default_rng([40, case])
        serial, mlp = mlp_pair(rng, hidden, ffn, group)
        x, dz = rng.standard_normal((tokens, hidden)), rng.standard_normal((tokens, hidden))
        fc, proj = mlp.c_fc.params, mlp.c_proj.params
        h, fc_cache = linear_forward(x, fc["weight"], fc["bias"])
        a, gelu_cache = gelu_forward(h)
        _, proj_cache = linear_forward(a, proj["weight"], None)  # the all-reduce and the bias need no cache
        cache = MLPCache(fc_cache, gelu_cache, proj_cache)
        got = r.call("parallel_mlp_backward", dz.copy(), cache, group)
        events = list(r.events)
        _, ref_cache = mlp.forward(x)
        mlp.zero_grad()
        expected = (mlp.backward(dz, ref_cache), mlp.c_fc.grads["weight"], mlp.c_fc.grads["bias"],
                    mlp.c_proj.grads["weight"], mlp.c_proj.grads["bias"])
        got = unpack(r, got, MLP_GRADS)
        if got is None:
            return
        symptoms = mlp_symptoms(dz, cache, p, serial)
        for i in (3, 4, 1, 2, 0):  # the order the backward computes them: the first wrong one tells most
            r.compare(f"{MLP_GRADS[i]} of parallel_mlp_backward(dz {dz.shape}), hidden {hidden}, ffn {ffn}",
                      got[i], expected[i], symptoms=symptoms[MLP_GRADS[i]])
        r.require([(e.op, e.shape) for e in events] == [("all_reduce", (tokens, hidden))], "communication",
                  f"the MLP's backward needs exactly one collective; yours issued {describe_events(events)}")


def ce_symptoms(logits: np.ndarray, targets: np.ndarray, p: int, rank: int, expected: np.ndarray) -> dict:
    """What exercise 06b's typical mistakes give on rank ``rank`` (``logits``: every rank's, [tokens, V])."""
    n, per = len(targets), logits.shape[1] // p
    start = rank * per
    mine = logits[:, start:start + per]
    softmax = expected + _onehot(targets - start, per) / n  # this rank's columns of the global softmax, / n
    local = np.exp(mine - mine.max(axis=1, keepdims=True))
    local /= local.sum(axis=1, keepdims=True)
    return {f"your gradient is {n} × the reference: the gradient of the summed loss, not of the mean over the "
            f"{n} tokens": n * expected,
            "the target's −1 is missing: your gradient is the softmax alone": softmax,
            "the sign is flipped: onehot − softmax": -expected,
            f"{OFF_SLICE}: the −1 sits at column t of every rank's slice (vocab_start left out)":
                softmax - _onehot(np.where(targets < per, targets, -1), per) / n,
            f"{OFF_SLICE}: every rank put a −1 in every row, wrapping ids that are not its own":
                softmax - _onehot((targets - start) % per, per) / n,
            "each rank normalised by its own Σ exp: a softmax over this rank's slice only, not the group's":
                (local - _onehot(targets - start, per)) / n}


def _onehot(local: np.ndarray, per: int) -> np.ndarray:
    """``[tokens, per]`` with a 1 at ``local[i]`` where ``0 <= local[i] < per`` (other rows all zero)."""
    out = np.zeros((len(local), per))
    ok = (local >= 0) & (local < per)
    out[np.flatnonzero(ok), local[ok]] = 1.0
    return out


@exercise("06b", "vocab_parallel_nll_backward",
          vocab_parallel_nll_backward=(
              "the gradient of loss_i = log Z_i − z_i,t with respect to z_i,c is softmax_i,c − [c = t]: which "
              "columns of it does this rank hold, and what does it need to compute them?",
              "log_z came out of the forward's reductions, so softmax on this rank's columns is exp(z − log_z): "
              "no communication at all (the max's all-reduce has no backward: the loss does not depend on which "
              "max was subtracted)",
              "the −1 goes only to the rank that owns the target: its column is t − vocab_start, when that lies in "
              "[0, V/p); and the loss is the mean over the N tokens",
              "(exp(z − log_z[:, None]) − onehot of the owned targets at column t − vocab_start) / N"))
def check_06b(r: Report) -> None:
    group = r.grid().tp_group
    p = group.size
    for case, (tokens, per_rank, scale) in enumerate([(7, 3, 1.0), (5, 4, 1000.0), (2, 1, 1.0)]):
        logits, targets, log_z = vocab_case([60, case], tokens, per_rank * p, scale)
        vocab = per_rank * p
        start = group.rank * per_rank
        full = np.exp(logits - log_z[:, None])
        full[np.arange(tokens), targets] -= 1.0
        expected = full[:, start:start + per_rank] / tokens
        got = r.call("vocab_parallel_nll_backward", logits[:, start:start + per_rank].copy(), targets.copy(),
                     start, log_z.copy())
        r.compare(f"vocab_parallel_nll_backward for {tokens} tokens, vocabulary {vocab}, logits x{scale:g}", got,
                  expected, tol=1e-12, symptoms=ce_symptoms(logits, targets, p, group.rank, expected))
        r.require(not r.events, "communication", f"log_z holds all this rank needs from the others; yours issued "
                                                 f"{describe_events(r.events)}")
