"""Where the lessons live, what each declares (number, title, rank count, exercise files), what each prints.

A lesson is a file ``lessons/NN_name.py`` whose first markdown cell starts with ``# # Lesson NN — Title`` and
whose code declares its world size in a line ``RANKS = N``. Nothing else registers it: the CLI, the runner
and the tests list the folder. It prints ``CHECK claim: value ... OK`` (or ``FAILED``) lines and figures into
``DEFAULT_OUT``. Pure file reading and text, no MPI: ``tpsim lesson list`` starts no MPI runtime. Its cells
(``# %%`` code, ``# %% [markdown]`` prose) are read by tpsim.teach.cells for the notebooks and the book.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import tpsim

LESSON_FILE = re.compile(r"^(\d\d)_\w+\.py$")
RANKS_LINE = re.compile(r"^RANKS\s*=\s*(\d+)\s*(?:#.*)?$", re.MULTILINE)
TITLE_LINE = re.compile(r"^# # (?:Lesson \d+\s*[—:-]\s*)?(.+?)\s*$", re.MULTILINE)
KINDS = ("exercises", "solutions")
DEFAULT_OUT = "tpsim-out/lessons"
CHECK_LINE = re.compile(r"^CHECK (.*) \.\.\. (OK|FAILED)$", re.MULTILINE)


class LessonsNotFound(LookupError):
    """No ``lessons/`` folder, no such lesson, or no such exercise file; the message says which and where."""


def lessons_dir() -> Path:
    """The lessons: ``tpsim/lessons/`` of an installed wheel, else ``lessons/`` beside ``tpsim/`` in a checkout.

    setup.py installs the repository's ``lessons/`` folder as ``tpsim/lessons/``; an editable install (``pip
    install -e .``) and a plain clone read the repository's folder itself."""
    package = Path(tpsim.__file__).resolve().parent
    for root in (package / "lessons", package.parent / "lessons"):
        if root.is_dir():
            return root
    raise LessonsNotFound(f"no lessons at {package / 'lessons'} or {package.parent / 'lessons'}: this tpsim was "
                          f"installed without them (reinstall it from a wheel or sdist built by setup.py, or "
                          f"from a clone with pip install -e .)")


def figures_dir() -> Path:
    """The committed figures and studies (``figures/drift.json``, ...): ``tpsim/lessons/figures/`` of a wheel, else
    the repository's ``figures/`` beside ``lessons/``."""
    root = lessons_dir()
    return root / "figures" if (root / "figures").is_dir() else root.parent / "figures"


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it, else as it is (messages read better)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def normalize(number: str | int) -> str:
    """``3``, ``"3"``, ``"03"`` -> ``"03"``."""
    text = str(number).strip()
    if not text.isdigit():
        raise LessonsNotFound(f"a lesson number is one or two digits, got {number!r}")
    return f"{int(text):02d}"


EXERCISE_NUMBER = re.compile(r"^(\d{1,2})([a-z]?)$")


def normalize_exercise(number: str | int) -> str:
    """``4``, ``"04"`` -> ``"04"``; ``"4b"``, ``"04B"`` -> ``"04b"``: a harder exercise on lesson 04's topic."""
    m = EXERCISE_NUMBER.match(str(number).strip().lower())
    if m is None:
        raise LessonsNotFound(f"an exercise number is a lesson number, optionally with a letter (04, 04b), "
                              f"got {number!r}")
    return f"{int(m.group(1)):02d}{m.group(2)}"


def lesson_of(exercise: str) -> str:
    """The lesson an exercise belongs to (and runs at the rank count of): ``"04b"`` -> ``"04"``."""
    return normalize_exercise(exercise)[:2]


@dataclass(frozen=True)
class LessonInfo:
    number: str  # "03"
    path: Path
    title: str
    ranks: int

    @property
    def command(self) -> str:
        """How to run it by hand: ``mpirun -n 4 python lessons/03_....py`` from a checkout; where the lessons are
        not below the working directory (an installed wheel), ``tpsim lesson run 03``, which finds the file."""
        shown = shown_path(self.path)
        if Path(shown).is_absolute():
            return f"tpsim lesson run {self.number}"
        return f"mpirun -n {self.ranks} python {shown}"


def read_lesson(path: Path) -> LessonInfo:
    """Parse one lesson file's ``RANKS = N`` and title (``ValueError`` when ``RANKS`` is missing)."""
    text = path.read_text(encoding="utf-8")
    ranks = RANKS_LINE.search(text)
    if ranks is None:
        raise ValueError(f"{path} declares no 'RANKS = N' line")
    title = TITLE_LINE.search(text)
    return LessonInfo(path.name[:2], path, title.group(1) if title else path.stem[3:].replace("_", " "),
                      int(ranks.group(1)))


def discover(root: Path | None = None) -> list[LessonInfo]:
    """Every ``NN_*.py`` in the lessons folder, by number."""
    root = lessons_dir() if root is None else root
    return [read_lesson(p) for p in sorted(root.iterdir()) if LESSON_FILE.match(p.name)]


def find_lesson(number: str | int, root: Path | None = None) -> LessonInfo:
    """Lesson ``number``, reading only its own file (another lesson being written cannot break this one)."""
    number = normalize(number)
    root = lessons_dir() if root is None else root
    found = sorted(p for p in root.glob(f"{number}_*.py") if LESSON_FILE.match(p.name))
    if not found:
        known = ", ".join(sorted({p.name[:2] for p in root.iterdir() if LESSON_FILE.match(p.name)})) or "none"
        raise LessonsNotFound(f"there is no lesson {number} (lessons: {known}; see tpsim lesson list)")
    return read_lesson(found[0])


def exercise_files(kind: str = "exercises", root: Path | None = None) -> dict[str, Path]:
    """``{"02": lessons/exercises/ex02_conjugate_f_g.py, "04b": ..., ...}`` (``kind`` "exercises" or "solutions").

    ``exNN_name.py`` is lesson NN's exercise; ``exNNb_name.py`` (a letter after the number) a harder one on the
    same lesson's topic, checked at that lesson's rank count."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    folder = (lessons_dir() if root is None else root) / kind
    pattern = re.compile(r"^ex(\d\d[a-z]?)_\w+\.py$")
    return {m.group(1): p for p in sorted(folder.glob("ex*.py")) if (m := pattern.match(p.name))}


def exercise_file(number: str | int, kind: str = "exercises", root: Path | None = None) -> Path:
    number = normalize_exercise(number)
    files = exercise_files(kind, root)
    if number not in files:
        raise LessonsNotFound(f"there is no lessons/{kind}/ex{number}_*.py")
    return files[number]


# --- what a lesson prints ---------------------------------------------------------------------------------------
def read_checks(output: str) -> list[tuple[str, bool]]:
    """The ``CHECK claim: value ... OK|FAILED`` lines of a lesson's output as ``(claim: value, ok)``."""
    return [(m.group(1), m.group(2) == "OK") for m in CHECK_LINE.finditer(output)]
