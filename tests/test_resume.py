"""SIGKILL or Ctrl-C training runs at many points; each resume gives byte-identical files. Bad resumes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import fixture_texts
import pytest
from script_helpers import (
    SCRIPTS,
    assert_one_line_error,
    run_script,
    script_env,
    signal_group_when,
    start_captured_script,
    start_script,
)

from superbpe.core.sources import input_fingerprint
from superbpe.engines.interface import native_available
from superbpe.formats.checkpoints import CHECKPOINT_FILE, load_checkpoint

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


def kill_when(
    proc, run_dir: Path, wanted, signum: int = signal.SIGKILL, delay: float = 0.0, timeout: float = 120
) -> dict | None:
    """Send ``signum`` to ``proc`` ``delay`` s after ``wanted(checkpoint)`` holds; returns that checkpoint."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = read_checkpoint(run_dir)
        if wanted(state, run_dir):
            time.sleep(delay)
            assert proc.poll() is None, "the run ended before the kill point"
            os.kill(proc.pid, signum)
            if signum == signal.SIGKILL:
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


def resume(tmp_path: Path, run_dir: Path, *extra: str):
    """``train.py resume=<run dir>``: the run's own overrides are read back from its .hydra directory."""
    return run_script("train.py", f"resume={run_dir}", *extra, cwd=tmp_path)


def test_killed_in_stage1_then_in_stage2_resumes_to_identical_merges(wiki, reference, tmp_path):
    run_dir = tmp_path / "run"
    proc = start_script("train.py", f"hydra.run.dir={run_dir}", *overrides(wiki), cwd=tmp_path)
    seen = kill_when(proc, run_dir, in_stage(0, 300))
    assert seen["stage_ends"] == [] and not seen["done"]
    before = [read_checkpoint(run_dir)["stage_seconds"]]  # the first process's last save
    peaks = [read_checkpoint(run_dir)["stage_peak_rss_bytes"]]

    proc = start_script("train.py", f"resume={run_dir}", cwd=tmp_path)
    seen = kill_when(
        proc,
        run_dir,
        lambda s, _: s is not None and s["stage_ends"] and s["merges_count"] >= s["stage_ends"][0] + 100,
    )
    assert len(seen["stage_ends"]) == 1 and not seen["done"]
    assert not (run_dir / "merges.txt").exists()
    before.append(read_checkpoint(run_dir)["stage_seconds"])
    peaks.append(read_checkpoint(run_dir)["stage_peak_rss_bytes"])
    # A killed process that held more than the one finishing the stage (python, then native): its peak
    # is the stage's, though it is gone.
    held = read_checkpoint(run_dir)
    held["stage_peak_rss_bytes"] = 2**40
    (run_dir / CHECKPOINT_FILE).write_text(json.dumps(held))

    done = resume(tmp_path, run_dir)
    assert done.returncode == 0, done.stderr
    assert (run_dir / "merges.txt").read_bytes() == reference
    assert read_checkpoint(run_dir)["done"]
    # Each stage's seconds span the processes that worked on it, the earlier ones' part named apart.
    metrics = json.loads((run_dir / "metrics.json").read_text())
    for stage, earlier in zip(metrics["stages"], before, strict=True):
        assert earlier > 0 and stage["seconds_before_resume"] == round(earlier, 3)
        assert stage["seconds"] > stage["seconds_before_resume"]
    # Their peak is the highest of those processes, the killed ones' up to their last save included.
    for stage, earlier in zip(metrics["stages"], peaks, strict=True):
        assert earlier > 0 and stage["peak_rss_bytes"] >= earlier
    assert metrics["stages"][1]["peak_rss_bytes"] == metrics["peak_rss_bytes"] == 2**40
    assert metrics["seconds"] > metrics["seconds_this_process"]


def test_killed_before_the_first_checkpoint_starts_over(wiki, reference, tmp_path):
    run_dir = tmp_path / "run"
    proc = start_script("train.py", f"hydra.run.dir={run_dir}", *overrides(wiki), cwd=tmp_path)
    recorded = run_dir / ".hydra" / "overrides.yaml"

    def started(state: dict | None, _run_dir: Path) -> bool:
        return state is None and recorded.is_file() and recorded.stat().st_size > 0

    kill_when(proc, run_dir, started)
    done = resume(tmp_path, run_dir)
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
    again = resume(tmp_path, run_dir, "vocab_size=400")  # repeating an override with its value is fine
    assert again.returncode == 0, again.stderr
    assert (run_dir / "merges.txt").read_bytes() == before


def test_mismatched_resume_is_refused_naming_what_differs(wiki, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(wiki.read_bytes())
    run_dir = tmp_path / "run"
    proc = start_script("train.py", f"hydra.run.dir={run_dir}", *overrides(corpus), cwd=tmp_path)
    kill_when(proc, run_dir, in_stage(0, 100))
    checkpoint = (run_dir / CHECKPOINT_FILE).read_bytes()

    other_vocab = resume(tmp_path, run_dir, "vocab_size=2400")
    assert_one_line_error(
        other_vocab, "cannot resume", "vocab_size=2400 conflicts with the run's vocab_size=2300",
        "other settings need a new run",
    )

    other_pattern = resume(tmp_path, run_dir, "schedule.stage2_pattern=superbpe-paper")
    assert_one_line_error(
        other_pattern, "cannot resume", "stage2_pattern=superbpe-paper is not one of the run's settings"
    )

    other_corpus = tmp_path / "other.txt"
    other_corpus.write_bytes(wiki.read_bytes()[:100_000])
    moved = resume(tmp_path, run_dir, f"data.paths=[{other_corpus}]")
    assert_one_line_error(moved, "cannot resume", "data.paths=")

    original = corpus.read_bytes()
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write("\nA changed corpus.\n")
    changed = resume(tmp_path, run_dir)
    size = f"{len(original)} bytes at the checkpoint, {corpus.stat().st_size} now"
    assert_one_line_error(changed, "cannot resume", f"corpus file {corpus.resolve()} changed: {size}")
    corpus.write_bytes(original)  # the same bytes, written again: a new modification time
    touched = resume(tmp_path, run_dir)
    assert_one_line_error(touched, "was modified since the checkpoint (same size)", "python3 -c 'import os;")
    restore = touched.stderr.split("give it back its time with: ")[1].split(" (resume with")[0]
    subprocess.run(restore, shell=True, check=True)
    assert load_checkpoint(run_dir).fingerprint == input_fingerprint([corpus])

    missing = resume(tmp_path, tmp_path / "no-such-run")
    assert_one_line_error(missing, "no such run directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "other.txt", "run"]  # no new run dirs

    assert (run_dir / CHECKPOINT_FILE).read_bytes() == checkpoint
    assert not (run_dir / "merges.txt").exists()


# -- Ctrl-C and random kills --------------------------------------------------------------------------------

OUTPUT_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "superbpe.json")


def test_ctrl_c_saves_the_merges_so_far_and_prints_the_resume_command(
    wikitext_text, multilingual_text, tmp_path
):
    """SIGINT in stage 2 between two timed checkpoints: the merges since the last one are saved, the
    resume command printed, exit 130; the resume (native when built: the engines agree) ends with the
    merges of an uninterrupted run."""
    corpus = tmp_path / "wiki.txt"
    corpus.write_text(wikitext_text + multilingual_text, encoding="utf-8")  # ~1.6 MB: stage 2 lasts seconds
    fast = "engine=native" if native_available() else "engine=python"
    # Stage 2 must outlast its first timed checkpoint plus the delay: on a quiet machine with 4000 merges
    # and a checkpoint every 0.5 s, it sometimes ended first (the SIGINT then found stage 2 done).
    args = [*overrides(corpus)[:-1], "vocab_size=6000", "checkpoint.every_merges=100000"]
    args.append("checkpoint.every_seconds=0.25")
    reference = run_script("train.py", f"hydra.run.dir={tmp_path / 'ref'}", *args, fast, cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr
    run_dir = tmp_path / "run"
    proc = start_captured(tmp_path, run_dir, args)
    seen = kill_when(proc, run_dir, lambda state, _: in_stage2(state), signal.SIGINT, delay=0.1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and f"continue with: python {SCRIPTS / 'train.py'} resume={run_dir}" in out
    assert "interrupted: " in (run_dir / "train.log").read_text()  # the run's record says so too
    saved = read_checkpoint(run_dir)
    assert saved is not None and not saved["done"] and len(saved["stage_ends"]) == 1
    assert saved["merges_count"] > seen["merges_count"]  # merges no timed save had written
    done = resume(tmp_path, run_dir, fast)
    assert done.returncode == 0, done.stderr
    assert (run_dir / "merges.txt").read_bytes() == (tmp_path / "ref" / "merges.txt").read_bytes()


def start_captured(
    cwd: Path, run_dir: Path, args: list[str], own_group: bool = False
) -> subprocess.Popen[str]:
    """Start ``train.py`` with its output captured (for checking what Ctrl-C prints)."""
    run = [f"hydra.run.dir={run_dir}", *args]
    return start_captured_script("train.py", *run, cwd=cwd, own_group=own_group, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    """In the child: Ctrl-C as a terminal delivers it. A launcher that ignores SIGINT (any background job
    of a non-interactive shell) passes that on, and Python never installs its handler for an ignored one."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def in_stage2(state: dict | None) -> bool:
    """A checkpoint saved while stage 2 chooses merges."""
    return (
        state is not None and len(state["stage_ends"]) == 1 and state["merges_count"] > state["stage_ends"][0]
    )


def random_kill_run(tmp_path: Path, name: str, args: list[str], kills: int, rng: random.Random) -> Path:
    """Start the run, SIGKILL it at a random moment ``kills`` times (resuming each time), then finish it.

    The moments are drawn over the length of an uninterrupted run, so they land in counting, in merges
    of either stage, at stage boundaries and during the final writes; each is taken once Hydra has
    written the run's overrides (before that there is no run to resume).
    """
    run_dir = tmp_path / name
    started = time.monotonic()
    first = run_script("train.py", f"hydra.run.dir={tmp_path / (name + '-ref')}", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    length = time.monotonic() - started
    command = [f"hydra.run.dir={run_dir}", *args]
    for _ in range(kills):
        proc = start_script("train.py", *command, cwd=tmp_path)
        recorded = run_dir / ".hydra" / "overrides.yaml"
        while not (recorded.is_file() and recorded.stat().st_size > 0) and proc.poll() is None:
            time.sleep(0.002)
        time.sleep(rng.uniform(0, length))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        command = [f"resume={run_dir}"]
    done = run_script("train.py", *command, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return run_dir


@pytest.mark.parametrize("engine", ["python", "native"])
@pytest.mark.parametrize("schedule", ["bpe", "superbpe"])
def test_random_kills_resume_to_identical_files(wiki, tmp_path, engine, schedule):
    """Fault injection: 6 SIGKILLs at random moments per engine and schedule (24 in all)."""
    if engine == "native" and not native_available():
        pytest.skip("superbpe._native is not built")
    args = [*overrides(wiki), f"engine={engine}", f"schedule={schedule}"]
    if schedule == "bpe":
        args = [a for a in args if not a.startswith("schedule.transition")]
    rng = random.Random(f"{engine}-{schedule}")
    run_dir = random_kill_run(tmp_path, "run", args, kills=6, rng=rng)
    for name in OUTPUT_FILES:
        assert (run_dir / name).read_bytes() == (tmp_path / "run-ref" / name).read_bytes(), name
    assert read_checkpoint(run_dir)["done"]
    assert not list(run_dir.glob(".*.tmp"))


def test_ctrl_c_while_worker_processes_count_exits_promptly_and_quietly(wiki, tmp_path):
    """Ctrl-C reaches the whole process group: workers leave it to the parent, which stops them (no
    worker tracebacks, no exit blocked on chunks still queued for them) and exits 130."""
    corpus = tmp_path / "big.txt"
    corpus.write_text(wiki.read_text(encoding="utf-8") * 60, encoding="utf-8")  # ~18 MB: seconds to count
    run_dir = tmp_path / "run"
    args = ["engine=python", "cache_dir=null", f"data.paths=[{corpus}]", "vocab_size=300", "workers=2"]
    proc = start_captured(tmp_path, run_dir, args, own_group=True)
    log = run_dir / "train.log"
    counting = lambda: log.is_file() and "training" in log.read_text()  # noqa: E731 - a one-line condition
    signal_group_when(proc, counting, signal.SIGINT, "counting", settle=0.5)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "continue with:" in out


@pytest.fixture(scope="module")
def english_lines(tmp_path_factory) -> Path:
    """Lines that almost never repeat (``benchmarks/make_english_corpus.py`` over stdlib docstrings)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from make_english_corpus import Chain, write_corpus  # benchmarks/ holds scripts, not a package

    paragraphs = [" ".join(doc.split()) for doc in fixture_texts.stdlib_docstrings(400_000)]
    path = tmp_path_factory.mktemp("english") / "lines.txt"
    write_corpus(Chain(paragraphs), path, 600_000, seed=5, workers=1)
    return path


@pytest.mark.parametrize("engine", ["python", "native"])
def test_killed_mid_stage2_on_distinct_english_lines_resumes_identically(english_lines, tmp_path, engine):
    if engine == "native" and not native_available():
        pytest.skip("superbpe._native is not built")
    args = [*overrides(english_lines), f"engine={engine}", "vocab_size=3000"]
    reference = tmp_path / "reference"
    done = run_script("train.py", f"hydra.run.dir={reference}", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run_dir = tmp_path / "run"
    proc = start_script("train.py", f"hydra.run.dir={run_dir}", *args, cwd=tmp_path)
    seen = kill_when(
        proc,
        run_dir,
        lambda s, _: s is not None and s["stage_ends"] and s["merges_count"] >= s["stage_ends"][0] + 40,
    )
    assert len(seen["stage_ends"]) == 1 and not seen["done"]
    done = resume(tmp_path, run_dir)
    assert done.returncode == 0, done.stderr
    for name in OUTPUT_FILES:
        assert (run_dir / name).read_bytes() == (reference / name).read_bytes(), name


def test_sigterm_saves_the_merges_and_says_how_to_resume(wiki, reference, tmp_path):
    """A scheduler's SIGTERM (preemption) stops a run as Ctrl-C does, not on the spot."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "train.py"), f"hydra.run.dir={run_dir}", *overrides(wiki)],
        cwd=tmp_path, env=script_env(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    kill_when(proc, run_dir, in_stage(0, 300), signum=signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "terminated: checkpoint of" in out and f"resume={run_dir}" in out and "Traceback" not in err
    saved = read_checkpoint(run_dir)
    assert saved is not None and saved["merges_count"] >= 300
    done = resume(tmp_path, run_dir)
    assert done.returncode == 0, done.stderr
    assert (run_dir / "merges.txt").read_bytes() == reference
