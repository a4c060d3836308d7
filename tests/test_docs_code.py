"""Every code block of every page is a program that runs, a command that works, or the output of a real run.

The blocks are read as Sphinx reads them (tests/docs_blocks.py): every page of docs/ written by hand, README.md,
and what a page includes (tests/README.md). Then

- a Python block runs in a fresh interpreter, in a folder holding a real run folder ``tpsim-out/`` (a 2-rank,
  3-step demo) when it reads one;
- a shell block's cheap commands run there and exit 0; the others (mpirun, make, ``tpsim check``) are checked
  against their command's own parser, targets and files (tests/docs_commands.py); ``$ command`` lines are run
  and what follows them must be what they print;
- an output block is compared line by line with the real run it shows (``OUTPUTS``: the committed demo run
  ``docs/demo-output.txt``, or a command run now); the few that no run here can show are listed, with the
  reason, in ``EXCEPTIONS``;
- every command written as inline code (``tpsim check NN FILE --hint``) names options its command has;
- a lesson page (docs/course/, made when the site is built) is its lesson's cells and that lesson's run.

Needs markdown-it (docs/requirements.txt pulls it in with MyST); without it the module skips and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("markdown_it", reason="docs requirements not installed: make docs installs docs/requirements.txt")

from docs_blocks import DOCS, GENERATED, ROOT, Block, blocks, excerpt_missing, inline_code  # noqa: E402
from docs_blocks import logical_lines, prompt_runs, simple_commands, source_pages  # noqa: E402
from docs_commands import is_synopsis, problem, synopsis_problem, tpsim_output  # noqa: E402
from launch_program import run_mpi  # noqa: E402
from tpsim.teach.lessons import discover  # noqa: E402

sys.path.insert(0, str(DOCS))
import lesson_pages  # noqa: E402  (docs/lesson_pages.py: how the course's pages are made)

DEMO_OUTPUT = DOCS / "demo-output.txt"  # a real run of `mpirun -n 8 python -m tpsim.demo`, committed
# (page, the block's first line) -> the run it shows: a file of a real run, ("tpsim", ARGS) run now, or
# ("mpirun", RANKS, ARGS, ENV) run now
OUTPUTS = {
    ("docs/guide/failing-well.md", "  step   36  SKIPPED"): ("mpirun", 8, ["-m", "tpsim.demo", "--lr", "1e6", "--clip",
                                                                      "0"], {}),
    ("docs/guide/pipelines.md", "pipeline: interleaved schedule over 2 stages"): (
        "mpirun", 4, ["-m", "tpsim.demo", "--pp", "2", "--tp", "2", "--schedule", "interleaved", "--vp", "2",
                      "--layers", "4", "--microbatches", "4", "--steps", "5"], {}),
    ("docs/guide/pipelines.md", "pipeline: zb-h1 schedule over 4 stages"): (
        "mpirun", 8, ["-m", "tpsim.demo", "--pp", "4", "--tp", "2", "--layers", "4", "--microbatches", "8",
                      "--schedule", "zb-h1", "--steps", "10"], {}),
    ("docs/guide/pipelines.md", "BUBBLE CHECK: MATCH — on the h100-80gb clock"): (
        "mpirun", 4, ["-m", "tpsim.demo", "--pp", "2", "--tp", "2", "--microbatches", "4", "--steps", "3", "--clock",
                      "h100"], {}),
    ("docs/guide/overlap.md", "DP OVERLAP CHECK: MATCH — the DP buckets overlapped"): (
        "mpirun", 4, ["-m", "tpsim.demo", "--tp", "2", "--dp", "2", "--clock", "h100", "--overlap-grad-reduce",
                      "--bucket-mb", "0.1", "--steps", "3"], {}),
    # the grid table is printed before the first step, so one step shows it as the page's 100-step run did
    ("docs/guide/mpi-and-machines.md", "             tp0 tp1   host"): (
        "mpirun", 8, ["-m", "tpsim.demo", "--tp", "2", "--steps", "1"], {"TPSIM_FAKE_HOSTS": "n1*3,n2*3,n3*2"}),
}
DEMO_PAGES = {"README.md", "docs/getting-started.md"}  # their output blocks are cut from DEMO_OUTPUT
EXCEPTIONS = {
    ("docs/internals/layout.md", "out, cache = name_forward(x, params...)"):
        "the layer contract as a pattern (two calling conventions side by side), not a program",
    ("docs/reference/formats.md", '{"format": "tpsim-checkpoint", "version": 1,'):
        "a checkpoint manifest abridged by hand ('...' for the other arrays), laid out over lines to be read",
    ("docs/reference/formats.md", '{"step": 0, "loss": 3.4526503473683112'):
        "a metrics.jsonl line of the default 8-rank demo; test_the_metrics_line_has_a_real_runs_fields checks it",
    ("docs/reference/formats.md", '{"format": "tpsim training state", "version": 1,'):
        "a training_state.json abridged by hand, its fields annotated; tests/test_programs_resume.py reads real ones",
    ("docs/guide/tp-overlap.md",
     "pipelined = max(g, a + g/c)          exposed = pipelined − g = max(0, a − (c − 1)·g/c)"):
        "the cost rule of tpsim.plan.tp_overlap as a formula, not a program's output; tests/test_tp_overlap_rule.py "
        "checks it by hand and against a step-by-step timeline",
    ("docs/guide/hf-checkpoints.md", "resumed from ck/ at step 50"):
        "the second of two runs (--save, then --resume), which one command cannot show; "
        "tests/test_programs_resume.py checks these lines of resumed runs",
}

ALL = [b for page in source_pages() for b in blocks(page)]
LESSON_PAGES = [GENERATED / f"{info.path.stem}.md" for info in discover()]  # docs/lesson_pages.py writes them
ids = lambda b: b.where  # noqa: E731


def of_kind(kind: str) -> list[Block]:
    return [b for b in ALL if b.kind == kind]


def listed(table: dict, block: Block):
    """The entry of ``table`` for ``block``: its page, and a start of its first line."""
    page = str(block.page.relative_to(ROOT))
    return next((value for (where, start), value in table.items()
                 if where == page and block.first_line.startswith(start)), None)


@pytest.fixture(scope="session")
def run_folder(tmp_path_factory):
    """A real run folder: ``mpirun -n 2 python -m tpsim.demo --steps 3``."""
    out = tmp_path_factory.mktemp("run") / "tpsim-out"
    r = run_mpi(2, ["-m", "tpsim.demo", "--steps", "3", "--out", str(out)], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.fixture
def workdir(tmp_path, request):
    """A fresh folder for a block, with the run folder as ``tpsim-out/`` when the block reads one."""
    block = request.node.callspec.params["block"]
    if "tpsim-out" in block.text:
        (tmp_path / "tpsim-out").symlink_to(request.getfixturevalue("run_folder"))
    return tmp_path


@pytest.mark.parametrize("block", of_kind("python"), ids=ids)
def test_python_block_runs(block, workdir):
    if "import pandas" in block.text:
        pytest.importorskip("pandas", reason="pandas is not a tpsim dependency; the block shows a pandas reader")
    r = subprocess.run([sys.executable, "-"], input=block.text, cwd=workdir, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"})
    assert r.returncode == 0, f"{block.where}: the block fails:\n{block.text}\n--\n{r.stdout}\n{r.stderr}"


@pytest.mark.parametrize("block", of_kind("shell"), ids=ids)
def test_shell_block_works(block, workdir):
    found = []
    if block.text.startswith("$ "):
        for command, shown in prompt_runs(block.text):
            words = simple_commands(command)[0]
            assert words[0] == "tpsim", f"{block.where}: only tpsim commands are run for their output"
            missing = excerpt_missing(shown, tpsim_output(words[1:], workdir))
            found += [f"`{command}` does not print: {line!r}" for line in missing]
    else:
        for line in logical_lines(block.text):
            if is_synopsis(line):
                found.append(synopsis_problem(line))
            else:
                found += [problem(words, workdir) for words in simple_commands(line)]
    found = [f for f in found if f]
    assert not found, f"{block.where}:\n" + "\n".join(found)


def real_output(block: Block, tmp_path, monkeypatch) -> str:
    if str(block.page.relative_to(ROOT)) in DEMO_PAGES:
        return DEMO_OUTPUT.read_text()
    source = listed(OUTPUTS, block)
    assert source is not None, (f"{block.where}: an output block with no run behind it; name the run in OUTPUTS "
                                f"(or, if no run here can show it, the reason in EXCEPTIONS):\n{block.text}")
    if source[0] == "tpsim":
        return tpsim_output(source[1], tmp_path)
    _, ranks, args, env = source
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the ranks inherit it
    r = run_mpi(ranks, [*args, "--out", str(tmp_path / "out")], timeout=180)
    return r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in of_kind("output") if listed(EXCEPTIONS, b) is None], ids=ids)
def test_output_block_is_a_real_runs(block, tmp_path, monkeypatch):
    missing = excerpt_missing(block.text, real_output(block, tmp_path, monkeypatch))
    assert not missing, (f"{block.where}: these lines are not the run's output (in this order):\n"
                         + "\n".join(missing))


def test_every_exception_is_a_block_of_its_page():
    stale = [k for k in [*EXCEPTIONS, *OUTPUTS] if not any(listed({k: True}, b) for b in ALL)]
    assert not stale, f"listed blocks that no page holds any more (update the list): {stale}"


@pytest.mark.slow
def test_the_metrics_line_has_a_real_runs_fields(run_folder):
    shown = next(b for b in ALL if listed({("docs/reference/formats.md", '{"step": 0, "loss"'): True}, b))
    real = json.loads((run_folder / "metrics.jsonl").read_text().splitlines()[0])
    written = json.loads(shown.text)
    assert {k: type(v).__name__ for k, v in written.items()} == {k: type(v).__name__ for k, v in real.items()}
    assert written["loss"] == pytest.approx(real["loss"], rel=1e-12), "step 0's loss is the serial model's at any layout"


COMMAND_START = ("tpsim ", "python -m tpsim", "mpirun ", "mpiexec ", "make ")


@pytest.mark.parametrize("page", source_pages() + LESSON_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_inline_commands_name_real_options(page):
    if not page.exists():
        pytest.skip(f"{page.relative_to(ROOT)} is made when the site is built (make docs)")
    found = [f"`{span}`: {p}" for span in inline_code(page) if span.startswith(COMMAND_START)
             if (p := synopsis_problem(span))]
    assert not found, f"{page.relative_to(ROOT)}:\n" + "\n".join(found)


@pytest.mark.parametrize("page", LESSON_PAGES, ids=lambda p: p.stem)
def test_a_lesson_page_is_its_lesson_and_its_run(page):
    lessons = {info.path.stem: info for info in discover()}
    if not page.exists():
        pytest.skip(f"{page.relative_to(ROOT)} is made when the site is built (make docs)")
    info = lessons[page.stem]
    run = lesson_pages.cached_run(info, lesson_pages.run_key(info.path, lesson_pages.package_digest()))
    if run is None:
        pytest.skip(f"lesson {info.number} or tpsim changed since the site was built: make docs rebuilds its page")
    text, _ = lesson_pages.page_text(info, run, set(lessons))
    assert page.read_text() == text, (f"{page.relative_to(ROOT)} is not lessons/{info.path.name} and its cached "
                                      f"run as docs/lesson_pages.py writes them (make docs rebuilds it)")
