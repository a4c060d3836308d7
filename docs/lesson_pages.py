"""The course's pages, one per lesson, generated when the site is built from the lesson files and a real run.

For every ``lessons/NN_*.py`` the page ``course/NN_*.md`` holds the lesson's own cells (``tpsim.teach.cells``):
its prose as Markdown, each code cell as a Python block, under it what that cell printed on the lesson's ranks
and the figures it drew. The run is the one ``tpsim lesson book`` makes (``tpsim.teach.book.run_lesson_cells``:
``mpiexec -n RANKS python -m tpsim.teach.run_cells``), split per cell by ``tpsim.teach.run_cells.split_output``,
so nothing here parses a lesson or its output a second way.

Running every lesson takes a minute or two, and the site is built twice in CI (``make docs``, then
``tests/test_docs.py``), so each run is cached in ``docs/_build/lesson-runs/NN_*/`` (its output, its figures)
under a key: the SHA-256 of the lesson file, of every file of the ``tpsim`` package and of the Python, NumPy and
mpi4py versions. A cached run is reused only when its key is today's; a lesson whose run fails (non-zero status,
a ``CHECK ... FAILED`` line, or no CHECK at all) is not cached and fails the build with its output.

``course/`` belongs to this generator: it is written at every build (a page whose text did not change is left
untouched, so Sphinx does not read it again) and anything in it that is not a current lesson's page or figure is
removed (``docs/.gitignore`` keeps it out of git). On the site, the lesson links of ``course.md``'s table
(``../lessons/NN_*.py``, which GitHub shows as source) lead to these pages instead.

    python docs/lesson_pages.py [NN ...]      # write the pages (all lessons, or those) and say what ran
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
PAGES = DOCS / "course"  # generated: docs/.gitignore
CACHE = DOCS / "_build" / "lesson-runs"
FORMAT = 1  # bump when a cached run's contents change meaning
RUN_TIMEOUT = 600.0
SHOWN_ON_FAILURE = 200  # last lines of a failed run's output in the build error (the whole of it is in a log)
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
COURSE_LINK = re.compile(r"\]\(\.\./lessons/(\d\d_\w+)\.py\)")


@dataclass
class Run:
    """One lesson's run: what it printed (stdout and stderr merged) and the folder holding its figures."""

    output: str
    returncode: int
    seconds: float
    folder: Path
    cached: bool

    def failure(self) -> str | None:
        from tpsim.teach.lessons import read_checks

        checks = read_checks(self.output)
        failed = sum(not ok for _, ok in checks)
        if self.returncode != 0:
            return f"exit status {self.returncode}" + (f", {failed} of {len(checks)} CHECKs FAILED" if failed else "")
        if not checks:
            return "no CHECK line (a lesson checks what it claims)"
        return f"{failed} of {len(checks)} CHECKs FAILED" if failed else None


def package_digest() -> str:
    """SHA-256 over every file of the tpsim package (path and bytes), bytecode aside."""
    digest = hashlib.sha256()
    package = ROOT / "tpsim"
    for path in sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def run_key(lesson: Path, package: str) -> str:
    versions = [platform.python_version()] + [metadata.version(name) for name in ("numpy", "mpi4py")]
    text = json.dumps([FORMAT, hashlib.sha256(lesson.read_bytes()).hexdigest(), package, versions])
    return hashlib.sha256(text.encode()).hexdigest()


def cached_run(info, key: str, cache: Path = CACHE) -> Run | None:
    folder = cache / info.path.stem
    try:
        saved = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        return None
    if saved.get("key") != key:
        return None
    return Run(saved["output"], saved["returncode"], saved["seconds"], folder, cached=True)


def fresh_run(info, key: str, cache: Path = CACHE) -> Run:
    """Run the lesson in a scratch folder; a run that passes replaces the cached one, a failed one is logged."""
    from tpsim.teach.book import run_lesson_cells

    cache.mkdir(parents=True, exist_ok=True)
    scratch = cache / f".running-{info.path.stem}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    launched = run_lesson_cells(info, scratch, RUN_TIMEOUT)
    run = Run(launched.stdout, launched.returncode, round(launched.seconds, 1), scratch, cached=False)
    if run.failure() is not None:
        (cache / f"{info.path.stem}.failed.log").write_text(run.output)
        return run
    (scratch / "run.json").write_text(json.dumps({"key": key, "output": run.output, "returncode": run.returncode,
                                                   "seconds": run.seconds}))
    folder = cache / info.path.stem
    shutil.rmtree(folder, ignore_errors=True)
    scratch.rename(folder)
    (cache / f"{info.path.stem}.failed.log").unlink(missing_ok=True)
    run.folder = folder
    return run


def fence(text: str, info: str) -> str:
    """``text`` in a code fence longer than any run of backticks inside it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{info}\n{text}\n{ticks}"


def relinked(markdown: str, lessons: set[str]) -> str:
    """A lesson's prose with its relative links made relative to the page: another lesson's file leads to its
    page, any other file to the repository's copy (a lesson's links are relative to ``lessons/``)."""
    def one(m: re.Match) -> str:
        target = m.group(2)
        if re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        stem = Path(path).stem
        if Path(path).parent == Path(".") and stem in lessons:
            new = f"{stem}.md"
        else:
            new = f"../../lessons/{path}"
        return f"{m.group(1)}{new}{'#' + anchor if anchor else ''}{m.group(3)}"
    return LINK.sub(one, markdown)


def shown_figures(names: list[str]) -> list[str]:
    """The figures a cell wrote, an SVG left out when its PNG is there too (the same figure twice)."""
    return [n for n in names if not (n.endswith(".svg") and n[:-4] + ".png" in names)]


def page_text(info, run: Run, lessons: set[str]) -> tuple[str, list[str]]:
    """The page's Markdown and the figure files it shows (in ``course/<lesson>/``)."""
    from tpsim.teach.cells import read_cells
    from tpsim.teach.lessons import exercise_files, read_checks
    from tpsim.teach.run_cells import split_output

    cells = read_cells(info.path)
    code = [c for c in cells if c.kind == "code"]
    texts, figures = split_output(run.output, len(code))
    checks = len(read_checks(run.output))
    source = f"lessons/{info.path.name}"
    exercise = (f" Its exercise: `tpsim lesson start {info.number}`, then `tpsim check {info.number}`."
                if info.number in exercise_files(root=info.path.parent) else "")
    note = (f":::{{note}}\nThis page is [{source}](../../{source}) and a real run of it on the code this site "
            f"was built from: `{info.command}` printed what is under each cell ({checks} "
            f"CHECK{'s, all' if checks != 1 else ','} OK, {run.seconds:.1f} s) and drew the figures. Run it yourself "
            f"with `tpsim lesson run {info.number}`.{exercise}\n:::")
    parts = [f"<!-- generated by docs/lesson_pages.py from {source} and a run of it: edit the lesson -->"]
    shown, index = [], 0
    for position, cell in enumerate(cells):
        if cell.kind == "markdown":
            parts.append(relinked(cell.source, lessons))
        else:
            parts.append(fence(cell.source, "python"))
            if texts[index]:
                parts.append(fence(texts[index], "text"))
            for name in shown_figures(figures[index]):
                parts.append(f"![{name}]({info.path.stem}/{name})")
                shown.append(name)
            index += 1
        if position == 0:
            parts.append(note)
    return "\n\n".join(parts) + "\n", shown


def write_if_changed(path: Path, data: bytes) -> None:
    if not path.exists() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def write_page(pages: Path, info, run: Run, lessons: set[str]) -> None:
    """``pages/NN_*.md`` and its figures in ``pages/NN_*/`` (a figure the page no longer shows is removed)."""
    text, figures = page_text(info, run, lessons)
    write_if_changed(pages / f"{info.path.stem}.md", text.encode())
    folder = pages / info.path.stem
    for name in figures:
        write_if_changed(folder / name, (run.folder / name).read_bytes())
    for old in folder.iterdir() if folder.is_dir() else ():
        if old.name not in figures:
            old.unlink()


def generate(numbers: list[str] | None = None, say=print, lessons_root: Path | None = None, pages: Path = PAGES,
             cache: Path = CACHE) -> dict[str, Run]:
    """Write the pages of every lesson of ``lessons_root`` (the repository's ``lessons/``), or of ``numbers``,
    into ``pages``; raise RuntimeError naming every lesson whose run failed, with its output."""
    from tpsim.teach.lessons import discover

    lessons = discover(lessons_root)
    chosen = [info for info in lessons if numbers is None or info.number in numbers]
    package = package_digest()
    runs, failed = {}, []
    for info in chosen:
        key = run_key(info.path, package)
        run = cached_run(info, key, cache) or fresh_run(info, key, cache)
        runs[info.number] = run
        problem = run.failure()
        say(f"lesson {info.number}: {'cached run' if run.cached else 'ran'} on {info.ranks} rank"
            f"{'s' if info.ranks != 1 else ''}, {run.seconds:.1f} s"
            + (f", FAILED: {problem}" if problem else ""))
        if problem:
            tail = "\n".join(run.output.splitlines()[-SHOWN_ON_FAILURE:])
            failed.append(f"lesson {info.number} ({info.path}) failed on {info.ranks} ranks: {problem}. Its output "
                          f"(the last {SHOWN_ON_FAILURE} lines; all of it in {cache / (info.path.stem + '.failed.log')}):"
                          f"\n{tail}")
            continue
        write_page(pages, info, run, {i.path.stem for i in lessons})
    if numbers is None:  # a lesson removed or renamed leaves no page behind
        current = {i.path.stem for i in lessons}
        for old in pages.iterdir() if pages.is_dir() else ():
            if (old.stem if old.suffix == ".md" else old.name) not in current:
                shutil.rmtree(old) if old.is_dir() else old.unlink()
    if failed:
        raise RuntimeError("\n\n".join(failed))
    return runs


# --- Sphinx -----------------------------------------------------------------------------------------------------
def _builder_inited(app):
    from sphinx.errors import ExtensionError
    from sphinx.util import logging

    log = logging.getLogger(__name__)
    try:
        generate(say=log.info)
    except RuntimeError as err:
        raise ExtensionError(f"the course's pages could not be made:\n{err}") from None


def _source_read(app, docname, source):
    if docname == "course":  # on the site, the table's lesson links lead to the lessons' pages
        source[0] = COURSE_LINK.sub(lambda m: f"](course/{m.group(1)}.md)" if (PAGES / f"{m.group(1)}.md").exists()
                                    else m.group(0), source[0])


def setup(app):
    app.connect("builder-inited", _builder_inited)
    app.connect("source-read", _source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    try:
        generate([f"{int(n):02d}" for n in sys.argv[1:]] or None)
    except RuntimeError as err:
        sys.exit(str(err))
