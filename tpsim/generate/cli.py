"""``mpirun -n N python -m tpsim.generate --init-from DIR --prompt 1,2,3 --max-new-tokens K [--tp N] [--json]``

DIR is a Hugging Face folder or a tpsim ``--export`` folder (GPT-2 or Llama). Every rank reads it and keeps its
shard; the N ranks form one TP group (data parallelism would only decode independent prompts side by side, so
it is refused: launch with -n equal to --tp). Prints the new token ids, then what the trace says (see
``tpsim.generate.report``); with ``--json`` the last line is ``{"tokens": [...], ...}``. It always generates
``--max-new-tokens`` tokens: there is no tokenizer here, and no stop at an end-of-sequence id. ``--check-serial``
also decodes with the serial model on rank 0, with the KV cache and without one (a full forward over the whole
prefix per token), compares tokens and each step's logits with the TP decode's (``tpsim.generate.check``) and
prints MATCH, or MISMATCH naming the first step and token that differ (exit 1).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from tpsim.errors import ConfigError
from tpsim.comm.launch import world_size
from tpsim.options import RankZeroParser, count


def build_parser() -> RankZeroParser:
    p = RankZeroParser(prog="python -m tpsim.generate",
                       description="Greedy decoding with tensor parallelism and a per-rank KV cache.")
    p.add_argument("--init-from", metavar="DIR", required=True,
                   help="a Hugging Face folder (config.json + model.safetensors) or a tpsim --export folder")
    p.add_argument("--tp", type=count, default=None,
                   help="tensor-parallel size (default and only value: the world size)")
    p.add_argument("--pp", type=count, default=1,
                   help="pipeline stages: 1 only (decoding runs one token at a time through every layer, so a "
                        "pipeline of p stages would leave p - 1 of them idle; train with --pp, then generate "
                        "from the --save folder at any --tp)")
    p.add_argument("--prompt", required=True,
                   help="token ids, comma-separated (1,2,3); several prompts of one length: 1,2;3,4")
    p.add_argument("--max-new-tokens", type=count, default=8, help="tokens to generate (default 8)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float64", help="compute dtype")
    p.add_argument("--check-serial", action="store_true",
                   help="also decode serially on rank 0, with and without the KV cache, and compare tokens and logits")
    p.add_argument("--json", action="store_true", help='end with one JSON line {"tokens": [...], ...}')
    return p


def parse_prompt(text: str) -> np.ndarray:
    """``"1,2,3"`` -> ``[[1, 2, 3]]``; ``"1,2;3,4"`` -> two prompts (one length)."""
    try:
        rows = [[int(t) for t in part.split(",")] for part in text.split(";")]
    except ValueError as exc:
        raise ConfigError(f"--prompt must be comma-separated integers (prompts split by ';'), got {text!r}") from exc
    if len({len(r) for r in rows}) != 1:
        raise ConfigError(f"--prompt: every prompt must have the same length, got {[len(r) for r in rows]}")
    return np.array(rows, dtype=np.int64)


def parse(argv: list[str] | None = None):
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.pp != 1:
        raise ConfigError(f"--pp {args.pp}: tpsim.generate decodes with tensor parallelism only (one token at a time "
                          "through every layer, a pipeline would leave all but one stage idle); a pipeline run's "
                          "--save folder generates at any --tp")
    args.tp = world_size() if args.tp is None else args.tp
    if args.tp != world_size():
        raise ConfigError(f"--tp {args.tp} does not match the world size {world_size()}: tpsim.generate runs one "
                          f"TP group (launch with mpirun -n {args.tp})")
    args.prompt_ids = parse_prompt(args.prompt)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from tpsim.generate.run import run  # after parsing: --help and flag errors stay fast

    result, lines, ok = run(args)
    if result is not None:  # rank 0
        print("\n".join(lines), flush=True)
        if args.json:
            print(json.dumps(result), flush=True)
    return 0 if ok else 1
