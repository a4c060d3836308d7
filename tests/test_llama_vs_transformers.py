"""The serial Llama against Hugging Face's ``LlamaForCausalLM`` on the same weights: loss and every gradient.

Skipped when torch or transformers is not installed (neither is a dependency). The Hugging Face model is built
from ``LlamaConfig.hf_config()`` alone — so the config keys are checked too — in float64 with SDPA attention
(the eager path runs its softmax in float32). Its rotary module computes cos/sin in float32 whatever the model
dtype, and its RMSNorm normalises in float32; the first test patches both to float64 and compares at 1e-10,
the second leaves them alone and shows the difference float32 makes (~1e-7 relative, which is why a comparison
with an unpatched model needs ~1e-6).
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.compare import relative_difference
from tpsim.models.llama import serial_llama
from tpsim.arch.llama import LlamaConfig
from tpsim.nn.rope import rope_cos_sin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CFG = LlamaConfig(vocab_size=19, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=16, rope_theta=500.0, initializer_range=0.3)


def hf_model(cfg: LlamaConfig, params: dict, float64: bool):
    """``LlamaForCausalLM`` from ``cfg.hf_config()``, holding ``params`` (tpsim's [in, out] linears transposed)."""
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg.hf_config(), attn_implementation="sdpa"))
    model = model.to(torch.float64)
    shapes = cfg.param_shapes()
    with torch.no_grad():
        for name, p in model.named_parameters():
            value = params[name]
            linear = name.endswith("_proj.weight")  # tpsim's Linear is [in, out]; torch's is [out, in]
            assert (value.T if linear else value).shape == tuple(p.shape) and value.shape == shapes[name], name
            p.copy_(torch.tensor(value.T if linear else value))
    if float64:
        for module in model.modules():  # LlamaRMSNorm casts to float32 and back: keep float64 instead
            if type(module).__name__ == "LlamaRMSNorm":
                module.forward = rmsnorm_float64(module)

        def rotary(x, position_ids):  # the same angles as tpsim: computed in float64
            cos, sin = rope_cos_sin(position_ids[0].numpy(), cfg.head_dim, cfg.rope_theta)
            return torch.tensor(cos)[None].expand(x.shape[0], -1, -1), torch.tensor(sin)[None].expand(x.shape[0], -1, -1)
        model.model.rotary_emb.forward = rotary
    return model


def rmsnorm_float64(module):
    def forward(x):
        return module.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon))
    return forward


def hf_loss_and_grads(model, ids: np.ndarray, labels: np.ndarray) -> tuple[float, dict]:
    """Mean cross-entropy with tpsim's labels (labels[b, t] = target of position t: no shift inside)."""
    model.zero_grad()
    logits = model(input_ids=torch.tensor(ids)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(labels).reshape(-1))
    loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad.numpy()
        grads[name] = g.T if name.endswith("_proj.weight") else g
    return loss.item(), grads


def data(seed=1, b=3, s=9):
    rng = np.random.default_rng(seed)
    return rng.integers(0, CFG.vocab_size, (b, s)), rng.integers(0, CFG.vocab_size, (b, s))


def test_serial_llama_equals_transformers_in_float64():
    ours = serial_llama(CFG, seed=2)
    ids, labels = data()
    loss = ours.loss_and_grads(ids, labels)
    theirs, grads = hf_loss_and_grads(hf_model(CFG, dict(ours.named_parameters()), float64=True), ids, labels)
    assert abs(loss - theirs) <= 1e-12 * abs(theirs), f"loss {loss!r} vs transformers {theirs!r}"
    mine = dict(ours.named_grads())
    assert set(mine) == set(grads)
    worst = {n: relative_difference(mine[n], grads[n], floor=1e-30) for n in mine}
    bad = {n: f"{d:.1e}" for n, d in worst.items() if d > 1e-10}
    assert not bad, f"gradients differ from transformers: {bad}"


def test_transformers_float32_rope_and_norm_differ_by_about_1e_7():
    ours = serial_llama(CFG, seed=2)
    ids, labels = data(seed=3)
    loss = ours.loss_and_grads(ids, labels)
    theirs, grads = hf_loss_and_grads(hf_model(CFG, dict(ours.named_parameters()), float64=False), ids, labels)
    rel = abs(loss - theirs) / abs(theirs)
    worst = max(relative_difference(g, grads[n], floor=1e-30) for n, g in ours.named_grads())
    assert rel < 1e-6 and worst < 1e-5, f"loss rel diff {rel:.1e}, worst grad rel diff {worst:.1e}"
    assert worst > 1e-12, "float32 angles and norms should leave a visible difference"
