"""Run the partial-FC demo (``tpsim.demo.partial_fc.run``) with default sizes; flags override them."""

import argparse

from tpsim.comm.launch import run_main


def main() -> int:
    p = argparse.ArgumentParser(prog="partial_fc_demo")
    p.add_argument("--out", default="tpsim-out")
    p.add_argument("--classes", type=int, default=31)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    args = p.parse_args()

    from tpsim.demo.partial_fc import run  # after parsing, as the demo's CLI does

    return run(args)


run_main(main, prog="partial_fc_demo")
