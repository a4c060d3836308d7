"""A program that fails on one rank while the others wait in a collective: the job must end, not hang."""

import sys

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.comm.launch import run_main


def main() -> int:
    grid = ProcessGrid(tp=1)
    if grid.rank == int(sys.argv[1]):
        raise RuntimeError(f"deliberate failure on rank {grid.rank}")
    grid.world.all_reduce(np.ones(4))  # the other ranks block here forever unless the job is aborted
    return 0


run_main(main, prog="raise_on_one_rank")
