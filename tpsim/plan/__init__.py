"""``tpsim plan``: plan a real-size training layout from the formulas the live runs check (pure arithmetic, no MPI).

One job a module, imported in one direction (cli → search → planner → comm, timing, memory → layout, models):

    models    ModelSpec, the presets (GPT-2, GPT-3 175B, Llama-3 8B/70B/405B) and a Hugging Face config.json reader
    gpus      GPU presets: memory, peak throughput, links inside and between nodes
    layout    Layout (tp, pp, dp, sp, zero, recompute, batch, dtype, ...) and its divisibility rules
    memory    model state per parameter (Megatron's table, ZeRO-1), activations per layer (Korthikanti Table 2;
              Llama derived), pipeline micro-batches in flight (1F1B)
    comm      wire bytes per step by group (TP from tpsim.predict.formulas.predict_step, DP, PP) and their α-β time
    timing    FLOPs per step (Narayanan et al. 2021), compute time, bubble, step time with and without overlap
    planner   plan(model, layout) → the JSON-ready dict ``--json`` prints
    search    --search: every tp × pp × dp = N that fits, fastest first
    report    the readable tables
    published Narayanan et al. 2021's runs and the ZeRO paper's example beside the planner
    validate  --validate: small live layouts check every per-layer term (launches mpiexec; the ranks run ``live``)
    cli       the ``tpsim plan`` command
"""
