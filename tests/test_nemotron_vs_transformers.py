"""The serial Nemotron against Hugging Face's ``NemotronForCausalLM`` on the same weights: loss and every gradient.

Skipped when torch or transformers is not installed (neither is a dependency). As for the Llama
(tests/test_llama_vs_transformers.py): the Hugging Face model is built from ``NemotronConfig.hf_config()``
alone, in float64 with SDPA attention, its rotary module (float32 angles) patched to tpsim's float64 ones over
the turned ``rotary_dim`` features; its LayerNorm1P (``F.layer_norm`` with ``weight + 1``) runs in float64 as
it is. The norms' weights and biases are moved off their zeros so the 1 + w path is exercised.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.arch.nemotron import NemotronConfig
from tpsim.compare import relative_difference
from tpsim.models.nemotron import serial_nemotron
from tpsim.nn.rope import rope_cos_sin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "NemotronForCausalLM"):
    pytest.skip("this transformers has no NemotronForCausalLM (added in 4.44)", allow_module_level=True)

CFG = NemotronConfig(vocab_size=19, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=16, rope_theta=500.0, initializer_range=0.3)


def hf_model(params: dict):
    """``NemotronForCausalLM`` from ``CFG.hf_config()`` holding ``params`` (linears transposed), float64 angles."""
    model = transformers.NemotronForCausalLM(transformers.NemotronConfig(**CFG.hf_config(),
                                                                         attn_implementation="sdpa"))
    model = model.to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            value = params[name]
            linear = name.endswith("_proj.weight")  # tpsim's Linear is [in, out]; torch's is [out, in]
            p.copy_(torch.tensor(value.T if linear else value))

    def rotary(x, position_ids):  # tpsim's angles, float64, over the turned features only
        cos, sin = rope_cos_sin(position_ids[0].numpy(), CFG.rotary_dim, CFG.rope_theta)
        return torch.tensor(cos)[None].expand(x.shape[0], -1, -1), torch.tensor(sin)[None].expand(x.shape[0], -1, -1)
    model.model.rotary_emb.forward = rotary
    return model


def test_serial_nemotron_equals_transformers_in_float64():
    ours = serial_nemotron(CFG, seed=2)
    rng = np.random.default_rng(5)
    for name, p in ours.named_parameters():
        if "layernorm" in name or name.startswith("model.norm"):
            p[...] = 0.2 * rng.standard_normal(p.shape)
    ids, labels = rng.integers(0, CFG.vocab_size, (3, 9)), rng.integers(0, CFG.vocab_size, (3, 9))
    loss = ours.loss_and_grads(ids, labels)
    model = hf_model(dict(ours.named_parameters()))
    model.zero_grad()
    logits = model(input_ids=torch.tensor(ids)).logits
    theirs = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(labels).reshape(-1))
    theirs.backward()
    assert abs(loss - theirs.item()) <= 1e-12 * abs(theirs.item()), f"loss {loss!r} vs transformers {theirs.item()!r}"
    grads = {n: (p.grad.numpy().T if n.endswith("_proj.weight") else p.grad.numpy())
             for n, p in model.named_parameters()}
    mine = dict(ours.named_grads())
    assert set(mine) == set(grads)
    bad = {n: f"{d:.1e}" for n in mine if (d := relative_difference(mine[n], grads[n], floor=1e-30)) > 1e-10}
    assert not bad, f"gradients differ from transformers: {bad}"
