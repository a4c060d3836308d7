"""The exercise checks under fire, for ``tests/test_checker_properties.py``: what each compare sees, and the
verdicts on learners whose functions return wrong answers of every kind.

    mpiexec -n N python tests/programs/checks_under_fire.py OUT NN [NN ...]

For each exercise NN (run at its lesson's rank count, N):

1. capture: the check runs with the reference solution; every rank writes ``OUT/NN.RANK.pkl``, the list of what
   each of its ``Report.compare`` calls saw (what, got, expected, tol, symptoms, layout) — the exercise's real
   answers, for the in-process properties, without a line of the check repeated there;
2. fire: for each plan of ``OUT/NN.plans.pkl`` (a list of plans, each a list of specs of ``tests/wrong_answers.py``,
   the same file on every rank) a learner's file whose functions return the plan's values, spec after spec, is
   checked the way ``tpsim check`` checks it; rank 0 prints one JSON line ``{"number", "plan", "status", "text"}``.

A traceback anywhere ends the job with a non-zero status (``run_main``): the test fails on it.
"""

import contextlib
import io
import json
import pickle
import sys
from pathlib import Path

from tpsim.comm.agree import Agreement
from tpsim.comm.launch import run_main
from tpsim.teach.checks import CHECKS
from tpsim.teach.lessons import exercise_files
from tpsim.teach.verdict import Report, load, run

TESTS = Path(__file__).resolve().parent.parent

LEARNER = """import sys
sys.path.insert(0, {tests!r})
from wrong_answers import learner_functions
globals().update(learner_functions({solution!r}, {plan!r}, {names!r}))
"""


class Recorder(Report):
    """A Report that keeps what every compare saw (pickled at once: a check may reuse its arrays)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.records: list[bytes] = []

    def compare(self, what, got, expected, tol=1e-10, symptoms=None, layout=None) -> bool:
        self.records.append(pickle.dumps({"what": what, "got": got, "expected": expected, "tol": tol,
                                          "symptoms": symptoms, "layout": layout}))
        return super().compare(what, got, expected, tol, symptoms, layout)


def capture(out: Path, number: str, solution: Path, agree: Agreement) -> None:
    recorder = Recorder(CHECKS[number], load(solution, number), agree, solution)
    CHECKS[number].run(recorder)
    if recorder.findings:
        raise AssertionError(f"the reference solution of {number} fails its check: {recorder.findings}")
    (out / f"{number}.{agree.rank}.pkl").write_bytes(pickle.dumps([pickle.loads(r) for r in recorder.records]))


def fire(out: Path, number: str, solution: Path, agree: Agreement) -> None:
    plans = pickle.loads((out / f"{number}.plans.pkl").read_bytes())
    folder = out / f"learners.{agree.rank}"
    folder.mkdir(exist_ok=True)
    for k, plan in enumerate(plans):
        plan_path = folder / f"{number}.plan{k}.pkl"
        plan_path.write_bytes(pickle.dumps(plan))
        learner = folder / f"ex{number}_learner{k}.py"
        learner.write_text(LEARNER.format(tests=str(TESTS), solution=str(solution), plan=str(plan_path),
                                          names=CHECKS[number].functions))
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            status = run(CHECKS[number], learner)
        if agree.rank == 0:
            print(json.dumps({"number": number, "plan": k, "status": status, "text": text.getvalue()}), flush=True)


def main() -> int:
    out, numbers = Path(sys.argv[1]), sys.argv[2:]
    solutions, agree = exercise_files("solutions"), Agreement()
    for number in numbers:
        capture(out, number, solutions[number], agree)
        fire(out, number, solutions[number], agree)
    return 0


if __name__ == "__main__":
    run_main(main, prog="checks_under_fire")
