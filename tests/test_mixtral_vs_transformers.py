"""A Mixtral written by tpsim, read by Hugging Face's own ``MixtralForCausalLM.from_pretrained``: the same loss,
every gradient and the same experts for every token, in float64.

tpsim writes the folder with its own writer (``to_hf`` + ``write_model_folder``: the hub's file names,
``block_sparse_moe.experts.{e}.w1/w2/w3``); transformers reads it through its own conversion into its fused expert
tensors. Skipped without torch or transformers (neither is a dependency). As for the Llama
(tests/test_llama_vs_transformers.py) the float32 islands of the Hugging Face model — rotary angles, RMSNorm's
normalisation, the router's softmax — run in float64 (the same expressions, the dtype kept), so the comparison
holds at 1e-12 for the loss and 1e-9 for the gradients. The auxiliary loss is off here: Hugging Face's adds one
loss over every layer's logits at once, tpsim's is per layer (tests/test_moe_vs_transformers.py compares it on one).
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.arch.mixtral import MixtralConfig
from tpsim.compare import relative_difference
from tpsim.hf.checkpoint import write_model_folder
from tpsim.hf.layout import to_hf
from tpsim.hf.names import to_internal
from tpsim.models.mixtral import serial_mixtral
from tpsim.nn.rope import rope_cos_sin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CFG = MixtralConfig(vocab_size=23, hidden_size=16, intermediate_size=12, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=16, rope_theta=500.0, initializer_range=0.3,
                    num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.0)
E, F = CFG.num_local_experts, CFG.intermediate_size


def float64_islands(model) -> None:
    """Rotary angles, RMSNorm and the routers' softmax in float64 (module docstring)."""
    def rotary(x, position_ids):
        cos, sin = rope_cos_sin(position_ids[0].numpy(), CFG.head_dim, CFG.rope_theta)
        return torch.tensor(cos)[None].expand(x.shape[0], -1, -1), torch.tensor(sin)[None].expand(x.shape[0], -1, -1)
    model.model.rotary_emb.forward = rotary
    for module in model.modules():
        if type(module).__name__ == "MixtralRMSNorm":
            module.forward = (lambda m: lambda x: m.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                                                               + m.variance_epsilon)))(module)
    for layer in model.model.layers:
        router = layer.mlp.gate

        def forward(hidden, router=router):
            hidden = hidden.reshape(-1, router.hidden_dim)
            logits = torch.nn.functional.linear(hidden, router.weight)
            top, index = torch.topk(torch.nn.functional.softmax(logits, dim=-1), router.top_k, dim=-1)
            return logits, top / top.sum(dim=-1, keepdim=True), index
        router.forward = forward


def their_grads(model) -> dict[str, np.ndarray]:
    """The Hugging Face model's gradients under tpsim's names and layouts (fused experts split)."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.numpy()
        if name.endswith("experts.gate_up_proj"):
            base = name[:-len("gate_up_proj")]
            for e in range(E):
                out[f"{base}{e}.gate_proj.weight"], out[f"{base}{e}.up_proj.weight"] = g[e, :F].T, g[e, F:].T
        elif name.endswith("experts.down_proj"):
            for e in range(E):
                out[f"{name[:-len('down_proj')]}{e}.down_proj.weight"] = g[e].T
        else:
            out[name] = g.T if name.endswith("_proj.weight") or name.endswith("mlp.gate.weight") else g
    return out


def test_an_exported_mixtral_loads_in_transformers_with_the_same_loss_gradients_and_experts(tmp_path):
    ours = serial_mixtral(CFG, seed=2)
    rng = np.random.default_rng(5)
    ids, labels = rng.integers(0, CFG.vocab_size, (3, 9)), rng.integers(0, CFG.vocab_size, (3, 9))
    ours.zero_grad()
    loss, cache = ours.forward(ids, labels)
    ours.backward(1.0, cache)
    write_model_folder(tmp_path, CFG, to_hf(dict(ours.named_parameters()), CFG))

    model = transformers.MixtralForCausalLM.from_pretrained(tmp_path, dtype=torch.float64, attn_implementation="sdpa",
                                                          experts_implementation="eager")  # grouped_mm: no float64
    float64_islands(model)
    out = model(input_ids=torch.tensor(ids), output_router_logits=True)
    theirs = torch.nn.functional.cross_entropy(out.logits.reshape(-1, CFG.vocab_size), torch.tensor(labels).reshape(-1))
    theirs.backward()
    assert abs(loss - theirs.item()) <= 1e-12 * abs(theirs.item()), f"loss {loss!r} vs {theirs.item()!r}"
    for i, logits in enumerate(out.router_logits):  # the same experts for every token of every layer
        index = torch.topk(torch.softmax(logits, -1), CFG.num_experts_per_tok, -1).indices.numpy()
        assert np.array_equal(index, cache.transformer.h[i].mlp.router.index), f"layer {i} routes otherwise"
    got = their_grads(model)
    for name, g in ours.named_grads():
        assert relative_difference(g, got[name], floor=1e-300) <= 1e-9, name


def test_tpsim_reads_the_folder_back_to_the_same_tensors(tmp_path):
    ours = serial_mixtral(CFG, seed=3)
    params = dict(ours.named_parameters())
    files = to_hf(params, CFG)
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in files  # the hub's names
    back = to_internal(files, CFG)
    assert all(np.array_equal(back[n], params[n]) for n in params)


def test_greedy_decoding_from_the_folder_gives_transformers_tokens(tmp_path):
    """tpsim's decoding with its KV cache (``tpsim.generate``'s code, the MoE layers whole) against
    ``model.generate`` (greedy) of the same folder: the same 6 new tokens for two prompts."""
    from tpsim.generate.decode import greedy

    ours = serial_mixtral(CFG, seed=4)
    write_model_folder(tmp_path, CFG, to_hf(dict(ours.named_parameters()), CFG))
    prompt = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    tokens, _ = greedy(ours, prompt, 6)
    model = transformers.MixtralForCausalLM.from_pretrained(tmp_path, dtype=torch.float64, attn_implementation="sdpa",
                                                            experts_implementation="eager")
    float64_islands(model)
    theirs = model.generate(torch.tensor(prompt), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert np.array_equal(tokens, theirs[:, prompt.shape[1]:].numpy())
