"""Shared plumbing of the Hydra entry points: one-line errors and cleaning up after a failed job."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from omegaconf.errors import OmegaConfBaseException

from superbpe.errors import SuperBPEError

#: Errors a user can cause: reported as one line on stderr, exit code 1, no traceback.
USER_ERRORS = (SuperBPEError, OmegaConfBaseException, OSError)


def fail(exc: BaseException) -> None:
    """Print ``exc`` as one line and exit 1."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(1)


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
