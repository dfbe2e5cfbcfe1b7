"""Checkpoints: what a killed run needs to continue to byte-identical merges.

Training is deterministic and the trainer continues exactly from replayed merges, so a checkpoint only
needs the merges so far, which stage they belong to, and enough of the configuration and the corpus
identity to refuse continuing a *different* run.

Two files, so that a save costs what changed rather than the whole run so far (rewriting every merge on
every save made a 128K-vocab run spend 16 s of its 20 s in checkpoints):

* ``checkpoint.merges`` — an append-only log, one merge a line (``left-hex right-hex``);
* ``checkpoint.json`` — written through a temp file and a rename; it names the log and how many merges
  and bytes of it are valid, with their SHA-256.

A save appends to the log (first cutting off anything past the last valid length, left by a kill),
fsyncs it, then replaces the JSON. SIGKILL at any moment therefore leaves a JSON whose valid prefix is
intact. When the merges do not extend what the log holds, the new log goes to the other of two file
names, so the JSON in place keeps pointing at an untouched file until it is replaced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superbpe.core.errors import ConfigError, InputError
from superbpe.core.types import Merge
from superbpe.core.util import atomic_write_text, naming_file, peak_rss_bytes

log = logging.getLogger("superbpe")
CHECKPOINT_FILE = "checkpoint.json"
MERGES_LOGS = ("checkpoint.merges", "checkpoint.merges.alt")
CHECKPOINT_FORMAT = 2


@dataclass
class Checkpoint:
    config: dict[str, Any]  # the run-defining settings (see run.compat_config)
    fingerprint: str  # corpus identity (sources.input_fingerprint)
    merges: list[Merge] = field(default_factory=list)
    stage_ends: list[int] = field(default_factory=list)  # merge count at the end of each finished stage
    stage_stats: list[dict[str, Any]] = field(default_factory=list)  # metrics of finished stages
    done: bool = False
    files: list[list[Any]] = field(default_factory=list)  # [path, size, mtime_ns] per corpus file
    # Wall seconds the processes before this one spent on the stage in progress, up to their last save:
    # a resumed stage's metrics add them to its own time.
    stage_seconds: float = 0.0
    # The engines those processes ran the stage in progress on, in order: a resume may change engines
    # inside a stage, and its metrics name every one that ran part of it.
    stage_engines: list[str] = field(default_factory=list)
    # The working directory the run was started in: relative data.paths were resolved there, so a resume
    # from elsewhere can say why they name other files ("" in checkpoints written before it was kept).
    cwd: str = ""
    # The highest peak RSS those processes reached in the stage in progress, up to their last save: the
    # stage's peak in its metrics is the highest of any process that ran part of it, as its seconds are.
    stage_peak_rss_bytes: int = 0

    @property
    def stage(self) -> int:
        """Index of the stage in progress (== number of finished stages)."""
        return len(self.stage_ends)


@dataclass
class _LogState:
    """What a run directory's merges log holds: the first ``count`` merges, in ``size`` bytes."""

    name: str
    count: int = 0
    size: int = 0
    digest: Any = field(default_factory=hashlib.sha256)
    last: Merge | None = None


def checkpoint_path(run_dir: Path) -> Path:
    return run_dir / CHECKPOINT_FILE


def _merge_lines(merges: Sequence[Merge]) -> bytes:
    return "".join(f"{left.hex()} {right.hex()}\n" for left, right in merges).encode("ascii")


def _parse_merge_lines(data: bytes, path: Path) -> list[Merge]:
    try:
        rows = [line.split(b" ") for line in data.splitlines()]
        return [(bytes.fromhex(left.decode()), bytes.fromhex(right.decode())) for left, right in rows]
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a usable merges log ({exc})") from None


def _write_log(run_dir: Path, state: _LogState, merges: Sequence[Merge]) -> None:
    """Make the log hold exactly ``merges``: append when they extend it, else start the other file."""
    extends = (
        state.count > 0
        and len(merges) >= state.count
        and merges[state.count - 1] == state.last
        and (run_dir / state.name).is_file()
    )
    if not extends:
        if state.count > 0:  # the JSON in place points at state.name: leave that file alone
            state.name = MERGES_LOGS[1] if state.name == MERGES_LOGS[0] else MERGES_LOGS[0]
        state.count, state.size, state.digest = 0, 0, hashlib.sha256()
    data = _merge_lines(merges[state.count :])
    with naming_file(run_dir / state.name), open(run_dir / state.name, "r+b" if extends else "wb") as handle:
        handle.truncate(state.size)  # drop a tail a killed save appended past the valid length
        handle.seek(state.size)
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    state.count, state.size = len(merges), state.size + len(data)
    state.digest.update(data)
    state.last = merges[-1] if merges else None


def _write_json(run_dir: Path, checkpoint: Checkpoint, state: _LogState) -> None:
    document = {
        "format": CHECKPOINT_FORMAT,
        "config": checkpoint.config,
        "fingerprint": checkpoint.fingerprint,
        "merges_log": state.name,
        "merges_count": state.count,
        "merges_bytes": state.size,
        "merges_sha256": state.digest.hexdigest(),
        "stage_ends": checkpoint.stage_ends,
        "stage_stats": checkpoint.stage_stats,
        "done": checkpoint.done,
        "files": checkpoint.files,
        "stage_seconds": round(checkpoint.stage_seconds, 3),
        "stage_engines": checkpoint.stage_engines,
        "cwd": checkpoint.cwd,
        "stage_peak_rss_bytes": checkpoint.stage_peak_rss_bytes,
    }
    atomic_write_text(checkpoint_path(run_dir), json.dumps(document) + "\n")


def save_checkpoint(run_dir: Path, checkpoint: Checkpoint, state: _LogState | None = None) -> _LogState:
    """Write ``checkpoint``; pass the returned state to the next save so it only appends."""
    run_dir.mkdir(parents=True, exist_ok=True)
    state = state if state is not None else _LogState(_unreferenced_log(run_dir))
    _write_log(run_dir, state, checkpoint.merges)
    _write_json(run_dir, checkpoint, state)
    return state


def _unreferenced_log(run_dir: Path) -> str:
    """The log name a checkpoint.json in place does not point at, so writing it cannot break that JSON."""
    try:
        referenced = json.loads(checkpoint_path(run_dir).read_text(encoding="utf-8")).get("merges_log")
    except (OSError, ValueError, AttributeError):
        referenced = None
    return MERGES_LOGS[1] if referenced == MERGES_LOGS[0] else MERGES_LOGS[0]


def load_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The run's checkpoint, or None when it has none yet."""
    loaded = _load(run_dir)
    return None if loaded is None else loaded[0]


def _load(run_dir: Path) -> tuple[Checkpoint, _LogState] | None:
    path = checkpoint_path(run_dir)
    if not path.is_file():
        _refuse_orphaned_log(run_dir)
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"unsupported format {data.get('format')!r}")
        name = data["merges_log"]
        if name not in MERGES_LOGS:
            raise ValueError(f"unknown merges log {name!r}")
        state = _LogState(name, int(data["merges_count"]), int(data["merges_bytes"]))
        merges = _read_log(run_dir / name, state, data["merges_sha256"])
        checkpoint = Checkpoint(
            config=data["config"],
            fingerprint=data["fingerprint"],
            merges=merges,
            stage_ends=[int(n) for n in data["stage_ends"]],
            stage_stats=list(data["stage_stats"]),
            done=bool(data["done"]),
            files=list(data.get("files") or []),  # absent from checkpoints written before it was kept
            stage_seconds=float(data.get("stage_seconds", 0.0)),  # likewise
            stage_engines=[str(name) for name in data.get("stage_engines") or []],  # likewise
            cwd=str(data.get("cwd") or ""),  # likewise
            stage_peak_rss_bytes=int(data.get("stage_peak_rss_bytes", 0)),  # likewise
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a usable checkpoint ({exc})") from None
    return checkpoint, state


def recorded_cwd(run_dir: Path) -> str:
    """The working directory the run in ``run_dir`` was started in, as its checkpoint records it ("" when it
    has no readable checkpoint, or one written before it was kept). Read without the merges, for a message."""
    try:
        data = json.loads(checkpoint_path(run_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return str(data.get("cwd") or "") if isinstance(data, dict) else ""


def orphaned_log(run_dir: Path) -> tuple[Path, int] | None:
    """A merges log that holds merges in a run directory without ``checkpoint.json``, and how many: the log
    alone says neither how much of it is valid nor which run it belongs to. None when there is none (an
    empty log holds nothing)."""
    if checkpoint_path(run_dir).is_file():
        return None
    for name in MERGES_LOGS:
        log_path = run_dir / name
        try:
            with open(log_path, "rb") as handle:
                lines = sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
        except OSError:  # absent (or unreadable, which the run's own writes would report)
            continue
        if lines:
            return log_path, lines
    return None


def _refuse_orphaned_log(run_dir: Path) -> None:
    """Refuse to continue a run whose merges log is there without its ``checkpoint.json``: starting over
    would write over the log."""
    if (found := orphaned_log(run_dir)) is not None:
        log_path, count = found
        raise InputError(
            f"{run_dir}: {CHECKPOINT_FILE} is missing but {log_path.name} holds {count} merges, which cannot "
            "be checked or continued without it; start a new run into a new directory, or remove "
            f"{log_path} to start this one over"
        )


def _read_log(path: Path, state: _LogState, sha256: str) -> list[Merge]:
    """The valid prefix of a merges log, checked against the JSON's length, count and digest."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(state.size)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the checkpoint's merges ({exc.strerror or exc})") from None
    state.digest.update(data)
    if len(data) != state.size or state.digest.hexdigest() != sha256:
        raise InputError(f"{path}: merges log does not match {CHECKPOINT_FILE} (truncated or modified)")
    merges = _parse_merge_lines(data, path)
    if len(merges) != state.count:
        raise InputError(f"{path}: holds {len(merges)} merges, {CHECKPOINT_FILE} says {state.count}")
    state.last = merges[-1] if merges else None
    return merges


def check_compatible(
    checkpoint: Checkpoint,
    config: dict[str, Any],
    fingerprint: str,
    run_dir: Path,
    files: Sequence[Sequence[Any]] = (),
    paths_note: str = "",
) -> None:
    """Refuse to continue a run with a different corpus or settings, naming what differs (``files``: the
    corpus files' state now, as :func:`superbpe.core.sources.input_files_state` gives it). ``paths_note``
    replaces the closing advice when data.paths differs: why they may (relative paths resolved in another
    working directory) and what to do."""
    differences = diff(checkpoint.config, config)
    paths_differ = any(d.startswith("data.paths") for d in differences)
    if checkpoint.fingerprint != fingerprint and not paths_differ:
        differences.insert(0, _changed_files(checkpoint.files, files))
    if differences:
        shown = "; ".join(differences[:4]) + ("; ..." if len(differences) > 4 else "")
        advice = " (resume with the original corpus and overrides)"
        if paths_differ and paths_note:
            advice = f": {paths_note}"
        raise ConfigError(f"cannot resume {run_dir}: {shown}{advice}")


def _changed_files(then: Sequence[Sequence[Any]], now: Sequence[Sequence[Any]]) -> str:
    """Which corpus files changed since the checkpoint (one whose size changed first), and, for one of the
    same size, how to give it back its recorded time if its bytes are the same too (a copy that did not
    keep times)."""
    try:
        before = {str(path): (int(size), int(mtime)) for path, size, mtime in then}
        changed = [(str(p), size, mtime) for p, size, mtime in now if before.get(str(p)) != (size, mtime)]
    except (TypeError, ValueError):  # a hand-edited checkpoint
        before, changed = {}, []
    if not before or not changed:  # a checkpoint written before the files were kept
        return "corpus files changed (size or modification time)"
    changed.sort(key=lambda file: before.get(file[0], (None,))[0] == file[1])  # resized ones first
    path, size, _ = changed[0]
    old_size, old_mtime = before.get(path, (None, 0))
    more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
    if old_size != size:
        return f"corpus file {path} changed: {old_size} bytes at the checkpoint, {size} now{more}"
    script = f"import os; os.utime({json.dumps(path)}, ns=({old_mtime}, {old_mtime}))"  # one shell quote
    return (
        f"corpus file {path} was modified since the checkpoint (same size){more}; if its bytes are the "
        f"same, give it back its time with: python3 -c {shlex.quote(script)}"
    )


def diff(old: Any, new: Any, path: str = "") -> list[str]:
    """Human-readable differences between two JSON-like values, by dotted path."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in old or key not in new:
                out.append(f"{sub} only in {'the checkpoint' if key in old else 'this run'}")
            else:
                out.extend(diff(old[key], new[key], sub))
        return out
    if path == "data.paths" and isinstance(old, list) and isinstance(new, list) and old != new:
        added, removed = [p for p in new if p not in old], [p for p in old if p not in new]
        parts = [f"added {_short(added)}"] * bool(added) + [f"removed {_short(removed)}"] * bool(removed)
        return [f"data.paths differs ({'; '.join(parts) or 'another order'} since the checkpoint)"]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new) and path != "data.paths":
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in diff(a, b, f"{path}[{i}]")]
    if old != new:
        return [f"{_KNOBS.get(path, path)} differs (checkpoint: {_short(old)}, now: {_short(new)})"]
    return []


#: Checkpoint settings named as the option a user gives (the merges of a source tokenizer are recorded
#: as their fingerprint).
_KNOBS = {"source": "the stage-1 source (schedule.from_run / schedule.from_tokenizer)"}


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def check_checkpoint_intervals(every_merges: int, every_seconds: float) -> None:
    """How often checkpoints are saved must be a positive interval (checked before a run counts)."""
    if every_merges < 1:
        raise ConfigError(f"checkpoint.every_merges must be >= 1, not {every_merges}")
    if not every_seconds > 0:  # NaN too: no time would ever be past it, so none would be saved by time
        raise ConfigError(f"checkpoint.every_seconds must be > 0, not {every_seconds}")


class Checkpointer:
    """Writes the checkpoint every ``every_merges`` merges or ``every_seconds`` seconds, whichever first."""

    def __init__(
        self, run_dir: Path, checkpoint: Checkpoint, every_merges: int, every_seconds: float, engine: str = ""
    ) -> None:
        """``engine``: the one this process trains on (recorded per stage with those before it)."""
        check_checkpoint_intervals(every_merges, every_seconds)
        self.engine = engine
        self.run_dir = run_dir
        self.state = checkpoint
        self.every_merges = every_merges
        self.every_seconds = every_seconds
        self.saved_at = len(checkpoint.merges)
        self.saved_time = time.monotonic()
        # The stage in progress: the seconds earlier processes spent on it, and when this one began it.
        self.earlier_stage_seconds = checkpoint.stage_seconds
        self.earlier_stage_engines = list(checkpoint.stage_engines)
        self.earlier_stage_peak_rss_bytes = checkpoint.stage_peak_rss_bytes
        self._stage_start = time.monotonic()
        self._in_stage = False  # between begin_stage and finish_stage: this process's peak is the stage's
        self._latest: Sequence[Merge] | None = None  # the merges last reported, saved or not
        loaded = _load(run_dir) if checkpoint_path(run_dir).is_file() else None
        # Continue the log a resumed run left only if it is this checkpoint's; otherwise start afresh.
        self._log = loaded[1] if loaded is not None and loaded[0].merges == checkpoint.merges else None

    def begin_stage(self) -> None:
        """The stage in progress starts (or resumes) now; each save records its seconds and peak so far
        (the caller starts a new peak-RSS window for the stage)."""
        self._stage_start = time.monotonic()
        self._in_stage = True

    def stage_engines(self) -> list[str]:
        """The engines the stage in progress has run on, in order, this process's last."""
        earlier = self.earlier_stage_engines
        return earlier if not self.engine or earlier[-1:] == [self.engine] else [*earlier, self.engine]

    def stage_peak_rss_bytes(self) -> int:
        """The stage in progress's peak RSS so far, over this process and those before it."""
        own = peak_rss_bytes() if self._in_stage else 0
        return max(self.earlier_stage_peak_rss_bytes, own)

    def save(self) -> None:
        in_stage = self.earlier_stage_seconds + time.monotonic() - self._stage_start
        self.state.stage_seconds = 0.0 if self.state.done else in_stage
        self.state.stage_engines = [] if self.state.done else self.stage_engines()
        self.state.stage_peak_rss_bytes = self.stage_peak_rss_bytes() if not self.state.done else 0
        self._log = save_checkpoint(self.run_dir, self.state, self._log)
        self.saved_at = len(self.state.merges)
        self.saved_time = time.monotonic()

    def progress(self, merges: Sequence[Merge]) -> None:
        """Called as merges are chosen; saves when due."""
        self._latest = merges
        due_merges = len(merges) - self.saved_at >= self.every_merges
        if due_merges or time.monotonic() - self.saved_time >= self.every_seconds:
            self.state.merges = list(merges)
            self.save()

    def save_latest(self) -> int:
        """Save every merge reported so far, due or not (Ctrl-C keeps the work); returns how many.

        The merges log is written afresh: an interrupt may have stopped a save between writing and
        recording what it appended, and a fresh log does not depend on that bookkeeping.
        """
        if self._latest is not None and len(self._latest) > len(self.state.merges):
            self.state.merges = list(self._latest)
        self._log = None
        self.save()
        return len(self.state.merges)

    def finish_stage(self, merges: Sequence[Merge], stats: dict[str, Any]) -> None:
        """A stage boundary is always checkpointed."""
        self._latest = None
        self.state.merges = list(merges)
        self.state.stage_ends.append(len(merges))
        self.state.stage_stats.append(stats)
        self.earlier_stage_seconds = 0.0  # the next stage has none yet
        self.earlier_stage_engines = []
        self.earlier_stage_peak_rss_bytes = 0
        self._stage_start = time.monotonic()
        self._in_stage = False  # the peak window is the finished stage's until the next one begins
        self.save()

    def finish_run(self) -> None:
        self.state.done = True
        self.save()
        for name in MERGES_LOGS:  # a log the final JSON does not point at is a leftover
            if self._log is not None and name != self._log.name:
                (self.run_dir / name).unlink(missing_ok=True)
