"""tpsim against Hugging Face transformers on the same weights: loss, gradients and greedy tokens.

Skipped when transformers (or torch) is not installed: neither is a dependency of tpsim. The folders are
tpsim's own (``tpsim.hf.write`` or the demo's ``--export``), loaded with ``from_pretrained`` unchanged, in
float64 so that "equal" means ~1e-12. HF's Llama rounds through float32 in two places (RMSNorm and the rotary
cos/sin, ~1e-7 relative even in a float64 model); the tests swap in the same formulas without that cast, so the
Llama is held to the GPT-2's 1e-10 instead of a tolerance loosened to fit.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from launch_program import run_mpi

from tpsim.compare import relative_difference
from tpsim.generate.decode import greedy
from tpsim.hf.folder import read_folder
from tpsim.hf.layout import transposed
from tpsim.hf.write import write_hf_folder
from tpsim.models.build import serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.models.llama import serial_llama
from tpsim.arch.llama import LlamaConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# initializer_range 0.5: weights large enough that greedy decoding does not repeat one token forever
CFG = GPTConfig(vocab_size=29, n_positions=24, n_embd=16, n_layer=2, n_head=4, initializer_range=0.5)
LLAMA = LlamaConfig(vocab_size=29, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=24, rope_theta=500.0, initializer_range=0.5)


def hf_loss_and_grads(model, ids: np.ndarray, labels: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    """Mean cross-entropy of HF's logits against tpsim's (already shifted) labels, and its grads by name."""
    model.zero_grad()
    logits = model(torch.tensor(ids)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(labels).reshape(-1),
                                             ignore_index=-100)
    loss.backward()
    return loss.item(), {n: p.grad.numpy() for n, p in model.named_parameters()}


def load_hf(folder, arch: str = "gpt2"):
    if arch == "gpt2":
        return transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float64).eval()
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    model.model.rotary_emb.forward = float64_rotary(model.config)
    for module in model.modules():
        if isinstance(module, transformers.models.llama.modeling_llama.LlamaRMSNorm):
            module.forward = float64_rms_norm(module)
    return model


def float64_rms_norm(norm):
    """HF's RMSNorm computes in float32 whatever the input (an upcast for 16-bit runs, a downcast for float64);
    the same formula without the cast: w · x / sqrt(mean(x²) + eps)."""
    def forward(x):
        return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))
    return forward


def float64_rotary(config):
    """HF's rotary embedding computes cos/sin in float32 (~1e-7 off); this one is the same formula in float64,
    so a Llama compares at 1e-10 like a GPT-2: cos, sin of position · θ^(−2i/hd), halves concatenated."""
    hd = config.hidden_size // config.num_attention_heads
    theta = getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]  # 4.x or 5.x spelling
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))

    def forward(x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return forward


def assert_close(ours: dict, theirs: dict, tol: float) -> None:
    assert set(ours) <= set(theirs), set(ours) - set(theirs)
    for name, a in ours.items():
        d = relative_difference(a, theirs[name], floor=1e-30)
        assert d <= tol, f"{name}: relative max |diff| {d:.2e} > {tol:g}"


MODELS = {"gpt2": (serial_gpt, CFG), "llama": (serial_llama, LLAMA)}


def hf_layout(grads: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
    """HF's gradients in tpsim's layout (Llama's nn.Linear weights are [out, in]; GPT-2's Conv1D is not)."""
    return {n: g.T if transposed(n, config) else g for n, g in grads.items()}


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_folder_loads_into_transformers_with_the_same_loss_and_grads(tmp_path, arch):
    serial_of, cfg = MODELS[arch]
    model = serial_of(cfg, seed=5)
    write_hf_folder(tmp_path, cfg, dict(model.named_parameters()), dtype="float64")
    assert type(load_hf(tmp_path, arch).config).__name__ == ("GPT2Config" if arch == "gpt2" else "LlamaConfig")
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (3, 11))
    labels = np.concatenate([ids[:, 1:], np.full((3, 1), -100)], axis=1)
    loss = model.loss_and_grads(ids, labels)
    t_loss, t_grads = hf_loss_and_grads(load_hf(tmp_path, arch), ids, labels)
    assert abs(loss - t_loss) <= 1e-12 * t_loss
    assert_close(dict(model.named_grads()), hf_layout(t_grads, cfg), 1e-10)


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_greedy_tokens_equal_transformers_generate(tmp_path, arch):
    serial_of, cfg = MODELS[arch]
    model = serial_of(cfg, seed=7)
    write_hf_folder(tmp_path, cfg, dict(model.named_parameters()), dtype="float64")
    prompt = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    ours, _ = greedy(model, prompt, 12)
    hf = load_hf(tmp_path, arch)
    hf.generation_config.eos_token_id = None  # LlamaConfig's default eos id 2 is a real token here; tpsim never stops
    theirs = hf.generate(torch.tensor(prompt), max_new_tokens=12, do_sample=False,
                         attention_mask=torch.ones(prompt.shape, dtype=torch.long), pad_token_id=0)
    assert len(set(ours.ravel().tolist())) > 2, "a degenerate test: the tokens should vary"
    np.testing.assert_array_equal(ours, theirs[:, prompt.shape[1]:].numpy())


def test_llama_export_loads_into_transformers_unchanged(tmp_path):
    """export_step0 of a Llama (a world of one rank): config.json is a LlamaConfig, params/grads.npz are HF's
    layout, from_pretrained(DIR) recomputes the exported loss and gradients."""
    from mpi4py import MPI

    from tpsim.comm import ProcessGrid
    from tpsim.models.llama import parallel_llama
    from tpsim.hf.checkpoint import export_step0

    grid = ProcessGrid(tp=1, comm=MPI.COMM_SELF)
    model = parallel_llama(serial_llama(LLAMA, seed=3), grid.tp_group)
    ids = np.random.default_rng(2).integers(0, LLAMA.vocab_size, (2, 9))
    labels = np.roll(ids, -1, axis=1)
    loss = model.loss_and_grads(ids, labels)
    export_step0(tmp_path, model, grid.tp_group, config=LLAMA, input_ids=ids, labels=labels, loss=loss, write=True)
    cfg = transformers.LlamaConfig(**json.loads((tmp_path / "config.json").read_text()))
    assert cfg.num_key_value_heads == 2 and not cfg.tie_word_embeddings and cfg.hidden_act == "silu"
    params, grads = (dict(np.load(tmp_path / f)) for f in ("params.npz", "grads.npz"))
    assert params["model.layers.0.self_attn.k_proj.weight"].shape == (2 * LLAMA.head_dim, LLAMA.hidden_size)
    hf = load_hf(tmp_path, "llama")
    assert_close(params, {n: p.detach().numpy() for n, p in hf.named_parameters()}, 0.0)
    t_loss, t_grads = hf_loss_and_grads(hf, ids, labels)
    assert abs(loss - t_loss) <= 1e-12 * t_loss
    assert_close(grads, t_grads, 1e-10)
    config, tensors = read_folder(tmp_path)  # and back: the export is a folder tpsim reads too
    assert config == LLAMA
    assert_close(tensors, dict(serial_llama(LLAMA, seed=3).named_parameters()), 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_demo_export_loads_into_transformers(tmp_path, arch):
    """The demo at TP 2 x DP 2 exports step 0 (no dropout: HF's eval model has none); from_pretrained(DIR)
    recomputes the loss and grads of the files, for either architecture."""
    extra = ["--kv-heads", "1", "--ffn", "32"] if arch == "llama" else []  # KV head replicated on both TP ranks
    r = run_mpi(4, ["-m", "tpsim.demo", "--arch", arch, "--tp", "2", "--dp", "2", "--steps", "0", "--vocab", "13",
                    "--hidden", "16", "--heads", "2", "--dropout", "0", *extra, "--export", str(tmp_path),
                    "--out", str(tmp_path / "out")])
    assert r.returncode == 0, r.stderr
    batch, grads = (dict(np.load(tmp_path / f)) for f in ("batch.npz", "grads.npz"))
    loss = json.loads((tmp_path / "step0.json").read_text())["loss"]
    t_loss, t_grads = hf_loss_and_grads(load_hf(tmp_path, arch), batch["input_ids"], batch["labels"])
    assert abs(loss - t_loss) <= 1e-12 * t_loss
    assert_close(grads, t_grads, 1e-10)
    config, _ = read_folder(tmp_path)  # and the folder reads back as the model it came from
    assert config.vocab_size == 13 and (config.hidden_size if arch == "llama" else config.n_embd) == 16
