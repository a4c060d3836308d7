"""Pipeline parallelism: schedules as data, checked before they run, timed on a virtual clock.

    tpsim.pipeline.actions      ``Action`` (one step of one rank: F, B, W, a send or a receive) and ``Schedule``
                                (every pipeline rank's action list), the vocabulary every schedule is written in
    tpsim.pipeline.schedules    the generators: ``build("1f1b", pp=4, microbatches=8)``; AFAB (GPipe) and 1F1B
                                there, all four in ``SCHEDULES``
    tpsim.pipeline.interleaved  interleaved 1F1B, v model chunks per rank (Narayanan et al. 2021 §2.2.2, Megatron-LM)
    tpsim.pipeline.zero_bubble  ZB-H1, backward split into B and W (Qi et al. 2023)
    tpsim.pipeline.check        ``check(schedule)``: every send its receive, every micro-batch its work, no
                                deadlock — or one line saying which rank and action is wrong
    tpsim.pipeline.cost_rule    the one rule every clock times an action by: start = max(rank free, input there)
    tpsim.pipeline.clock        ``simulate(schedule, costs)``: the virtual clock; bubble, busy/idle, in flight, bytes
    tpsim.pipeline.stage_clock  the planner's clock: the compute orders compiled once, timed by the same rule
    tpsim.pipeline.grid         the time × rank grid as text;  tpsim.pipeline.figure  the same drawn (matplotlib)

Pure arithmetic, MPI-free: the planner and ``tpsim schedule`` (``tpsim.schedule_cli``, above both this package and
the closed formulas it prints beside the clock) import it without MPI; the live pipeline runs the same lists on
real ranks. The closed formulas the clock is checked against live in ``tpsim.predict.pipeline``.
"""
