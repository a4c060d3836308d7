"""Is a command written in the documentation one that works? (tests/test_docs_code.py)

``problem(words)`` checks one simple command (``["tpsim", "plan", "--model", ...]``) and returns what is wrong
with it, or None:

- ``tpsim ...``: the subcommand exists and its own argparse parser accepts the arguments; the cheap ones
  (``--help``, ``--version``, ``plan`` but ``--validate``, ``lesson list|start|notebook``, ``report``, ``plot``)
  are also run in the test's folder and must exit 0;
- ``mpirun``/``mpiexec``: the launcher's options are ones MPICH's or Open MPI's launcher takes, then the
  program: ``python -m tpsim.demo|generate`` parsed by its parser, ``python lessons/NN_*.py`` a lesson that
  declares that many ranks, a script that exists;
- ``python -m pytest`` (and ``tests/mpi/pytest_on_every_rank.py``): every flag is in ``pytest --help``, every
  path exists; ``python -c CODE`` is run; ``python -m tpsim.launcher -n N ...`` is checked as ``mpiexec -n N``;
- ``make X``: X is a target of the Makefile (and ``ARGS`` of ``make demo`` are demo flags);
- ``pip install``: an extra named in ``".[...]"`` is one of pyproject.toml's, a ``-r`` file exists;
- ``jupyter``, ``module``, ``printf``, ``source``, ``head``, ...: another project's command, not checked.

``synopsis_problem(line)`` checks a usage line (``--tp T [--sp] --model NAME | --config FILE``): every option
written in it is one the command has.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import io
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from docs_blocks import DOCS, ROOT

sys.path.insert(0, str(DOCS))
import cli_reference  # noqa: E402  (docs/cli_reference.py: the commands' parsers, as the reference shows them)

EXTERNAL = {"jupyter", "module", "printf", "source", "cd", "export", "head", "tail", "grep", "less"}
LAUNCHER_OPTIONS = {"-n": 1, "-np": 1, "-f": 1, "-hosts": 1, "-genv": 2, "-ppn": 1, "--hostfile": 1, "-x": 1,
                    "--map-by": 1, "--oversubscribe": 0}
PYTEST_VALUES = {"-k", "-m", "-p", "--ignore", "--timeout", "--timeout-method", "--deselect"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\.\w+)?$")  # N, DIR, FILE.npz
OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


@functools.cache
def parser(name: str) -> argparse.ArgumentParser:
    return cli_reference.parser_of(name)


def parse_problem(name: str, args: list[str]) -> str | None:
    """What ``name``'s parser says about ``args`` (None when it accepts them)."""
    out = io.StringIO()
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser(name).parse_args(args)
        except SystemExit as stop:
            if stop.code not in (0, None):
                return f"{name} {' '.join(args)}: {out.getvalue().strip().splitlines()[-1]}"
        except Exception as err:  # noqa: BLE001 — a parser whose error() raises (the demo's: ConfigError)
            return f"{name} {' '.join(args)}: {type(err).__name__}: {err}"
    return None


def run_problem(argv: list[str], cwd: Path) -> str | None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "TPSIM_WORK": str(cwd / "tpsim-work")}
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    return None if r.returncode == 0 else f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"


def tpsim_output(args: list[str], cwd: Path) -> str:
    """What ``tpsim ARGS`` prints, run in ``cwd`` (it must exit 0)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    r = subprocess.run([sys.executable, "-m", "tpsim.cli", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, f"tpsim {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def cheap(name: str, rest: list[str]) -> bool:
    if "--help" in rest or "-h" in rest:
        return True
    return (name == "plan" and "--validate" not in rest) or name in ("report", "plot") or \
        (name == "lesson" and rest[:1] in (["list"], ["start"], ["notebook"]))


def tpsim_problem(args: list[str], cwd: Path | None) -> str | None:
    from tpsim.cli import COMMANDS

    if not args:
        return "tpsim with no command"
    if args[0] in ("-h", "--help", "-V", "--version"):
        return run_problem([sys.executable, "-m", "tpsim.cli", args[0]], cwd) if cwd else None
    if args[0] not in COMMANDS:
        return f"tpsim has no command {args[0]!r}"
    found = parse_problem(f"tpsim {args[0]}", args[1:])
    if found is None and cwd is not None and cheap(args[0], args[1:]):
        found = run_problem([sys.executable, "-m", "tpsim.cli", *args], cwd)
    return found


@functools.cache
def pytest_help() -> str:
    return subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True,
                          cwd=ROOT).stdout


def pytest_problem(args: list[str]) -> str | None:
    words = iter(args)
    for word in words:
        if word.startswith("-"):
            flag = word.split("=")[0]
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", pytest_help()):
                return f"pytest has no option {flag}"
            if flag in PYTEST_VALUES and "=" not in word:
                next(words, None)
        elif not (ROOT / word.split("::")[0]).exists():
            return f"pytest argument {word}: no such file or folder"
    return None


def python_problem(args: list[str], cwd: Path | None, ranks: str | None = None) -> str | None:
    if not args:
        return "python with no program (an interactive session?)"
    if args[0] == "-c":
        return run_problem([sys.executable, "-c", args[1]], cwd) if cwd else None
    if args[0] == "-m":
        module, rest = args[1], args[2:]
        if module in ("tpsim.demo", "tpsim.generate"):
            return parse_problem(f"python -m {module}", rest)
        if module == "tpsim.launcher":
            return launcher_problem(rest)
        if module == "pytest":
            return pytest_problem(rest)
        if module == "tpsim.cli":
            return tpsim_problem(rest, cwd)
        return None if importlib.util.find_spec(module) else f"python -m {module}: no such module"
    script = ROOT / args[0]
    if not script.is_file():
        return f"python {args[0]}: no such file (from the repository root)"
    if script.parent.name == "lessons" and ranks is not None:
        from tpsim.teach.lessons import read_lesson

        if str(read_lesson(script).ranks) != ranks and not PLACEHOLDER.match(ranks):
            return f"{args[0]} runs on {read_lesson(script).ranks} ranks, not {ranks}"
    if script.name == "pytest_on_every_rank.py":
        return pytest_problem(args[1:])
    return None


def launcher_problem(args: list[str]) -> str | None:
    """``python -m tpsim.launcher [--show] [--timeout S] -n N ARGS...``"""
    rest = list(args)
    while rest and rest[0] in ("--show", "--timeout"):
        rest = rest[2:] if rest[0] == "--timeout" else rest[1:]
    if rest[:1] != ["-n"] or len(rest) < 3:
        return f"python -m tpsim.launcher {' '.join(args)}: expected [--show] [--timeout S] -n N ARGS..."
    return python_problem(rest[2:], None, ranks=rest[1])


def mpirun_problem(args: list[str]) -> str | None:
    rest, ranks = list(args), None
    while rest and rest[0] not in ("python", "python3"):
        option = rest.pop(0)
        if option not in LAUNCHER_OPTIONS:
            return f"mpirun option {option} is not one tpsim's pages use (add it to LAUNCHER_OPTIONS if it is right)"
        values, rest = rest[:LAUNCHER_OPTIONS[option]], rest[LAUNCHER_OPTIONS[option]:]
        if option in ("-n", "-np"):
            ranks = values[0]
            if not (ranks.isdigit() or PLACEHOLDER.match(ranks)):
                return f"mpirun -n {ranks}: not a rank count"
    return python_problem(rest[1:], None, ranks) if rest else "mpirun without a python program"


@functools.cache
def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def make_problem(args: list[str]) -> str | None:
    targets = [a for a in args if "=" not in a]
    missing = [t for t in targets if t not in make_targets()]
    if missing:
        return f"make {' '.join(missing)}: no such target in the Makefile"
    passed = [a.split("=", 1)[1] for a in args if a.startswith("ARGS=")]
    if passed and targets == ["demo"]:
        return parse_problem("python -m tpsim.demo", passed[0].split())
    return None


def pip_problem(args: list[str]) -> str | None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for i, word in enumerate(args):
        named = re.match(r"^\.\[([\w,-]+)\]$", word)
        if named and (unknown := set(named.group(1).split(",")) - extras):
            return f"pip install {word}: pyproject.toml has no extra {', '.join(sorted(unknown))}"
        if word == "-r" and not (ROOT / args[i + 1]).is_file():
            return f"pip install -r {args[i + 1]}: no such file"
    return None


def problem(words: list[str], cwd: Path | None) -> str | None:
    """What is wrong with one simple command (None: nothing); cheap commands run in ``cwd`` (None: never)."""
    first, rest = words[0], words[1:]
    if first == "tpsim":
        return tpsim_problem(rest, cwd)
    if first in ("mpirun", "mpiexec"):
        return mpirun_problem(rest)
    if first in ("python", "python3"):
        return python_problem(rest, cwd)
    if first == "make":
        return make_problem(rest)
    if first == "pip":
        return pip_problem(rest)
    if first in EXTERNAL:
        return None
    return f"{first}: not a command these pages are known to use (add it to docs_commands.py)"


def is_synopsis(line: str) -> bool:
    """A usage line rather than a command: optional parts in brackets, alternatives, placeholders."""
    return bool(re.search(r"[\[\]{}…]|\.\.\.| \| ", line)) or any(PLACEHOLDER.match(w) for w in line.split()[1:])


def synopsis_problem(line: str) -> str | None:
    """Every option written in a usage line of ``tpsim X``, ``python -m tpsim.demo|generate`` or ``make X`` is
    one that command has (arguments are not checked: they are placeholders)."""
    words = line.split()
    if "python" in words and words[0] in ("mpirun", "mpiexec"):
        words = words[words.index("python"):]
    if words[:1] == ["make"]:
        return make_problem([w for w in words[1:2] if re.match(r"^[\w-]+$", w) and not PLACEHOLDER.match(w)])
    if words[:1] == ["tpsim"] and len(words) > 1 and not words[1].startswith("-"):
        from tpsim.cli import COMMANDS

        if words[1] not in COMMANDS:
            return f"tpsim has no command {words[1]!r}"
        name, tail = f"tpsim {words[1]}", " ".join(words[2:])
    elif words[:3] in (["python", "-m", "tpsim.demo"], ["python", "-m", "tpsim.generate"]):
        name, tail = " ".join(words[:3]), " ".join(words[3:])
    else:
        return None
    known = set(cli_reference.options(parser(name))) | {"-h", "--help"}
    unknown = [option for option in OPTION.findall(tail) if option not in known]
    return f"{name} has no option {', '.join(unknown)}" if unknown else None
