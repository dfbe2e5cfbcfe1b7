"""Checkpoints: every field survives a round trip, saves append, and a torn or altered log is caught."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import superbpe.formats.checkpoints as checkpoints_module
from superbpe.core.errors import ConfigError, InputError
from superbpe.formats.checkpoints import (
    CHECKPOINT_FILE,
    MERGES_LOGS,
    Checkpoint,
    Checkpointer,
    check_checkpoint_intervals,
    check_compatible,
    diff,
    load_checkpoint,
    save_checkpoint,
)

MERGES = [(b"a", b"b"), (b"\xff", b" \x00"), (b"ab", b"\n"), (b"c", b"d")]


def make_checkpoint(merges: list[tuple[bytes, bytes]]) -> Checkpoint:
    return Checkpoint(config={"vocab_size": 300}, fingerprint="abc", merges=list(merges))


def test_checkpoint_round_trip_keeps_every_field(tmp_path: Path) -> None:
    checkpoint = Checkpoint(
        config={"vocab_size": 300, "stages": [{"name": "bpe"}]},
        fingerprint="abc",
        merges=[(b"a", b"b"), (b"\xff", b" \x00")],
        stage_ends=[2],
        stage_stats=[{"seconds": 1.5}],
        done=True,
        files=[["/corpus/a.txt", 1000, 1764362400123456789]],
    )
    save_checkpoint(tmp_path, checkpoint)
    assert load_checkpoint(tmp_path) == checkpoint


def test_saves_append_to_the_log_and_keep_earlier_bytes(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path, make_checkpoint([]), every_merges=1, every_seconds=3600)
    checkpointer.progress(MERGES[:2])
    log_path = tmp_path / MERGES_LOGS[0]
    first = log_path.read_bytes()
    checkpointer.progress(MERGES)
    assert log_path.read_bytes().startswith(first) and len(log_path.read_bytes()) > len(first)
    assert json.loads((tmp_path / CHECKPOINT_FILE).read_text())["merges_count"] == 4
    assert load_checkpoint(tmp_path).merges == MERGES


def test_a_tail_past_the_valid_length_is_ignored_then_cut(tmp_path: Path) -> None:
    """A kill between appending and replacing the JSON leaves extra lines; they must not count."""
    state = save_checkpoint(tmp_path, make_checkpoint(MERGES[:2]))
    log_path = tmp_path / MERGES_LOGS[0]
    with log_path.open("ab") as handle:
        handle.write(b"6566 67\n6869")  # a torn append
    assert load_checkpoint(tmp_path).merges == MERGES[:2]
    checkpointer = Checkpointer(tmp_path, load_checkpoint(tmp_path), every_merges=1, every_seconds=3600)
    checkpointer.progress(MERGES)
    assert load_checkpoint(tmp_path).merges == MERGES
    assert b"6869" not in log_path.read_bytes()
    assert state.name == MERGES_LOGS[0]


def test_merges_that_do_not_extend_the_log_go_to_the_other_file(tmp_path: Path) -> None:
    state = save_checkpoint(tmp_path, make_checkpoint(MERGES))
    other = [(b"x", b"y")]
    state = save_checkpoint(tmp_path, make_checkpoint(other), state)
    assert state.name == MERGES_LOGS[1]
    assert load_checkpoint(tmp_path).merges == other
    assert (tmp_path / MERGES_LOGS[0]).read_bytes().count(b"\n") == len(MERGES)  # untouched


def test_a_fresh_save_never_writes_the_log_the_json_in_place_points_at(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, make_checkpoint(MERGES))
    before = (tmp_path / MERGES_LOGS[0]).read_bytes()
    save_checkpoint(tmp_path, make_checkpoint(MERGES[:1]))
    assert (tmp_path / MERGES_LOGS[0]).read_bytes() == before
    assert load_checkpoint(tmp_path).merges == MERGES[:1]


def test_a_stage_in_progress_keeps_its_seconds_across_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage resumed after a kill is timed from its first process on: each save records the stage's
    seconds so far, which the next process's checkpointer starts from."""
    clock = [100.0]
    monkeypatch.setattr(checkpoints_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    first = Checkpointer(tmp_path, make_checkpoint([]), every_merges=1, every_seconds=3600)
    first.begin_stage()
    clock[0] += 7.0
    first.progress(MERGES[:2])
    assert load_checkpoint(tmp_path).stage_seconds == 7.0
    clock[0] += 50.0  # killed: the time after the last save is not known to the next process
    second = Checkpointer(tmp_path, load_checkpoint(tmp_path), every_merges=1, every_seconds=3600)
    assert second.earlier_stage_seconds == 7.0
    second.begin_stage()
    clock[0] += 3.0
    second.progress(MERGES[:3])
    assert load_checkpoint(tmp_path).stage_seconds == 10.0
    second.finish_stage(MERGES, {"seconds": 11.0})
    assert second.earlier_stage_seconds == 0.0 and load_checkpoint(tmp_path).stage_seconds == 0.0


def test_a_stage_in_progress_keeps_its_peak_rss_across_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage resumed after a kill reported only the peak of the process that finished it: a python
    process that held 1 GB before the kill, then a native resume at 100 MB, gave 100 MB. Each save
    records the stage's peak so far; the next stage starts from none."""
    peak = [900]
    monkeypatch.setattr(checkpoints_module, "peak_rss_bytes", lambda: peak[0])
    first = Checkpointer(tmp_path, make_checkpoint([]), every_merges=1, every_seconds=3600)
    first.begin_stage()
    first.progress(MERGES[:2])
    assert load_checkpoint(tmp_path).stage_peak_rss_bytes == 900
    peak[0] = 100  # the resuming process holds less
    second = Checkpointer(tmp_path, load_checkpoint(tmp_path), every_merges=1, every_seconds=3600)
    assert second.earlier_stage_peak_rss_bytes == 900
    second.begin_stage()
    second.progress(MERGES[:3])
    assert load_checkpoint(tmp_path).stage_peak_rss_bytes == 900
    assert second.stage_peak_rss_bytes() == 900
    second.finish_stage(MERGES, {"seconds": 11.0})
    assert second.earlier_stage_peak_rss_bytes == 0 and load_checkpoint(tmp_path).stage_peak_rss_bytes == 0


def test_finished_run_leaves_one_log(tmp_path: Path) -> None:
    state = save_checkpoint(tmp_path, make_checkpoint(MERGES))
    save_checkpoint(tmp_path, make_checkpoint(MERGES[:1]), state)
    checkpointer = Checkpointer(tmp_path, load_checkpoint(tmp_path), every_merges=1, every_seconds=3600)
    checkpointer.finish_run()
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_FILE, MERGES_LOGS[1]]
    assert load_checkpoint(tmp_path).done


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda log: log.write_bytes(log.read_bytes()[:-3]), "does not match"),
        (lambda log: log.write_bytes(log.read_bytes().replace(b"61", b"62", 1)), "does not match"),
        (lambda log: log.unlink(), "cannot read"),
    ],
)
def test_a_damaged_log_is_one_clear_error(tmp_path: Path, damage, message: str) -> None:
    save_checkpoint(tmp_path, make_checkpoint(MERGES))
    damage(tmp_path / MERGES_LOGS[0])
    with pytest.raises(InputError, match=message):
        load_checkpoint(tmp_path)


def test_an_old_or_foreign_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT_FILE).write_text(json.dumps({"format": 1, "merges": []}))
    with pytest.raises(InputError, match="unsupported format"):
        load_checkpoint(tmp_path)


def test_differences_name_the_option_a_user_gives() -> None:
    assert diff({"vocab_size": 300, "source": "ab12"}, {"vocab_size": 400, "source": "cd34"}) == [
        "the stage-1 source (schedule.from_run / schedule.from_tokenizer) differs "
        '(checkpoint: "ab12", now: "cd34")',
        "vocab_size differs (checkpoint: 300, now: 400)",
    ]


def test_a_corpus_directory_that_gained_or_lost_files_names_them() -> None:
    """The list was cut at 80 characters, where the new file's name would have been."""
    old = {"data": {"paths": [f"/corpus/part-{i:04d}.txt" for i in range(6)]}}
    new = {"data": {"paths": [*old["data"]["paths"][1:], "/corpus/part-9999.txt"]}}
    assert diff(old, new) == [
        'data.paths differs (added ["/corpus/part-9999.txt"]; removed ["/corpus/part-0000.txt"] since the '
        "checkpoint)"
    ]


def test_a_changed_corpus_is_named_a_resized_file_first(tmp_path: Path) -> None:
    then = [["/c/a.txt", 10, 5], ["/c/b.txt", 20, -1_500_000_000]]
    checkpoint = Checkpoint(config={}, fingerprint="old", files=then)
    resized = r"corpus file /c/b.txt changed: 20 bytes at the checkpoint, 21 now and 1 more"
    with pytest.raises(ConfigError, match=resized):
        check_compatible(checkpoint, {}, "new", tmp_path, [["/c/a.txt", 10, 6], ["/c/b.txt", 21, 7]])
    restore = r"""python3 -c 'import os; os.utime\("/c/b.txt", ns=\(-1500000000, -1500000000\)\)'"""
    with pytest.raises(ConfigError, match=restore):
        check_compatible(checkpoint, {}, "new", tmp_path, [["/c/a.txt", 10, 5], ["/c/b.txt", 20, 7]])
    damaged = Checkpoint(config={}, fingerprint="old", files=[["/c/a.txt"]])
    with pytest.raises(ConfigError, match=r"corpus files changed \(size or modification time\)"):
        check_compatible(damaged, {}, "new", tmp_path, [["/c/a.txt", 10, 6]])


@pytest.mark.parametrize(("every_merges", "every_seconds", "named"), [
    (0, 60.0, "every_merges must be >= 1, not 0"),
    (1000, 0.0, "every_seconds must be > 0, not 0.0"),
    (1000, float("nan"), "every_seconds must be > 0, not nan"),  # was taken: no checkpoint ever by time
])  # fmt: skip
def test_checkpoint_intervals_that_are_not_positive_are_refused(every_merges, every_seconds, named):
    with pytest.raises(ConfigError, match=named):
        check_checkpoint_intervals(every_merges, every_seconds)
