"""The serial MoE layer against ``transformers``' own blocks on the same weights, in float64: Mixtral's
``MixtralSparseMoeBlock`` (softmax, top-2 renormalised) and Qwen2-MoE's ``Qwen2MoeSparseMoeBlock`` (softmax, top-k
not renormalised, one shared expert behind a sigmoid gate) — output, the experts chosen, every gradient — and
Mixtral's load-balancing loss (``load_balancing_loss_func`` on one layer) against the router's.

Skipped without torch or transformers (neither is a dependency); written for transformers 5's fused expert
tensors (``experts.gate_up_proj`` [E, 2F, h], ``experts.down_proj`` [E, h, F]). Their routers take the softmax in
float32 whatever the model's dtype; the test runs that one line in float64 (the same expression, the dtype
kept), so the comparison can hold at 1e-12 rather than float32's 1e-7.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.compare import relative_difference
from tpsim.nn.moe import MoE

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen2_moe.modeling_qwen2_moe", reason="this transformers has no Qwen2-MoE")
from transformers.models.mixtral import modeling_mixtral  # noqa: E402
from transformers.models.qwen2_moe import modeling_qwen2_moe  # noqa: E402

H, F, E, K = 8, 6, 4, 2


def float64_router(router, renormalise: bool):
    def forward(hidden_states):
        hidden_states = hidden_states.reshape(-1, router.hidden_dim)
        logits = torch.nn.functional.linear(hidden_states, router.weight)
        probs = torch.nn.functional.softmax(logits, dim=-1)  # float64: the models' own line, dtype kept
        top, index = torch.topk(probs, router.top_k, dim=-1)
        if renormalise:
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, top, index
    return forward


def load(block, ours: MoE) -> None:
    """Our weights into the block (tpsim's [in, out] linears transposed; gate and up stacked as the fused tensor)."""
    t = lambda a: torch.tensor(a)  # noqa: E731
    with torch.no_grad():
        block.gate.weight.copy_(t(ours.router.gate.params["weight"].T))
        for e, expert in enumerate(ours.experts):
            block.experts.gate_up_proj[e].copy_(t(np.concatenate([expert.gate_proj.params["weight"].T,
                                                                   expert.up_proj.params["weight"].T])))
            block.experts.down_proj[e].copy_(t(expert.down_proj.params["weight"].T))
        if ours.shared_experts:
            for name in ("gate_proj", "up_proj", "down_proj"):
                mine = getattr(ours.shared_experts[0], name).params["weight"]
                getattr(block.shared_expert, name).weight.copy_(t(mine.T))
            block.shared_expert_gate.weight.copy_(t(ours.shared_expert_gate.params["weight"].T))


def their_grads(block, ours: MoE) -> dict[str, np.ndarray]:
    """The block's gradients under tpsim's names and layouts."""
    out = {"gate.weight": block.gate.weight.grad.numpy().T}
    for e in range(E):
        gate_up = block.experts.gate_up_proj.grad[e].numpy()
        out[f"experts.{e}.gate_proj.weight"] = gate_up[:F].T
        out[f"experts.{e}.up_proj.weight"] = gate_up[F:].T
        out[f"experts.{e}.down_proj.weight"] = block.experts.down_proj.grad[e].numpy().T
    if ours.shared_experts:
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[f"shared_experts.0.{name}.weight"] = getattr(block.shared_expert, name).weight.grad.numpy().T
        out["shared_expert_gate.weight"] = block.shared_expert_gate.weight.grad.numpy().T
    return out


def compare(block, ours: MoE, renormalise: bool) -> None:
    block.gate.forward = float64_router(block.gate, renormalise)
    load(block, ours)
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal((2, 5, H)), rng.standard_normal((2, 5, H))
    y, cache = ours.forward(x)
    ours.zero_grad()
    dx = ours.backward(dy, cache)
    xt = torch.tensor(x, requires_grad=True)
    out = block(xt)
    yt = out[0] if isinstance(out, tuple) else out
    (yt * torch.tensor(dy)).sum().backward()
    _, _, index = block.gate(torch.tensor(x).reshape(-1, H))
    assert np.array_equal(index.numpy(), cache.router.index), "a different expert chosen"
    assert relative_difference(y, yt.detach().numpy(), floor=1e-30) < 1e-12
    assert relative_difference(dx, xt.grad.numpy(), floor=1e-30) < 1e-12
    theirs = their_grads(block, ours)
    mine = dict(ours.named_grads())
    assert set(mine) == set(theirs)
    bad = {n: f"{d:.1e}" for n in mine if (d := relative_difference(mine[n], theirs[n], floor=1e-30)) > 1e-12}
    assert not bad, f"gradients differ from transformers: {bad}"


def test_mixtral_block_equals_ours():
    config = transformers.MixtralConfig(hidden_size=H, intermediate_size=F, num_local_experts=E,
                                        num_experts_per_tok=K, router_jitter_noise=0.0)
    block = modeling_mixtral.MixtralSparseMoeBlock(config).to(torch.float64)
    compare(block, MoE(H, F, E, K, rng=np.random.default_rng(1), std=0.5), renormalise=True)


def test_qwen2_moe_block_with_its_gated_shared_expert_equals_ours():
    config = transformers.Qwen2MoeConfig(hidden_size=H, moe_intermediate_size=F, num_experts=E, num_experts_per_tok=K,
                                         shared_expert_intermediate_size=5, norm_topk_prob=False)
    block = modeling_qwen2_moe.Qwen2MoeSparseMoeBlock(config).to(torch.float64)
    ours = MoE(H, F, E, K, router="softmax_plain", shared_experts=1, shared_ffn=5, shared_gate=True,
               rng=np.random.default_rng(2), std=0.5)
    compare(block, ours, renormalise=False)


def test_the_load_balancing_loss_is_mixtrals_on_one_layer():
    """Equal to float32's precision: transformers' function returns a float32 tensor (its means and one-hot
    counts run in float32), a relative 1.8e-8 here; the tolerance is float32's, 1e-6."""
    ours = MoE(H, F, E, K, aux_coef=1.0, rng=np.random.default_rng(4), std=0.5)
    x = np.random.default_rng(5).standard_normal((10, H))
    _, cache = ours.forward(x)
    theirs = modeling_mixtral.load_balancing_loss_func((torch.tensor(cache.router.logits),), E, K)
    assert abs(cache.router.aux_loss - float(theirs)) <= 1e-6 * float(theirs)
