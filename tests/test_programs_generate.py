"""``python -m tpsim.generate`` as a user runs it: a Hugging Face folder in, tokens out (the same as serial
decoding with and without the KV cache), the trace's verdicts, and one-line errors with exit 2 on every rank."""

from __future__ import annotations

import json

import numpy as np
import pytest

from launch_program import run_mpi

from tpsim.generate.check import LOGIT_TOLERANCE, against_serial
from tpsim.generate.decode import greedy, greedy_without_cache
from tpsim.generate.run import serial_model
from tpsim.hf.folder import read_folder
from tpsim.hf.write import write_hf_folder
from tpsim.models.build import serial_gpt
from tpsim.arch.gpt2 import GPTConfig

pytestmark = pytest.mark.slow

CFG = GPTConfig(vocab_size=29, n_positions=16, n_embd=16, n_layer=2, n_head=4, initializer_range=0.5)
CACHE_FREE = "serial decoding without a cache (a full forward over positions 0..t per token): tokens equal"


def llama_config(kv_heads: int):
    from tpsim.arch.llama import LlamaConfig

    return LlamaConfig(vocab_size=29, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=16,
                       initializer_range=0.5)


def test_generate_from_a_sharded_bfloat16_folder(tmp_path):
    write_hf_folder(tmp_path, CFG, dict(serial_gpt(CFG, seed=2).named_parameters()), dtype="bfloat16", shards=2)
    r = run_mpi(4, ["-m", "tpsim.generate", "--init-from", str(tmp_path), "--prompt", "3,1,4,1,5",
                    "--max-new-tokens", "6", "--check-serial", "--json"])
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    config, tensors = read_folder(tmp_path)
    expected, _ = greedy(serial_model(config, tensors, np.float64), np.array([[3, 1, 4, 1, 5]]), 6)
    assert result["tokens"] == expected.tolist() and result["tp"] == 4 and result["arch"] == "gpt2"
    assert result["decode_collectives_per_token"] == 2 * CFG.n_layer + 3
    for line in ("VERDICT: MATCH", CACHE_FREE, "FORMULA CHECK: OK", "this rank's KV cache: ", "NVLink 4",
                 "latency share", "tie and padding rules: TP(4) argmax of 5 crafted rows"):
        assert line in r.stdout, line


def test_generate_llama_from_a_transformers_5_folder_with_replicated_kv_heads(tmp_path):
    from tpsim.models.llama import serial_llama

    cfg = llama_config(1)
    write_hf_folder(tmp_path, cfg, dict(serial_llama(cfg, seed=2).named_parameters()), dtype="float16",
                    config_overrides={"rope_theta": None,
                                      "rope_parameters": {"rope_theta": 1e4, "rope_type": "default"}})
    r = run_mpi(4, ["-m", "tpsim.generate", "--init-from", str(tmp_path), "--prompt", "3,1,4;2,7,1",
                    "--max-new-tokens", "5", "--check-serial", "--json"])
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["arch"] == "llama" and result["serial_match"] and result["formula_ok"]
    assert len(result["tokens"]) == 2 and len(result["tokens"][0]) == 5
    assert "1 (this model)" in r.stdout, "the KV table's row for this model's kv_heads"
    assert CACHE_FREE in r.stdout, "the replicated KV head against the cache-free reference"


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_check_serial_also_decodes_without_the_cache(tmp_path, arch, tp):
    """--check-serial's second reference, the training forward over positions 0..t per token, at TP 1, 2, 4;
    the Llama's 2 KV heads (of 4) are split at TP 2 and replicated at TP 4."""
    from tpsim.models.llama import serial_llama

    cfg, build = (CFG, serial_gpt) if arch == "gpt2" else (llama_config(2), serial_llama)
    write_hf_folder(tmp_path, cfg, dict(build(cfg, seed=3).named_parameters()))
    r = run_mpi(tp, ["-m", "tpsim.generate", "--init-from", str(tmp_path), "--prompt", "3,1,4;2,7,1",
                     "--max-new-tokens", "8", "--check-serial", "--json"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    config, tensors = read_folder(tmp_path)
    expected, _ = greedy_without_cache(serial_model(config, tensors, np.float64), np.array([[3, 1, 4], [2, 7, 1]]), 8)
    assert json.loads(r.stdout.strip().splitlines()[-1])["tokens"] == expected.tolist()
    assert CACHE_FREE in r.stdout and "with and without the KV cache" in r.stdout, r.stdout


def test_a_check_serial_mismatch_names_the_first_step_and_token():
    """The comparison itself (serial): one changed token at decode step 2, then one logit nudged past the bound."""
    from tpsim.models.llama import serial_llama

    model, prompt = serial_llama(llama_config(1), seed=3), np.array([[3, 1, 4], [2, 7, 1]])
    tokens, logits = greedy_without_cache(model, prompt, 5)
    logits = np.stack(logits)
    ok, lines = against_serial(model, prompt, tokens, logits, 1)
    assert ok and lines[-1].startswith("VERDICT: MATCH"), lines
    wrong = tokens.copy()
    wrong[1, 2] = (wrong[1, 2] + 1) % 29
    ok, lines = against_serial(model, prompt, wrong, logits, 1)
    assert not ok and lines[-1].startswith("VERDICT: MISMATCH"), lines
    assert f"step 2 (decode step 2, new token 3), sequence 1: token {wrong[1, 2]} vs {tokens[1, 2]}" in lines[-1]
    nudged = logits.copy()
    nudged[1, 0, 5] += 1e3 * LOGIT_TOLERANCE["float64"] * max(1.0, np.abs(logits[1]).max())
    ok, lines = against_serial(model, prompt, tokens, nudged, 1)
    assert not ok and "step 1 (decode step 1, new token 2), sequence 0" in lines[-1], lines


# one launch per case, by design: each is its own error path, and a program stops at its first error
@pytest.mark.parametrize("args,message", [
    (["--tp", "3"], "--tp 3 does not match the world size 2"),
    (["--prompt", "1,99"], "--prompt id 99 is outside the vocabulary [0, 29)"),
    (["--max-new-tokens", "20"], "needs 21 positions, the model has 16"),
    (["--pp", "2"], "--pp 2: tpsim.generate decodes with tensor parallelism only"),
])
def test_generate_errors_are_one_line(tmp_path, args, message):
    write_hf_folder(tmp_path, CFG, dict(serial_gpt(CFG, seed=2).named_parameters()))
    base = {"--prompt": "1,2"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = ["-m", "tpsim.generate", "--init-from", str(tmp_path)] + [x for kv in base.items() for x in kv]
    r = run_mpi(2, argv)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_refused_feature_names_itself(tmp_path):
    write_hf_folder(tmp_path, CFG, dict(serial_gpt(CFG, seed=2).named_parameters()),
                    config_overrides={"activation_function": "relu"})
    r = run_mpi(2, ["-m", "tpsim.generate", "--init-from", str(tmp_path), "--prompt", "1,2"])
    assert r.returncode == 2 and 'activation_function = "relu" is not supported' in r.stderr, r.stderr


def test_demo_starts_from_a_hugging_face_folder(tmp_path):
    """--init-from DIR on the demo: a bfloat16 GPT-2 folder with a longer position table, sharded at TP 2 x DP 2;
    flags that describe another model are refused with the flags that would match."""
    cfg = GPTConfig(vocab_size=13, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    folder = write_hf_folder(tmp_path / "hf", cfg, dict(serial_gpt(cfg, seed=4).named_parameters()), dtype="bfloat16")
    args = ["-m", "tpsim.demo", "--tp", "2", "--dp", "2", "--steps", "0", "--vocab", "13", "--hidden", "16",
            "--heads", "2", "--seq-len", "8", "--init-from", folder, "--export", str(tmp_path / "e"),
            "--out", str(tmp_path / "out")]
    r = run_mpi(4, args)
    assert r.returncode == 0, r.stderr
    assert "VERDICT: MATCH" in r.stdout
    _, tensors = read_folder(folder)
    exported = np.load(tmp_path / "e" / "params.npz")
    name = "transformer.h.1.mlp.c_fc.weight"
    np.testing.assert_array_equal(exported[name], tensors[name])
    np.testing.assert_array_equal(exported["transformer.wpe.weight"], tensors["transformer.wpe.weight"][:8])
    r = run_mpi(4, args[:args.index("--hidden") + 1] + ["32"] + args[args.index("--hidden") + 2:])
    assert r.returncode == 2 and "holds gpt2 --layers 2 --hidden 16 --heads 2 --vocab 13" in r.stderr, r.stderr
