"""The measured runs behind the formula figures, each a real ``mpiexec`` job in a subprocess.

    measure_comm(tp, folder)    the demo at TP ``tp`` x DP 1: the records of its last step (``comm.jsonl``)
    measure_memory(tp, folder)  this module as the memory worker: every live array of one forward, per rank

The worker runs as ``mpiexec -n TP python -m tpsim.figures.runs --tp TP --json PATH``; the launching
process imports no MPI (``tpsim.launcher``), only the ranks do.
"""

from __future__ import annotations

import json
from pathlib import Path

from tpsim.launcher import launch as run_mpiexec
from tpsim.figures.style import SEED, TOY, toy_config
from tpsim.atomic import write_text
from tpsim.options import OneLineParser, count


def launch(n: int, args: list[str], timeout: float = 180) -> str:
    """``mpiexec -n N python ARGS`` (``tpsim.launcher``: killed whole on timeout); returns stdout or raises."""
    run = run_mpiexec(n, args, timeout=timeout)
    if run.returncode:
        what = f"did not finish within {timeout} s" if run.timed_out else f"exited with {run.returncode}"
        raise RuntimeError(f"mpiexec -n {n} {' '.join(args)} {what}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return run.stdout


def measure_comm(tp: int, folder: Path) -> list[dict]:
    """The demo at TP ``tp`` x DP 1 for 2 steps; the records of its last step (step 1), every rank."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TOY.items()]
    launch(tp, ["-m", "tpsim.demo", "--tp", str(tp), "--dp", "1", "--steps", "2", "--seed", str(SEED), *flags,
                "--out", str(folder)])
    records = [json.loads(line) for line in (folder / "comm.jsonl").read_text().splitlines()]
    return [r for r in records if r["step"] == 1]


def measure_memory(tp: int, folder: Path) -> dict[str, list[dict]]:
    """The memory worker at TP ``tp``: ``{"0.0" | "0.1" | "sp 0.0" | "sp 0.1": [bytes of rank 0, 1, ...]}``."""
    path = folder / f"memory_tp{tp}.json"
    launch(tp, ["-m", "tpsim.figures.runs", "--tp", str(tp), "--json", str(path)])
    return json.loads(path.read_text())


def memory_worker(tp: int, path: str) -> int:
    """Under mpiexec: one forward of the toy GPT per dropout setting, without and with sequence parallelism
    (keys "0.0", "0.1", "sp 0.0", "sp 0.1"); rank 0 writes every rank's bytes."""
    from dataclasses import replace

    from tpsim.comm import ProcessGrid
    from tpsim.data import ReverseTask
    from tpsim.models.build import build_gpt
    from tpsim.nn.dropout import DropoutPlan
    from tpsim.tp.random import ExactDropoutRNG
    from tpsim.trace.measure import measure_activations, measure_memory
    from tpsim.train import AdamW, GradSync

    grid = ProcessGrid(tp=tp)
    out = {}
    for sp, p in ((False, 0.0), (False, 0.1), (True, 0.0), (True, 0.1)):
        cfg = replace(toy_config(), dropout=p)
        model = build_gpt(cfg, grid.tp_group, seed=SEED, sequence_parallel=sp)
        GradSync(model, grid.dp_group)
        ids, labels = ReverseTask(cfg.vocab_size, TOY["seq_len"]).batch(SEED, 0, TOY["batch_size"])
        plan = DropoutPlan(ExactDropoutRNG(SEED), 0) if p else DropoutPlan()
        with grid.tracer.paused():
            _, cache = model.forward(ids, labels, plan)
        mine = measure_memory(model, AdamW(model), cache, exclude=(ids, labels)).as_dict()
        # GPT cache = (transformer, head, loss); transformer = (wte, wpe, dropout mask, [block caches], ln_f)
        mine["block0"] = measure_activations(cache.transformer.h[0])
        mine["itemsize"] = model.transformer.ln_f.params["weight"].itemsize
        out[("sp " if sp else "") + str(p)] = grid.world.gather_objects(mine)
    if grid.rank == 0:
        write_text(path, json.dumps(out))
    return 0


if __name__ == "__main__":  # the memory worker, one rank of ``measure_memory``'s mpiexec job
    parser = OneLineParser(prog="python -m tpsim.figures.runs", description=memory_worker.__doc__)
    parser.add_argument("--tp", type=count, required=True, help="tensor-parallel degree (= the world size)")
    parser.add_argument("--json", required=True, help="where rank 0 writes every rank's bytes")
    args = parser.parse_args()
    from tpsim.comm.launch import run_main

    run_main(lambda: memory_worker(args.tp, args.json), prog="tpsim.figures")  # exits
