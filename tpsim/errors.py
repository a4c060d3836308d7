"""The one error type a user's configuration can raise, defined below everything so that pure arithmetic
(formulas, memory, partition sizes, the planner) can raise it without importing MPI.

``ConfigError`` means "this configuration cannot work" (sizes that do not divide, a world size that does not
match tp × dp, ...). Entry points turn it into one line and exit status 2 on every rank (``run_main``), so every
check that raises it must run identically on every rank, before the first collective.
"""

from __future__ import annotations

ABORTED = 70  # a job's exit status after an unexpected exception on some rank (sysexits' "internal software error")


class ConfigError(ValueError):
    """A configuration that cannot work (sizes that do not divide, ...). Raised identically on every rank."""


def at_least(minimum: float, **values) -> None:
    """``ConfigError`` naming the first flag below ``minimum`` (``--batch-size must be >= 1, got 0``); nan fails."""
    for name, value in values.items():
        if not value >= minimum:  # also catches nan
            raise ConfigError(f"--{name.replace('_', '-')} must be >= {minimum:g}, got {value}")


class TrainingStopped(RuntimeError):
    """A run that cannot go on (e.g. too many non-finite steps in a row), decided identically on every rank:
    entry points print one line on rank 0 and exit with status 1 on every rank (``run_main``), no traceback."""
