"""The demo's two architectures: ``--arch gpt2`` (default) and ``--arch llama`` — flags, config, model building.

``gpt_tour`` calls these and never asks which architecture it runs: both models have the same methods
(forward/backward/loss_and_grads, named_grads, config), the same DP sync, clipping, optimizer and formulas.

Llama defaults: ``--kv-heads`` 2 (grouped-query attention shows; at TP 4 each KV head is replicated on two
ranks and the ``kv`` sub-group appears in the trace), ``--ffn`` 8h/3 rounded up to a multiple of 32 (the
SwiGLU size that keeps the MLP's parameters near a 4h GeLU MLP's, as Llama does; 192 for h = 64).
"""

from __future__ import annotations

import argparse

from tpsim.errors import ConfigError

ARCHS = ("gpt2", "llama")


def add_arguments(group) -> None:
    """``--arch``, ``--kv-heads``, ``--ffn`` in the parser's model group."""
    group.add_argument("--arch", choices=ARCHS, default="gpt2",
                       help="gpt2: GPT-2 blocks (default); llama: RMSNorm, SwiGLU, RoPE, grouped-query attention")
    group.add_argument("--kv-heads", type=int, default=None,
                       help="llama: key/value heads, dividing --heads (default 2: tp > 2 replicates them)")
    group.add_argument("--ffn", type=int, default=None,
                       help="llama: intermediate size, divisible by tp (default 8h/3 rounded up to a multiple of 32)")


def check_arguments(args: argparse.Namespace) -> None:
    """Fill in the Llama defaults; refuse what the chosen architecture cannot do (on every rank)."""
    if args.arch != "llama":
        for flag in ("kv_heads", "ffn"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')} is for --arch llama")
        return
    if args.dropout:
        raise ConfigError("--arch llama has no dropout (Llama's attention and residual dropouts are 0)")
    if args.kv_heads is None:
        args.kv_heads = 2 if args.heads % 2 == 0 else args.heads
    if args.ffn is None:
        args.ffn = -(-8 * args.hidden // 3 // 32) * 32
    for flag in ("kv_heads", "ffn"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")


def llama_config(args: argparse.Namespace):
    from tpsim.arch.llama import LlamaConfig

    return LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                       num_hidden_layers=args.layers, num_attention_heads=args.heads,
                       num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq_len).check(args.tp)


def is_llama(config) -> bool:
    return hasattr(config, "num_key_value_heads")


def serial_model(config, seed: int, dtype):
    """The serial reference of either architecture."""
    if is_llama(config):
        from tpsim.models.llama import serial_llama
        return serial_llama(config, seed=seed, dtype=dtype)
    from tpsim.models.build import serial_gpt
    return serial_gpt(config, seed=seed, dtype=dtype)


def build_model(config, group, seed: int, dtype, sequence_parallel: bool):
    """This rank's tensor-parallel model of either architecture."""
    if is_llama(config):
        from tpsim.models.llama import build_llama
        return build_llama(config, group, seed=seed, dtype=dtype, sequence_parallel=sequence_parallel)
    from tpsim.models.build import build_gpt
    return build_gpt(config, group, seed=seed, dtype=dtype, sequence_parallel=sequence_parallel)


def describe(config, tp: int) -> str:
    """The model part of the demo's header line."""
    if not is_llama(config):
        return (f"GPT: {config.n_layer} layers, hidden {config.n_embd}, {config.n_head} heads "
                f"({config.n_head // tp} per TP rank)")
    kv, rep = config.num_key_value_heads, max(tp // config.num_key_value_heads, 1)
    kv_text = f"{max(kv // tp, 1)} per TP rank" + (f", each replicated on {rep} ranks" if rep > 1 else "")
    return (f"Llama: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
            f"{config.num_attention_heads} heads ({config.num_attention_heads // tp} per TP rank), "
            f"{kv} KV heads ({kv_text}), ffn {config.intermediate_size}")


def no_decay(name: str) -> bool:
    """Parameters AdamW does not decay: biases and norms (GPT-2's ln_*, Llama's *layernorm and model.norm)."""
    return name.endswith("bias") or ".ln_" in name or "norm." in name
