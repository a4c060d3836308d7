"""The run folder you can read and trust: comm.jsonl and spans.jsonl field by field, timeline.json as a valid
Chrome trace, `tpsim plot` redrawing the figures and `tpsim report` adding up to the records.

One demo run at 4 ranks (TP 2 x DP 2, 3 steps) feeds the file tests; the CLI runs as a separate process each
time, the way a user calls it.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from launch_program import ROOT, run_mpi
from tpsim.cost import wire_bytes
from tpsim.trace.module_table import module_table, scope_parts
from tpsim.trace.schema import COMM_FIELDS, SPAN_FIELDS, field_problems
from tpsim.trace.timeline import chrome_trace, clamp_nesting

# The fields the issue promises, checked here by name so the schema module cannot quietly drop one.
PROMISED = {"rank": int, "step": int, "phase": str, "scope": str, "op": str, "group": str, "group_size": int,
            "dtype": str, "shape": list, "bytes": int, "wire_bytes": int, "start_us": (int, float),
            "dur_us": (int, float)}
STEPS, TP, DP = 3, 2, 2


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def tpsim(*args):
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "tpsim.cli", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def nesting_problems(trace: dict) -> list[str]:
    """Everything that would make a viewer reject or misdraw the trace; [] when it is valid."""
    problems = []
    if trace.get("displayTimeUnit") != "ms" or not isinstance(trace.get("traceEvents"), list):
        return ["not {'traceEvents': [...], 'displayTimeUnit': 'ms'}"]
    tracks: dict[tuple, list[tuple[int, int, str]]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            if not (isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))
                    and e["ts"] >= 0 and e["dur"] >= 0):
                problems.append(f"bad ts/dur: {e}")
                continue
            begin = round(e["ts"] * 1000)  # integer ns, so float noise cannot fake an overlap
            tracks.setdefault((e["pid"], e["tid"]), []).append((begin, begin + round(e["dur"] * 1000), e["name"]))
        elif e.get("ph") != "M":
            problems.append(f"unexpected event phase {e.get('ph')!r}")
    for track, events in tracks.items():
        stack: list[tuple[int, int, str]] = []
        for begin, end, name in sorted(events, key=lambda t: (t[0], -t[1])):
            while stack and stack[-1][1] <= begin:
                stack.pop()
            if stack and end > stack[-1][1]:
                problems.append(f"track {track}: {name} [{begin}, {end}] overlaps {stack[-1][2]} "
                                f"[{stack[-1][0]}, {stack[-1][1]}] without nesting")
            stack.append((begin, end, name))
    return problems


# --- pieces, no MPI ----------------------------------------------------------------------------------------------
def test_scope_parts_keep_list_entries_together():
    assert scope_parts("transformer.h.0.attn.c_proj") == ["transformer", "h.0", "attn", "c_proj"]
    assert scope_parts("ddp.bucket3") == ["ddp", "bucket3"] and scope_parts("") == []


def test_clamp_trims_an_overhanging_child_and_the_checker_sees_the_difference():
    spans = [{"rank": 0, "step": 0, "phase": "forward", "scope": "block", "start": 1e-3, "duration": 10e-6},
             {"rank": 0, "step": 0, "phase": "forward", "scope": "block.mlp", "start": 1.005e-3, "duration": 6e-6}]
    raw = {"displayTimeUnit": "ms", "traceEvents": [
        {"ph": "X", "name": s["scope"], "pid": 0, "tid": 0, "ts": s["start"] * 1e6, "dur": s["duration"] * 1e6}
        for s in spans]}
    assert nesting_problems(raw), "the checker must catch a child that ends 1 µs after its parent"
    assert nesting_problems({"displayTimeUnit": "ms", "traceEvents": clamp_nesting(raw["traceEvents"])}) == []
    trace = chrome_trace(spans, [])
    assert nesting_problems(trace) == []
    child = next(e for e in trace["traceEvents"] if e.get("name") == "block.mlp")
    assert child["ts"] == pytest.approx(1005.0) and child["dur"] == pytest.approx(5.0)


def test_module_table_counts_every_record_once_per_rank():
    rec = dict(op="all_reduce", group="tp", duration=1e-3)
    records = [dict(rec, rank=r, phase=ph, scope=sc, bytes=b, wire_bytes=b)
               for r in (0, 1) for ph, sc, b in (("forward", "transformer.h.0.mlp.c_proj", 100),
                                                 ("backward", "transformer.h.0.mlp.c_fc", 60),
                                                 ("dp_sync", "ddp.bucket0", 7))]
    text = module_table(records)
    assert "all phases: 3 calls, 167 bytes" in text
    assert re.search(r"^      c_proj\s+1\s+100 B", text, re.M), text
    assert re.search(r"^ddp \[dp_sync\]\s+1\s+7 B", text, re.M), text


# --- one recorded run --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    r = run_mpi(4, ["-m", "tpsim.demo", "--tp", str(TP), "--dp", str(DP), "--steps", str(STEPS), "--out", str(out)])
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.mark.slow
def test_comm_jsonl_has_every_documented_field_with_its_type(run_dir):
    rows = read_jsonl(run_dir / "comm.jsonl")
    assert set(PROMISED) <= set(COMM_FIELDS), "the schema documents every promised field"
    for i, row in enumerate(rows):
        assert field_problems(row, COMM_FIELDS) == [], f"line {i + 1}: {row}"
        for name, kind in PROMISED.items():
            assert isinstance(row[name], kind) and not isinstance(row[name], bool), (i + 1, name, row[name])
    assert {r["rank"] for r in rows} == set(range(TP * DP))


@pytest.mark.slow
def test_bytes_and_wire_bytes_agree_with_the_shapes_and_the_cost_model(run_dir):
    for r in read_jsonl(run_dir / "comm.jsonl"):
        assert r["wire_bytes"] == wire_bytes(r["op"], r["bytes"], r["group_size"]), r
        assert r["group_size"] == len(r["group_ranks"]) and r["rank"] in r["group_ranks"], r
        if r["op"] not in ("gather", "barrier"):  # gather: pickled size; barrier: nothing
            assert r["bytes"] == math.prod(r["shape"]) * np.dtype(r["dtype"]).itemsize, r
        assert r["start_us"] == pytest.approx(r["start"] * 1e6, abs=1e-3) and r["dur_us"] >= 0


@pytest.mark.slow
def test_jsonl_files_load_with_pandas(run_dir):
    pd = pytest.importorskip("pandas")
    df = pd.read_json(run_dir / "comm.jsonl", lines=True)
    assert set(PROMISED) <= set(df.columns) and len(df) == len(read_jsonl(run_dir / "comm.jsonl"))
    assert set(SPAN_FIELDS) <= set(pd.read_json(run_dir / "spans.jsonl", lines=True).columns)


@pytest.mark.slow
def test_spans_jsonl_keeps_the_last_two_steps_of_every_rank(run_dir):
    spans = read_jsonl(run_dir / "spans.jsonl")
    assert all(field_problems(s, SPAN_FIELDS) == [] for s in spans)
    assert {s["step"] for s in spans} == {STEPS - 2, STEPS - 1}
    assert {s["rank"] for s in spans} == set(range(TP * DP))
    scopes = {s["scope"] for s in spans}
    assert {"", "transformer.h.1", "transformer.h.1.attn", "transformer.h.0.mlp", "lm_head", "loss"} <= scopes


@pytest.mark.slow
def test_timeline_json_is_a_chrome_trace_with_two_nested_tracks_per_rank(run_dir):
    trace = json.loads((run_dir / "timeline.json").read_text())
    assert nesting_problems(trace) == []
    events = trace["traceEvents"]
    names = {(e["pid"], e["name"]): e["args"]["name"] for e in events if e["ph"] == "M" and "tid" not in e
             and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M"
               and e["name"] == "thread_name"}
    xs = [e for e in events if e["ph"] == "X"]
    for rank in range(TP * DP):
        assert names[(rank, "process_name")] == f"rank {rank} (tp {rank % TP}, dp {rank // TP})"
        assert threads[(rank, 0)] == "compute" and threads[(rank, 1)] == "communication"
        assert any(e["pid"] == rank and e["tid"] == 0 for e in xs) and any(
            e["pid"] == rank and e["tid"] == 1 for e in xs), f"rank {rank} has both tracks filled"
    comm = [e for e in xs if e["tid"] == 1 and e["cat"] == "communication"]  # the rest: nested "wait" events
    assert all({"bytes", "wire_bytes", "group", "shape", "op", "scope", "phase", "wait_us"} <= set(e["args"])
               for e in comm)
    assert all(e["cat"] == "wait" and e["name"] == "wait" for e in xs if e["tid"] == 1 and e not in comm)
    assert all({"scope", "phase"} <= set(e["args"]) for e in xs if e["tid"] == 0)
    assert {e["args"]["step"] for e in xs} == {STEPS - 2, STEPS - 1}, "only the last two steps"
    assert sum(e["name"] == "transformer.h.0.attn" for e in xs) == 2 * 2 * TP * DP, "fwd+bwd, 2 steps, each rank"


@pytest.mark.slow
def test_plot_redraws_every_figure_from_the_files(run_dir):
    for name in ("loss.png", "comm_bytes.png", "timeline.png"):
        (run_dir / name).unlink()
    r = tpsim("plot", run_dir)
    assert r.returncode == 0, r.stderr
    for name in ("loss.png", "comm_bytes.png", "timeline.png"):
        assert (run_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert f"step {STEPS - 1}: wrote" in r.stdout


@pytest.mark.slow
def test_report_prints_the_module_tree_and_adds_up_to_the_records(run_dir):
    step = STEPS - 1
    r = tpsim("report", run_dir)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert re.search(r"-+ forward -+\s+-+ backward -+", out), out
    lines = out.splitlines()
    at: dict[str, int] = {}  # first line of each (indented) name
    for i, line in enumerate(lines):
        at.setdefault(re.match(r" *\S*", line)[0], i)
    assert at["transformer"] < at["  h.0"] < at["    attn"] < at["      c_proj"], out  # the tree, indented
    assert any(line.startswith("total ") for line in lines)
    rows = [x for x in read_jsonl(run_dir / "comm.jsonl") if x["step"] == step]
    ranks = len({x["rank"] for x in rows})
    total = re.search(r"all phases: ([\d.]+) calls, ([\d,]+) bytes, ([\d,]+) wire bytes", out)
    assert float(total[1]) == len(rows) / ranks
    assert int(total[2].replace(",", "")) == sum(x["bytes"] for x in rows) / ranks
    assert int(total[3].replace(",", "")) == sum(x["wire_bytes"] for x in rows) / ranks
    for by in ("layer", "op"):
        other = tpsim("report", run_dir, "--by", by, "--step", step)
        assert other.returncode == 0 and total[0] in other.stdout, "every view adds up to the same totals"
        assert max(map(len, other.stdout.splitlines()[1:])) <= 100, f"--by {by} fits 100 columns"
    assert max(map(len, lines[1:])) <= 100, "the module tree fits 100 columns (the title holds the run's path)"


@pytest.mark.slow
def test_report_by_kind_splits_every_layer_and_adds_up_to_its_spans(run_dir):
    step = STEPS - 1
    r = tpsim("report", run_dir, "--by", "kind")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[2].split() == ["layer", "matmul", "elementwise", "softmax_norm", "wait", "transfer", "other",
                                "total"], r.stdout
    assert max(len(line) for line in lines[2:]) <= 100, "the table fits a 100-column terminal"
    rows = {" ".join(ln.split()[:-13]): ln.split()[-13:] for ln in lines[4:] if ln.strip() and not ln.startswith("-")}
    for layer in ("transformer.h.0.attn", "transformer.h.1.mlp", "transformer.h.0.ln_1", "lm_head", "loss", "ddp"):
        assert layer in rows, r.stdout
    ms = {layer: [float(c) for c in cells[0:12:2]] + [float(cells[12])] for layer, cells in rows.items()}
    for layer, (*kinds, total) in ms.items():
        # each cell is rounded to its shown precision (0.01 ms below 100 ms, 0.1 below 1 s, 1 above)
        half_units = sum((0.01 if v < 99.995 else 0.1 if v < 999.95 else 1.0) / 2 for v in [*kinds, total])
        assert sum(kinds) == pytest.approx(total, abs=half_units + 1e-9), f"{layer}: the kinds add up to the row"
    assert ms["transformer.h.0.mlp"][0] > 0 and ms["transformer.h.0.mlp"][1] > 0, "matmul and GeLU"
    assert ms["transformer.h.0.ln_2"][2] > 0 and ms["loss"][2] > 0, "LayerNorm and cross-entropy"
    assert ms["transformer.h.0.attn"][3] + ms["transformer.h.0.attn"][4] > 0, "the TP all-reduces"
    spans = [s for s in read_jsonl(run_dir / "spans.jsonl") if s["step"] == step]
    assert {"layer", "matmul", "elementwise", "softmax_norm"} == {s["kind"] for s in spans}
    model = [s for s in spans if s["scope"] == "" and s["kind"] == "layer"]  # the forward and backward spans
    ranks = TP * DP
    in_model = sum(sum(v[:6]) for k, v in ms.items() if k not in ("total", "ddp", "batch", "loss_normalizer", "optimizer"))
    assert in_model == pytest.approx(sum(s["duration"] for s in model) * 1e3 / ranks, rel=0.01, abs=0.05)
    one = tpsim("report", run_dir, "--by", "kind", "--rank", 1)
    assert one.returncode == 0 and "rank 1" in one.stdout


@pytest.mark.slow
def test_cli_errors_are_one_line_and_exit_2(run_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "comm.jsonl").write_text('{"rank": 0}\nnot json\n')
    cases = [(("report", tmp_path / "nope"), "no run folder"), (("plot", tmp_path / "nope"), "no run folder"),
             (("report", tmp_path / "empty"), "comm.jsonl is missing"),
             (("report", tmp_path / "bad"), "line 2: not JSON"),
             (("report", run_dir, "--step", 99), "step 99 is not in"),
             (("report", run_dir, "--rank", 9), "rank 9 has no records")]
    for args, message in cases:
        r = tpsim(*args)
        errors = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(errors) == 1 and message in errors[0], (args, r.stderr)
        assert errors[0].startswith(f"tpsim {args[0]}: error: ") and "Traceback" not in r.stderr
