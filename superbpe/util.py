"""Small shared helpers: atomic file writes and peak memory."""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import BinaryIO


@contextlib.contextmanager
def atomic_write(path: Path) -> Iterator[BinaryIO]:
    """Write to a temp file beside ``path`` and rename it into place only on success.

    A reader (or a resumed run after SIGKILL) therefore sees either the old file or the
    complete new one, never a torn write.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs should read like any other file
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_write(path) as handle:
        handle.write(text.encode("utf-8"))


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far.

    Linux's ``VmHWM`` first: ``ru_maxrss`` is inherited from the parent across fork and exec, so a child
    of a big process would report the parent's peak as its own. ``ru_maxrss`` elsewhere (macOS: bytes).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def import_optional(module: str, extra: str, purpose: str) -> ModuleType:
    """Import a dependency of an optional feature, or say in one line which extra provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        from superbpe.errors import ConfigError

        raise ConfigError(f'{purpose} needs {module}: pip install "superbpe[{extra}]"') from None
