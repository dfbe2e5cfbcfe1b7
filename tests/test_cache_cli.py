"""superbpe-cache list|clear and the cache_max_gib cap."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest
from script_helpers import run_script

from superbpe.cli import cache as cache_command
from superbpe.core.errors import ConfigError
from superbpe.training.cache import RunCache, cache_entries, clear_cache, enforce_size_cap, parse_age


def make_entry(root: Path, kind: str, name: str, size: int, age_seconds: float) -> Path:
    """An entry named as the cache names them: ``name``'s stem padded to a 40-digit key."""
    stem, suffix = name.split(".")
    path = root / kind / (stem.encode().hex().rjust(40, "0") + "." + suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    (root / kind / (path.stem + ".lock")).touch()
    stamp = time.time() - age_seconds
    os.utime(path, (stamp, stamp))
    return path


def test_list_and_clear_older_than(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = make_entry(tmp_path, "counts", "a.counts", 1000, 10 * 86400)
    new = make_entry(tmp_path, "merges", "b.json", 500, 60)
    cache_command(["--cache-dir", str(tmp_path), "list"])
    listing = capsys.readouterr().out
    assert old.name in listing and new.name in listing and "2 entries" in listing
    cache_command(["--cache-dir", str(tmp_path), "clear", "--older-than", "7d"])
    assert "removed 1 entry (1.0 KB) from" in capsys.readouterr().out
    assert not old.exists() and new.exists()
    assert clear_cache(tmp_path) == (1, 500) and cache_entries(tmp_path) == []
    assert not list(tmp_path.rglob("*.lock"))  # each entry's lock went with it


@pytest.mark.parametrize("where", ["before", "after"])
def test_an_empty_cache_dir_is_refused_not_taken_for_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """``--cache-dir "$DIR"`` with DIR unset: ``clear`` emptied the default cache, not the one meant."""
    default = tmp_path / "default"
    entry = make_entry(default, "counts", "a.counts", 100, 60)
    monkeypatch.setenv("SUPERBPE_CACHE_DIR", str(default))
    args = ["--cache-dir", "", "clear"] if where == "before" else ["clear", "--cache-dir", " "]
    with pytest.raises(SystemExit):
        cache_command(args)
    assert "error: --cache-dir is empty: give a directory" in capsys.readouterr().err
    assert entry.exists()


def test_ctrl_c_of_clear_says_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The console script said "before the command started, nothing done" of a clear stopped part way."""
    import superbpe.cli as cli  # the command, whose clearing is stopped

    def ctrl_c(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "clear_cache", ctrl_c)
    with pytest.raises(SystemExit) as stopped:
        cache_command(["--cache-dir", str(tmp_path), "clear"])
    assert stopped.value.code == 130
    assert capsys.readouterr().out == (
        "interrupted: clear stopped before its end (the entries removed so far are gone, the others kept)\n"
    )


def test_a_missing_cache_dir_is_said_not_listed_as_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped --cache-dir read as an empty cache ("0 entries"), which hid the typo."""
    missing = tmp_path / "superbp"
    said = {
        "list": "0 entries, 0 B (no such directory)",
        "verify": f"0 entries checked in {missing} (no such directory): 0 bad",
        "clear": f"removed 0 entries (0 B) from {missing} (no such directory)",
    }
    for command, line in said.items():
        cache_command(["--cache-dir", str(missing), command])
        assert capsys.readouterr().out.splitlines()[-1] == line
    assert not missing.exists()


def test_files_that_are_not_entries_are_neither_listed_nor_removed(tmp_path: Path) -> None:
    """A --cache-dir naming a user's own directory: its files were listed as entries, and removed."""
    mine = [tmp_path / "counts" / "important.txt", tmp_path / "merges" / "data.json", tmp_path / "notes.md"]
    for path in mine:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("keep me")
    entry = make_entry(tmp_path, "merges", "e.json", 10, 60)
    assert [found.path for found in cache_entries(tmp_path)] == [entry]
    assert clear_cache(tmp_path) == (1, 10)
    assert all(path.read_text() == "keep me" for path in mine)


def test_what_killed_jobs_left_is_listed_and_cleared_unless_a_job_holds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job killed while writing an entry left its temp file, one killed while computing it the entry's
    lock: neither was listed, cleared or counted under the cap. A job still at work holds the lock."""
    entry = make_entry(tmp_path, "counts", "a.counts", 100, 60)
    key = "f" * 40
    cut_short = tmp_path / "counts" / f".{key}.counts.x1y2z3.tmp"
    cut_short.write_bytes(b"x" * 3000)
    never_written = tmp_path / "merges" / f"{'e' * 40}.lock"
    never_written.parent.mkdir()
    never_written.touch()
    busy_key = "d" * 40
    busy = tmp_path / "counts" / f".{busy_key}.counts.q1.tmp"
    busy.write_bytes(b"x" * 7)
    held = os.open(tmp_path / "counts" / f"{busy_key}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)  # another open file: the remover's own lock attempt fails
    try:
        cache_command(["--cache-dir", str(tmp_path), "list"])
        assert "1 entry, 100 B\n4 files left by killed jobs" in capsys.readouterr().out
        cache_command(["--cache-dir", str(tmp_path), "clear", "--older-than", "1h"])
        assert "removed 0 entries (0 B) and 2 files left by killed jobs (3.0 KB)" in capsys.readouterr().out
        assert not cut_short.exists() and not never_written.exists()
        assert not (tmp_path / "counts" / f"{key}.lock").exists()  # taken to remove its temp file, then gone
        assert busy.exists() and entry.exists() and (tmp_path / "counts" / f"{entry.stem}.lock").exists()
    finally:
        os.close(held)
    assert enforce_size_cap(tmp_path, 1000) == (0, 0) and not busy.exists() and entry.exists()


def test_counts_of_one_are_said_in_the_singular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The listing said "1 entries" and "1 files left by killed jobs"."""
    make_entry(tmp_path, "counts", "a.counts", 100, 3600)
    (tmp_path / "counts" / f".{'f' * 40}.counts.x1.tmp").write_bytes(b"x" * 10)
    about = {"stage": "stage1", "pretokenizer": "gpt2", "data": ["/d/a.txt"], "files": 2}
    RunCache.store_merges(tmp_path / "merges" / f"{'b' * 40}.json", [(b"t", b"h")], False, about=about)
    cache_command(["--cache-dir", str(tmp_path), "list"])
    listing = capsys.readouterr().out
    assert listing.endswith(" B\n1 file left by killed jobs, 10 B (clear removes them)\n")
    assert "\n2 entries, " in listing and ": 1 merge of a.txt +1 file\n" in listing
    cache_command(["--cache-dir", str(tmp_path), "clear", "--older-than", "30m"])
    assert capsys.readouterr().out == (
        f"removed 1 entry (100 B) and 1 file left by killed jobs (10 B) from {tmp_path}\n"
    )
    cache_command(["--cache-dir", str(tmp_path), "verify"])
    assert capsys.readouterr().out == f"1 entry checked in {tmp_path}: 0 bad\n"


def test_size_cap_removes_least_recently_used_first(tmp_path: Path) -> None:
    paths = [make_entry(tmp_path, "counts", f"{i}.counts", 1000, age) for i, age in enumerate([30, 10, 20])]
    assert enforce_size_cap(tmp_path, 2000) == (1, 1000)
    assert [p.exists() for p in paths] == [False, True, True]
    cache = RunCache(tmp_path, max_gib=1000 / (1 << 30))
    cache.trim()
    assert [p.exists() for p in paths] == [False, True, False]


def test_bad_age_and_bad_cap_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_age("12h") == 43200 and parse_age("90s") == 90 and parse_age("1.5d") == 1.5 * 86400
    for bad in ("soon", "7", "3x", "d"):  # a bare number is refused: 7 days or 7 seconds?
        with pytest.raises(SystemExit) as info:
            cache_command(["--cache-dir", str(tmp_path), "clear", "--older-than", bad])
        assert info.value.code == 1
        assert capsys.readouterr().err.strip() == (
            f"error: bad age '{bad}': a number with its unit s, m, h, d or w (e.g. 7d, 12h, 30m)"
        )
    with pytest.raises(ConfigError, match="cache_max_gib must be positive"):
        RunCache(tmp_path, max_gib=0)


def test_list_says_what_each_entry_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The listing showed bare keys: nothing told a count of one pattern from another, or merges of one
    corpus from another's."""
    from superbpe.core.counts import PieceCounts, counts_meta
    from superbpe.core.pretokenize import get_pretokenizer

    key = "a" * 40
    counts = PieceCounts({b"the": 3, b" cat": 1}, counts_meta(get_pretokenizer("o200k"), ["<|endoftext|>"]))
    (tmp_path / "counts").mkdir()
    counts.save(tmp_path / "counts" / f"{key}.counts")
    (tmp_path / "merges").mkdir()
    about = {"stage": "stage1", "pretokenizer": "superbpe-stage1", "data": ["/d/a.txt", "/d/b.txt"]}
    about["files"] = 5
    RunCache.store_merges(tmp_path / "merges" / f"{'b' * 40}.json", [(b"t", b"h")], False, about=about)
    about = {**about, "stage": "stage2", "files": 2, "engine": "python+native"}  # as runs now record it
    RunCache.store_merges(tmp_path / "merges" / f"{'e' * 40}.json", [(b"t", b"h")], False, about=about)
    RunCache.store_merges(tmp_path / "merges" / f"{'c' * 40}.json", [(b"t", b"h"), (b"th", b"e")], True)
    (tmp_path / "merges" / f"{'d' * 40}.json").write_text("{")
    cache_command(["--cache-dir", str(tmp_path), "list"])
    lines = {line.split()[7]: line for line in capsys.readouterr().out.splitlines()[1:-1]}
    assert lines[f"{key}.counts"].endswith("counts of o200k: 2 pieces, specials ['<|endoftext|>']")
    assert lines[f"{'b' * 40}.json"].endswith("stage1 (superbpe-stage1): 1 merge of a.txt, b.txt +3 files")
    by_engines = "stage2 (superbpe-stage1, by python+native): 1 merge of a.txt, b.txt"
    assert lines[f"{'e' * 40}.json"].endswith(by_engines)
    assert lines[f"{'c' * 40}.json"].endswith("  2 merges (all the counts allow)")  # written without `about`
    assert lines[f"{'d' * 40}.json"].endswith("unreadable (superbpe-cache verify)")


def test_the_checkout_has_a_wrapper_of_the_command(tmp_path: Path) -> None:
    """``python scripts/cache.py`` runs ``superbpe-cache`` from a checkout, as scripts/ does every command."""
    make_entry(tmp_path, "counts", "a.counts", 1000, 60)
    done = run_script("cache.py", "--cache-dir", str(tmp_path), "list", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "1 entry" in done.stdout
