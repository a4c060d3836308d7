from tpsim.comm.launch import run_main
from tpsim.demo.cli import main

run_main(main, prog="tpsim.demo")
