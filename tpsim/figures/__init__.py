"""The formula figures, from real runs: ``python -m tpsim.figures [--out figures/]`` (``make figures``).

For TP = 1, 2, 4, 8 (DP 1) it launches the demo under ``mpiexec`` in a subprocess — exactly what a reader
runs — reads the last step of its ``comm.jsonl``, and launches the memory worker, which builds the same toy
GPT, runs one forward and measures every live array (``tpsim.predict.memory``). Then it draws

    bytes_vs_tp.png          bytes per rank per step by phase and op: measured points on predict_step's lines
    whatif_tp_placement.png  α-β estimate of a step's communication for GPT sizes the toy runs cannot reach,
                             TP inside a node (NVLink) vs TP across nodes (InfiniBand) — the reason Megatron
                             keeps TP within the machine (Shoeybi et al., 2019, §5; Narayanan et al., 2021)
    memory_per_rank.png      measured memory per rank vs TP with our exact formulas, and the activation bytes
                             of one layer beside Korthikanti et al. (2022), Table 2
    sp_memory.png            activation memory per rank with and without sequence parallelism
    plan_*.png               ``tpsim plan`` at real sizes (memory by layout, search frontier, TP placement)

and ``figures.json`` with the numbers. Everything is seeded and the PNGs carry no timestamp, so a rerun gives
the same files. About 10 s on two cores, most of it ``mpiexec`` start-up.

One job a file, imported in one direction (cli → runs, comm, whatif, memory → style):

    cli.py     the command: measure, check every number against its formula, draw, write figures.json
    runs.py    the measured runs: the demo's trace per TP, and the memory worker (``python -m ...figures.runs``)
    comm.py    bytes_vs_tp.png                    whatif.py   whatif_tp_placement.png
    memory.py  memory_per_rank.png, sp_memory.png style.py    the toy model, TP sizes, colours, axes, saving
    plan.py    plan_memory_by_layout.png, plan_search_frontier.png, plan_tp_placement.png (no runs)

This package imports nothing on import, so ``python -m tpsim.figures.runs`` starts no plotting.
"""
