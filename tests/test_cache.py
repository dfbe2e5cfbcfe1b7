"""The run cache: longest-prefix merges, locking, and concurrent jobs sharing one cache directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_helpers import SCRIPTS, script_env

from superbpe.training.cache import RunCache, cache_key

MERGES = [(b"a", b"b"), (b"ab", b"c"), (b" ", b"t")]


def test_store_keeps_the_longest_prefix_and_exhaustion(tmp_path):
    cache = RunCache(tmp_path)
    with cache.entry("merges", cache_key(x=1), ".json") as path:
        cache.store_merges(path, MERGES[:2], exhausted=False)
        cache.store_merges(path, MERGES[:1], exhausted=False)  # shorter: ignored
        assert cache.load_merges(path).merges == MERGES[:2]
        cache.store_merges(path, MERGES, exhausted=True)
        loaded = cache.load_merges(path)
        assert loaded.merges == MERGES and loaded.exhausted


def test_unreadable_entries_are_ignored_not_fatal(tmp_path):
    cache = RunCache(tmp_path)
    with cache.entry("counts", "k", ".counts") as path:
        path.write_bytes(b"garbage")
        assert cache.load_counts(path) is None
    with cache.entry("merges", "k", ".json") as path:
        path.write_text("{")
        assert cache.load_merges(path) is None


def test_disabled_cache_never_hits(tmp_path):
    cache = RunCache(None)
    with cache.entry("merges", "k", ".json") as path:
        assert path is None and cache.load_merges(path) is None
        cache.store_merges(path, MERGES, exhausted=False)
    assert not cache.enabled


def test_key_depends_on_every_part():
    assert cache_key(a=1, b=[1, 2]) == cache_key(b=[1, 2], a=1)
    assert cache_key(a=1, b=[1, 2]) != cache_key(a=1, b=[2, 1])


@pytest.mark.slow
def test_an_entry_whose_computation_fails_leaves_no_lock_and_no_directory(tmp_path):
    cache = RunCache(tmp_path / "cache")
    with pytest.raises(RuntimeError), cache.entry("counts", "k", ".counts"):
        raise RuntimeError("counting failed")
    assert not (tmp_path / "cache").exists()
    with cache.entry("counts", "k", ".counts") as path:
        path.write_bytes(b"done")
    assert sorted(p.name for p in (tmp_path / "cache" / "counts").iterdir()) == ["k.counts", "k.lock"]


def test_a_lock_file_removed_while_waited_on_is_taken_again(tmp_path):
    """A job waiting on a failed entry's lock must not hold a lock on the removed file while another
    job locks the new one: it takes the lock again on the file now at the path."""
    import threading

    from superbpe.training.cache import locked

    lock = tmp_path / "k.lock"
    inside = threading.Event()
    order: list[str] = []

    def waiter() -> None:
        inside.wait()
        with locked(lock):
            order.append("waiter")

    thread = threading.Thread(target=waiter)
    thread.start()
    with locked(lock):
        inside.set()
        order.append("first")
        lock.unlink()  # as a failed entry does, while the waiter is blocked on the old file
    thread.join(timeout=10)
    assert order == ["first", "waiter"] and lock.exists()


def test_concurrent_jobs_share_the_cache_safely(tmp_path, sample_texts):
    import subprocess
    import sys

    cache = tmp_path / "cache"
    args = [
        "engine=python",
        f"data.paths=[{sample_texts / 'corpus.en'}]",
        "vocab_size=700",
        "schedule=superbpe",
        "schedule.transition=0.5",
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPTS / "train.py"), f"hydra.run.dir={tmp_path / f'run{i}'}", *args],
            cwd=tmp_path,
            env=script_env(cache),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    merges = {(tmp_path / f"run{i}" / "merges.txt").read_bytes() for i in range(3)}
    assert len(merges) == 1
    entries = sorted(p.name for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".lock"))
    assert sum(name.endswith(".counts") for name in entries) == 2  # one per pattern, none torn or duplicated
    assert not [name for name in entries if name.endswith(".tmp")]
    for path in cache.rglob("*.json"):
        json.loads(path.read_text())



def test_a_script_run_without_a_cache_of_its_own_keeps_out_of_the_users(tmp_path, sample_texts, monkeypatch):
    """``run_script`` without ``cache_dir`` ran the command on the user's ``~/.cache/superbpe``: every test
    corpus left entries there (their corpora gone with the test), and the tests met whatever was there.
    It runs on the test session's own cache instead."""
    from script_helpers import run_script

    home = tmp_path / "home"  # the user's, for this test: ~/.cache/superbpe is the default cache
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SUPERBPE_CACHE_DIR", raising=False)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((sample_texts / "corpus.en").read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    run = f"output_dir={tmp_path / 'run'}"
    proc = run_script("train.py", f"data.paths=[{corpus}]", "vocab_size=300", run, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (home / ".cache").exists()
    session = Path(script_env()["SUPERBPE_CACHE_DIR"])
    made = [json.loads(path.read_text())["about"]["data"] for path in session.glob("merges/*.json")]
    assert [str(corpus)] in made
