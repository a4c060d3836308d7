"""Run a learner's function on real ranks, compare it with the reference, and explain what differs.

A check (``tpsim.teach.checks``) drives a ``Report`` on every rank:

    got = report.call("g_backward", dy, group)        # the learner's function; its collectives are recorded
    report.compare("g_backward(dy)", got, expected)   # which rank, which tensor, max difference, shapes
    report.require(not report.events, "g_backward", "g's backward must not communicate")

A learner's function may raise (``NotImplementedError`` in a stub, a bug elsewhere) on some ranks and not on
others. After every call the ranks therefore agree (``tpsim.comm.agree``, untraced) whether any of them failed;
if one did, all of them stop, so no rank is left waiting in a collective the others never reach. At the end
the findings of every rank are gathered to rank 0, which prints ``OK`` or the explanation, and every rank
returns the same exit status: 0 OK, 1 wrong, 3 not done yet.
"""

from __future__ import annotations

import importlib.util
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from tpsim.comm import CommEvent, ProcessGrid, Tracer
from tpsim.comm.agree import Agreement
from tpsim.compare import max_abs_diff
from tpsim.errors import ConfigError
from tpsim.teach.diagnose import diagnose, explain_difference  # noqa: F401 (the checks import it from here)
from tpsim.teach.hints import HINT_STATE, offer, reveal

OK, WRONG, RAISED, NOT_DONE = 0, 1, 2, 3  # agreed by MAX over the ranks: the worst wins
EXIT_STATUS = {OK: 0, WRONG: 1, RAISED: 1, NOT_DONE: 3}


@dataclass(frozen=True)
class Check:
    """Exercise ``number``: the learner's ``functions`` and the check that drives them, with hints per function
    (a tuple of levels, from a nudge to the last, which comes close to the answer)."""

    number: str
    functions: tuple[str, ...]
    run: Callable[["Report"], None]
    hints: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass
class Finding:
    """What one rank saw go wrong in ``function``: ``what`` names the tensor or the rule, ``lines`` explain."""

    rank: int
    function: str
    what: str
    lines: list[str]
    named: bool = False  # a symptom (a known mistake) explains it, not only the generic difference


class Stop(Exception):
    """Every rank stops the check: some rank's call failed with ``status`` (agreed over the ranks)."""

    def __init__(self, status: int, function: str) -> None:
        super().__init__(function)
        self.status, self.function = status, function


def describe_events(events: list[CommEvent]) -> str:
    """``"all_reduce(sum) [3, 5] on tp, ..."``, one entry per call, or ``"no collective"``."""
    if not events:
        return "no collective"
    return ", ".join(f"{e.op}{f'({e.reduce_op})' if e.reduce_op else ''} {list(e.shape)} on {e.group}"
                     for e in events)


class Report:
    """The learner's module, the traced collectives of the last call, and this rank's findings."""

    def __init__(self, check: Check, module, agree: Agreement) -> None:
        self.check, self.module, self.agree = check, module, agree
        self.rank, self.world_size = agree.rank, agree.size
        self.tracer = Tracer(self.rank)  # pass it to the ProcessGrid the learner's functions get
        self.events: list[CommEvent] = []  # the collectives of the last ``call``
        self.findings: list[Finding] = []
        self.compared, self.worst, self.function = 0, 0.0, ""

    def grid(self, tp: int | None = None) -> ProcessGrid:
        """A traced grid over all ranks (TP = the world unless ``tp`` says otherwise)."""
        return ProcessGrid(tp=self.world_size if tp is None else tp, tracer=self.tracer)

    def call(self, name: str, *args):
        """Run the learner's ``name(*args)`` on every rank; stop every rank if it fails on any."""
        self.function = name
        fn = getattr(self.module, name, None)
        status = OK
        if not callable(fn):
            status = WRONG
            self.findings.append(Finding(self.rank, name, name, [f"your file has no function {name}"]))
        else:
            self.tracer.reset()
            try:
                with np.errstate(all="ignore"):  # an overflow shows up below as "not finite", once, on rank 0
                    out = fn(*args)
            except NotImplementedError:
                status = NOT_DONE
            except Exception as err:  # the learner's bug: explain it, never crash the checker
                status = RAISED
                frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == self.module.__file__]
                where = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
                self.findings.append(Finding(self.rank, name, name, [f"raised {type(err).__name__}: {err}{where}"]))
            self.events = list(self.tracer.events)
        agreed = int(self.agree.reduce(np.array([status], dtype=np.int8), op="max")[0])
        if agreed != OK:
            raise Stop(agreed, name)
        return out

    def compare(self, what: str, got, expected, tol: float = 1e-10, symptoms: dict | None = None) -> bool:
        """Record a finding unless ``got`` equals ``expected`` within ``tol`` (absolute). ``symptoms``:
        ``{sentence: what that mistake returns on these inputs}``, tried in order (``tpsim.teach.diagnose``)."""
        self.compared += 1
        lines, named = diagnose(got, expected, tol, symptoms)
        if lines is None:
            if np.asarray(expected).dtype.kind == "f" and np.size(expected):
                self.worst = max(self.worst, max_abs_diff(got, expected))
            return True
        self.findings.append(Finding(self.rank, self.function, what, lines, named))
        return False

    def require(self, ok: bool, what: str, message: str) -> bool:
        """Record ``message`` as a finding unless ``ok`` (a rule about communication, in-place updates, ...)."""
        if not ok:
            self.findings.append(Finding(self.rank, self.function, what, [message]))
        return bool(ok)


def load(path: Path, number: str):
    """Import the learner's file as a module (the same on every rank: an error is raised everywhere alike)."""
    if not path.is_file():
        raise ConfigError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(f"tpsim_exercise_{number}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(check: Check, path: Path, hint: int = 0, hint_state: Path = HINT_STATE) -> int:
    """Check the file ``path`` on every rank; rank 0 prints the verdict (and, with ``hint``, the hints: see
    ``tpsim.teach.hints``). Returns the exit status (the same everywhere)."""
    agree = Agreement()
    status, stopped_in = OK, ""
    try:
        module = load(path, check.number)
    except ConfigError:
        raise
    except Exception as err:  # a syntax error, say: the same on every rank
        report = Report(check, None, agree)
        report.findings.append(Finding(report.rank, "", str(path), [f"cannot import it: {type(err).__name__}: {err}"]))
        status = WRONG
    else:
        report = Report(check, module, agree)
        try:
            check.run(report)
        except Stop as stop:
            status, stopped_in = stop.status, stop.function
    # the worst status, and whether any rank found something wrong (a wrong answer outranks "not done")
    agreed = agree.reduce(np.array([status, bool(report.findings)], dtype=np.int8), op="max")
    status = WRONG if agreed[1] else int(agreed[0])
    gathered = agree.gather((report.findings, report.compared, report.worst))
    if agree.rank == 0:
        text = summary(check, path, status, stopped_in, gathered, agree.size)
        about = stuck_in(status, stopped_in, gathered)
        if about and hint:
            text += "\n" + "\n".join(reveal(check.number, about, check.hints.get(about, ()), hint, hint_state))
        elif about:
            text += "\n" + offer(check.number, about, check.hints.get(about, ()), path)
        print(text.rstrip(), flush=True)
    return EXIT_STATUS[status]


def stuck_in(status: int, stopped_in: str, gathered: list) -> str:
    """The function a hint is about: the first one that went wrong, or the one not done yet; "" when OK."""
    if status == OK:
        return ""
    if status == NOT_DONE:
        return stopped_in
    findings = [f for rank_findings, _, _ in gathered for f in rank_findings]
    return findings[0].function if findings else stopped_in


def summary(check: Check, path: Path, status: int, stopped_in: str, gathered: list, ranks: int) -> str:
    """The text rank 0 prints: OK with the numbers, "not done yet", or the first finding explained."""
    n = check.number
    if status == NOT_DONE:
        return f"exercise {n} is not done yet: implement {stopped_in} (see the TODO in {path})"
    findings = [f for rank_findings, _, _ in gathered for f in rank_findings]
    if status == OK:
        compared = sum(c for _, c, _ in gathered)
        worst = max(w for _, _, w in gathered)
        return (f"exercise {n} OK: {', '.join(check.functions)} "
                f"{'matches' if len(check.functions) == 1 else 'match'} the reference on {ranks} "
                f"rank{'s' if ranks > 1 else ''} ({compared} tensors compared over all ranks, "
                f"max difference {worst:.1e})")
    if not findings:  # every rank agreed something failed, yet none said what: should not happen
        return f"exercise {n} FAILED on some rank without an explanation ({path})"
    first = findings[0]
    lines = [f"exercise {n} FAILED: {first.function or 'your file'} does not do what the reference does ({path}).",
             f"  rank {first.rank}, {first.what}:", *[f"    {line}" for line in first.lines]]
    others = sorted({f.rank for f in findings if f.what == first.what and f.rank != first.rank})
    if others:
        lines.append(f"  the same goes wrong on rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}")
    more = len({(f.function, f.what) for f in findings}) - 1
    if more > 0:
        lines.append(f"  ({more} more problem{'s' if more > 1 else ''} after this one; fix this first)")
    if stopped_in and stopped_in != first.function:
        lines.append(f"  ({stopped_in} stopped the check too: not done yet, or it raised on some rank)")
    return "\n".join(lines)
