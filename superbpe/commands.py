"""The console scripts' entry points (``superbpe-train``, ``-encode``, ...): each imports its command when
called.

Why a module of its own: a command first loads Hydra, OmegaConf and most of the package, which takes a
moment, and a Ctrl-C during that import came out of the console script's own import line as a traceback.
Imported here, it ends as a command stopped before it started does: one line, exit 130. SIGTERM is
taken the same way from here on (exit 143): its default action ended the process without a word until
the command's own handler (``cli._on_sigterm``) was in place. Only the interpreter's start and this
package's small ``__init__`` come before it.
"""

from __future__ import annotations

import signal

_terminated = False
#: The commands that take SIGTERM as Ctrl-C once they run (``cli.run_hydra``); the others end on it.
_HYDRA_COMMANDS = ("train", "encode", "evaluate")


def _on_early_sigterm(signum: int, frame: object) -> None:
    """SIGTERM while the command loads: stopped as Ctrl-C is, remembered so the line says "terminated"."""
    global _terminated
    _terminated = True
    raise KeyboardInterrupt


def _command(name: str) -> None:
    signal.signal(signal.SIGTERM, _on_early_sigterm)  # the command puts its own in place when it runs
    try:
        from superbpe import cli  # the slow import, inside the handling this module exists for
    except KeyboardInterrupt:
        word, status = ("terminated", 143) if _terminated else ("interrupted", 130)
        print(f"{word}: before the command started, nothing done")  # where the commands say it
        raise SystemExit(status) from None
    if name not in _HYDRA_COMMANDS:  # no handler of its own follows: SIGTERM ends it, as it always did
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        try:
            getattr(cli, name)()
        except KeyboardInterrupt:  # between the import and the command's own handling of it
            cli.interrupted("before the command started, nothing done", terminated=_terminated)
    except SystemExit as stop:
        if stop.code in _STOPPED:
            _end_at_the_next_signal()
        raise


#: The exit statuses of a command stopped by Ctrl-C or SIGTERM (``cli.interrupted``).
_STOPPED = (130, 143)


def _end_at_the_next_signal() -> None:
    """Give Ctrl-C and SIGTERM their default action once the command has said how it stopped: the process
    then frees what it held (seconds for the python engine's tables), and a second Ctrl-C meanwhile raised
    KeyboardInterrupt in Python's shutdown, a traceback after the line. Now it ends the process at once, as
    the shell reports the signal (130, 143); everything was saved before the line."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


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
