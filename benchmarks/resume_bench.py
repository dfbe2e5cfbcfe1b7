"""``python benchmarks/resume_bench.py CORPUS``: how long resuming a SuperBPE run stopped mid stage 2 takes.

A fresh ``superbpe-train schedule=superbpe`` run is timed, without a cache (the resume must count and
train) or, with ``--cache``, with a fresh one whose merges entries are then removed (a run stopped in
stage 2 has cached its counts but not that stage's merges). The run is then copied as if it had stopped
``--at`` of the way through stage 2 (its checkpoint cut there, its outputs removed), and
``superbpe-train resume=<copy>`` is timed. The work left at that point is what the fresh run spent after
stage 1 (its wall time minus stage 1's seconds from ``metrics.json``); the row gives the resume's wall
time against it. Both runs must write the same ``merges.txt``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from superbpe.formats.checkpoints import Checkpoint, load_checkpoint, save_checkpoint


def train_command() -> str:
    """The ``superbpe-train`` of this interpreter's environment (whether or not it is activated), else the
    one on ``PATH``."""
    beside = Path(sys.executable).parent / "superbpe-train"
    if beside.exists():
        return str(beside)
    found = shutil.which("superbpe-train")
    if found is None:
        raise SystemExit(f"error: no superbpe-train beside {sys.executable} or on PATH")
    return found


def train(what: str, log: Path, *overrides: str) -> float:
    """Wall seconds of one ``superbpe-train`` process (start-up included, as a user sees it). Its output
    goes to ``log``, whose last line is the one-line error when it fails."""
    command = [train_command(), *overrides]
    start = time.perf_counter()
    with open(log, "w") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        lines = log.read_text(errors="replace").strip().splitlines()
        raise SystemExit(
            f"error: superbpe-train ({what}) failed (exit {done.returncode}):"
            f" {lines[-1] if lines else 'no output'}"
        )
    return time.perf_counter() - start


def stop_mid_stage_2(run: Path, copy: Path, at: float) -> int:
    """``copy``: ``run`` with its checkpoint cut ``at`` of the way through stage 2; returns merges kept."""
    full = load_checkpoint(run)
    if full is None or len(full.stage_ends) != 2:
        raise SystemExit(f"error: the fresh run in {run} is not a finished two-stage run")
    copy.mkdir(parents=True)
    shutil.copytree(run / ".hydra", copy / ".hydra")
    stage1 = full.stage_ends[0]
    kept = stage1 + int((len(full.merges) - stage1) * at)
    cut = Checkpoint(
        config=full.config,
        fingerprint=full.fingerprint,
        merges=full.merges[:kept],
        stage_ends=full.stage_ends[:1],
        stage_stats=full.stage_stats[:1],
    )
    save_checkpoint(copy, cut)
    return kept


def one_round(corpus: Path, vocab: int, at: float, tmp: Path, cache: bool) -> dict[str, float]:
    fresh, copy = tmp / "fresh", tmp / "resumed"
    wall = train(
        "the fresh run",
        tmp / "fresh.log",
        "schedule=superbpe",
        "data=files",
        f"data.paths=[{corpus}]",
        f"vocab_size={vocab}",
        f"cache_dir={tmp / 'cache'}" if cache else "cache_dir=null",
        f"hydra.run.dir={fresh}",
    )
    shutil.rmtree(tmp / "cache" / "merges", ignore_errors=True)
    metrics = json.loads((fresh / "metrics.json").read_text())
    stage1 = float(metrics["stages"][0]["seconds"])
    kept = stop_mid_stage_2(fresh, copy, at)
    resumed = train("the resume", tmp / "resumed.log", f"resume={copy}")
    if (copy / "merges.txt").read_bytes() != (fresh / "merges.txt").read_bytes():
        raise SystemExit("the resumed run wrote other merges than the fresh run")
    shutil.rmtree(fresh)
    shutil.rmtree(copy)
    remaining = wall - stage1
    return {"fresh": wall, "stage1": stage1, "remaining": remaining, "resume": resumed,
            "ratio": resumed / remaining, "kept": kept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--at", type=float, default=0.5, help="share of stage 2 done when it stopped")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--cache", action="store_true",
        help="a run cache holding the counts (the default is none: the resume counts the corpus again)",
    )  # fmt: skip
    args = parser.parse_args()
    if not 0 < args.at < 1:
        raise SystemExit(f"error: --at is the share of stage 2 done, a fraction in (0, 1), not {args.at:g}")
    if args.rounds < 1:
        raise SystemExit(f"error: --rounds must be at least 1, not {args.rounds}")
    print("round  fresh s  stage 1 s  remaining s  resume s  resume/remaining  merges kept")
    for number in range(1, args.rounds + 1):
        with tempfile.TemporaryDirectory(prefix="resume-bench-") as tmp:
            row = one_round(args.corpus.resolve(), args.vocab, args.at, Path(tmp), args.cache)
        print(f"{number:>5}  {row['fresh']:7.2f}  {row['stage1']:9.2f}  {row['remaining']:11.2f}  "
              f"{row['resume']:8.2f}  {row['ratio']:16.2f}x  {int(row['kept']):>11}")


if __name__ == "__main__":
    main()
