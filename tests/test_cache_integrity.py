"""Checksums of cached artifacts: a damaged or old-format entry is discarded with a one-line warning and
computed again (the run's merges are those of a clean run), and ``superbpe-cache verify`` names it."""

from __future__ import annotations

import json
import logging
import random
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from superbpe.cli import cache as cache_command
from superbpe.core.counts import PieceCounts, counts_file_problem
from superbpe.core.errors import InputError
from superbpe.engines import native as native_engine
from superbpe.training.config import DataConfig, EngineConfig, PretokenizerConfig, TrainConfig, to_dataclass
from superbpe.training.run import run_training

ENGINES = ["python", *(["native"] if native_engine.available() else [])]
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few KB of word salad with repeated lines, so both stages have pairs worth merging."""
    rng = random.Random(7)
    words = ["the", "cache", "counts", "of", "a", "piece", "merge", "run", "tokens", "and", "12", "345"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(60)]
    path = tmp_path_factory.mktemp("corpus") / "salad.txt"
    path.write_text("\n".join(rng.choice(lines) for _ in range(600)) + "\n", encoding="utf-8")
    return path


def _config(corpus: Path, out: Path, engine: str, cache_dir: Path | None) -> TrainConfig:
    from omegaconf import OmegaConf

    cfg = TrainConfig(
        data=DataConfig(paths=[str(corpus)]),
        pretokenizer=PretokenizerConfig("superbpe-stage1"),
        engine=EngineConfig(engine),
        vocab_size=360,
        output_dir=str(out),
        cache_dir=None if cache_dir is None else str(cache_dir),
    )
    schedule = {
        "name": "superbpe",
        "stages": [{"name": "stage1", "until": 60}, {"name": "stage2", "pretokenizer": {"name": "superbpe"}}],
    }
    return to_dataclass(OmegaConf.merge(OmegaConf.structured(cfg), {"schedule": schedule}), TrainConfig)


def _entries(cache_dir: Path, kind: str) -> list[Path]:
    suffix = ".counts" if kind == "counts" else ".json"
    return sorted((cache_dir / kind).glob(f"*{suffix}"))


def _layout(data: bytes) -> tuple[int, int, list[tuple[int, int]]]:
    """Where the meta starts and ends, and each entry's (key offset, count offset) in ``.counts`` bytes."""
    (meta_len,) = struct.unpack_from("<I", data, 6)
    meta_end = 10 + meta_len
    (entries,) = struct.unpack_from("<Q", data, meta_end)
    pos, found = meta_end + 8, []
    for _ in range(entries):
        (size,) = struct.unpack_from("<I", data, pos)
        found.append((pos + 4, pos + 4 + size))
        pos += 12 + size
    return 10, meta_end, found


def _flip_in_meta(data: bytearray) -> None:
    """A letter of the pattern's name: the meta stays valid JSON."""
    at = data.index(b'"name": "') + len(b'"name": "')
    data[at] ^= 0x01


def _flip_in_key(data: bytearray) -> None:
    _, _, entries = _layout(bytes(data))
    key, count = next(e for e in entries[len(entries) // 2 :] if e[1] - e[0] >= 2)
    data[(key + count) // 2] ^= 0x01


def _flip_in_count(data: bytearray) -> None:
    """A count grows by 65536: that piece's pairs come first."""
    _, _, entries = _layout(bytes(data))
    data[entries[len(entries) // 2][1] + 2] ^= 0x01


def _cut_tail(data: bytearray) -> None:
    del data[-9:]


def _to_format_one(data: bytearray) -> None:
    """The same file as the format before wrote it: magic 1, no checksum."""
    del data[-4:]
    data[4] = 1


DAMAGE: dict[str, Callable[[bytearray], None]] = {
    "meta": _flip_in_meta,
    "key": _flip_in_key,
    "count": _flip_in_count,
    "truncated": _cut_tail,
    "format 1": _to_format_one,
}


@pytest.fixture(scope="module")
def clean_merges(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    out = tmp_path_factory.mktemp("clean")
    return {engine: run_training(_config(corpus, out / engine, engine, None)).merges for engine in ENGINES}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_counts_entry_is_counted_again_with_one_warning(
    tmp_path: Path,
    corpus: Path,
    clean_merges: dict[str, list],
    engine: str,
    damage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache_dir = tmp_path / "cache"
    assert run_training(_config(corpus, tmp_path / "first", engine, cache_dir)).merges == clean_merges[engine]
    counts_entries = _entries(cache_dir, "counts")
    assert len(counts_entries) == 2  # both stages' counts
    for path in _entries(cache_dir, "merges"):  # so that the merges come from the counts
        path.unlink()
    victim = counts_entries[-1]
    data = bytearray(victim.read_bytes())
    DAMAGE[damage](data)
    victim.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="superbpe"):
        again = run_training(_config(corpus, tmp_path / "again", engine, cache_dir))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(victim) in warnings[0] and "\n" not in warnings[0], warnings
    assert "computing it again" in warnings[0]
    assert again.merges == clean_merges[engine]
    assert counts_file_problem(victim) is None  # counted again and written back whole
    assert all(counts_file_problem(path) is None for path in _entries(cache_dir, "counts"))


def _change_a_merge(path: Path) -> None:
    """A hex digit of the first merge another: still a valid entry, of other merges."""
    text = path.read_text()
    at = text.index('"merges": [["') + len('"merges": [["') + 1
    path.write_text(text[:at] + ("7" if text[at] == "6" else "6") + text[at + 1 :])


@pytest.mark.parametrize("engine", ENGINES)
def test_a_damaged_merges_entry_is_trained_again_with_one_warning(
    tmp_path: Path,
    corpus: Path,
    clean_merges: dict[str, list],
    engine: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache_dir = tmp_path / "cache"
    run_training(_config(corpus, tmp_path / "first", engine, cache_dir))
    victim = max(_entries(cache_dir, "merges"), key=lambda p: p.stat().st_size)
    _change_a_merge(victim)
    with caplog.at_level(logging.INFO, logger="superbpe"):
        again = run_training(_config(corpus, tmp_path / "again", engine, cache_dir))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(victim) in warnings[0] and "checksum" in warnings[0], warnings
    assert again.merges == clean_merges[engine]
    assert json.loads(victim.read_text())["format"] == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_every_changed_byte_and_every_cut_is_refused(tmp_path: Path, engine: str) -> None:
    counts = PieceCounts({b"ab": 3, b"c": 1, b" the": 70000}, {"pretokenizer": {"name": "gpt2"}})
    data = counts.to_bytes()
    load = native_engine.load_counts if engine == "native" else PieceCounts.load
    path = tmp_path / "x.counts"
    for at in range(len(data)):
        for bit in (0x01, 0x80):
            bad = bytearray(data)
            bad[at] ^= bit
            path.write_bytes(bytes(bad))
            with pytest.raises(InputError, match="x.counts: not a valid piece-counts file"):
                load(path)
            assert counts_file_problem(path) is not None
    for length in range(len(data)):
        path.write_bytes(data[:length])
        with pytest.raises(InputError, match="x.counts: not a valid piece-counts file"):
            load(path)
        assert counts_file_problem(path) is not None


@pytest.mark.parametrize("engine", ENGINES)
def test_format_one_is_read_as_it_was_unless_a_checksum_is_required(tmp_path: Path, engine: str) -> None:
    counts = PieceCounts({b"ab": 3, b"c": 1}, {"pretokenizer": {"name": "gpt2"}})
    old = bytearray(counts.to_bytes())
    _to_format_one(old)
    path = tmp_path / "old.counts"
    path.write_bytes(bytes(old))
    load = native_engine.load_counts if engine == "native" else PieceCounts.load
    back = load(path)
    assert dict(back.items()) == dict(counts.items()) and back.meta == counts.meta
    with pytest.raises(InputError, match="old.counts: .*format 1, which has no checksum"):
        load(path, require_checksum=True)
    assert "format 1" in counts_file_problem(path)
    later = bytearray(counts.to_bytes())
    later[4] = 3
    path.write_bytes(bytes(later))
    with pytest.raises(InputError, match="format 3 of a later superbpe"):
        load(path)


def test_cache_verify_names_bad_entries_and_removes_them(
    tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache_dir = tmp_path / "cache"
    run_training(_config(corpus, tmp_path / "first", ENGINES[-1], cache_dir))
    cache_command(["--cache-dir", str(cache_dir), "verify"])
    assert capsys.readouterr().out.strip().endswith(": 0 bad")
    counts_entries, merges_entries = _entries(cache_dir, "counts"), _entries(cache_dir, "merges")
    damaged = bytearray(counts_entries[0].read_bytes())
    _flip_in_count(damaged)
    counts_entries[0].write_bytes(bytes(damaged))
    old = bytearray(counts_entries[1].read_bytes())
    _to_format_one(old)
    counts_entries[1].write_bytes(bytes(old))
    _change_a_merge(merges_entries[0])
    with pytest.raises(SystemExit) as status:
        cache_command(["--cache-dir", str(cache_dir), "verify"])
    assert status.value.code == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[-1].endswith(": 3 bad; --remove removes them"), lines
    assert any(str(counts_entries[0]) in line and "checksum does not match" in line for line in lines)
    assert any(str(counts_entries[1]) in line and "format 1" in line for line in lines)
    assert any(str(merges_entries[0]) in line and "checksum does not match" in line for line in lines)
    cache_command(["--cache-dir", str(cache_dir), "verify", "--remove"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert sum(line.endswith("(removed)") for line in lines) == 3 and lines[-1].endswith(": 3 bad"), lines
    assert not any(path.exists() for path in (*counts_entries, merges_entries[0]))
    cache_command(["--cache-dir", str(cache_dir), "verify"])
    assert capsys.readouterr().out.strip().endswith(": 0 bad")
