"""``mpirun -n 8 python -m tpsim.demo`` — the guided tour: grid, equivalence check, communication table."""
