"""Golden values for the shared serial functions, known without torch: the suite is as strong without it.

Every number below was computed once, independently of tpsim, with mpmath at 50 significant digits from the
function's published definition (the formula is given beside each), then rounded to the nearest float64. The
PyTorch cross-checks (tests/test_against_torch.py) are skipped where torch cannot be installed; these are not,
so e.g. GPT-2's GeLU constant 0.044715 changed to 0.04471 (which moves gelu_new(1) by ~1e-6) fails here too.
Tolerances are a few float64 ulps (relative 1e-15, 1e-14 after an exp/log): a correct float64 evaluation is
within them, any change of a formula or constant lands far outside.

The independent references (tpsim.train.reference: the demo's serial twin and the optimizer-protocol tests use
them) write their own clipping and AdamW update; they get the same golden numbers as the training code's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from mpi4py import MPI

from tpsim.comm.group import Group
from tpsim.comm.tracer import Tracer
from tpsim.train.reference import reference_adamw, reference_clip
from tpsim.nn.activations import gelu_forward
from tpsim.nn.cross_entropy import softmax_cross_entropy_forward
from tpsim.nn.layernorm import layernorm_forward
from tpsim.nn.module import Module
from tpsim.nn.softmax import softmax_forward
from tpsim.train import AdamW, clip_grad_norm

REL = 1e-15


def close(got, want, rel: float = REL) -> None:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    err = np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-300))
    assert err <= rel, f"got {got.tolist()}, golden {want.tolist()}: relative error {err:.2e} > {rel:g}"


def test_gelu_new_gpt2_tanh_form():
    # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))  (Hendrycks & Gimpel 2016, arXiv:1606.08415; GPT-2's gelu_new)
    x = np.array([1.0, -0.5, 3.0])
    close(gelu_forward(x, "tanh")[0], [0.8411919906082767, -0.15428599017485609, 2.996362607918227])


def test_gelu_exact_erf_form():
    # x·Φ(x) = 0.5·x·(1 + erf(x/√2))  (Hendrycks & Gimpel 2016; torch's approximate="none")
    x = np.array([1.0, -0.5, 3.0])
    close(gelu_forward(x, "none")[0], [0.8413447460685429, -0.15426876936299344, 2.99595030590511])


def test_layernorm_of_a_fixed_vector():
    # (x − mean) / √(biased var + 1e-5): x = [1, 2, 3, 4, 10], mean 4, var 10  (Ba et al. 2016, arXiv:1607.06450)
    x = np.array([[1.0, 2.0, 3.0, 4.0, 10.0]])
    y = layernorm_forward(x, np.ones(5), np.zeros(5), eps=1e-5)[0]
    close(y, [[-0.9486828237092205, -0.632455215806147, -0.3162276079030735, 0.0, 1.897365647418441]])
    y = layernorm_forward(x, np.full(5, 2.0), np.full(5, 0.5), eps=1e-5)[0]  # affine: 2·x̂ + 0.5
    close(y, 2.0 * np.array([[-0.9486828237092205, -0.632455215806147, -0.3162276079030735, 0.0,
                              1.897365647418441]]) + 0.5)


def test_softmax_of_fixed_logits_and_of_huge_ones():
    # exp(x_i) / Σ exp(x_j) of [1, 2, 3]; adding 1000 changes nothing (the max-trick must keep it finite)
    want = [0.09003057317038046, 0.24472847105479764, 0.6652409557748219]
    close(softmax_forward(np.array([1.0, 2.0, 3.0]))[0], want)
    close(softmax_forward(np.array([1001.0, 1002.0, 1003.0]))[0], want, rel=1e-14)


def test_cross_entropy_of_fixed_logits():
    # mean over rows of log Σ_j exp(z_j) − z_target: rows [2, −1, 0.5, 0] → 0 and [−3, 1, 4, 1] → 2
    logits = np.array([[2.0, -1.0, 0.5, 0.0], [-3.0, 1.0, 4.0, 1.0]])
    loss = softmax_cross_entropy_forward(logits, np.array([0, 2]))[0]
    close(loss, 0.2190507498983542, rel=1e-14)
    ignored = softmax_cross_entropy_forward(np.vstack([logits, logits[:1]]), np.array([0, 2, -100]))[0]
    close(ignored, 0.2190507498983542, rel=1e-14)  # an ignored row counts neither in the sum nor in the mean


# AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101, decoupled weight decay; torch.optim.AdamW's form):
#   p ← p·(1 − lr·wd);  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;  p ← p − lr·m̂ / (√v̂ + eps)
# p = 1, lr 0.1, wd 0.01, betas (0.9, 0.999), eps 1e-8, gradients 0.5 then −0.25:
ADAMW_GRADS = (0.5, -0.25)
ADAMW_GOLDEN = [(0.899000002, 0.05, 0.00025),  # (p, m, v) after t = 1
                (0.8714672987058462, 0.02, 0.00031225)]  # and after t = 2
ADAMW_REL = 4e-15  # two steps of a dozen roundings each; L2 decay instead of decoupled moves p by ~1e-3


def one_param(value: float) -> Module:
    module = Module()
    module.add_param("weight", np.array([value]))
    return module


def test_adamw_two_steps_by_the_published_update():
    module = one_param(1.0)
    opt = AdamW(module, lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    for g, (p, m, v) in zip(ADAMW_GRADS, ADAMW_GOLDEN):
        module.grads["weight"][:] = g
        opt.step()
        close(module.params["weight"], [p], ADAMW_REL)
        close(opt.state["weight"]["exp_avg"], [m], ADAMW_REL)
        close(opt.state["weight"]["exp_avg_sq"], [v], ADAMW_REL)


def test_the_reference_adamw_by_the_published_update():
    p, m, v = np.ones(1), np.zeros(1), np.zeros(1)
    for t, (g, golden) in enumerate(zip(ADAMW_GRADS, ADAMW_GOLDEN), start=1):
        reference_adamw(p, np.array([g]), m, v, t, lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        for got, want in zip((p, m, v), golden):
            close(got, [want], ADAMW_REL)


# clip_grad_norm (PyTorch's rule): ‖g‖₂ over every gradient, here √(3² + 4² + 12²) = 13; with max_norm 1 every
# gradient is scaled by 1 / (13 + 1e-6) = 0.07692307100591761.
CLIP_NORM, CLIP_COEF = 13.0, 0.07692307100591761


def test_clip_grad_norm_of_a_fixed_set():
    module = Module()
    module.add_param("a", np.zeros(2))
    module.add_param("b", np.zeros(1))
    module.grads["a"][:], module.grads["b"][:] = [3.0, 4.0], [12.0]
    alone = Group(MPI.COMM_SELF, "tp", (0,), Tracer(0, enabled=False))  # one rank: the serial norm
    assert clip_grad_norm(module, alone, 1.0) == pytest.approx(CLIP_NORM, rel=REL)
    close(module.grads["a"], [3.0 * CLIP_COEF, 4.0 * CLIP_COEF])
    close(module.grads["b"], [12.0 * CLIP_COEF])
    assert clip_grad_norm(module, alone, 2.0) == pytest.approx(1.0, rel=1e-6)  # below the threshold: untouched
    close(module.grads["b"], [12.0 * CLIP_COEF])


def test_the_reference_clip_of_a_fixed_set():
    grads = [np.array([3.0, 4.0]), np.array([12.0])]
    assert reference_clip(grads, 1.0) == pytest.approx(CLIP_NORM, rel=REL)
    close(np.concatenate(grads), np.array([3.0, 4.0, 12.0]) * CLIP_COEF)
    assert reference_clip(grads, math.inf) == pytest.approx(1.0, rel=1e-6)  # inf: measure only
