"""Checkpoints: what a killed run needs to continue to byte-identical merges.

Training is deterministic and the trainer continues exactly from replayed merges, so a checkpoint only
needs the merges so far, which stage they belong to, and enough of the configuration and the corpus
identity to refuse continuing a *different* run. It is one JSON file written through a temp file and a
rename, so SIGKILL at any moment leaves either the previous or the new checkpoint, never a torn one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superbpe.cache import decode_merges, encode_merges
from superbpe.engine import Merge
from superbpe.errors import ConfigError, InputError
from superbpe.util import atomic_write_text

log = logging.getLogger("superbpe")
CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_FORMAT = 1


@dataclass
class Checkpoint:
    config: dict[str, Any]  # the run-defining settings (see run.compat_config)
    fingerprint: str  # corpus identity (sources.input_fingerprint)
    merges: list[Merge] = field(default_factory=list)
    stage_ends: list[int] = field(default_factory=list)  # merge count at the end of each finished stage
    stage_stats: list[dict[str, Any]] = field(default_factory=list)  # metrics of finished stages
    done: bool = False

    @property
    def stage(self) -> int:
        """Index of the stage in progress (== number of finished stages)."""
        return len(self.stage_ends)

    def to_json(self) -> dict[str, Any]:
        """Field by field: ``asdict`` would deep-copy every merge on every save (seconds at 32K merges)."""
        return {
            "format": CHECKPOINT_FORMAT,
            "config": self.config,
            "fingerprint": self.fingerprint,
            "merges": encode_merges(self.merges),
            "stage_ends": self.stage_ends,
            "stage_stats": self.stage_stats,
            "done": self.done,
        }


def checkpoint_path(run_dir: Path) -> Path:
    return run_dir / CHECKPOINT_FILE


def save_checkpoint(run_dir: Path, checkpoint: Checkpoint) -> None:
    atomic_write_text(checkpoint_path(run_dir), json.dumps(checkpoint.to_json()) + "\n")


def load_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The run's checkpoint, or None when it has none yet."""
    path = checkpoint_path(run_dir)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"unsupported format {data.get('format')!r}")
        return Checkpoint(
            config=data["config"],
            fingerprint=data["fingerprint"],
            merges=decode_merges(data["merges"]),
            stage_ends=[int(n) for n in data["stage_ends"]],
            stage_stats=list(data["stage_stats"]),
            done=bool(data["done"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a usable checkpoint ({exc})") from None


def check_compatible(checkpoint: Checkpoint, config: dict[str, Any], fingerprint: str, run_dir: Path) -> None:
    """Refuse to continue a run with a different corpus or settings, naming what differs."""
    differences = diff(checkpoint.config, config)
    if checkpoint.fingerprint != fingerprint and not any(d.startswith("data.paths") for d in differences):
        differences.insert(0, "corpus files changed (size or modification time)")
    if differences:
        shown = "; ".join(differences[:4]) + ("; ..." if len(differences) > 4 else "")
        raise ConfigError(
            f"cannot resume {run_dir}: {shown} (resume with the original corpus and overrides)"
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
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new) and path != "data.paths":
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in diff(a, b, f"{path}[{i}]")]
    if old != new:
        return [f"{path} differs (checkpoint: {_short(old)}, now: {_short(new)})"]
    return []


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


class Checkpointer:
    """Writes the checkpoint every ``every_merges`` merges or ``every_seconds`` seconds, whichever first."""

    def __init__(
        self, run_dir: Path, checkpoint: Checkpoint, every_merges: int, every_seconds: float
    ) -> None:
        if every_merges < 1:
            raise ConfigError(f"checkpoint.every_merges must be >= 1, not {every_merges}")
        if every_seconds <= 0:
            raise ConfigError(f"checkpoint.every_seconds must be > 0, not {every_seconds}")
        self.run_dir = run_dir
        self.state = checkpoint
        self.every_merges = every_merges
        self.every_seconds = every_seconds
        self.saved_at = len(checkpoint.merges)
        self.saved_time = time.monotonic()

    def save(self) -> None:
        save_checkpoint(self.run_dir, self.state)
        self.saved_at = len(self.state.merges)
        self.saved_time = time.monotonic()

    def progress(self, merges: Sequence[Merge]) -> None:
        """Called as merges are chosen; saves when due."""
        due_merges = len(merges) - self.saved_at >= self.every_merges
        if due_merges or time.monotonic() - self.saved_time >= self.every_seconds:
            self.state.merges = list(merges)
            self.save()

    def finish_stage(self, merges: Sequence[Merge], stats: dict[str, Any]) -> None:
        """A stage boundary is always checkpointed."""
        self.state.merges = list(merges)
        self.state.stage_ends.append(len(merges))
        self.state.stage_stats.append(stats)
        self.save()

    def finish_run(self) -> None:
        self.state.done = True
        self.save()
