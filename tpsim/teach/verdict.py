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

Nothing a learner's function does may crash the checker or hang it silently:

- a value the check's own code cannot read (``np.asarray(got, dtype=np.int64)`` of a str, say) stops the check
  with a finding that names what was returned (``tpsim.teach.returned``), on every rank alike; a rank whose
  check broke alone joins the others at their next agreement (after a call, before a grid, at the end), where
  they stop too;
- a rank whose call raised waits ``PATIENCE_S`` for the others: if they do not come (they wait in a collective
  it never reached), it prints what it knows and ends the job with the same exit status.
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
from tpsim.comm.launch import abort
from tpsim.errors import ConfigError
from tpsim.teach.diagnose import diagnose, difference
from tpsim.teach.hints import HINT_STATE, offer, reveal
from tpsim.teach.returned import describe, safe_text

OK, WRONG, RAISED, NOT_DONE = 0, 1, 2, 3  # agreed by MAX over the ranks: the worst wins
EXIT_STATUS = {OK: 0, WRONG: 1, RAISED: 1, NOT_DONE: 3}
END, STATUS, FOUND, BROKE = range(4)  # one agreement: at the end?, worst status, any finding?, a check broke?
PATIENCE_S = 5.0  # how long a rank whose call failed waits for the others before it ends the job itself
NOTHING = object()  # no call has returned yet


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

    def __init__(self, check: Check, module, agree: Agreement, path: Path | str = "") -> None:
        self.check, self.module, self.agree, self.path = check, module, agree, path
        self.rank, self.world_size = agree.rank, agree.size
        self.tracer = Tracer(self.rank)  # pass it to the ProcessGrid the learner's functions get
        self.events: list[CommEvent] = []  # the collectives of the last ``call``
        self.findings: list[Finding] = []
        self.compared, self.worst, self.function = 0, 0.0, ""
        self.returned = NOTHING  # what the last call returned: what a check that broke was reading

    def agree_on(self, status: int, *, end: bool = False, broke: bool = False,
                 patience: float | None = None) -> np.ndarray:
        """One agreement of every rank (``END``, ``STATUS``, ``FOUND``, ``BROKE``, each the MAX over the ranks);
        after ``patience`` seconds without the others this rank prints what it knows and ends the job."""
        mine = np.array([end, status, bool(self.findings), broke], dtype=np.int8)
        agreed = self.agree.reduce_within(mine, patience, op="max")
        if agreed is None:
            print(summary(self.check, self.path, max(status, WRONG if self.findings else OK), self.function,
                          [(self.findings, self.compared, self.worst)], self.world_size) +
                  f"\n  (the other ranks did not get past {self.function or 'the check'} within {PATIENCE_S:g} s: "
                  f"most likely they wait in a collective that MPI rank {self.rank} never reached, so the check "
                  f"ends here)", flush=True)
            abort(EXIT_STATUS[max(status, WRONG if self.findings else OK)])
        return agreed

    def grid(self, tp: int | None = None) -> ProcessGrid:
        """A traced grid over all ranks (TP = the world unless ``tp`` says otherwise)."""
        if self.agree_on(OK)[BROKE]:  # before the collectives that build it: a rank whose check broke is not there
            raise Stop(WRONG, "")
        return ProcessGrid(tp=self.world_size if tp is None else tp, tracer=self.tracer)

    def call(self, name: str, *args):
        """Run the learner's ``name(*args)`` on every rank; stop every rank if it fails on any."""
        self.function = name
        try:
            fn = getattr(self.module, name, None)
        except Exception:  # a module __getattr__ of the learner's that raises
            fn = None
        status, out = OK, None
        if not callable(fn):
            status = WRONG
            have = f"{name} is {describe(fn)}, not a function" if hasattr(self.module, name) else \
                f"has no function {name}"
            self.findings.append(Finding(self.rank, name, name, [f"your file {have}"]))
        else:
            self.tracer.reset()
            try:
                with np.errstate(all="ignore"):  # an overflow shows up below as "not finite", once, on rank 0
                    out = fn(*args)
            except NotImplementedError:
                status = NOT_DONE
            except (Exception, SystemExit) as err:  # the learner's bug (or exit()): explain it, never crash
                status = RAISED
                self.findings.append(Finding(self.rank, name, name, [self.raised(err)]))
            self.events = list(self.tracer.events)
        agreed = self.agree_on(status, patience=None if status == OK else PATIENCE_S)
        if agreed[BROKE]:
            raise Stop(WRONG, "")
        if agreed[STATUS] != OK:
            raise Stop(int(agreed[STATUS]), name)
        self.returned = out
        return out

    def raised(self, err: BaseException) -> str:
        """``"raised ValueError: ... (line 12: ...)"``: the exception and the learner's line it came from."""
        frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == self.module.__file__]
        where = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
        message = safe_text(err, 200)
        return f"raised {type(err).__name__}{': ' + message if message else ''}{where}"

    def unusable(self, err: Exception) -> Finding:
        """The finding of a check that broke on the learner's last value (its own code could not read it)."""
        frames = traceback.extract_tb(err.__traceback__)
        ours = [f for f in frames if f"{Path('teach', 'checks')}" in f.filename] or frames
        where = f" ({Path(ours[-1].filename).name}, line {ours[-1].lineno})" if ours else ""
        return Finding(self.rank, self.function, f"what {self.function} returned",
                       [f"your {self.function} returned {describe(self.returned)}, which the check cannot use: "
                        f"{type(err).__name__}: {safe_text(err, 200)}{where}"])

    def compare(self, what: str, got, expected, tol: float = 1e-10, symptoms: dict | None = None,
                layout: str | None = None) -> bool:
        """Record a finding unless ``got`` equals ``expected`` within ``tol`` (absolute). ``symptoms``:
        ``{sentence: what that mistake returns on these inputs}``, tried in order; ``layout``: ``"values"``,
        ``"rows"`` (one answer per row) or ``"set"`` (integer ids), inferred when None (``tpsim.teach.diagnose``)."""
        self.compared += 1
        lines, named = diagnose(got, expected, tol, symptoms, layout)
        if lines is None:
            if np.asarray(expected).dtype.kind == "f" and np.size(expected):
                self.worst = max(self.worst, difference(got, expected))
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
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot load {path} as Python (a .py file)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(check: Check, path: Path, hint: int = 0, hint_state: Path = HINT_STATE) -> int:
    """Check the file ``path`` on every rank; rank 0 prints the verdict (and, with ``hint``, the hints: see
    ``tpsim.teach.hints``). Returns the exit status (the same everywhere)."""
    agree = Agreement()
    status, stopped_in, agreed = OK, "", None
    try:
        module = load(path, check.number)
    except ConfigError:
        raise
    except (Exception, SystemExit) as err:  # a syntax error, say: the same on every rank
        report = Report(check, None, agree, path)
        report.findings.append(Finding(report.rank, "", str(path),
                                       [f"cannot import it: {type(err).__name__}: {safe_text(err, 200)}"]))
        status = WRONG
    else:
        report = Report(check, module, agree, path)
        try:
            check.run(report)
        except Stop as stop:
            status, stopped_in = stop.status, stop.function
        except Exception as err:
            if report.returned is NOTHING:  # before any value of the learner's: the checker's own bug, loudly
                raise
            report.findings.append(report.unusable(err))
            status = WRONG
            agreed = report.agree_on(WRONG, broke=True, patience=PATIENCE_S)  # the others' next agreement
            if not agreed[END]:
                agreed = None  # they were between calls and stop now: meet them at the end
    # the worst status, and whether any rank found something wrong (a wrong answer outranks "not done")
    if agreed is None:
        agreed = report.agree_on(status, end=True)
    status = WRONG if agreed[FOUND] else int(agreed[STATUS])
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
    where = f"on MPI rank {first.rank} (of {ranks}): " if ranks > 1 else ""  # not an argument named rank
    lines = [f"exercise {n} FAILED: {first.function or 'your file'} does not do what the reference does ({path}).",
             f"  {where}{first.what}", *[f"    {line}" for line in first.lines]]
    others = sorted({f.rank for f in findings if f.what == first.what and f.rank != first.rank})
    if others:
        lines.append(f"  the same goes wrong on MPI rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}")
    more = len({(f.function, f.what) for f in findings}) - 1
    if more > 0:
        lines.append(f"  ({more} more problem{'s' if more > 1 else ''} after this one; fix this first)")
    if stopped_in and stopped_in != first.function:
        lines.append(f"  ({stopped_in} stopped the check too: not done yet, or it raised on some MPI rank)")
    return "\n".join(lines)
