"""The command reference, generated from the commands' own argparse parsers when the site is built.

Each command builds its parser inside its entry point; ``parser_of`` calls the entry point with ``parse_args``
replaced by a stop that hands the parser back, so nothing runs and no command needs a hook for the docs. The
page ``reference/commands.md`` holds a marker per command; the Sphinx hook below replaces each with a table of
that parser's options, so the reference cannot drift from the CLI. ``python docs/cli_reference.py`` prints the
generated Markdown. tests/test_docs.py checks that every option of every parser is on the built page.
"""

from __future__ import annotations

import argparse
import os
import importlib
import re
from contextlib import contextmanager

# marker on the page -> (module, entry point, argv that reaches parse_args)
COMMANDS = {
    "python -m tpsim.demo": ("tpsim.demo.cli", "build_parser", None),
    "python -m tpsim.generate": ("tpsim.generate.cli", "build_parser", None),
    "tpsim plan": ("tpsim.plan.cli", "parser", None),
    "tpsim schedule": ("tpsim.schedule_cli", "parser", None),
    "tpsim plot": ("tpsim.trace.cli", "plot_main", []),
    "tpsim report": ("tpsim.trace.cli", "report_main", []),
    "tpsim lesson": ("tpsim.teach.cli", "lesson_main", []),
    "tpsim check": ("tpsim.teach.cli", "check_main", []),
}
# commands that parse their own arguments: their usage text, as they print it
USAGE_TEXTS = {
    "tpsim": ("tpsim.cli", "usage"),
    "python -m tpsim.launcher": ("tpsim.launcher", "USAGE"),
}
MARKER = re.compile(r"^<!-- options: (?P<name>[^>]+?) -->$", re.M)


class _Caught(Exception):
    def __init__(self, parser):
        self.parser = parser


@contextmanager
def _stop_at_parse():
    original = argparse.ArgumentParser.parse_args

    def stop(self, *args, **kwargs):
        raise _Caught(self)

    argparse.ArgumentParser.parse_args = stop
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original


def parser_of(name: str) -> argparse.ArgumentParser:
    """The parser of command ``name`` (a key of ``COMMANDS``), built by the command's own code."""
    module, func, argv = COMMANDS[name]
    entry = getattr(importlib.import_module(module), func)
    if argv is None:
        return entry()
    with _stop_at_parse():
        try:
            entry(argv)
        except _Caught as caught:
            return caught.parser
    raise RuntimeError(f"{module}.{func} returned without parsing its arguments")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name, sub in action.choices.items()}


def subcommand_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    return {choice.dest: choice.help or "" for action in parser._actions
            if isinstance(action, argparse._SubParsersAction) for choice in action._choices_actions}


def options(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string (``--tp``) of a parser and its subcommands, ``-h``/``--help`` aside."""
    found = [s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")]
    for sub in subcommands(parser).values():
        found += options(sub)
    return found


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def table(parser: argparse.ArgumentParser) -> str:
    rows = ["| option | default | meaning |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += " " + (action.metavar or (("{" + ",".join(map(str, action.choices)) + "}")
                                                   if action.choices else action.dest.upper()))
        else:
            name = action.metavar or action.dest.upper()
        default = action.default
        shown = "" if default is None or default is argparse.SUPPRESS or action.nargs == 0 else _code(str(default))
        if action.required and action.nargs not in ("?", "*"):
            shown = "required"
        help_ = (action.help or "") % {"default": default, "prog": parser.prog} if action.help else ""
        rows.append(f"| {_code(_cell(name))} | {_cell(shown)} | {_cell(help_)} |")
    return "\n".join(rows) if len(rows) > 2 else "No options."


def usage_text(name: str) -> str:
    module, attr = USAGE_TEXTS[name]
    value = getattr(importlib.import_module(module), attr)
    return value() if callable(value) else value


def section(name: str) -> str:
    if name in USAGE_TEXTS:
        return f"```text\n{usage_text(name).strip()}\n```"
    os.environ["COLUMNS"] = "100"  # the usage lines wrap the same wherever the site is built
    parser = parser_of(name)
    parts = [f"```text\n{parser.format_usage().strip()}\n```", ""]
    if parser.description:
        parts += [_cell(parser.description), ""]
    parts.append(table(parser))
    helps = subcommand_help(parser)
    for sub_name, sub in subcommands(parser).items():
        about = sub.description or helps.get(sub_name, "")
        parts += ["", f"**`{name} {sub_name}`**" + (f": {_cell(about)}" if about else ""), "", table(sub)]
    if parser.epilog:
        parts += ["", _cell(parser.epilog)]
    return "\n".join(parts)


def expand(text: str) -> str:
    """The page's markers replaced by their commands' tables."""
    return MARKER.sub(lambda m: section(m.group("name")), text)


def _source_read(app, docname, source):
    if docname == "reference/commands":
        source[0] = expand(source[0])


def setup(app):
    app.connect("source-read", _source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    for name in [*USAGE_TEXTS, *COMMANDS]:
        print(f"## {name}\n\n{section(name)}\n")
