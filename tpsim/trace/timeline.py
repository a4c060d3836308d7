"""A run as a timeline: every rank's compute spans and collectives on one clock.

Two outputs from the same records (``spans.jsonl`` + ``comm.jsonl``):

    chrome_trace(...)   -> timeline.json   Chrome trace format: opens in ui.perfetto.dev and chrome://tracing
    plot_timeline(...)  -> timeline.png    one step, one row per rank, compute above, collectives below

In the Chrome trace each rank is a process (``pid`` = rank) with two threads: ``tid`` 0 "compute" (layer
spans, and inside them the ``tpsim.kinds`` marks: matmul, elementwise, softmax_norm) and ``tid`` 1
"communication" (each collective, with a nested "wait" event for the time it waited for its group); a run with
``--overlap-grad-reduce`` / ``--overlap-param-gather`` adds ``tid`` 2 "communication (overlapped)": each
collective issued non-blocking, from its issue to the end of its wait (it overlaps the others: its own track).
A pipeline run adds one more process, "virtual clock" (``virtual_clock_events``): a thread per pipeline rank of
rank 0's pipeline, one event per F, B and W at its start and end on the live virtual clock
(``tpsim.live_pipeline.clock``) and a "wait" event where a receive waited for its message; under a GPU clock also the
collectives after the schedule (the loss broadcast, the embedding's all-reduce, the DP sync: from the rank's clock to
their end at the group's latest clock plus their cost), and a "comm" thread per pipeline rank: the DP gradient buckets
on its comm stream (``tpsim.pipeline.overlap``), the compute thread's "DP exposed" (or "DP sync") the part it waited
for. The steps kept follow one another from 0 (the optimizer, between them, is not on that clock). A GPU clock's
modelled seconds are drawn as seconds, the unit clock's units as milliseconds (the process name says which).
``timeline.png`` draws the layer spans only. The viewers draw a track's events as a stack, so events on one track must *nest*
(a child inside its parent, never a partial overlap). Spans recorded by one rank nest by construction (one
clock; a parent's starts before and stops after its children's), and times are rounded end by end, which
keeps that order; ``clamp_nesting`` still trims any overhang, so a merged or edited file cannot misdraw.
"""

from __future__ import annotations

import json
from pathlib import Path

from tpsim.kinds import LAYER
from tpsim.phases import BACKWARD, DATA, DP_SYNC, FORWARD, OPTIMIZER
from tpsim.trace.kind_split import comm_waits
from tpsim.trace.records import grid_of
from tpsim.atomic import save_figure, write_text

COMPUTE_TID, COMM_TID, OVERLAP_TID = 0, 1, 2
VIRTUAL_COMM_TID = 1000  # + pipeline rank: the virtual clock's comm stream of that rank (DP buckets)
UNIT_DRAWN_AS = 1e-3  # seconds of the trace's time axis one unit of the unit clock is drawn as
PHASE_COLORS = {DATA: "#BBBBBB", FORWARD: "#A6CEE3", DP_SYNC: "#B2DF8A", BACKWARD: "#FDBF6F", OPTIMIZER: "#CAB2D6"}
LAYER_COLORS = {"embedding": "#F6D55C", "layernorm": "#B39DDB", "attention": "#F28E2B", "mlp": "#59A14F",
               "lm_head": "#E15759", "loss": "#76B7B2", "block": "#D0D0D0", "transformer": "#E8E8E8",
               "other": "#F4F4F4"}


def rank_label(rank: int, coords: dict[int, tuple[int, ...]]) -> str:
    """``rank 5 (tp 1, dp 1)`` (``, pp 1`` in a pipeline); just ``rank 5`` when the records do not say where it
    sits."""
    if rank not in coords:
        return f"rank {rank}"
    c = coords[rank]
    return f"rank {rank} (tp {c[0]}, dp {c[1]}" + (f", pp {c[2]})" if len(c) > 2 else ")")


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _complete(name: str, cat: str, pid: int, tid: int, start: float, duration: float, args: dict) -> dict:
    # Round the *end* too, not the duration: rounding is monotone, so back-to-back events stay back to back.
    begin, end = _ns(start), _ns(start + duration)
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": begin / 1000,
            "dur": max(0, end - begin) / 1000, "args": args}


def clamp_nesting(events: list[dict]) -> list[dict]:
    """Sort one track's X events parent-first and trim any event that ends after the event containing it."""
    events = sorted(events, key=lambda e: (round(e["ts"] * 1000), -round(e["dur"] * 1000)))
    open_ends: list[int] = []  # ends (ns) of the events that contain the current one
    for e in events:
        begin, end = round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)
        while open_ends and open_ends[-1] <= begin:
            open_ends.pop()
        if open_ends and end > open_ends[-1]:
            end = open_ends[-1]
            e["dur"] = (end - begin) / 1000
        open_ends.append(end)
    return events


def span_name(span: dict) -> str:
    if span.get("kind", LAYER) != LAYER:
        return span["kind"]  # a mark: its layer is the span around it (and its args' scope)
    return span["scope"] or span["phase"]  # the whole model's span is named by its phase


def collective_args(rec: dict) -> dict:
    keys = ("scope", "phase", "step", "op", "reduce_op", "group", "group_ranks", "dtype", "shape", "bytes",
            "wire_bytes")
    return {k: rec[k] for k in keys}


def virtual_clock_events(virtual: dict, pid: int, steps) -> list[dict]:
    """The "virtual clock" process ``pid`` of a pipeline run (module docstring). ``virtual``: ``clock`` (in
    words), ``seconds`` (a GPU clock: modelled seconds; else units), ``ranks`` (world rank of each pipeline rank)
    and ``tracks[pipeline rank][step]``, that rank's ``(op, micro-batch, chunk, start, end)`` spans of the step
    (``tpsim.live_pipeline.clock.VirtualSpan``), kept for ``steps`` only."""
    scale = 1.0 if virtual["seconds"] else UNIT_DRAWN_AS
    drawn = "modelled seconds" if virtual["seconds"] else "1 unit drawn as 1 ms"
    events = [{"ph": "M", "pid": pid, "name": "process_name",
               "args": {"name": f"virtual clock: {virtual['clock']} ({drawn})"}},
              {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}}]
    kept = sorted(set(steps).intersection(*(track.keys() for track in virtual["tracks"])))
    offsets, at = {}, 0.0
    for step in kept:  # each step from where the one before ended on its slowest rank
        offsets[step] = at
        at += max((span[4] for track in virtual["tracks"] for span in track[step]), default=0.0)
    for stage, (rank, track) in enumerate(zip(virtual["ranks"], virtual["tracks"])):
        events += [{"ph": "M", "pid": pid, "tid": stage, "name": "thread_name",
                    "args": {"name": f"pipeline rank {stage} (world rank {rank})"}},
                   {"ph": "M", "pid": pid, "tid": stage, "name": "thread_sort_index", "args": {"sort_index": stage}}]
        if any(span[2] < 0 for step in kept for span in track[step]):
            tid = VIRTUAL_COMM_TID + stage
            events += [{"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                        "args": {"name": f"pipeline rank {stage} comm (DP buckets)"}},
                       {"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}]
        for step in kept:
            for op, j, chunk, start, end in track[step]:
                args = {"step": step, "microbatch": j, "chunk": chunk, "virtual_start": start, "virtual_end": end}
                if chunk < 0:  # the comm stream (tpsim.live_pipeline.clock.LiveClock.comm_spans): a DP bucket
                    events.append(_complete(op, "comm stream", pid, VIRTUAL_COMM_TID + stage,
                                            (offsets[step] + start) * scale, (end - start) * scale, args))
                    continue
                if j < 0:  # a collective after the schedule (tpsim.live_pipeline.step): this rank's clock to its end
                    name, cat = op, "collective"
                elif op.startswith("RECV"):
                    if end <= start:
                        continue  # the message was there: no wait
                    what = "activation" if op == "RECV_F" else "gradient"
                    name, cat = "wait", "idle"
                    args["for"] = f"micro-batch {j}'s {what} (chunk {chunk})"
                else:
                    name, cat = f"{op}{j}" + (f".{chunk}" if chunk else ""), "virtual"
                events.append(_complete(name, cat, pid, stage, (offsets[step] + start) * scale,
                                        (end - start) * scale, args))
    return events


def chrome_trace(spans: list[dict], records: list[dict], steps=None, virtual: dict | None = None) -> dict:
    """The Chrome trace of ``steps`` (default: every step that has spans) from every rank; ``virtual``: a pipeline
    run's virtual-clock tracks (``virtual_clock_events``), drawn as one more process."""
    if steps is None:
        steps = {s["step"] for s in spans}
    steps = set(steps)
    coords = grid_of(records)  # from every record: a rank's groups show in the init broadcasts too
    spans = [s for s in spans if s["step"] in steps]
    comms = [r for r in records if r["step"] in steps]
    waits = comm_waits(comms)
    ranks = sorted({s["rank"] for s in spans} | {r["rank"] for r in comms})
    meta = []
    for rank in ranks:
        meta += [{"ph": "M", "pid": rank, "name": "process_name", "args": {"name": rank_label(rank, coords)}},
                 {"ph": "M", "pid": rank, "name": "process_sort_index", "args": {"sort_index": rank}}]
        threads = [(COMPUTE_TID, "compute"), (COMM_TID, "communication")]
        if any(r.get("overlap") for r in comms if r["rank"] == rank):
            threads.append((OVERLAP_TID, "communication (overlapped)"))
        for tid, name in threads:
            meta += [{"ph": "M", "pid": rank, "tid": tid, "name": "thread_name", "args": {"name": name}},
                     {"ph": "M", "pid": rank, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}]
    tracks: dict[tuple[int, int], list[dict]] = {}
    for s in spans:
        tracks.setdefault((s["rank"], COMPUTE_TID), []).append(
            _complete(span_name(s), "compute", s["rank"], COMPUTE_TID, s["start"], s["duration"],
                      {"scope": s["scope"], "phase": s["phase"], "step": s["step"], "kind": s.get("kind", LAYER)}))
    for r, wait in zip(comms, waits):
        if r.get("overlap"):  # issued non-blocking: from its issue to the end of its wait, beside the others
            tracks.setdefault((r["rank"], OVERLAP_TID), []).append(
                _complete(f"{r['op']} {r['group']}", "communication", r["rank"], OVERLAP_TID, r["start"],
                          r["duration"], dict(collective_args(r), overlap=True)))
            continue
        track = tracks.setdefault((r["rank"], COMM_TID), [])
        track.append(_complete(f"{r['op']} {r['group']}", "communication", r["rank"], COMM_TID, r["start"],
                               r["duration"], dict(collective_args(r), wait_us=round(wait * 1e6, 3))))
        if wait > 0:
            track.append(_complete("wait", "wait", r["rank"], COMM_TID, r["start"], wait,
                                   {"scope": r["scope"], "phase": r["phase"], "step": r["step"],
                                    "for": f"the last of {r['group']} group {r['group_ranks']} to arrive"}))
    events = meta + [e for key in sorted(tracks) for e in clamp_nesting(tracks[key])]
    if virtual is not None:
        events += virtual_clock_events(virtual, max(ranks, default=-1) + 1, steps)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "tpsim", "steps": sorted(steps)}}


def write_chrome_trace(trace: dict, path: str | Path) -> Path:
    path = Path(path)
    return write_text(path, json.dumps(trace, separators=(",", ":")) + "\n")


def layer_sort(scope: str) -> str:
    """What sort of layer a span times, for its colour: ``transformer.h.0.ln_2`` → ``layernorm``."""
    last = scope.rsplit(".", 1)[-1]
    if last in ("wte", "wpe"):
        return "embedding"
    if last.startswith("ln"):
        return "layernorm"
    if last in ("attn", "mlp", "lm_head", "loss", "transformer"):
        return {"attn": "attention"}.get(last, last)
    if last.isdigit():
        return "block"
    return "other"


def _depths(spans: list[dict]) -> list[tuple[int, dict]]:
    """(nesting depth, span) for one rank's spans, parents first."""
    out, ends = [], []
    for s in sorted(spans, key=lambda s: (s["start"], -s["duration"])):
        while ends and ends[-1] <= s["start"]:
            ends.pop()
        out.append((len(ends), s))
        ends.append(s["start"] + s["duration"])
    return out


def _boxes(ax, boxes: list[tuple[float, float, float, float, str]], alpha: float = 1.0) -> None:
    """Rectangles ``(x, width, y, height, colour)`` as one collection, drawn in list order (later on top):
    one artist instead of hundreds keeps the figure quick to draw."""
    from matplotlib.collections import PolyCollection

    verts = [[(x, y), (x + w, y), (x + w, y + h), (x, y + h)] for x, w, y, h, _ in boxes]
    ax.add_collection(PolyCollection(verts, facecolors=[b[4] for b in boxes], linewidths=0, alpha=alpha))


def plot_timeline(spans: list[dict], records: list[dict], step: int, path: str | Path, title: str = "") -> Path:
    """One training step, a row per rank: phases shaded, layer spans above, collectives (by op) below."""
    from matplotlib.patches import Patch

    from tpsim.plotting import pyplot
    from tpsim.trace.plots import OP_COLORS

    plt = pyplot()
    # layer spans only (marks would crowd the lane); the whole-model span is the phase shading
    spans = [s for s in spans if s["step"] == step and s["scope"] and s.get("kind", LAYER) == LAYER]
    comms = [r for r in records if r["step"] == step]
    ranks = sorted({s["rank"] for s in spans} | {r["rank"] for r in comms})
    timed = spans + comms
    t0 = min((x["start"] for x in timed), default=0.0)
    t1 = max((x["start"] + x["duration"] for x in timed), default=t0 + 1e-3)
    ms = lambda x: ((x["start"] - t0) * 1e3, x["duration"] * 1e3)  # noqa: E731 - (left, width) in ms
    coords = grid_of(records)
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(ranks) + 1.8))
    bands, bars = [], []
    for row, rank in enumerate(ranks):
        mine = [x for x in timed if x["rank"] == rank]
        for phase, color in PHASE_COLORS.items():  # a phase's extent on this rank, as a faint band
            xs = [x for x in mine if x["phase"] == phase]
            if xs:
                left = min(x["start"] for x in xs)
                right = max(x["start"] + x["duration"] for x in xs)
                bands.append(((left - t0) * 1e3, (right - left) * 1e3, row - 0.48, 0.96, color))
        for _, s in _depths([s for s in spans if s["rank"] == rank]):  # children drawn over their parents
            bars.append((*ms(s), row - 0.4, 0.45, LAYER_COLORS[layer_sort(s["scope"])]))
        bars += [(*ms(r), row + 0.1, 0.3, OP_COLORS.get(r["op"], "#333333")) for r in mine if "op" in r]
    _boxes(ax, bands, alpha=0.35)
    _boxes(ax, bars)
    ax.set_xlim(0, (t1 - t0) * 1e3 * 1.01)
    ax.set_yticks(range(len(ranks)), [rank_label(r, coords) for r in ranks], fontsize=8)
    ax.set_ylim(len(ranks) - 0.5, -0.5)
    ax.set_xlabel(f"ms since the start of step {step}  (upper lane: compute spans, lower lane: collectives)")
    ax.grid(axis="x", alpha=0.3)
    kinds = sorted({layer_sort(s["scope"]) for s in spans}, key=list(LAYER_COLORS).index)
    ops = [op for op in OP_COLORS if any(r["op"] == op for r in comms)]
    phases = [p for p in PHASE_COLORS if any(x["phase"] == p for x in timed)]
    handles = ([Patch(color=PHASE_COLORS[p], alpha=0.35, label=p) for p in phases]
               + [Patch(color=LAYER_COLORS[k], label=k) for k in kinds]
               + [Patch(color=OP_COLORS[o], label=o) for o in ops])
    ncol = min(len(handles), 8)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=7, frameon=False)
    ax.set_title(title or f"timeline of step {step}")
    legend_in = 0.2 * (-(-len(handles) // ncol)) + 0.15 if handles else 0.0  # legend rows, in inches
    fig.tight_layout(rect=(0, legend_in / fig.get_figheight(), 1, 1))
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return Path(path)
