"""The demo's argument groups that only declare options: the model, the virtual clock, the overlap flags, the
files (``tpsim.demo.cli`` builds the parser from them and turns the answers into a ``RunConfig``)."""

from __future__ import annotations

from tpsim.arch import ARCH_NAMES, ARCH_SPELLINGS
from tpsim.config import DROPOUT_RNGS, DTYPE_ALIASES, DTYPE_NAMES
from tpsim.cp.choice import CP_COMMS, CP_LAYOUTS
from tpsim.options import count, fraction, probability, whole


def model_arguments(m) -> None:
    """The model group: sizes every architecture shares, then the architecture and its own (``tpsim.arch``)."""
    m.add_argument("--layers", type=count, default=2, help="transformer blocks (default 2)")
    m.add_argument("--hidden", type=count, default=64, help="hidden size h (default 64)")
    m.add_argument("--heads", type=count, default=4, help="attention heads, divisible by tp (default 4)")
    m.add_argument("--vocab", type=count, default=32, help="vocabulary size, any value (padded to a multiple of tp)")
    m.add_argument("--seq-len", type=count, default=16, help="tokens per sequence (default 16)")
    m.add_argument("--dropout", type=probability, default=None,
                   help="embedding/residual/attention dropout p (default 0.1 for gpt2, so the checks against "
                        "serial cover it; llama and nemotron have none)")
    m.add_argument("--dropout-rng", choices=DROPOUT_RNGS, default="exact",
                   help="exact: masks keyed by global position (TP equals serial); megatron: per-rank streams")
    m.add_argument("--dtype", choices=[*DTYPE_NAMES, *DTYPE_ALIASES], default="float64",
                   metavar="{" + ",".join(DTYPE_NAMES) + "}",
                   help="compute dtype; bfloat16/float16: Megatron's mixed precision (float32 main params and "
                        "grads; float16 with dynamic loss scaling)")
    m.add_argument("--arch", choices=ARCH_SPELLINGS, default="gpt2", metavar="{" + ",".join(ARCH_NAMES) + "}",
                   help="gpt2: GPT-2 blocks (default); llama: RMSNorm, SwiGLU, RoPE, grouped-query attention; "
                        "nemotron: LayerNorm1P, squared-ReLU MLP, RoPE on half of each head, grouped-query attention")
    m.add_argument("--kv-heads", type=count, default=None,
                   help="llama, nemotron: key/value heads, dividing --heads (default 2: tp > 2 replicates them)")
    m.add_argument("--ffn", type=count, default=None,
                   help="llama, nemotron: intermediate size, divisible by tp (default: llama 8h/3 rounded up to a "
                        "multiple of 32, nemotron 4h)")


def cp_arguments(g) -> None:
    """Context parallelism (``tpsim.cp``): the sequence cut over --cp ranks, attention across them."""
    g.add_argument("--cp", type=count, default=1,
                   help="context-parallel size (default 1): every sequence cut over cp ranks for every layer, "
                        "attention across them; the ranks are TP fastest, then CP, then DP, stages outermost")
    g.add_argument("--cp-comm", choices=CP_COMMS, default="ring",
                   help="how attention reaches the other shards: ring (K/V passed around, merged by log-sum-exp; "
                        "default), allgather (K/V gathered, Llama 3's choice) or ulysses (all-to-all to heads)")
    g.add_argument("--cp-layout", choices=CP_LAYOUTS, default="zigzag",
                   help="which tokens a CP rank holds: zigzag (chunks r and 2cp-1-r of 2cp: equal causal work, "
                        "default) or contiguous (one block each: the last rank works 2cp-1 times the first)")


def clock_arguments(g) -> None:
    """The pipeline's virtual clock (``tpsim.config.clock_choice``): unit costs, or the planner's on a GPU."""
    g.add_argument("--clock", default="unit", metavar="unit|GPU",
                   help="what the pipeline's virtual clock charges: unit (default: a stage's F 1, B 2, messages "
                        "free) or a GPU of tpsim plan (h100-80gb, or a unique prefix such as h100): the planner's "
                        "per-stage costs from FLOPs and alpha-beta messages for this run's layout")
    g.add_argument("--mfu", type=fraction, default=None,
                   help="with --clock GPU: every matmul at this fraction of peak (default: the planner's kernel "
                        "model, each kernel on the GPU's roofline)")


def overlap_arguments(t) -> None:
    """Megatron-LM's DP overlap flags (``tpsim.train.grad_ready``, ``tpsim.train.zero_comm``)."""
    t.add_argument("--overlap-grad-reduce", action="store_true",
                   help="issue each DP gradient bucket's all-reduce (ZeRO-1: reduce-scatter) as soon as its last "
                        "gradient is final in the last micro-batch's backward, and wait before the optimizer "
                        "(Megatron-LM's flag); bit for bit the same numbers")
    t.add_argument("--overlap-param-gather", action="store_true",
                   help="with --zero 1: post the parameter all-gather at the end of the optimizer step and wait "
                        "for it only before the next forward")


def file_arguments(o) -> None:
    """The input / output group: the run folder, the step-0 export, and the model and checkpoint files."""
    o.add_argument("--out", default="tpsim-out", help="output folder, written by rank 0 (default tpsim-out/)")
    o.add_argument("--timeline-steps", type=whole, default=2,
                   help="last steps kept in spans.jsonl and timeline.json (default 2)")
    o.add_argument("--init-from", metavar="FILE.npz|DIR", default=None,
                   help="start from these full parameters: a tpsim .npz (HF names, any TP size wrote them) or a "
                        "Hugging Face folder (config.json + model.safetensors, or an --export folder)")
    o.add_argument("--export", metavar="DIR", default=None,
                   help="write config.json, params.npz, grads.npz, batch.npz, step0.json for step 0")
    o.add_argument("--save", metavar="DIR", default=None,
                   help="after the last step, write the trained model as a Hugging Face folder (config.json + "
                        "model.safetensors), for --init-from, tpsim.generate and from_pretrained, and the training "
                        "checkpoint (optimizer.safetensors + training_state.json), for --resume")
    o.add_argument("--resume", metavar="DIR", default=None,
                   help="continue a --save folder's training on this run's layout (any TP, DP, ZeRO-1, PP): its "
                        "parameters, AdamW state and step; --steps is the total to reach")
