"""Run the partial-FC demo (``tpsim.demo.partial_fc.run``) with small sizes: 31 classes, a global batch of 32
(``python -m tpsim.demo --scenario partial-fc`` with those flags); further flags override them."""

import sys

from tpsim.comm.launch import run_main


def main() -> int:
    from tpsim.demo.cli import parse
    from tpsim.demo.partial_fc import run  # after parsing, as the demo's CLI does

    return run(parse(["--scenario", "partial-fc", "--classes", "31", "--batch-size", "32", *sys.argv[1:]]))


run_main(main, prog="partial_fc_demo")
