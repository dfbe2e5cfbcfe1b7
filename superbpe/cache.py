"""A cache shared by runs: piece counts and per-stage merge lists.

Sweeps repeat work: every point counts the same corpus with the same pattern, and every transition
point of a SuperBPE sweep trains the same stage 1, only to a different length. So:

* piece counts are cached by (corpus fingerprint, pre-tokenizer, special tokens, read options);
* merges of a stage are cached by (its piece counts, its rules, the merges it starts from). BPE is
  greedy, so the first ``n`` merges of a longer run *are* the run to ``n``: a cached list serves any
  shorter request, and a longer request replays it and trains only the rest.

Concurrent sweep jobs (Hydra's joblib launcher, several shells) share the directory: each entry is
computed under an exclusive ``flock`` on its own lock file and written atomically, so a job either
waits and reuses a finished entry or computes it itself; a killed job releases its lock with its
process and never leaves a torn file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from superbpe.counting import PieceCounts
from superbpe.engine import Merge
from superbpe.util import atomic_write_text

log = logging.getLogger("superbpe")
CACHE_FORMAT = 1


def cache_key(**parts: Any) -> str:
    """A stable digest of JSON-able parts."""
    text = json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@dataclass(frozen=True)
class CachedMerges:
    merges: list[Merge]  # the stage's own merges (not the ones it started from)
    exhausted: bool  # training ran out of pairs before the requested length: no longer list exists


class RunCache:
    """The cache directory; ``RunCache(None)`` is a cache that never hits and never writes."""

    def __init__(self, root: str | os.PathLike[str] | None) -> None:
        self.root = Path(root).expanduser() if root else None

    @property
    def enabled(self) -> bool:
        return self.root is not None

    @contextlib.contextmanager
    def entry(self, kind: str, key: str, suffix: str) -> Iterator[Path | None]:
        """Lock one entry and yield its path (None when the cache is off)."""
        if self.root is None:
            yield None
            return
        directory = self.root / kind
        with locked(directory / f"{key}.lock"):
            yield directory / f"{key}{suffix}"

    def load_counts(self, path: Path | None) -> PieceCounts | None:
        if path is None or not path.is_file():
            return None
        try:
            counts = PieceCounts.load(path)
        except ValueError as exc:  # corrupt entry: recompute rather than fail the run
            log.warning("ignoring unreadable cache entry %s: %s", path, exc)
            return None
        log.info("piece counts from cache %s", path)
        return counts

    @staticmethod
    def load_merges(path: Path | None, *, warn: bool = True) -> CachedMerges | None:
        """The entry, or None when absent or unreadable (said once: ``store_merges`` re-reads quietly)."""
        if path is None or not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return CachedMerges(decode_merges(data["merges"]), bool(data["exhausted"]))
        except (ValueError, KeyError, TypeError) as exc:
            if warn:
                log.warning("ignoring unreadable cache entry %s: %s", path, exc)
            return None

    @staticmethod
    def store_merges(path: Path | None, merges: Sequence[Merge], exhausted: bool) -> None:
        """Keep the longest list seen for this entry (all are prefixes of the same greedy run)."""
        if path is None:
            return
        current = RunCache.load_merges(path, warn=False)
        if (
            current is not None
            and (current.exhausted or len(current.merges) >= len(merges))
            and not exhausted
        ):
            return
        atomic_write_text(path, json.dumps({"merges": encode_merges(merges), "exhausted": exhausted}))


def encode_merges(merges: Sequence[Merge]) -> list[list[str]]:
    """Merges as hex pairs: exact for any bytes, still JSON."""
    return [[left.hex(), right.hex()] for left, right in merges]


def decode_merges(rows: Sequence[Sequence[str]]) -> list[Merge]:
    return [(bytes.fromhex(left), bytes.fromhex(right)) for left, right in rows]
