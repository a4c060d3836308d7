"""The files of a run folder, field by field: the one place their format is written down.

A run (``python -m tpsim.demo --out DIR``) leaves in ``DIR``:

    comm.jsonl      one JSON object per collective call per rank            (COMM_FIELDS; send/recv + P2P_FIELDS;
                                                                             a --tp-comm-overlap step + OVERLAP_FIELDS)
    spans.jsonl     one JSON object per compute span per rank, last K steps (SPAN_FIELDS)
    metrics.jsonl   one JSON object per training step: step, loss, grad_norm, tokens, seconds, ...
    timeline.json   Chrome trace of the last K steps (ui.perfetto.dev, chrome://tracing), see below
    loss.png, comm_bytes.png, timeline.png      figures; ``tpsim plot DIR`` redraws them from the files

Every ``.jsonl`` loads with ``pandas.read_json(path, lines=True)`` (lists stay lists in one column).
Times are seconds (``start``, ``duration``) and microseconds (``start_us``, ``dur_us``) since a common t0
taken right after a barrier when the process grid was built, so ranks can be compared on one axis.

timeline.json: ``{"traceEvents": [...], "displayTimeUnit": "ms"}``. One process per rank (``pid`` = rank,
named "rank N (tp i, dp j)"), two threads: ``tid`` 0 "compute" (the spans) and 1 "communication" (the
collectives). Complete events ``ph: "X"`` with ``ts``/``dur`` in µs; events on one track nest. ``args`` of a
collective: scope, phase, step, op, reduce_op, group, group_ranks, dtype, shape, bytes, wire_bytes, wait_us
(``tpsim.trace.kind_split.comm_waits``), with a nested "wait" event of that length at its start when it is
over 0; of a span: scope, phase, step, kind. A span of kind "layer" is named by its scope, a mark (matmul,
elementwise, softmax_norm) by its kind, nested inside its layer.

A comm.jsonl row may also carry ``overlap`` (bool): the call was issued non-blocking to run beside compute
(``--overlap-grad-reduce`` / ``--overlap-param-gather``), recorded when issued, its duration to the end of its wait;
folders written before it have none, so it is not among the required COMM_FIELDS.
"""

from __future__ import annotations

# name: (JSON type(s) after json.loads, meaning)
COMM_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "rank": ((int,), "world rank that made the call"),
    "step": ((int,), "training step (tracer.step when the call was made)"),
    "phase": ((str,), "forward, backward (set by the f/g operators), dp_sync, optimizer, data, init, verify, "
                      "trace, ...; '' outside any region"),
    "scope": ((str,), "dotted module path of the issuing layer, e.g. transformer.h.0.mlp.c_proj; "
                      "'' at top level"),
    "op": ((str,), "all_reduce, all_gather, reduce_scatter, broadcast, gather or barrier; send or recv for a "
                   "pipeline's point-to-point message (then P2P_FIELDS too)"),
    "reduce_op": ((str,), "sum, max or min for reductions, '' otherwise"),
    "group": ((str,), "tp, dp or world; with pipelines also pp (send/recv, the loss), embedding (the tied "
                      "word embedding's gradient, first and last stage) and mp (TP x PP: the gradient norm)"),
    "group_size": ((int,), "number of ranks in the group (p)"),
    "group_ranks": ((list,), "world ranks of the group, in group-rank order"),
    "dtype": ((str,), "NumPy dtype of the tensor, e.g. float64"),
    "shape": ((list,), "shape of the logical tensor that bytes measures"),
    "bytes": ((int,), "size of the full logical tensor: all_reduce the buffer, all_gather the gathered output, "
                      "reduce_scatter the unreduced input, broadcast the buffer, gather the total pickled size"),
    "wire_bytes": ((int,), "bytes one rank sends under the ring algorithm (tpsim.cost.wire_bytes): "
                           "all_reduce 2(p-1)/p*bytes, all_gather/reduce_scatter/gather (p-1)/p*bytes, "
                           "broadcast bytes, send bytes, recv 0; 0 when p == 1"),
    "start": ((int, float), "seconds since the common t0"),
    "duration": ((int, float), "seconds spent inside the call (waiting for the others included)"),
    "start_us": ((int, float), "start in microseconds"),
    "dur_us": ((int, float), "duration in microseconds"),
}

# The fields a send or recv record carries besides COMM_FIELDS: each message is recorded once by its sender
# (op send) and once by its receiver (op recv), matched by (direction, micro-batch, sender's virtual stage).
P2P_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "peer": ((int,), "world rank at the other end of the message"),
    "microbatch": ((int,), "the pipeline micro-batch the message carries"),
    "chunk": ((int,), "the model chunk of the recording rank that sent (send) or will use (recv) it"),
}

# The fields a step of a collective pipelined with GEMMs carries besides COMM_FIELDS (--tp-comm-overlap,
# tpsim.tp.collective_matmul): its bytes, shape and wire_bytes are then the one chunk this rank sent in the step.
OVERLAP_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "gemms": ((list,), "[m, n, k] of each [m, k] x [k, n] GEMM the collective ran beside"),
    "overlap_step": ((int,), "this step of the collective, 1 .. overlap_steps"),
    "overlap_steps": ((int,), "the collective's steps: group size - 1 (the clock prices it at the last)"),
}

SPAN_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "rank": ((int,), "world rank"),
    "step": ((int,), "training step"),
    "phase": ((str,), "forward or backward"),
    "scope": ((str,), "dotted path of the module whose forward/backward this times, e.g. transformer.h.0.attn; "
                      "'' for the whole model"),
    "start": ((int, float), "seconds since the common t0"),
    "duration": ((int, float), "seconds, including any collective the module issued inside"),
    "kind": ((str,), "layer: a module's forward or backward; matmul, elementwise or softmax_norm: a mark of "
                     "tpsim.kinds inside it (scope and phase are its layer's); read by tpsim report --by kind"),
    "start_us": ((int, float), "start in microseconds"),
    "dur_us": ((int, float), "duration in microseconds"),
}


def field_problems(row: dict, fields: dict) -> list[str]:
    """What is wrong with one record: missing fields and fields of the wrong JSON type (bool is not int)."""
    problems = []
    for name, (types, _) in fields.items():
        if name not in row:
            problems.append(f"missing field {name!r}")
        elif isinstance(row[name], bool) or not isinstance(row[name], types):
            problems.append(f"field {name!r} is {type(row[name]).__name__}, expected "
                            + " or ".join(t.__name__ for t in types))
    return problems
