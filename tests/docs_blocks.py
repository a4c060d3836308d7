"""The code blocks of the documentation pages, and what each kind of block is checked against (tests/test_docs_code.py).

A page's blocks are read with markdown-it (the parser under MyST), so an indented block, a fence inside a list
and a fence of four backticks are found as Sphinx finds them; a ``{include}`` directive adds the included file's
blocks. Each block is one of

- ``python``: a program, run in a fresh interpreter;
- ``shell``: commands; the cheap ones are run, the others checked against the command's own parser;
- ``output``: what a program printed, compared with a real run's output;
- a directive (``{toctree}``, ``{eval-rst}``, ...): not code, not checked here.

A block without a language is ``shell`` when every line starts with a command this project uses (or a prompt
``$ ``), else ``output``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GENERATED = DOCS / "course"  # docs/lesson_pages.py writes these when the site is built
COMMAND_WORDS = {"tpsim", "mpirun", "mpiexec", "make", "python", "pip", "jupyter", "source", "printf", "module",
                 "for", "done", "$"}
PYTHON = {"python", "py", "python3", "pycon"}
SHELL = {"sh", "bash", "shell", "console"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the block's first line in the page
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0] if self.text else ""

    @property
    def kind(self) -> str:
        if self.lang.startswith("{"):
            return "directive"
        if self.lang in PYTHON:
            return "python"
        if self.lang in SHELL:
            return "shell"
        if self.lang == "" and (self.text.startswith("$ ") or _all_commands(self.text)):
            return "shell"
        return "output"


CONTINUED = re.compile(r"\n\s+(?=[\[-])")  # a usage line continued on an indented line that starts with [ or -


def _all_commands(text: str) -> bool:
    """Every line (comments aside) starts with a command word or an environment assignment."""
    lines = CONTINUED.sub(" ", text).splitlines()
    firsts = [line.split()[0] for line in lines if line.strip() and not line.startswith("#")]
    return bool(firsts) and all(word in COMMAND_WORDS | {"do"} or _is_assignment(word) for word in firsts)


def _is_assignment(word: str) -> bool:
    return bool(re.match(r"^[A-Z_][A-Z0-9_]*=", word))


def source_pages() -> list[Path]:
    """The pages written by hand: docs/**/*.md (build output and generated pages aside) and README.md."""
    pages = [p for p in DOCS.rglob("*.md") if "_build" not in p.parts and not p.is_relative_to(GENERATED)]
    return sorted([ROOT / "README.md", *pages])


def blocks(page: Path) -> list[Block]:
    """Every code block of ``page``, those of the files it includes after its own."""
    from markdown_it import MarkdownIt

    found, included = [], []
    for token in MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8")):
        if token.type not in ("fence", "code_block"):
            continue
        info = token.info.strip()
        directive = re.match(r"^\{(code-block|code|sourcecode)\}\s*(\S*)", info)
        lang = directive.group(2) if directive else info.split()[0] if info else ""
        include = re.match(r"^\{include\}\s+(\S+)", info)
        if include:
            included.append((page.parent / include.group(1)).resolve())
        found.append(Block(page, token.map[0] + 2 if token.type == "fence" else token.map[0] + 1, lang,
                           token.content.rstrip("\n")))
    for path in included:
        found += blocks(path)
    return found


def inline_code(page: Path) -> list[str]:
    """The inline code spans of ``page``'s prose."""
    from markdown_it import MarkdownIt

    spans = []
    for token in MarkdownIt("commonmark").enable("table").parse(page.read_text(encoding="utf-8")):
        spans += [child.content for child in token.children or () if child.type == "code_inline"]
    return spans


# --- shell lines into commands --------------------------------------------------------------------------------
def logical_lines(text: str) -> list[str]:
    """Lines with their continuations (a backslash, an indented ``[--option``) joined; comment-only and blank
    lines dropped."""
    joined = CONTINUED.sub(" ", re.sub(r"\\\n\s*", " ", text))
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def simple_commands(line: str) -> list[list[str]]:
    """The simple commands of one shell line: split at ``;``, ``&&``, ``||``, ``|``; redirections, a leading
    ``$ `` prompt, environment assignments, ``for ... do`` / ``done`` / ``break`` left out; ``$n`` becomes 1."""
    lexer = shlex.shlex(line.replace("$n", "1").replace("$$n", "1"), posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands, current, tokens = [], [], list(lexer)
    skip_next = False
    for token in tokens:
        if skip_next:
            skip_next = False
        elif token in (">", ">>", "<", "2>"):
            skip_next = True
        elif set(token) <= set(";&|"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    cleaned = []
    for words in commands:
        while words and (words[0] == "$" or _is_assignment(words[0])):
            words = words[1:]
        if not words or words[0] in ("done", "break") or words[0] == "for":
            continue
        if words[0] == "do":
            words = words[1:]
        if words:
            cleaned.append(words)
    return cleaned


def prompt_runs(text: str) -> list[tuple[str, str]]:
    """``(command, its output)`` for each ``$ command`` line of a block and the lines under it."""
    runs: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            runs.append((line[2:], []))
        elif runs:
            runs[-1][1].append(line)
    return [(command, "\n".join(out)) for command, out in runs]


def excerpt_missing(shown: str, real: str) -> list[str]:
    """The lines of ``shown`` that are not, in order, lines of ``real`` (a line ``...`` marks lines left out;
    trailing spaces aside). An empty list: every line shown is the real output's."""
    real_lines = [line.rstrip() for line in real.splitlines()]
    position, missing = 0, []
    for line in (line.rstrip() for line in shown.splitlines()):
        if line.strip() in ("...", "…"):
            continue
        try:
            position = real_lines.index(line, position) + 1
        except ValueError:
            missing.append(line)
    return missing
