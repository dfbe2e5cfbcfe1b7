"""``metrics.json``: what a run did and cost, beside the tokenizer it made.

Sweeps are compared from these files alone (``scripts/summarize.py``), so each one carries the
config summary (schedule, transition, vocab size, patterns), per-stage merges / seconds / peak RSS,
and bytes per token on the held-out file when one was given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from superbpe.core.util import atomic_write_text
from superbpe.formats.checkpoints import Checkpoint
from superbpe.training.config import TrainConfig

METRICS_FORMAT = 1


def build_metrics(
    cfg: TrainConfig,
    compat: dict[str, Any],
    checkpoint: Checkpoint,
    seconds: float,
    evaluation: dict[str, Any] | None,
    vocab_size: int,
    *,
    engine: str,
) -> dict[str, Any]:
    """The metrics document of one finished run; ``engine`` is the one that ran (``auto`` resolved)."""
    stages = checkpoint.stage_stats
    merges = len(checkpoint.merges)
    first_end = checkpoint.stage_ends[0] if checkpoint.stage_ends else merges
    return {
        "format": METRICS_FORMAT,
        "config": {
            "schedule": cfg.schedule.name,
            "transition": cfg.schedule.transition,
            "vocab_size": cfg.vocab_size,
            "special_tokens": compat["special_tokens"],
            "engine": engine,
            "engine_requested": cfg.engine.name,
            "pretokenizers": [stage["pretokenizer"]["name"] for stage in compat["stages"]],
            "from_run": cfg.schedule.from_run,
            "from_tokenizer": cfg.schedule.from_tokenizer,
            "data": compat["data"]["paths"][:20],
            "data_files": len(compat["data"]["paths"]),
            "eval": cfg.eval,
        },
        "num_merges": merges,
        "vocab_size": vocab_size,
        "transition_merges": first_end if len(checkpoint.stage_ends) > 1 else None,
        "transition_fraction": round(first_end / merges, 4)
        if merges and len(checkpoint.stage_ends) > 1
        else None,
        "stages": stages,
        "seconds": round(sum(float(s.get("seconds", 0.0)) for s in stages), 3),
        "seconds_this_process": round(seconds, 3),
        "peak_rss_bytes": max((int(s.get("peak_rss_bytes", 0)) for s in stages), default=0),
        "eval": evaluation,
    }


def write_metrics(path: Path, metrics: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(metrics, indent=2, ensure_ascii=False) + "\n")
