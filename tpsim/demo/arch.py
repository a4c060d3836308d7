"""The demo's architectures (``--arch``, from the registry ``tpsim.arch``) — flags, config, model building.

``gpt_tour`` calls these and never asks which architecture it runs: both models have the same methods
(forward/backward/loss_and_grads, named_grads, config), the same DP sync, clipping, optimizer and formulas;
what differs is the registry entry's (its config class's ``from_sizes`` and ``check``, its builders).

Llama defaults (``LlamaConfig.from_sizes``): ``--kv-heads`` 2 (grouped-query attention shows; at TP 4 each KV head
is replicated on two ranks and the ``kv`` sub-group appears in the trace), ``--ffn`` 8h/3 rounded up to a
multiple of 32 (the SwiGLU size that keeps the MLP's parameters near a 4h GeLU MLP's, as Llama does; 192 for h = 64).
"""

from __future__ import annotations

import argparse

from tpsim.arch import ARCH_NAMES, ARCH_SPELLINGS, architecture, architecture_of


def arch_name(name: str) -> str:
    """``--arch``'s value under the registry's spelling (``gpt`` -> ``gpt2``); an unknown one is left for
    argparse's choices to refuse, naming them."""
    return architecture(name).name if name in ARCH_SPELLINGS else name


def add_arguments(group) -> None:
    """``--arch``, ``--kv-heads``, ``--ffn`` in the parser's model group."""
    group.add_argument("--arch", type=arch_name, choices=ARCH_NAMES, default="gpt2",
                       help="gpt2: GPT-2 blocks (default); llama: RMSNorm, SwiGLU, RoPE, grouped-query attention")
    group.add_argument("--kv-heads", type=int, default=None,
                       help="llama: key/value heads, dividing --heads (default 2: tp > 2 replicates them)")
    group.add_argument("--ffn", type=int, default=None,
                       help="llama: intermediate size, divisible by tp (default 8h/3 rounded up to a multiple of 32)")


def sizes_config(args: argparse.Namespace):
    """The flags' model as the architecture's config (``from_sizes``: its defaults, what it refuses)."""
    return architecture(args.arch).config.from_sizes(
        vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads, max_positions=args.seq_len,
        dropout=args.dropout, kv_heads=args.kv_heads, ffn=args.ffn)


def check_arguments(args: argparse.Namespace) -> None:
    """Fill in the architecture's own size defaults; refuse what it cannot do (on every rank)."""
    config = sizes_config(args)
    for size in config.size_choices:  # Llama: --kv-heads and --ffn; GPT-2 has none to fill
        setattr(args, size, getattr(config, size))


def llama_config(args: argparse.Namespace):
    """The flags' model, checked at ``--tp`` (any architecture: the name stays for ``gpt_tour``)."""
    return sizes_config(args).check(args.tp)


def serial_model(config, seed: int, dtype):
    """The serial reference of the config's architecture."""
    return architecture_of(config).serial(config, seed=seed, dtype=dtype)


def build_model(config, group, seed: int, dtype, sequence_parallel: bool):
    """This rank's tensor-parallel model of the config's architecture."""
    return architecture_of(config).build(config, group, seed=seed, dtype=dtype, sequence_parallel=sequence_parallel)


def describe(config, tp: int) -> str:
    """The model part of the demo's header line."""
    return config.describe(tp)


def no_decay(name: str) -> bool:
    """Parameters AdamW does not decay: biases and norms (GPT-2's ln_*, Llama's *layernorm and model.norm)."""
    return name.endswith("bias") or ".ln_" in name or "norm." in name
