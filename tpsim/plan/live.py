"""The live side of ``tpsim plan --validate``: one rank of a small real run (run under ``mpiexec``).

    mpiexec -n N python -m tpsim.plan.live --tp T --dp D [--sp] [--arch gpt2|llama|nemotron] [--zero 0|1|2] [--dtype D]
                                           [--cp C --cp-comm ring|allgather|ulysses] --json PATH

Builds the toy GPT (float64, dropout 0.1 so the paper's masks exist), the toy Llama or the toy Nemotron (GQA, 2 KV
heads), runs
one traced training step of a global batch split over the DP replicas (DDP, or ZeRO-1/2 with ``--zero``), and
measures on every rank: the bytes the first layer caches (``transformer.h.0`` / ``model.layers.0``), the
parameters, gradients and optimizer state held, and the wire bytes of the step's collectives — the first
layer's TP collectives (and, with ``--cp``, its CP messages: each CP rank reads its zigzag tokens of every
sequence) and the DP gradient sync. Rank 0 writes every rank's numbers to PATH.
"""

from __future__ import annotations

import json
from pathlib import Path

from tpsim.arch import ARCH_SPELLINGS, GPTConfig, LlamaConfig, NemotronConfig, architecture
from tpsim.options import OneLineParser, count
from tpsim.zero_stage import zero_stage

TOYS = {"gpt2": GPTConfig(vocab_size=37, n_positions=16, n_embd=24, n_layer=2, n_head=4, dropout=0.1),
        "llama": LlamaConfig(vocab_size=37, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2,  # split at tp 2, replicated at tp 4
                             max_position_embeddings=16),
        "nemotron": NemotronConfig(vocab_size=37, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16),
        }  # the toy model of each architecture, by registry name
ROWS_PER_REPLICA, SEED = 2, 16


def toy_config(arch: str):
    """The toy model's config of ``arch`` (any spelling the registry accepts)."""
    return TOYS[architecture(arch).name]


def build(arch: str, grid, sp: bool, dtype=None, cp_comm: str = "ring"):
    """``(model, sequence length, dropout plan)``: the toy GPT (dropout 0.1) or the toy Llama (no dropout), in
    ``dtype`` (float64 when None); attention across ``grid.cp_group`` by ``cp_comm`` when cp > 1."""
    from tpsim.cp.context import core_for
    from tpsim.nn.dropout import DropoutPlan
    from tpsim.tp.random import ExactDropoutRNG

    cfg = toy_config(arch)
    model = architecture(arch).build(cfg, grid.tp_group, seed=SEED, dtype=dtype, sequence_parallel=sp,
                                     core=core_for(grid.cp_group, cp_comm))
    return model, cfg.max_positions, DropoutPlan(ExactDropoutRNG(SEED), 0) if cfg.dropout else DropoutPlan()


def optimizer_and_sync(model, grid, zero: int, mixed: bool = False):
    """AdamW with a DDP ``GradSync`` (dp > 1), or ZeRO-1/2's ``DistributedOptimizer``, itself the gradient sync;
    ``mixed``: AdamW inside the mixed-precision optimizer (float32 main parameters)."""
    from tpsim.train import AdamW, GradSync, mixed_precision

    if zero_stage(zero).shards_optimizer:  # tpsim.train.zero: Megatron's distributed optimizer (ZeRO-1/2/3)
        from tpsim.train.zero import DistributedOptimizer

        opt = DistributedOptimizer(AdamW(model), grid, stage=zero)
        return opt, opt
    opt = mixed_precision(model, AdamW, grid.world) if mixed else AdamW(model)
    return opt, GradSync(model, grid.dp_group) if grid.replicas > 1 else None


def worker(tp: int, dp: int, sp: bool, path: str, arch: str = "gpt2", zero: int = 0,
           dtype: str = "float64", cp: int = 1, cp_comm: str = "ring") -> int:
    import numpy as np

    from tpsim.nn.precision import dtype_of

    from tpsim.comm import ProcessGrid
    from tpsim.trace.measure import measure_activations, measure_memory
    from tpsim.train import compute_grads

    grid = ProcessGrid(tp=tp, dp=dp, cp=cp)
    model, seq, plan = build(arch, grid, sp, dtype_of(dtype), cp_comm)
    optimizer, sync = optimizer_and_sync(model, grid, zero, mixed=dtype in ("bfloat16", "float16"))
    rows = slice(grid.dp_rank * ROWS_PER_REPLICA, (grid.dp_rank + 1) * ROWS_PER_REPLICA)
    ids = np.random.default_rng(SEED).integers(0, model.config.vocab, (ROWS_PER_REPLICA * dp, seq))[rows]
    labels = np.roll(ids, -1, axis=1)
    if cp > 1:  # this CP rank's tokens of every sequence
        held = model.body().core.positions(seq // cp)
        ids, labels = np.ascontiguousarray(ids[:, held]), np.ascontiguousarray(labels[:, held])
    with grid.tracer.paused():
        _, cache = model.forward(ids, labels, plan)
    mine = measure_memory(model, optimizer, cache, exclude=(ids, labels)).as_dict()
    mine["layer"] = measure_activations(cache.transformer.h[0])  # the Llama reuses the GPT's cache types
    grid.tracer.reset()
    compute_grads(model, grid, sync, ids, labels, plan=plan)
    if zero_stage(zero).shards_optimizer:
        optimizer.step()  # ZeRO-1/2's all-gather of the updated slices belongs to the step
    events = list(grid.tracer.events)
    mine["tp_layer_wire"] = sum(e.wire_bytes for e in events if e.group in ("tp", "kv")
                                and e.scope.startswith(f"{model.config.layer_names.block}.0."))
    mine["cp_layer_wire"] = sum(e.wire_bytes for e in events if e.group == "cp"
                                and e.scope.startswith(f"{model.config.layer_names.block}.0."))
    mine["dp_grad_wire"] = sum(e.wire_bytes for e in events if e.group == "dp" and e.scope.startswith(("ddp", "zero")))
    everyone = grid.world.gather_objects(mine)
    if grid.rank == 0:
        Path(path).write_text(json.dumps(everyone))
    return 0


if __name__ == "__main__":
    parser = OneLineParser(prog="python -m tpsim.plan.live", description=worker.__doc__)
    parser.add_argument("--tp", type=count, required=True)
    parser.add_argument("--dp", type=count, default=1)
    parser.add_argument("--sp", action="store_true")
    parser.add_argument("--arch", default="gpt2", choices=ARCH_SPELLINGS)
    parser.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3),
                        help="ZeRO-1, 2 or 3 (tpsim.train.zero) instead of DDP")
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32", "bfloat16", "float16"))
    parser.add_argument("--cp", type=count, default=1)
    parser.add_argument("--cp-comm", default="ring", choices=("ring", "allgather", "ulysses"))
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    from tpsim.comm.launch import run_main

    run_main(lambda: worker(args.tp, args.dp, args.sp, args.json, args.arch, args.zero, args.dtype, args.cp,
                            args.cp_comm), prog="tpsim.plan.live")
