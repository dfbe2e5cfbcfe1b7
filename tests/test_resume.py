"""SIGKILL a training run at several points, resume it, and get byte-identical merges; refuse bad resumes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from script_helpers import assert_one_line_error, run_script, start_script

from superbpe.checkpoints import CHECKPOINT_FILE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wiki(tmp_path_factory, wikitext_text) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "wiki.txt"
    path.write_text(wikitext_text[:300_000], encoding="utf-8")
    return path


def overrides(corpus: Path) -> list[str]:
    """A two-stage run of a few seconds that checkpoints every 20 merges (no cache: resume must train)."""
    return [
        "engine=python",
        "cache_dir=null",
        f"data.paths=[{corpus}]",
        "vocab_size=2300",
        "schedule=superbpe",
        "schedule.transition=0.7",
        "checkpoint.every_merges=20",
    ]


@pytest.fixture(scope="module")
def reference(wiki, tmp_path_factory) -> bytes:
    """merges.txt of the same run never interrupted."""
    tmp = tmp_path_factory.mktemp("reference")
    proc = run_script("train.py", f"hydra.run.dir={tmp / 'run'}", *overrides(wiki), cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return (tmp / "run" / "merges.txt").read_bytes()


def read_checkpoint(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / CHECKPOINT_FILE).read_text())
    except FileNotFoundError:
        return None


def kill_when(proc, run_dir: Path, wanted, timeout: float = 120) -> dict | None:
    """SIGKILL ``proc`` as soon as ``wanted(checkpoint)`` holds; returns the checkpoint seen then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = read_checkpoint(run_dir)
        if wanted(state, run_dir):
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return state
        assert proc.poll() is None, "the run ended before the kill point"
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("kill point never reached")


def in_stage(stage: int, min_merges: int):
    def wanted(state, _run_dir):
        return state is not None and len(state["stage_ends"]) == stage and state["merges_count"] >= min_merges

    return wanted


def resume(tmp_path: Path, run_dir: Path, corpus: Path, name: str, *extra: str):
    return run_script(
        "train.py",
        f"hydra.run.dir={tmp_path / name}",
        *overrides(corpus),
        f"resume={run_dir}",
        *extra,
        cwd=tmp_path,
    )


def test_killed_in_stage1_then_in_stage2_resumes_to_identical_merges(wiki, reference, tmp_path):
    run_dir = tmp_path / "run"
    proc = start_script("train.py", f"hydra.run.dir={run_dir}", *overrides(wiki), cwd=tmp_path)
    seen = kill_when(proc, run_dir, in_stage(0, 300))
    assert seen["stage_ends"] == [] and not seen["done"]

    proc = start_script(
        "train.py",
        f"hydra.run.dir={tmp_path / 'resume1'}",
        *overrides(wiki),
        f"resume={run_dir}",
        cwd=tmp_path,
    )
    seen = kill_when(
        proc,
        run_dir,
        lambda s, _: s is not None and s["stage_ends"] and s["merges_count"] >= s["stage_ends"][0] + 100,
    )
    assert len(seen["stage_ends"]) == 1 and not seen["done"]
    assert not (run_dir / "merges.txt").exists()

    done = resume(tmp_path, run_dir, wiki, "resume2")
    assert done.returncode == 0, done.stderr
    assert (run_dir / "merges.txt").read_bytes() == reference
    assert read_checkpoint(run_dir)["done"]


def test_killed_before_the_first_checkpoint_starts_over(wiki, reference, tmp_path):
    run_dir = tmp_path / "run"
    proc = start_script("train.py", f"hydra.run.dir={run_dir}", *overrides(wiki), cwd=tmp_path)
    kill_when(proc, run_dir, lambda state, d: state is None and (d / ".hydra").is_dir())
    done = resume(tmp_path, run_dir, wiki, "resume")
    assert done.returncode == 0, done.stderr
    assert (run_dir / "merges.txt").read_bytes() == reference


def test_resuming_a_finished_run_rewrites_the_same_files(wiki, reference, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_script(
        "train.py",
        f"hydra.run.dir={run_dir}",
        *overrides(wiki)[:-1],
        "vocab_size=400",
        "schedule.transition=50",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    before = (run_dir / "merges.txt").read_bytes()
    (run_dir / "merges.txt").unlink()  # as if killed while writing the outputs
    again = run_script(
        "train.py",
        f"hydra.run.dir={tmp_path / 'again'}",
        *overrides(wiki)[:-1],
        "vocab_size=400",
        "schedule.transition=50",
        f"resume={run_dir}",
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr
    assert (run_dir / "merges.txt").read_bytes() == before


def test_mismatched_resume_is_refused_naming_what_differs(wiki, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(wiki.read_bytes())
    run_dir = tmp_path / "run"
    proc = start_script("train.py", f"hydra.run.dir={run_dir}", *overrides(corpus), cwd=tmp_path)
    kill_when(proc, run_dir, in_stage(0, 100))
    checkpoint = (run_dir / CHECKPOINT_FILE).read_bytes()

    other_vocab = resume(tmp_path, run_dir, corpus, "r1", "vocab_size=2400")
    assert_one_line_error(other_vocab, "cannot resume", "vocab_size differs", "2300", "2400")

    other_pattern = resume(tmp_path, run_dir, corpus, "r2", "schedule.stage2_pattern=superbpe-paper")
    assert_one_line_error(other_pattern, "cannot resume", "stages[1].pretokenizer")

    other_corpus = tmp_path / "other.txt"
    other_corpus.write_bytes(wiki.read_bytes()[:100_000])
    moved = run_script(
        "train.py",
        f"hydra.run.dir={tmp_path / 'r3'}",
        *overrides(other_corpus),
        f"resume={run_dir}",
        cwd=tmp_path,
    )
    assert_one_line_error(moved, "cannot resume", "data.paths differs")

    with corpus.open("a", encoding="utf-8") as handle:
        handle.write("\nA changed corpus.\n")
    changed = resume(tmp_path, run_dir, corpus, "r4")
    assert_one_line_error(changed, "cannot resume", "corpus files changed")

    missing = resume(tmp_path, tmp_path / "no-such-run", corpus, "r5")
    assert_one_line_error(missing, "no such run directory")

    assert (run_dir / CHECKPOINT_FILE).read_bytes() == checkpoint
    assert not (run_dir / "merges.txt").exists()
