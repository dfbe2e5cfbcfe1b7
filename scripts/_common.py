"""Shared plumbing of the Hydra entry points: one-line errors and cleaning up after a failed job."""

from __future__ import annotations

import itertools
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf.errors import OmegaConfBaseException

from superbpe.errors import SuperBPEError

#: Errors a user can cause: reported as one line on stderr, exit code 1, no traceback.
USER_ERRORS = (SuperBPEError, OmegaConfBaseException, OSError)


def fail(exc: BaseException | str) -> None:
    """Print ``exc`` as one line and exit 1."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(1)


def run_hydra(main: Callable[[], None]) -> None:
    """Call a ``@hydra.main`` function; Hydra's own errors (bad override, unknown group) as one line.

    Hydra prints those as several lines plus a hint about HYDRA_FULL_ERROR, and its suggestion for a
    misspelt key (``+key=...``) is itself refused here. With HYDRA_FULL_ERROR=1 set by the user,
    the full traceback is shown as Hydra would.
    """
    from hydra.errors import HydraException

    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        main()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra raise instead of printing, so it is caught below
    try:
        main()
    except (HydraException, OmegaConfBaseException) as exc:
        fail(_hydra_message(exc))


def _hydra_message(exc: BaseException) -> str:
    """The first line of Hydra's message, and of its cause (OmegaConf says which key is wrong)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    override = getattr(exc, "override", None)  # an override Hydra's grammar cannot parse
    if isinstance(override, str):
        return f"cannot parse override {override!r} ({first}); quote the value: \"key='value'\""
    lines = str(exc).splitlines()
    if any(line.startswith("Available options") for line in lines):  # an unknown group option
        start = next(i for i, line in enumerate(lines) if line.startswith("Available options"))
        options = list(itertools.takewhile(lambda line: line.startswith("\t"), lines[start + 1 :]))
        options = [option.strip() for option in options]
        return f"{first} (choose one of: {', '.join(options)})"
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        first = f"{first.rstrip('.')}: {str(cause).strip().splitlines()[0]}"
    return first


def remove_if_only_logs(run_dir: Path) -> None:
    """Delete a Hydra run directory that holds nothing but Hydra's own files (a job that failed early)."""
    if not run_dir.is_dir():
        return
    for item in run_dir.iterdir():
        if item.name != ".hydra" and not item.name.endswith(".log"):
            return
    shutil.rmtree(run_dir, ignore_errors=True)
    parent = run_dir.parent
    if parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()


def setup_logging() -> None:
    """Log lines on stderr (the encode/evaluate configs turn Hydra's logging off)."""
    import logging

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s", stream=sys.stderr)
