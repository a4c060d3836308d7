"""Expert parallelism: a mixture-of-experts layer whose experts live on different ranks (``tpsim.ep.moe``).

    experts.py     the experts one rank holds: E/ep of them, each cut over ETP by columns (grouped runs)
    params.py      which parameters are experts' (their gradients and norm go over the expert groups)
    shuffle.py     the permutations between token order, destination order and expert order
    dispatch.py    the token dispatchers: all-to-all-v (counts first) and all-gather/reduce-scatter
    stats.py       the auxiliary losses' statistics of sequences spread over several ranks
    moe.py         the layer: route locally, dispatch, run the local experts, combine

Importing the package imports nothing; ``experts`` and ``params`` need no MPI.
"""
