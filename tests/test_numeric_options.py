"""Every numeric option of every command is checked where it is parsed: 0, −1, a word (and for a number, nan, inf
and a value past its range) are refused with one line naming the option and exit status 2, before any work.

The parsers are taken from the commands themselves — ``tpsim plot``, ``report``, ``lesson`` (each subcommand),
``check``, ``plan``, ``schedule``, the demo and ``tpsim.generate`` — by catching the parser each one builds as it
parses. Each numeric option's ``type`` is one of ``tpsim.options``' (its range in its name); an option typed a
bare ``int`` or ``float`` without ``choices`` fails the first test. The demo and decoding run on ranks: their parser
raises ``ConfigError``, which the entry point prints as one line on every rank's behalf (checked once under mpirun:
the issue's ``--microbatches 0``, a ``ZeroDivisionError`` on every rank before).
"""

from __future__ import annotations

import argparse

import pytest

from launch_program import run_mpi, without_launcher_notices
from tpsim.errors import ConfigError
from tpsim.options import NUMBERS, count, fraction, non_negative, positive, probability, whole

BAD = {count: ["0", "-1", "two", "1.5"], whole: ["-1", "two"], positive: ["0", "-1", "two", "nan", "inf"],
       non_negative: ["-1", "two", "nan"], fraction: ["0", "-1", "1.5", "two"], probability: ["-1", "1", "two"]}
GOOD = {count: "1", whole: "0", positive: "0.5", non_negative: "0", fraction: "1", probability: "0"}


class Caught(Exception):
    def __init__(self, parser):
        self.parser = parser


def built_parser(run, monkeypatch) -> argparse.ArgumentParser:
    """The parser ``run()`` builds, caught as it starts parsing."""
    def catch(self, args=None, namespace=None):
        raise Caught(self)
    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", catch)
        try:
            run()
        except Caught as got:
            return got.parser
    raise AssertionError("the command parsed nothing")


def commands(monkeypatch) -> dict:
    from tpsim.demo.cli import build_parser as demo
    from tpsim.generate.cli import build_parser as generate
    from tpsim.schedule_cli import parser as schedule
    from tpsim.plan.cli import parser as plan
    from tpsim.teach.cli import check_main, lesson_main
    from tpsim.trace.cli import plot_main, report_main

    return {"tpsim plot": built_parser(lambda: plot_main(["x"]), monkeypatch),
            "tpsim report": built_parser(lambda: report_main(["x"]), monkeypatch),
            "tpsim lesson": built_parser(lambda: lesson_main(["list"]), monkeypatch),
            "tpsim check": built_parser(lambda: check_main(["01"]), monkeypatch),
            "tpsim plan": plan(), "tpsim schedule": schedule(), "python -m tpsim.demo": demo(),
            "python -m tpsim.generate": generate()}


def numeric_options(parser, prefix=()):
    """``(argv to reach the option's parser, action)`` for every option of ``parser`` and its subcommands that
    takes a number."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from numeric_options(sub, (*prefix, name))
        elif action.option_strings and (action.type in NUMBERS or action.type in (int, float)):
            yield prefix, action


def required(parser) -> list[str]:
    """Valid values for what ``parser`` requires (positionals, required options)."""
    out = []
    for action in parser._actions:
        if not action.option_strings and action.nargs not in ("?", "*") and action.dest != "help":
            out.append("01")
        elif action.option_strings and action.required:
            out += [action.option_strings[0], "x" if action.type is None else GOOD.get(action.type, "1")]
    return out


def subparser(parser, path):
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def test_every_numeric_option_is_typed_by_its_range(monkeypatch):
    bare = [f"{cmd} {' '.join(path)} {a.option_strings[0]}".replace("  ", " ")
            for cmd, p in commands(monkeypatch).items() for path, a in numeric_options(p)
            if a.type in (int, float) and not a.choices]
    assert not bare, f"numeric options with no range: {bare}"


def test_a_value_out_of_range_or_a_word_is_one_line_naming_the_option_and_exit_2(monkeypatch, capsys):
    tried = 0
    for cmd, parser in commands(monkeypatch).items():
        for path, action in numeric_options(parser):
            if action.type not in BAD:
                continue
            option, sub = action.option_strings[0], subparser(parser, path)
            for value in BAD[action.type]:
                argv = [*path, *required(sub), option, value]
                tried += 1
                try:
                    parser.parse_args(argv)
                except SystemExit as stop:
                    err = capsys.readouterr().err
                    assert stop.code == 2, f"{cmd} {argv}: exit {stop.code}"
                    lines = err.strip().splitlines()
                    assert len(lines) == 1 and f"argument {option}" in lines[0] and value in lines[0], \
                        f"{cmd} {argv}: {err!r}"
                except ConfigError as err:  # the demo's and decoding's parser: one line, printed by the entry
                    assert "\n" not in str(err) and f"argument {option}" in str(err) and value in str(err)
                else:
                    raise AssertionError(f"{cmd} {' '.join(argv)} was accepted")
    assert tried > 150


@pytest.mark.parametrize("value", ["1", "0.5", "0"])
def test_values_in_range_still_parse(value):
    from tpsim.plan.cli import parser

    args = parser().parse_args(["--bucket-mb", value, "--mfu", "1", "--tp", "2"])
    assert (args.bucket_mb, args.mfu, args.tp) == (float(value), 1.0, 2)


@pytest.mark.slow
def test_the_demo_with_zero_micro_batches_is_one_line_and_exit_2():
    r = run_mpi(4, ["-m", "tpsim.demo", "--pp", "2", "--tp", "2", "--microbatches", "0"], timeout=60)
    err = without_launcher_notices(r.stderr).strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert err == ["tpsim.demo: error: argument --microbatches: '0' is not a whole number >= 1"], err
