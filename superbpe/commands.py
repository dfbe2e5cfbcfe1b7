"""The console scripts' entry points (``superbpe-train``, ``-encode``, ...): each imports its command when
called.

Why a module of its own: a command first loads Hydra, OmegaConf and most of the package, which takes a
moment, and a Ctrl-C during that import came out of the console script's own import line as a traceback.
Imported here, it ends as a command stopped before it started does: one line, exit 130.
"""

from __future__ import annotations


def _command(name: str) -> None:
    try:
        from superbpe import cli  # the slow import, inside the handling this module exists for
    except KeyboardInterrupt:
        print("interrupted: before the command started, nothing done")  # where the commands say it
        raise SystemExit(130) from None
    try:
        getattr(cli, name)()
    except KeyboardInterrupt:  # between the import and the command's own handling of it
        cli.interrupted("before the command started, nothing done")


def train() -> None:
    """``superbpe-train`` (see :func:`superbpe.cli.train`)."""
    _command("train")


def encode() -> None:
    """``superbpe-encode`` (see :func:`superbpe.cli.encode`)."""
    _command("encode")


def evaluate() -> None:
    """``superbpe-evaluate`` (see :func:`superbpe.cli.evaluate`)."""
    _command("evaluate")


def summarize() -> None:
    """``superbpe-summarize`` (see :func:`superbpe.cli.summarize`)."""
    _command("summarize")


def cache() -> None:
    """``superbpe-cache`` (see :func:`superbpe.cli.cache`)."""
    _command("cache")
