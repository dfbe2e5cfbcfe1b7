"""A cache shared by runs: piece counts and per-stage merge lists.

Sweeps repeat work: every point counts the same corpus with the same pattern, and every transition
point of a SuperBPE sweep trains the same stage 1, only to a different length. So:

* piece counts are cached by (corpus fingerprint, pre-tokenizer, special tokens, read options);
* merges of a stage are cached by (its piece counts, its rules, the merges it starts from). BPE is
  greedy, so the first ``n`` merges of a longer run *are* the run to ``n``: a cached list serves any
  shorter request, and a longer request replays it and trains only the rest. Lengths are counted in
  new tokens (:func:`token_prefix`): a duplicate merge (``compat.duplicates="merge"``) makes none. A
  stage that drops absent inherited merges (``compat.absent_inherited="drop"``) may lack some of the
  merges it starts from, so its entry holds its whole list, not just what follows them.

Concurrent sweep jobs (Hydra's joblib launcher, several shells) share the directory: each entry is
computed under an exclusive ``flock`` on its own lock file and written atomically, so a job either
waits and reuses a finished entry or computes it itself; a killed job releases its lock with its
process and never leaves a torn file.

Every entry carries a checksum (the ``.counts`` format's own; a SHA-256 of the merges in a merges
entry), checked whenever it is read: a cache must never change a run's result unseen, and a flipped bit
in a key or a count is a valid-looking table. An entry that fails its check, or that has none (an older
format), is discarded with a one-line warning and computed again; ``superbpe-cache verify`` checks them
all.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from superbpe.core.counts import PieceCounts, counts_file_header, counts_file_problem
from superbpe.core.errors import ConfigError
from superbpe.core.types import Merge
from superbpe.core.util import (
    TEMP_SUFFIX,
    atomic_write_text,
    counted,
    directory_problem,
    human_size,
    missing_dirs,
    remove_empty_dirs,
    user_path,
)
from superbpe.engines import native as native_engine

log = logging.getLogger("superbpe")
CACHE_FORMAT = 1
#: The format of a merges entry; entries without it (written before they had a checksum) are stale.
MERGES_ENTRY_FORMAT = 2
#: Piece counts of plain text whose file would be larger than this share of the corpus are not
#: cached: reading such a file back takes as long as counting the corpus again (a SuperBPE stage 2
#: of web text, nearly every line distinct, makes a file nearly the size of the corpus), and writing
#: it delays the run that counted.
COUNTS_MAX_SHARE = 0.25
#: Counts files up to this size are cached whatever their share: reading them back is quick.
COUNTS_ALWAYS_BYTES = 64 << 20


def counts_not_worth_caching(counts: PieceCounts, corpus_bytes: int, plain_text: bool) -> str | None:
    """Why ``counts`` of a corpus of ``corpus_bytes`` (all ``plain_text`` files, which count fastest)
    are not worth a cache entry, or None when they are."""
    size = counts.file_size()
    if not plain_text or size <= COUNTS_ALWAYS_BYTES or size <= COUNTS_MAX_SHARE * corpus_bytes:
        return None
    return (
        f"their file would hold {human_size(size, 'B')}, {100 * size / max(corpus_bytes, 1):.0f}% of the "
        "corpus, and reading it back saves no time over counting again"
    )


def cache_key(**parts: Any) -> str:
    """A stable digest of JSON-able parts."""
    text = json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed) for the block.

    A lock file may be removed while others wait on it (an entry whose computation failed leaves
    none, see ``RunCache.entry``), so the lock counts only if ``path`` is still the file locked;
    otherwise the lock is taken again on the file now at ``path``.
    """
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the directory went away between the two calls: again
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _same_file(fd, path):
            break
        os.close(fd)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        now = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


@dataclass(frozen=True)
class CachedMerges:
    merges: list[Merge]  # the stage's own merges (or, when it drops inherited ones, its whole list)
    exhausted: bool  # training ran out of pairs before the requested length: no longer list exists
    # The engine(s) that chose them, as the entry's ``about`` says (``python+native``); None when it does not.
    engine: str | None = None


class RunCache:
    """The cache directory; ``RunCache(None)`` is a cache that never hits and never writes."""

    def __init__(self, root: str | os.PathLike[str] | None, max_gib: float | None = None) -> None:
        self.root = user_path(root) if root else None
        problem = None if self.root is None else directory_problem(self.root)
        if problem:
            raise ConfigError(f"cache_dir {self.root} cannot be used ({problem}); cache_dir=null: no cache")
        if max_gib is not None and not max_gib > 0:
            raise ConfigError(f"cache_max_gib must be positive (or null for no cap), not {max_gib}")
        self.max_bytes = None if max_gib is None else int(max_gib * (1 << 30))

    def trim(self) -> None:
        """Apply the size cap: drop least recently used entries until the cache fits (after a run)."""
        if self.root is not None and self.max_bytes is not None:
            removed, freed = enforce_size_cap(self.root, self.max_bytes)
            if removed:
                log.info("cache over its cap: removed %d old entries (%d bytes)", removed, freed)

    @property
    def enabled(self) -> bool:
        return self.root is not None

    @contextlib.contextmanager
    def entry(self, kind: str, key: str, suffix: str) -> Iterator[Path | None]:
        """Lock one entry and yield its path (None when the cache is off).

        When the block leaves no entry (its computation failed), its lock file goes too, and so do the
        directories made for it that are still empty: a failed run leaves nothing in the cache.
        """
        if self.root is None:
            yield None
            return
        directory = self.root / kind
        made = missing_dirs(directory)
        lock, path = directory / f"{key}.lock", directory / f"{key}{suffix}"
        try:
            with locked(lock):
                try:
                    yield path
                finally:
                    if not path.exists():
                        lock.unlink(missing_ok=True)
        finally:
            if not path.exists():
                remove_empty_dirs(made)  # one not empty stays: another job uses it

    def load_counts(self, path: Path | None, *, native: bool = False) -> PieceCounts | None:
        """The cached counts, read straight into a Rust table when ``native`` (the native engine trains
        on that table; a Python mapping would be parsed and then converted to one, entry by entry)."""
        if path is None or not path.is_file():
            return None
        try:
            if native:
                counts: PieceCounts = native_engine.load_counts(path, require_checksum=True)
            else:
                counts = PieceCounts.load(path, require_checksum=True)
        except ValueError as exc:  # the error names the file and what is wrong with it
            discard_entry(path, str(exc))
            return None
        log.info("piece counts from cache %s", path)
        mark_used(path)
        return counts

    @staticmethod
    def load_merges(path: Path | None, *, warn: bool = True) -> CachedMerges | None:
        """The entry, or None when absent or unusable; an unusable one is discarded with a warning, or
        quietly when not ``warn`` (``store_merges`` replaces it)."""
        if path is None or not path.is_file():
            return None
        try:
            cached = read_merges_entry(path)
        except ValueError as exc:
            if warn:
                discard_entry(path, f"{path}: {exc}")
            return None
        mark_used(path)
        return cached

    @staticmethod
    def store_merges(
        path: Path | None, merges: Sequence[Merge], exhausted: bool, about: dict[str, Any] | None = None
    ) -> None:
        """Keep the longest list seen for this entry (all are prefixes of the same greedy run). ``about``
        says what the merges were made from (stage, pattern, corpus files) for ``superbpe-cache list``
        (the key, a digest, does not); it is kept outside the checksum, which covers what runs read."""
        if path is None:
            return
        current = RunCache.load_merges(path, warn=False)
        if (
            current is not None
            and (current.exhausted or len(current.merges) >= len(merges))
            and not exhausted
        ):
            return
        rows = encode_merges(merges)
        entry = {"format": MERGES_ENTRY_FORMAT, "merges": rows, "exhausted": exhausted}
        entry |= {"sha256": _merges_digest(rows, exhausted)} | ({"about": about} if about else {})
        atomic_write_text(path, json.dumps(entry))


def _merges_digest(rows: Any, exhausted: Any) -> str:
    """The checksum of a merges entry: SHA-256 of its content in one canonical spelling."""
    text = json.dumps([rows, exhausted], separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_merges_entry(path: Path) -> CachedMerges:
    """A merges entry whose checksum matches; ``ValueError`` saying why it cannot be used."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("format") != MERGES_ENTRY_FORMAT:
            found = data.get("format", 1) if isinstance(data, dict) else None
            raise ValueError(f"format {found}, not {MERGES_ENTRY_FORMAT}: written without a checksum")
        if data.get("sha256") != _merges_digest(data["merges"], data["exhausted"]):
            raise ValueError("its checksum does not match: damaged since it was written")
        engine = (data.get("about") or {}).get("engine")
        engine = engine if isinstance(engine, str) else None
        return CachedMerges(decode_merges(data["merges"]), bool(data["exhausted"]), engine)
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror})") from None
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a merges entry ({exc!r})") from None


def discard_entry(path: Path, why: str) -> None:
    """Remove an entry that cannot be used (the caller holds its lock) and say so in one line: the run
    computes it again, so a bad entry costs time, never a failed run or different merges."""
    log.warning("cache entry discarded, computing it again: %s", why)
    with contextlib.suppress(OSError):  # one that cannot be removed is replaced when written again
        path.unlink(missing_ok=True)


def token_prefix(merges: Sequence[Merge], tokens: int) -> list[Merge] | None:
    """The shortest prefix of ``merges`` that makes ``tokens`` new tokens, or None if they make fewer.

    A merge whose token an earlier one made (a duplicate, HF-style) adds no token; the trainer stops
    right after the merge that makes the last token it wants, so this prefix is the shorter run.
    """
    made: set[bytes] = set()
    if tokens <= 0:
        return []
    for index, (left, right) in enumerate(merges):
        made.add(left + right)
        if len(made) == tokens:
            return list(merges[: index + 1])
    return None


def tokens_made(merges: Sequence[Merge]) -> int:
    """How many new tokens ``merges`` make (fewer than merges when some are duplicates)."""
    return len({left + right for left, right in merges})


def encode_merges(merges: Sequence[Merge]) -> list[list[str]]:
    """Merges as hex pairs: exact for any bytes, still JSON."""
    return [[left.hex(), right.hex()] for left, right in merges]


def decode_merges(rows: Sequence[Sequence[str]]) -> list[Merge]:
    return [(bytes.fromhex(left), bytes.fromhex(right)) for left, right in rows]


# ---------------------------------------------------------------------------------------------------------
# Managing the cache directory (``superbpe-cache``, the ``cache_max_gib`` cap)

DEFAULT_CACHE_DIR = "~/.cache/superbpe"
AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    kind: str  # "counts" | "merges"
    size: int
    last_used: float  # mtime: set when written and again whenever a run reuses the entry


def resolve_cache_dir(directory: str | None) -> Path:
    """``directory``, else ``$SUPERBPE_CACHE_DIR``, else ``~/.cache/superbpe`` (as ``conf/train.yaml``)."""
    return user_path(directory or os.environ.get("SUPERBPE_CACHE_DIR") or DEFAULT_CACHE_DIR)


def parse_age(text: str) -> float:
    """``"90s"``, ``"30m"``, ``"12h"``, ``"7d"``, ``"2w"`` as seconds.

    The unit is required: a bare ``7`` meant seven days to the user who typed it and seven seconds to
    the parser, and ``clear`` then removed every entry.
    """
    seconds = -1.0
    if text[-1:] in AGE_UNITS:
        with contextlib.suppress(ValueError):
            seconds = float(text[:-1]) * AGE_UNITS[text[-1]]
    if not seconds >= 0:
        raise ConfigError(f"bad age {text!r}: a number with its unit s, m, h, d or w (e.g. 7d, 12h, 30m)")
    return seconds


#: An entry's file name: its key (:func:`cache_key`) and its kind's suffix. Nothing else in a cache
#: directory is an entry, so a ``--cache-dir`` naming some other directory lists and removes nothing.
_SUFFIXES = {"counts": ".counts", "merges": ".json"}
_ENTRY_NAMES = {kind: re.compile(rf"[0-9a-f]{{40}}{re.escape(suffix)}") for kind, suffix in _SUFFIXES.items()}


#: What a killed job leaves beside the entries: the temp file of an entry's write cut short (as
#: ``atomic_write`` names it) and the lock of an entry it never wrote.
_TEMP_NAME = re.compile(
    rf"\.([0-9a-f]{{40}})({'|'.join(map(re.escape, _SUFFIXES.values()))})\.[^/]+{re.escape(TEMP_SUFFIX)}"
)
_LOCK_NAME = re.compile(r"([0-9a-f]{40})\.lock")


def leftovers(root: Path) -> list[tuple[Path, Path]]:
    """Each file a killed job left in the cache, with the lock of the entry it belongs to. A lock is left
    only while its entry is missing; a job computing or writing that entry holds it (see
    :func:`remove_leftover`)."""
    found = []
    for kind, suffix in _SUFFIXES.items():
        directory = root / kind
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if (temp := _TEMP_NAME.fullmatch(path.name)) and temp.group(2) == suffix:
                found.append((path, directory / f"{temp.group(1)}.lock"))
            elif _LOCK_NAME.fullmatch(path.name) and not path.with_suffix(suffix).exists():
                found.append((path, path))
    return found


@contextlib.contextmanager
def _lock_if_free(lock_path: Path) -> Iterator[bool]:
    """Hold an entry's lock for the block if no job holds it (True), else do nothing (False). A job
    computing or writing the entry holds it; a remover that finds the lock file gone from under it (taken
    away by another remover) holds nothing."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield _same_file(fd, lock_path)
    finally:
        os.close(fd)


def _size(path: Path) -> int:
    """A file's size; 0 when it is gone (removed by a concurrent clear)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def remove_leftover(path: Path, lock_path: Path) -> int | None:
    """Delete a leftover (:func:`leftovers`) while its entry's lock is free, and the lock too while the
    entry is missing; its size, or None (kept) when a job holds the lock: it is computing or writing."""
    with _lock_if_free(lock_path) as free:
        if not free:
            return None
        size = 0
        if path != lock_path:
            size = _size(path)
            path.unlink(missing_ok=True)
        if not any(lock_path.with_suffix(suffix).exists() for suffix in _SUFFIXES.values()):
            lock_path.unlink(missing_ok=True)
        return size


def cache_entries(root: Path) -> list[CacheEntry]:
    """Every finished entry, newest use first (lock files and temp files of writes in flight excluded)."""
    entries = []
    for kind, name in _ENTRY_NAMES.items():
        directory = root / kind
        if not directory.is_dir():
            continue
        for path in directory.iterdir():
            if not name.fullmatch(path.name) or not path.is_file():
                continue
            with contextlib.suppress(FileNotFoundError):  # removed by a concurrent clear
                stat = path.stat()
                entries.append(CacheEntry(path, kind, stat.st_size, stat.st_mtime))
    return sorted(entries, key=lambda entry: entry.last_used, reverse=True)


def mark_used(path: Path | None) -> None:
    """Bump an entry's mtime when a run reuses it, so size-capped eviction removes the least used."""
    if path is not None:
        with contextlib.suppress(OSError):
            os.utime(path)


def remove_entry(entry: CacheEntry) -> bool:
    """Delete one entry under its lock; False (kept) when a job holds the lock right now."""
    lock_path = entry.path.with_suffix(".lock")
    with _lock_if_free(lock_path) as free:
        if not free:
            return False
        entry.path.unlink(missing_ok=True)
        # Its lock goes too, while held: a job waiting on it finds the path no longer the file it locked
        # and locks the path anew (`locked`).
        lock_path.unlink(missing_ok=True)
        return True


def clear_leftovers(root: Path) -> tuple[int, int]:
    """Remove what killed jobs left (:func:`leftovers`) and no job is using; returns (files, bytes)."""
    removed = freed = 0
    for path, lock in leftovers(root):
        if (size := remove_leftover(path, lock)) is not None:
            removed, freed = removed + 1, freed + size
    return removed, freed


def clear_cache(root: Path, older_than_seconds: float | None = None) -> tuple[int, int]:
    """Remove every entry (or those unused for ``older_than_seconds``); returns (entries, bytes) removed.
    What killed jobs left goes by :func:`clear_leftovers`."""
    cutoff = None if older_than_seconds is None else time.time() - older_than_seconds
    removed = freed = 0
    for entry in cache_entries(root):
        if (cutoff is None or entry.last_used < cutoff) and remove_entry(entry):
            removed, freed = removed + 1, freed + entry.size
    return removed, freed


def enforce_size_cap(root: Path, max_bytes: int) -> tuple[int, int]:
    """Remove what killed jobs left, then least recently used entries until the cache holds at most
    ``max_bytes``."""
    clear_leftovers(root)
    entries = cache_entries(root)
    total = sum(entry.size for entry in entries)
    removed = freed = 0
    for entry in reversed(entries):  # oldest use first
        if total - freed <= max_bytes:
            break
        if remove_entry(entry):
            removed, freed = removed + 1, freed + entry.size
    return removed, freed


def entry_problem(entry: CacheEntry) -> str | None:
    """Why ``entry`` would be discarded by the next run that reads it, or None when it is sound."""
    if entry.kind == "counts":
        return counts_file_problem(entry.path)
    try:
        read_merges_entry(entry.path)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class BadEntry:
    entry: CacheEntry
    problem: str  # what is wrong, in a few words
    removed: bool


def verify_cache(root: Path, *, remove: bool = False) -> tuple[int, list[BadEntry]]:
    """Check every entry's checksum: (entries checked, the bad ones). With ``remove`` each bad one is
    removed under its lock, once checked again there (a job may have just replaced it); one whose lock
    a job holds is kept (the job is replacing it)."""
    entries = cache_entries(root)
    bad = []
    for entry in entries:
        if (problem := entry_problem(entry)) is None:
            continue
        removed = False
        if remove:
            lock_path = entry.path.with_suffix(".lock")
            with _lock_if_free(lock_path) as free:
                if free and entry_problem(entry) is not None:
                    entry.path.unlink(missing_ok=True)
                    lock_path.unlink(missing_ok=True)
                    removed = True
        bad.append(BadEntry(entry, problem, removed))
    return len(entries), bad


def entry_contents(entry: CacheEntry) -> str:
    """What an entry holds, in a few words, from what it records: a count's pattern and pieces (its
    header), a merges list's length and, when written with it, its stage, pattern, the engine(s) that chose
    it and corpus files.
    An entry that cannot be read says so (``verify`` says why)."""
    if entry.kind == "counts":
        header = counts_file_header(entry.path)
        if header is None:
            return "unreadable (superbpe-cache verify)"
        meta, pieces = header
        pattern = (meta.get("pretokenizer") or {}).get("name", "?")
        noun = "piece" if pieces == 1 else "pieces"
        return f"counts of {pattern}: {human_size(pieces)} {noun}, specials {meta.get('special_tokens', [])}"
    try:
        data = json.loads(entry.path.read_text(encoding="utf-8"))
        merges, about = len(data["merges"]), data.get("about") or {}
    except (OSError, ValueError, KeyError, TypeError):
        return "unreadable (superbpe-cache verify)"
    text = f"{counted(merges, 'merge')}{' (all the counts allow)' if data.get('exhausted') else ''}"
    if about:
        files = [Path(path).name for path in about.get("data") or []]
        more = int(about.get("files") or len(files)) - len(files)
        corpus = ", ".join(files) + (f" +{counted(more, 'file')}" if more > 0 else "")
        engine = about.get("engine")  # absent from older entries
        made = f"{about.get('pretokenizer', '?')}" + (f", by {engine}" if isinstance(engine, str) else "")
        text = f"{about.get('stage', '?')} ({made}): {text} of {corpus or '?'}"
    return text


def describe_cache(root: Path) -> str:
    """A listing for ``superbpe-cache list``: one line per entry (kind, size, last use, key for removal,
    what it holds), then the total."""
    entries = cache_entries(root)
    now = time.time()
    lines = [f"{root}"]
    for entry in entries:
        age_hours = (now - entry.last_used) / 3600
        size = human_size(entry.size, "B")
        lines.append(
            f"  {entry.kind:<7} {size:>10}  used {age_hours:8.1f} h ago  {entry.path.name}  "
            f"{entry_contents(entry)}"
        )
    total = sum(entry.size for entry in entries)
    lines.append(f"{counted(len(entries), 'entry', 'entries')}, {human_size(total, 'B')}")
    if left := leftovers(root):
        size = sum(_size(path) for path, _ in left)
        found = counted(len(left), "file")
        lines.append(f"{found} left by killed jobs, {human_size(size, 'B')} (clear removes them)")
    return "\n".join(lines)
