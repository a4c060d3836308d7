"""Every file tpsim writes is written atomically: a temporary name in the same folder, fsync, then ``os.replace``.

A reader — or a run killed half-way through a write (SIGKILL, SIGTERM, a full disk) — therefore sees either the
old file or the whole new one, never a file that looks complete but is not. ``os.replace`` is atomic within one
file system, which is why the temporary file lives in the destination's own folder; the leftover of a killed
write is a hidden ``.NAME.XXXX.tmp`` that no reader opens. MPI-free, like everything below ``comm``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, IO


def atomic_write(path, write: Callable[[IO[bytes]], object]) -> Path:
    """Call ``write(file)`` on a temporary binary file next to ``path``, fsync it, then rename it over ``path``."""
    path = Path(os.fspath(path))
    import tempfile  # here, not at the top: it pulls in shutil, random, bz2, lzma — start-up time × every rank

    fd, tmp = tempfile.mkstemp(dir=path.parent.resolve(), prefix=f".{path.name}.", suffix=".tmp")
    _PARTIAL.add(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would have
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    finally:
        _PARTIAL.discard(tmp)
    return path


_PARTIAL: set[str] = set()  # temporary files being written right now


def discard_partial() -> None:
    """Remove the temporary files of writes still in progress: for a process about to end on a signal."""
    for tmp in list(_PARTIAL):
        try:
            os.remove(tmp)
        except OSError:
            pass


def write_text(path, text: str) -> Path:
    """``Path.write_text``, atomically (UTF-8)."""
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def write_lines(path, lines) -> Path:
    """One string per line (each gets a ``\\n``), atomically."""
    return atomic_write(path, lambda f: f.writelines(line.encode("utf-8") + b"\n" for line in lines))


def save_figure(fig, path, **kwargs) -> Path:
    """``fig.savefig(path, **kwargs)``, atomically; the format comes from ``path``'s suffix as savefig's would."""
    fmt = kwargs.pop("format", None) or Path(path).suffix.lstrip(".") or None
    return atomic_write(path, lambda f: fig.savefig(f, format=fmt, **kwargs))


_UMASK: int | None = None


def _umask() -> int:
    global _UMASK
    if _UMASK is None:  # reading the umask means setting it: do it once, and put it straight back
        _UMASK = os.umask(0)
        os.umask(_UMASK)
    return _UMASK
