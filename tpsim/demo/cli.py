"""Command line of the demo: flags, validation on every rank, and the choice of TP × DP.

Invalid values raise ``ConfigError`` on every rank before any collective; ``run_main`` prints it once and
exits 2 on all ranks (one line, no traceback, no hang). Flags are stable: later features add, never rename.
"""

from __future__ import annotations

import argparse
import sys
from math import gcd

from tpsim.comm import ConfigError
from tpsim.comm.launch import world_rank, world_size


class RankZeroParser(argparse.ArgumentParser):
    """argparse that prints help on rank 0 only and turns usage errors into ``ConfigError``."""

    def print_help(self, file=None):
        if world_rank() == 0:
            super().print_help(file)

    def error(self, message):
        raise ConfigError(message)


def build_parser() -> RankZeroParser:
    p = RankZeroParser(prog="python -m tpsim.demo",
                       description="Tensor parallelism on real MPI ranks: the rank grid, a check against the "
                                   "serial model, and where every byte of communication goes.")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: 4 if it divides the world)")
    p.add_argument("--dp", type=int, default=None, help="data-parallel size (default: world / tp)")
    p.add_argument("--hidden", type=int, default=64, help="hidden size h (default 64)")
    p.add_argument("--tokens", type=int, default=32, help="tokens per TP group for the MLP check (default 32)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the master weights and data")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float64", help="compute dtype")
    p.add_argument("--out", default="tpsim-out", help="output folder, written by rank 0 (default tpsim-out/)")
    return p


def choose_grid(world: int, tp: int | None, dp: int | None) -> tuple[int, int]:
    """Fill in whichever of tp/dp is missing; default TP is gcd(world, 4): 8 ranks → TP 4 × DP 2."""
    for name, v in (("--tp", tp), ("--dp", dp)):
        if v is not None and v < 1:
            raise ConfigError(f"{name} must be >= 1, got {v}")
    if tp is None and dp is None:
        tp = gcd(world, 4)
    if tp is None:
        if world % dp:
            raise ConfigError(f"world size {world} is not divisible by --dp {dp}")
        tp = world // dp
    if dp is None:
        if world % tp:
            raise ConfigError(f"world size {world} is not divisible by --tp {tp} (world must equal tp x dp)")
        dp = world // tp
    if tp * dp != world:
        raise ConfigError(f"--tp {tp} x --dp {dp} = {tp * dp} does not match the world size {world} "
                          f"(launch with mpirun -n {tp * dp})")
    return tp, dp


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    args.tp, args.dp = choose_grid(world_size(), args.tp, args.dp)
    for name in ("hidden", "tokens"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> int:
    from tpsim.demo.mlp_tour import run  # imported after parsing so --help stays fast

    return run(parse(argv))
