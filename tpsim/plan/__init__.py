"""``tpsim plan``: plan a real-size training layout from the formulas the live runs check (pure arithmetic, no MPI).

One job a module, imported in one direction (cli → search → planner → pipeline → comm, timing, memory → layout,
models; memory and comm read the schedule's lists from ``tpsim.pipeline.stage_clock``):

    models    ModelSpec, the presets (GPT-2, GPT-3 175B, Llama-3 8B/70B/405B) and a Hugging Face config.json reader
    (GPU presets: tpsim.gpus)
    layout    Layout (tp, cp, pp, dp, sp, zero, recompute, batch, dtype, schedule, vp, stage_layers, ...) and its rules
    cp_shape  a context-parallel rank's attention: its query rows against the keys, the busiest rank's share
    cp_terms  context parallelism's bytes (tpsim.predict.cp_comm), link, and time the attention leaves exposed
    memory    model state per parameter (Megatron's table, ZeRO-1/2/3), activations per layer (Korthikanti
              Table 2; Llama derived), the schedule's micro-batches in flight per stage
    zero3     ZeRO's stages per parameter column (``PLANNED_ZERO_STAGES`` in layout) and ZeRO-3's pieces and their
              gathered bytes in flight; ``zero3_time``: their per-piece gathers on the comm stream, one ahead
    comm      wire bytes per step by group (TP from tpsim.predict.formulas.predict_step, DP, PP: the schedule's
              sends) and the α-β time of TP and DP
    timing    FLOPs per step (Narayanan et al. 2021) and per layer as F, B (dX), W (dW); step time with and
              without overlap
    pipeline  the schedule on the virtual clock at real size: per-stage costs from FLOPs, α-β messages; the
              bubble measured beside the formula, the p2p bytes
    planner   plan(model, layout) → a ``Plan`` (``Plan.as_dict()``: what ``--json`` prints)
    search    --search: every tp × pp × dp = N / cp that fits, fastest first (cp as given)
    report    the readable tables
    published Narayanan et al. 2021's runs and the ZeRO paper's Figure 1 (stages 0-3) beside the planner
    validate  --validate: small live layouts check every per-layer term (launches mpiexec; the ranks run ``live``)
              and, in ``validate_pipeline``, the pipeline terms on live pipelines (the ranks run ``live_pipeline``)
    of_run    a live run as the planner sees it (ModelSpec, Layout) and the costs of its ``--clock GPU`` (what
              ``--clock`` and ``--mfu`` accept: ``tpsim.config.clock_choice``)
    tp_overlap  --tp-comm-overlap's cost rule (a collective pipelined with its GEMM: its exposed time), priced by
              the live clock and ``pipeline_comm`` alike (which layouts may overlap: ``tpsim.config``)
    cli       the ``tpsim plan`` command
"""
