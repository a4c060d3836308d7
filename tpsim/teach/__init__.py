"""The guided lessons and their exercises: discovery, the lesson runtime, and the exercise checker.

    lessons/NN_name.py                jupytext percent scripts, ``mpirun -n RANKS python lessons/NN_name.py``
    lessons/exercises/exNN_name.py    a TODO stub per lesson: the key piece, left for the learner
    lessons/exercises/exNNb_name.py   a harder exercise on lesson NN's topic (04b, 06b, 08b, 11b)
    lessons/solutions/exNN_name.py    the reference answers (``tpsim check NN lessons/solutions/...`` passes)

    tpsim.teach.lessons     find lessons by file name; read each one's ``RANKS = N`` and title
    tpsim.teach.runtime     ``Lesson``: the rank check, ``CHECK ... OK`` lines, figures in ``--out``
    tpsim.teach.verdict     run a learner's function on real ranks and explain a difference
    tpsim.teach.diagnose    a wrong result described by its symptom (what a known mistake gives), never the answer
    tpsim.teach.hints       ``tpsim check NN FILE --hint``: hints one level at a time, remembered per exercise
    tpsim.teach.checks      one check per exercise (the registry ``CHECKS``), with symptoms and hint levels
    tpsim.teach.cli         ``tpsim lesson list|start|run NN`` and ``tpsim check NN [FILE] [--hint [N]]``
    tpsim.teach.workspace   the learner's folder (``$TPSIM_WORK``, ``./tpsim-work/``): ``tpsim lesson start NN``
                            copies the stubs there, ``tpsim check NN`` looks there first
    tpsim.teach.cells       a lesson's ``# %%`` cells, and the notebook JSON they make
    tpsim.teach.notebook    ``tpsim lesson notebook NN``: the cells as ``%%px`` on ipyparallel MPI engines
    tpsim.teach.run_cells   a lesson run cell by cell under mpiexec, its output marked per cell
    tpsim.teach.book        ``tpsim lesson book``: a page per lesson (prose, code, a real run, figures), an index

Adding a lesson is adding a file: ``lessons/10_sequence_parallelism.py`` that sets ``RANKS = N`` in its first code
cell, opens with the markdown line ``# # Lesson 10 — Title``, builds ``Lesson("10", RANKS)`` and ends with
``lesson.finish()``. The CLI, ``lessons/run_all.py`` and ``tests/test_lessons.py`` find it by its name. An
exercise adds the stub, the solution and a check function registered with ``@exercise("10", ...)`` (hints as
levels, the last one close to the answer, and the symptoms of its typical mistakes: ``tpsim.teach.checks``).
"""
