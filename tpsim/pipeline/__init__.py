"""Pipeline parallelism: schedules as data, checked before they run, timed on a virtual clock.

    tpsim.pipeline.actions     ``Action`` (one step of one rank: F, B, W, a send or a receive) and ``Schedule``
                               (every pipeline rank's action list), the vocabulary every schedule is written in
    tpsim.pipeline.schedules   the generators: ``build("1f1b", pp=4, microbatches=8)``; AFAB (GPipe) and 1F1B
                               here, interleaved and zero-bubble in their own files, registered in ``SCHEDULES``

Pure arithmetic, MPI-free: the planner and ``tpsim schedule`` import it without MPI; the live pipeline runs the
same lists on real ranks.
"""
