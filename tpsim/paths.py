"""Check before working: every path a run will write or read, checked before the first collective.

A run that trains for minutes and then finds that ``--out`` names a file, or a folder under ``/proc``, has
wasted those minutes and (worse) ended in a traceback on one rank. Entry points therefore call these checks on
every rank while parsing their flags; a problem raises ``ConfigError`` — one line naming the flag, the path and
the problem, exit status 2 on every rank (``run_main``), nothing computed. The checks are deterministic on a
file system all ranks share, which is where rank 0 writes.

Writability is *tried*, not inferred from permission bits: root passes every ``os.access`` test, yet cannot
create files under ``/proc`` or on a read-only mount. ``check_output_dir`` therefore creates and removes one
empty temporary file in the deepest folder that exists; it creates no folder. MPI-free.
"""

from __future__ import annotations

import os

from tpsim.errors import ConfigError


def _deepest_existing(path: str) -> str:
    """``path`` itself if it exists, else its nearest existing ancestor (``.`` for a relative path)."""
    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return probe


def _try_write(folder: str) -> str | None:
    """None if a file can be created in ``folder``, else the reason (the OS's words)."""
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tpsim-write-check.")
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.remove(tmp)
    return None


def check_output_dir(path, flag: str = "--out") -> str:
    """Raise ``ConfigError`` unless ``path`` is (or can be created as) a folder this process can write in."""
    path = os.fspath(path)
    where = f"{flag} {path}"
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError(f"{where}: exists and is a file, not a folder")
    existing = _deepest_existing(path)
    if not os.path.isdir(existing):
        raise ConfigError(f"{where}: cannot be created: {existing} is a file, not a folder")
    reason = _try_write(existing)
    if reason is not None:
        verb = "is not writable" if existing == os.path.abspath(path) else f"cannot be created in {existing}"
        raise ConfigError(f"{where}: {verb} ({reason})")
    return path


def check_output_file(path, flag: str) -> str:
    """Raise ``ConfigError`` unless ``path`` can be written as a file: not a folder, its folder writable."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path}: is a folder, expected a file name")
    check_output_dir(os.path.dirname(os.path.abspath(path)), f"{flag} {path}: its folder")
    return path


def check_input_file(path, flag: str, *, folder_with: str | None = None) -> str:
    """Raise ``ConfigError`` unless ``path`` is an existing, readable file (its format is the reader's job).

    ``folder_with``: a folder is accepted too when it holds a readable file of that name (e.g. a Hugging Face
    model folder's ``config.json``; its weights are the reader's job)."""
    path = os.fspath(path)
    where = f"{flag} {path}"
    if not os.path.exists(path):
        raise ConfigError(f"{where}: no such file")
    if os.path.isdir(path):
        if folder_with is None:
            raise ConfigError(f"{where}: is a folder, expected a file")
        if not os.path.isfile(os.path.join(path, folder_with)):
            raise ConfigError(f"{where}: a folder without {folder_with} (expected a tpsim .npz or a model folder)")
    readable = os.path.join(path, folder_with) if os.path.isdir(path) else path
    try:
        with open(readable, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    return path
