"""Command-line numbers checked where they are parsed, and a usage error as one line.

Every numeric option of every command takes one of these as its argparse ``type``, so a value out of its range is
refused by the parser — before any rank builds anything — with one line naming the option and the rule:

    count          a whole number >= 1      sizes (--tp, --pp, --microbatches, --layers, ...), steps, widths
    whole          a whole number >= 0      a step or rank index, a seed, counts where 0 means none
    positive       a finite number > 0      a learning rate, a timeout
    non_negative   a finite number >= 0     a bucket cap (0: one bucket a tensor), a clip norm (0: off)
    fraction       a number in (0, 1]       an MFU or efficiency
    probability    a number in [0, 1)       a dropout rate

``OneLineParser`` is argparse with its usage errors printed as ``PROG: error: MESSAGE`` on one line, exit status 2
(``--help`` still prints the whole usage); ``run_command`` runs a command and prints a ``ConfigError`` the same
way. ``RankZeroParser, for programs on MPI ranks (the demo, decoding, the
lessons), raises a usage error as ``ConfigError`` on every rank — the entry point prints it once — and prints
``--help`` on rank 0 only. Pure: MPI is asked for the rank only when help is printed.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Callable

from tpsim.errors import ConfigError


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr and exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def run_command(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int],
                argv: list[str] | None = None) -> int:
    """A single-process command's entry: ``run(parser.parse_args(argv))``, a ``ConfigError`` it raises printed as
    ``PROG: error: MESSAGE`` on one line with exit status 2, as the parser's own usage errors are."""
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ConfigError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2


class RankZeroParser(argparse.ArgumentParser):
    """argparse that prints help on rank 0 only and turns usage errors into ``ConfigError``."""

    def print_help(self, file=None):
        from tpsim.comm.launch import world_rank  # only here: parsing needs no MPI

        if world_rank() == 0:
            super().print_help(file)

    def error(self, message):
        raise ConfigError(message)


def _number(name: str, kind: type, rule: str, ok: Callable[[float], bool]):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {rule}") from None
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(f"{text!r} is not {rule}")
        return value
    parse.__name__ = name
    parse.rule = rule
    return parse


count = _number("count", int, "a whole number >= 1", lambda x: x >= 1)
whole = _number("whole", int, "a whole number >= 0", lambda x: x >= 0)
positive = _number("positive", float, "a number > 0", lambda x: x > 0)
non_negative = _number("non_negative", float, "a number >= 0", lambda x: x >= 0)
fraction = _number("fraction", float, "a number in (0, 1]", lambda x: 0 < x <= 1)
probability = _number("probability", float, "a number in [0, 1)", lambda x: 0 <= x < 1)
speedup = _number("speedup", float, "a number in [1, 2]", lambda x: 1 <= x <= 2)  # FP8 over 16-bit, at most 2x
NUMBERS = (count, whole, positive, non_negative, fraction, probability, speedup)
