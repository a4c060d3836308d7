"""tpsim against an independent implementation: GPT-2 written in PyTorch with autograd.

Skipped when torch is not installed (it is not a dependency). The torch model below is written from the GPT-2
paper and Hugging Face's layout, not from tpsim's code: token + position embeddings, pre-LN blocks (eps 1e-5),
causal attention with q | k | v packed in c_attn, GeLU tanh, tied LM head, mean cross-entropy (-100 ignored).
It reads the parameters by their GPT-2 names, so it checks the export format too.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from launch_program import run_mpi

from tpsim.compare import relative_difference

torch = pytest.importorskip("torch")
F = torch.nn.functional


def torch_gpt2_loss(params: dict, cfg: dict, ids: np.ndarray, labels: np.ndarray, label_smoothing: float = 0.0):
    """Loss and grads (by name) of GPT-2 in float64 PyTorch."""
    P = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    h, nh = cfg["n_embd"], cfg["n_head"]
    ids_t = torch.tensor(ids)
    b, s = ids_t.shape
    x = P["transformer.wte.weight"][ids_t] + P["transformer.wpe.weight"][torch.arange(s)]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        a = F.layer_norm(x, (h,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps=cfg["layer_norm_epsilon"])
        q, k, v = (a @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]).split(h, dim=-1)
        q, k, v = (t.view(b, s, nh, h // nh).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(h // nh)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, h)
        x = x + y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"]
        m = F.layer_norm(x, (h,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps=cfg["layer_norm_epsilon"])
        m = F.gelu(m @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (h,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], eps=cfg["layer_norm_epsilon"])
    logits = x @ P["transformer.wte.weight"].T
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(labels).reshape(-1),
                           ignore_index=-100, label_smoothing=label_smoothing)
    loss.backward()
    return loss.item(), {k: t.grad.numpy() for k, t in P.items()}


def assert_grads_close(ours: dict, theirs: dict, tol: float = 1e-10):
    assert set(ours) == set(theirs)
    for name in ours:
        d = relative_difference(ours[name], theirs[name], floor=1e-30)
        assert d <= tol, f"{name}: relative max |diff| {d:.2e}"


def test_serial_gpt_equals_pytorch():
    from tpsim.data import ReverseTask
    from tpsim.models.build import serial_gpt
    from tpsim.arch.gpt2 import GPTConfig

    cfg = GPTConfig(vocab_size=23, n_positions=12, n_embd=24, n_layer=2, n_head=3)
    model = serial_gpt(cfg, seed=11)
    ids, labels = ReverseTask(23, 12).batch(seed=2, step=0, batch_size=5)  # includes ignored labels
    loss = model.loss_and_grads(ids, labels)
    t_loss, t_grads = torch_gpt2_loss(dict(model.named_parameters()), cfg.hf_config(), ids, labels)
    assert abs(loss - t_loss) <= 1e-12 * t_loss
    assert_grads_close(dict(model.named_grads()), t_grads)


def test_label_smoothing_equals_pytorch():
    from tpsim.nn import softmax_cross_entropy_backward, softmax_cross_entropy_forward

    rng = np.random.default_rng(0)
    logits, targets = 1000 * rng.standard_normal((13, 17)), rng.integers(0, 17, 13)
    targets[3] = -100
    loss, cache = softmax_cross_entropy_forward(logits, targets, label_smoothing=0.1)
    lt = torch.tensor(logits, requires_grad=True)
    ref = F.cross_entropy(lt, torch.tensor(targets), ignore_index=-100, label_smoothing=0.1)
    ref.backward()
    assert abs(loss - ref.item()) <= 1e-12 * abs(ref.item())
    assert np.max(np.abs(softmax_cross_entropy_backward(1.0, cache) - lt.grad.numpy())) <= 1e-14


@pytest.mark.slow
def test_tp_dp_export_equals_pytorch(tmp_path):
    """The demo at TP 2 x DP 2 exports step 0; PyTorch recomputes loss and grads from the files alone."""
    r = run_mpi(4, ["-m", "tpsim.demo", "--tp", "2", "--dp", "2", "--steps", "0", "--vocab", "13",  # PyTorch
                    "--hidden", "16", "--heads", "2", "--dropout", "0",  # draws other dropout masks: none here
                    "--export", str(tmp_path), "--out", str(tmp_path / "out")])
    assert r.returncode == 0, r.stderr
    cfg = json.loads((tmp_path / "config.json").read_text())
    params, grads, batch = (dict(np.load(tmp_path / f)) for f in ("params.npz", "grads.npz", "batch.npz"))
    loss = json.loads((tmp_path / "step0.json").read_text())["loss"]
    t_loss, t_grads = torch_gpt2_loss(params, cfg, batch["input_ids"], batch["labels"])
    assert abs(loss - t_loss) <= 1e-12 * t_loss
    assert_grads_close(grads, t_grads)
