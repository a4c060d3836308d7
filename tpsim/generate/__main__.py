from tpsim.mpi_library import exit_without_mpi

with exit_without_mpi("tpsim.generate"):  # no MPI library: one line naming the extras, not mpi4py's traceback
    from tpsim.comm.launch import run_main
    from tpsim.generate.cli import main
run_main(main, prog="tpsim.generate")
