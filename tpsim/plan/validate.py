"""``tpsim plan --validate``: small live layouts check every per-layer term the planner uses.

Each case launches ``python -m tpsim.plan.live`` under ``mpiexec`` (``tpsim.launcher``; the toy GPT in float64,
dropout 0.1, with DDP or, where ``tpsim.train.zero`` exists, ZeRO-1; where ``tpsim.models.llama`` exists, the
toy Llama with KV heads split and replicated) and compares, on every rank, what the run measured with what the
planner's own functions give for the same model and layout at float64:

    activation bytes per layer    measure_activations(transformer.h.0's cache)  vs  Korthikanti Table 2 + rstd
    TP wire bytes per layer       the trace's transformer.h.0.* records          vs  tp_wire_bytes_per_layer
    CP wire bytes per layer       its CP messages (cp > 1: ring, allgather, ulysses) vs  tpsim.plan.cp_terms
    params, grads, optimizer      the live arrays (tpsim.predict.memory)           vs  params × bytes per parameter
    DP wire bytes per step        the trace's ddp records                        vs  dp_wire_bytes

A term matches when every rank's number equals the planner's exactly. The pipeline cases
(``tpsim.plan.validate_pipeline``: PP 2 × TP 2 1F1B, PP 2 × DP 2 interleaved vp 2, PP 4 AFAB, each on 4 ranks)
run live pipeline ranks whose virtual clock charges the planner's costs on an H100 and compare the step time
with the planner's makespan (to 1e-12 relative: a float sum in another order), the p2p bytes per replica, the
peak in flight per rank and the tied embedding's all-reduce with the planner's, exactly; a schedule the live
ranks cannot run yet (zb-h1) is listed with the reason. The FLOP count is printed as what it is: from the paper.

``CASES`` is the registry: a new feature is one more ``Case`` whose ``live_args`` the worker understands and
whose layout the planner prices. The Llama and ZeRO-1 cases join where ``tpsim.models.llama`` and
``tpsim.train.zero`` exist; the bfloat16 case runs Megatron's mixed precision (16-bit parameters and activations,
float32 main gradients, float32 main parameters and AdamW state: 2 + 4 + 12 bytes per parameter).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tpsim.config import Parallelism, arch_name, dtype_name
from tpsim.launcher import launch
from tpsim.plan.comm import dp_wire_bytes, tied_head_elements, tp_wire_bytes_per_layer
from tpsim.plan.cp_terms import layer_bytes as cp_layer_bytes
from tpsim.plan.layout import Layout
from tpsim.plan.memory import activation_bytes_per_layer, stage_param_elements, state_bytes_per_param
from tpsim.plan.of_run import model_spec
from tpsim.table import RULE, format_table

LIVE_DTYPE = "float64"  # tpsim's live runs: float64 arrays, bool dropout masks


@dataclass(frozen=True)
class Case:
    """One live layout: a ``tpsim.config.Parallelism`` (the fields a run and a ``plan.Layout`` share), the
    architecture and the dtype in ``tpsim.config``'s vocabulary (aliases accepted)."""

    name: str
    parallel: Parallelism
    arch: str = "gpt2"
    dtype: str = LIVE_DTYPE  # float64, or bfloat16 for a mixed-precision run
    not_compared: tuple[tuple[str, str], ...] = ()  # (term, why): printed, not counted
    live_args: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "arch", arch_name(self.arch))
        object.__setattr__(self, "dtype", dtype_name(self.dtype))

    @property
    def ranks(self) -> int:
        return self.parallel.world


def _case(name: str, tp: int, dp: int = 1, sp: bool = False, zero: int = 0, cp: int = 1, cp_comm: str = "ring",
          **rest) -> Case:
    par = Parallelism(tp=tp, dp=dp, sp=sp, zero=zero, cp=cp, cp_comm=cp_comm).check()
    return Case(name, par, **rest)


CASES = [_case("TP 2", 2), _case("TP 2 + SP", 2, sp=True), _case("DP 2", 1, dp=2),
         _case("TP 2 x DP 2 + SP", 2, 2, sp=True), _case("Llama TP 2", 2, arch="llama"),
         _case("Llama TP 4 + SP, KV replicated", 4, sp=True, arch="llama"), _case("ZeRO-1 TP 2 x DP 2", 2, 2, zero=1),
         _case("Nemotron TP 2 x DP 2 + SP", 2, 2, sp=True, arch="nemotron")]
BF16_CACHES = ("tpsim's 16-bit layers keep LayerNorm's x-hat, the GeLU input and the softmax probabilities in "
               "float32 (the fused-kernel inputs), where Korthikanti et al. count 2 bytes")
CASES += [_case("bfloat16 TP 2 x DP 2", 2, 2, dtype="bfloat16",  # 16-bit mixed precision (tpsim.train.mixed_precision)
                not_compared=(("activation bytes per layer", BF16_CACHES),))]
# context parallelism (tpsim.cp): each CP rank's s/cp tokens, the CP messages of a layer, gradients over DP x CP
CASES += [_case("CP 2 ring x TP 2", 2, cp=2), _case("Llama CP 2 allgather x DP 2", 1, 2, cp=2, cp_comm="allgather",
                                                     arch="llama"),
          _case("CP 2 ulysses x TP 2 + SP, ZeRO-1", 2, zero=1, sp=True, cp=2, cp_comm="ulysses")]
# ZeRO-1 in 16 bits: float32 gradients reduce-scattered, bfloat16 parameters all-gathered
CASES += [_case("ZeRO-1 bfloat16 TP 2 x DP 2", 2, 2, zero=1, dtype="bfloat16",
                not_compared=(("activation bytes per layer", BF16_CACHES),))]
# ZeRO-2 (tpsim.train.zero2): the gradients kept as owned slices only (measured at rest), ZeRO-1's bytes at m = 1
CASES += [_case("ZeRO-2 TP 2 x DP 2", 2, 2, zero=2), _case("Llama ZeRO-2 DP 4", 1, 4, zero=2, arch="llama"),
          _case("ZeRO-2 bfloat16 DP 4", 1, 4, zero=2, dtype="bfloat16",
                not_compared=(("activation bytes per layer", BF16_CACHES),))]
# ZeRO-3 (tpsim.train.zero3): the parameters too, every unit gathered before its forward and its backward
CASES += [_case("ZeRO-3 TP 2 x DP 2", 2, 2, zero=3), _case("Llama ZeRO-3 DP 4", 1, 4, zero=3, arch="llama"),
          _case("ZeRO-3 bfloat16 CP 2 x DP 2", 1, 2, zero=3, cp=2, dtype="bfloat16",
                not_compared=(("activation bytes per layer", BF16_CACHES),))]


def toy(arch: str = "gpt2"):
    """``(ModelSpec, rows per replica)`` of the live worker's toy model."""
    from tpsim.plan.live import ROWS_PER_REPLICA, toy_config

    c = toy_config(arch)
    return model_spec(c, f"toy {c.arch}"), ROWS_PER_REPLICA


def predicted_terms(case: Case) -> dict[str, int]:
    """The planner's numbers for one case, keyed like the live worker's."""
    model, rows = toy(case.arch)
    par = case.parallel
    lay = Layout(**asdict(par), seq_len=model.positions, micro_batch=rows, global_batch=rows * par.dp,
                 dtype=case.dtype)
    n = stage_param_elements(model, par.tp, 1, 0)
    per = state_bytes_per_param(case.dtype, par.zero, par.grad_replicas)  # ZeRO-1: the optimizer ÷ dp·cp
    terms = {"activation bytes per layer": activation_bytes_per_layer(model, lay)["total"],
             "TP wire bytes per layer": tp_wire_bytes_per_layer(model, lay),
             "params bytes": n * per["params"], "grads bytes": n * per["grads"],
             "optimizer bytes": round(n * per["optimizer"])}
    if par.cp > 1:
        terms["CP wire bytes per layer"] = sum(cp_layer_bytes(model, lay).values())
    if par.grad_replicas > 1:
        terms["DP wire bytes per step"] = dp_wire_bytes(lay, n, tied_head_elements(model, lay))
    return terms


def measured_terms(rank: dict) -> dict[str, int]:
    return {"activation bytes per layer": rank["layer"]["activations"] + rank["layer"]["masks"],
            "TP wire bytes per layer": rank["tp_layer_wire"], "params bytes": rank["params"],
            "grads bytes": rank["grads"], "optimizer bytes": rank["optimizer"],
            "CP wire bytes per layer": rank.get("cp_layer_wire"), "DP wire bytes per step": rank["dp_grad_wire"]}


def run_case(case: Case, folder: Path, timeout: float = 120) -> list[dict]:
    path = folder / f"{case.name.replace(' ', '_').replace('+', 'sp')}.json"
    par = case.parallel
    args = ["-m", "tpsim.plan.live", "--tp", str(par.tp), "--dp", str(par.dp), "--json", str(path),
            "--arch", case.arch, *(["--sp"] if par.sp else []), "--zero", str(par.zero),
            "--dtype", case.dtype, "--cp", str(par.cp), "--cp-comm", par.cp_comm, *case.live_args]
    run = launch(case.ranks, args, timeout=timeout)
    if run.returncode:
        raise RuntimeError(f"{case.name}: mpiexec exited with {run.returncode}\n"
                           f"{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return json.loads(path.read_text())


def check_case(case: Case, ranks: list[dict]) -> list[tuple[str, str, str, str, bool]]:
    """``(case, term, planner, measured (every rank), ok)`` for every term of one case."""
    out, skipped = [], dict(case.not_compared)
    for term, want in predicted_terms(case).items():
        if term in skipped:
            continue
        got = sorted({measured_terms(r)[term] for r in ranks})
        ok = got == [want]
        out.append((case.name, term, f"{want:,.0f}", " / ".join(f"{x:,.0f}" for x in got), ok))
    return out


PAPER = ["FLOPs per step, from the paper: 72·B·s·L·h²·(1 + s/6h + V/12Lh) (Narayanan et al. 2021, Appendix), and "
         "each kernel's seconds (tpsim.plan.kernel_time, fitted on published runs: tpsim plan --published); the "
         "pipeline cases' clocks charge the planner's own per-stage costs on both sides, so their step time checks "
         "the schedule's timing, its collectives and the overlap on live ranks, not the kernels' speed"]


def main(cases=None, pipeline_cases=None) -> int:
    """Run every case (``cases``: ``CASES``; ``pipeline_cases``: ``PIPELINE_CASES``), print the table, 0 when
    every term matches."""
    from tpsim.plan.validate_pipeline import PIPELINE_CASES, check_pipeline_case, run_pipeline_case, skipped

    cases = CASES if cases is None else cases
    pipeline_cases = PIPELINE_CASES if pipeline_cases is None else pipeline_cases
    rows, not_run = [], [(c, skipped(c)) for c in pipeline_cases]
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            rows += check_case(case, run_case(case, Path(tmp)))
        for case, why in not_run:
            if why is None:
                rows += check_pipeline_case(case, run_pipeline_case(case, Path(tmp)))
    table = [["case", "term", "planner", "measured (all ranks)", "ok"], RULE]
    table += [[c, t, want, got, "yes" if ok else "NO"] for c, t, want, got, ok in rows]
    print(format_table(table, right=(2, 3), title="tpsim plan --validate: the planner's terms vs live runs"))
    for case in cases:
        for term, why in case.not_compared:
            print(f"{case.name}, {term}: not compared — {why}")
    for case, why in not_run:
        if why is not None:
            print(f"{case.name}: not run live — {why}")
    print("\nnot compared with live runs:\n" + "\n".join("  " + line for line in PAPER))
    bad = [r for r in rows if not r[4]]
    if bad:
        print(f"VALIDATION FAILED: {len(bad)} of {len(rows)} terms differ: "
              + "; ".join(f"{c} {t}: planner {w} vs measured {g}" for c, t, w, g, _ in bad))
        return 1
    print(f"VALIDATION: all {len(rows)} terms match")
    return 0
