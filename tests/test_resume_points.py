"""Resuming at each point a run can stop: mid stage 2, after the last stage, and after the run finished."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from pathlib import Path

import pytest
from run_helpers import superbpe_schedule

from superbpe.core.errors import ConfigError, InputError
from superbpe.engines.interface import native_available
from superbpe.formats.checkpoints import Checkpoint, load_checkpoint, save_checkpoint
from superbpe.formats.gpt2 import MERGES_FILE
from superbpe.training.config import DataConfig, EngineConfig, PretokenizerConfig, TrainConfig
from superbpe.training.directories import run_dir_lock
from superbpe.training.run import run_training

OUTPUTS = ("vocab.json", MERGES_FILE, "tokenizer.json", "superbpe.json", "metrics.json")


def superbpe_config(corpus: Path, out: Path, engine: str) -> TrainConfig:
    return TrainConfig(
        data=DataConfig(paths=[str(corpus)]),
        pretokenizer=PretokenizerConfig(name="superbpe-stage1"),
        engine=EngineConfig(engine),
        schedule=superbpe_schedule(300),
        vocab_size=900,
        output_dir=str(out),
        cache_dir=None,
    )


@pytest.fixture
def corpus(tmp_path: Path, wikitext_text: str) -> Path:
    path = tmp_path / "wiki.txt"
    path.write_text(wikitext_text[:200_000], encoding="utf-8")
    return path


def cut_checkpoint(run_dir: Path, merges: int, stages: int) -> None:
    """Leave ``run_dir`` as a run stopped after ``merges`` merges with ``stages`` finished stages."""
    full = load_checkpoint(run_dir)
    assert full is not None
    for name in OUTPUTS:
        (run_dir / name).unlink()
    (run_dir / "checkpoint.json").unlink()
    cut = Checkpoint(
        config=full.config,
        fingerprint=full.fingerprint,
        merges=full.merges[:merges],
        stage_ends=full.stage_ends[:stages],
        stage_stats=full.stage_stats[:stages],
    )
    save_checkpoint(run_dir, cut)


def resume(cfg: TrainConfig) -> TrainConfig:
    return replace(cfg, resume=cfg.output_dir, output_dir=None)


def test_resuming_a_finished_run_says_so_and_rewrites_nothing(corpus, tmp_path, caplog):
    cfg = superbpe_config(corpus, tmp_path / "run", "python")
    first = run_training(cfg)
    stamps = {name: (tmp_path / "run" / name).stat().st_mtime_ns for name in OUTPUTS}
    with caplog.at_level(logging.INFO, logger="superbpe"):
        again = run_training(resume(cfg))
    assert again.merges == first.merges and again.output_dir == first.output_dir
    assert again.metrics["vocab_size"] == first.metrics["vocab_size"]
    assert {name: (tmp_path / "run" / name).stat().st_mtime_ns for name in OUTPUTS} == stamps
    assert "already finished" in caplog.text and "nothing to do" in caplog.text
    assert "stage 3" not in caplog.text


def test_a_run_stopped_after_its_last_stage_writes_its_files_without_a_stage_3_of_2(corpus, tmp_path, caplog):
    cfg = superbpe_config(corpus, tmp_path / "run", "python")
    first = run_training(cfg)
    reference = (tmp_path / "run" / MERGES_FILE).read_bytes()
    cut_checkpoint(tmp_path / "run", len(first.merges), 2)
    with caplog.at_level(logging.INFO, logger="superbpe"):
        run_training(resume(cfg))
    assert "all 2 stage(s) trained" in caplog.text and "stage 3 of 2" not in caplog.text
    assert (tmp_path / "run" / MERGES_FILE).read_bytes() == reference


@pytest.mark.skipif(not native_available(), reason="the native engine is not built")
def test_mid_stage_2_the_native_engine_chooses_the_stage_merges_again_rather_than_replay_them(
    corpus, tmp_path, monkeypatch
):
    """Replaying stage-2 merges stops the native replay from cutting pieces at word boundaries (about 4x
    slower than the whole stage's choice); choosing them again gives the same merges."""
    from superbpe.engines.native import NativeEngine

    cfg = superbpe_config(corpus, tmp_path / "run", "native")
    first = run_training(cfg)
    reference = (tmp_path / "run" / MERGES_FILE).read_bytes()
    cut_checkpoint(tmp_path / "run", 300 + (len(first.merges) - 300) // 2, 1)
    replays: list[int] = []
    train = NativeEngine.train

    def spy(self, counts, num_merges, **options):  # type: ignore[no-untyped-def]
        replays.append(len(options["replay"]))
        return train(self, counts, num_merges, **options)

    monkeypatch.setattr(NativeEngine, "train", spy)
    again = run_training(resume(cfg))
    assert replays == [300]  # stage 1's merges only
    assert again.merges == first.merges
    assert (tmp_path / "run" / MERGES_FILE).read_bytes() == reference


def test_resuming_from_python_with_no_corpus_says_the_settings_are_given_again(corpus, tmp_path):
    """A run started from Python has no recorded overrides: "no corpus given" did not say why."""
    cfg = superbpe_config(corpus, tmp_path / "run", "python")
    run_training(cfg)
    bare = TrainConfig(resume=str(tmp_path / "run"), cache_dir=None)
    with pytest.raises(InputError, match="run .* not started by superbpe-train .* give them again"):
        run_training(bare)


def _run_in(directory: Path, run_dir: Path, resume: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small run on ``corpus.txt`` named relative to ``directory``, started or resumed there."""
    monkeypatch.chdir(directory)
    cfg = TrainConfig(data=DataConfig(paths=["corpus.txt"]), vocab_size=300, cache_dir=None)
    run_training(replace(cfg, resume=str(run_dir)) if resume else replace(cfg, output_dir=str(run_dir)))


def _two_places(tmp_path: Path) -> tuple[Path, Path]:
    """Two directories holding a ``corpus.txt`` of the same text."""
    places = tmp_path / "started", tmp_path / "elsewhere"
    for directory in places:
        directory.mkdir()
        (directory / "corpus.txt").write_text("the cat sat on the mat, the dog ran " * 200, encoding="utf-8")
    return places


def test_a_resume_from_another_directory_says_the_paths_were_relative_to_the_run_s(tmp_path, monkeypatch):
    """Relative data.paths resolve in the working directory: resumed elsewhere, the run was refused as on
    "changed data.paths" (or a missing file) without a word of the directory it was started in."""
    (started, elsewhere), run_dir = _two_places(tmp_path), tmp_path / "run"
    _run_in(started, run_dir, False, monkeypatch)
    files = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    here, there = re.escape(str(elsewhere)), re.escape(str(started))
    relative = rf"corpus.txt in data.paths is relative to the working directory \({here}\), but "
    resumed = re.escape(str(run_dir))
    with pytest.raises(ConfigError, match=(
        rf"^cannot resume {resumed}: data.paths differs \(.*\): {relative}the run was started in {there}: "
        rf"resume from there \(cd {there}\), or give data.paths as absolute paths$"
    )):  # fmt: skip
        _run_in(elsewhere, run_dir, True, monkeypatch)
    (elsewhere / "corpus.txt").unlink()
    with pytest.raises(InputError, match=rf"^corpus.txt: no such file or directory: {relative}the run was"):
        _run_in(elsewhere, run_dir, True, monkeypatch)
    started.rename(tmp_path / "moved")
    (elsewhere / "corpus.txt").write_text("text", encoding="utf-8")
    gone = rf"{relative}the run was started in {there}, which no longer exists: a resume trains on the files"
    with pytest.raises(ConfigError, match=gone):
        _run_in(elsewhere, run_dir, True, monkeypatch)
    assert {path.name: path.read_bytes() for path in run_dir.iterdir()} == files


def test_a_resume_of_a_run_that_did_not_record_its_directory_still_says_the_paths_are_relative(
    tmp_path, monkeypatch
):
    (started, elsewhere), run_dir = _two_places(tmp_path), tmp_path / "run"
    _run_in(started, run_dir, False, monkeypatch)
    record = json.loads((run_dir / "checkpoint.json").read_text())
    assert record["cwd"] == str(started)
    del record["cwd"]  # as a checkpoint written before it was kept
    (run_dir / "checkpoint.json").write_text(json.dumps(record))
    here = re.escape(str(elsewhere))
    with pytest.raises(ConfigError, match=(
        rf"\): corpus.txt in data.paths is relative to the working directory \({here}\); if the run was "
        "started in another directory, resume from that one$"
    )):  # fmt: skip
        _run_in(elsewhere, run_dir, True, monkeypatch)
    _run_in(started, run_dir, True, monkeypatch)


def test_a_run_directory_another_process_trains_into_is_refused(corpus, tmp_path):
    """The same resume started twice trained twice into one directory, each writing the same files."""
    import fcntl  # reason: stands in for the other process's hold on the directory
    import os  # reason: as above

    cfg = superbpe_config(corpus, tmp_path / "run", "python")
    first = run_training(cfg)
    cut_checkpoint(tmp_path / "run", len(first.merges) // 2, 0)
    held = os.open(tmp_path / "run", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    (tmp_path / "run" / ".merges.txt.abc.tmp").write_text("being written")  # by the other process
    try:
        with pytest.raises(InputError, match="another process is training into it"):
            run_training(resume(cfg))
        assert (tmp_path / "run" / ".merges.txt.abc.tmp").exists()  # not taken for a killed run's
    finally:
        os.close(held)
    assert run_training(resume(cfg)).merges == first.merges
    assert not (tmp_path / "run" / ".merges.txt.abc.tmp").exists()


def test_resuming_a_finished_run_whose_files_were_changed_writes_them_again(corpus, tmp_path, caplog):
    """A merges.txt overwritten by hand was taken as the run's: "nothing to do"."""
    cfg = superbpe_config(corpus, tmp_path / "run", "python")
    run_training(cfg)
    reference = (tmp_path / "run" / MERGES_FILE).read_bytes()
    (tmp_path / "run" / MERGES_FILE).write_bytes(reference[: len(reference) // 2])
    with caplog.at_level(logging.INFO, logger="superbpe"):
        run_training(resume(cfg))
    assert "merges.txt changed since the run wrote them: writing the tokenizer again" in caplog.text
    assert "nothing to do" not in caplog.text
    assert (tmp_path / "run" / MERGES_FILE).read_bytes() == reference
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="superbpe"):
        run_training(resume(cfg))
    assert "nothing to do" in caplog.text
    # The transformers files removed: they were left missing, the tokenizer said to be "in place".
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        written = (tmp_path / "run" / name).read_bytes()
        (tmp_path / "run" / name).unlink()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="superbpe"):
            run_training(resume(cfg))
        assert "nothing to do" not in caplog.text
        assert (tmp_path / "run" / name).read_bytes() == written


def test_a_run_directory_that_cannot_be_locked_is_trained_into_unheld(corpus, tmp_path, monkeypatch):
    """Some network file systems refuse locks (ENOLCK): the run goes on, as it would without the lock."""
    import errno  # reason: as below
    import fcntl  # reason: stands in for a file system without locks

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    cfg = superbpe_config(corpus, tmp_path / "run", "python")
    assert run_training(cfg).merges


@pytest.mark.skipif(not native_available(), reason="superbpe._native is not built")
def test_each_stage_records_the_engine_that_trained_it(corpus, tmp_path):
    """A run stopped after stage 1 on the python engine and resumed on the native one recorded only the
    last engine, as though it had trained both stages."""
    cfg = superbpe_config(corpus, tmp_path / "run", "python")
    first = run_training(cfg)
    cut_checkpoint(tmp_path / "run", first.stage_ends[0], 1)
    run_training(replace(resume(cfg), engine=EngineConfig("native")))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [stage["engine"] for stage in metrics["stages"]] == ["python", "native"]
    assert metrics["config"]["engine"] == "native"


@pytest.mark.skipif(not native_available(), reason="superbpe._native is not built")
def test_a_stage_resumed_inside_on_another_engine_records_both(corpus, tmp_path, monkeypatch):
    """A run stopped inside stage 2 on the python engine and resumed there on the native one recorded
    that stage as trained on native alone."""
    from superbpe.formats.checkpoints import Checkpointer  # reason: stopped mid-stage through its hook
    from superbpe.training.run import TrainingInterrupted  # reason: as above

    cfg = superbpe_config(corpus, tmp_path / "run", "python")
    progress = Checkpointer.progress

    def stop_in_stage_2(self: Checkpointer, merges: list) -> None:
        progress(self, merges)
        if len(merges) > 350:  # stage 1 ends at 300
            raise KeyboardInterrupt

    monkeypatch.setattr(Checkpointer, "progress", stop_in_stage_2)
    with pytest.raises(TrainingInterrupted):
        run_training(cfg)
    monkeypatch.undo()
    stopped = json.loads((tmp_path / "run" / "checkpoint.json").read_text())
    run_training(replace(resume(cfg), engine=EngineConfig("native")))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [stage["engine"] for stage in metrics["stages"]] == ["python", "python+native"]
    assert stopped["stage_engines"] == ["python"]


def test_a_process_forked_by_a_run_killed_outright_does_not_hold_its_directory(tmp_path):
    """A counting worker that a SIGKILL left behind kept the run directory's lock (a fork copies it),
    so every resume was refused as another process training into it."""
    import os  # reason: forks and kills the stand-ins for the run and its worker
    import signal  # reason: as above
    import subprocess  # reason: the run is a process of its own, to be killed outright
    import sys  # reason: as above

    run = tmp_path / "run"
    run.mkdir()
    script = (
        "import os, time\nfrom pathlib import Path\nfrom superbpe.training.directories import run_dir_lock\n"
        f"with run_dir_lock(Path({str(run)!r})):\n"
        "    if os.fork() == 0:  # says it runs once past the fork, so that the test does not race it\n"
        "        print(os.getpid(), flush=True)\n        time.sleep(60)\n        os._exit(0)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    worker = int(proc.stdout.readline())  # type: ignore[union-attr]
    proc.kill()
    proc.wait()
    try:
        with run_dir_lock(run):
            pass
    finally:
        os.kill(worker, signal.SIGKILL)
