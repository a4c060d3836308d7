from tpsim.comm.launch import run_main
from tpsim.generate.cli import main

run_main(main, prog="tpsim.generate")
