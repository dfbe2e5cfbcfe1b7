"""compat=official training runs: the stage-merges cache, small vocabularies, the memory estimate."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
from run_helpers import hf_stage1, superbpe_schedule

from superbpe.core.compat import OFFICIAL
from superbpe.core.errors import ConfigError
from superbpe.formats.gpt2 import MERGES_FILE, VOCAB_FILE
from superbpe.training.cache import token_prefix, tokens_made
from superbpe.training.config import DataConfig, EngineConfig, PretokenizerConfig, ScheduleConfig, TrainConfig
from superbpe.training.run import run_training

ENGINES = ["python", "native"]


def _run(out: Path, corpus: Path, *, cache: Path | None, vocab_size: int = 1500, engine: str = "native",
         schedule: ScheduleConfig | None = None, **compat: object) -> Path:  # fmt: skip
    cfg = TrainConfig(
        data=DataConfig(paths=[str(corpus)]),
        pretokenizer=PretokenizerConfig(name="superbpe-stage1"),
        engine=EngineConfig(name=engine),
        schedule=schedule or superbpe_schedule(1000),
        compat=replace(OFFICIAL, **compat),
        vocab_size=vocab_size,
        special_tokens=[],
        output_dir=str(out),
        cache_dir=None if cache is None else str(cache),
        progress=False,
    )
    return run_training(cfg).output_dir


def _files(directory: Path) -> tuple[bytes, bytes]:
    return (directory / MERGES_FILE).read_bytes(), (directory / VOCAB_FILE).read_bytes()


def _cache_hits(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "merges from cache" in r.getMessage()]


def test_official_stages_use_the_merges_cache(tmp_path, shared_data, official_data, caplog):
    corpus, cache = shared_data / "corpus.en", tmp_path / "cache"
    theirs = _files(official_data / "corpus_en" / "superbpe")
    caplog.set_level(logging.INFO, logger="superbpe")
    assert _files(_run(tmp_path / "first", corpus, cache=cache)) == theirs
    assert _cache_hits(caplog) == []
    caplog.clear()
    assert _files(_run(tmp_path / "second", corpus, cache=cache)) == theirs
    assert [m.split(":")[0] for m in _cache_hits(caplog)] == ["stage stage1", "stage stage2"]
    caplog.clear()
    # Another knob that changes merges has its own entries (stage 1's rules differ, so both stages miss).
    other = _run(tmp_path / "bytes", corpus, cache=cache, tie_break="bytes")
    assert _cache_hits(caplog) == []
    assert _files(other) == _files(_run(tmp_path / "bytes-fresh", corpus, cache=None, tie_break="bytes"))
    caplog.clear()
    # A shorter run is a prefix of the cached one (cut in tokens): equal to training it afresh.
    shorter = _files(_run(tmp_path / "shorter", corpus, cache=cache, vocab_size=1400))
    assert len(_cache_hits(caplog)) == 2
    assert shorter == _files(_run(tmp_path / "shorter-fresh", corpus, cache=None, vocab_size=1400))


def test_token_prefix_counts_duplicate_merges_as_no_token():
    merges = [(b"a", b"b"), (b"c", b"d"), (b"a", b"b"), (b"ab", b"c"), (b"x", b"y")]
    assert tokens_made(merges) == 4
    assert token_prefix(merges, 0) == []
    assert token_prefix(merges, 2) == merges[:2]  # the duplicate after the 2nd token is not part of it
    assert token_prefix(merges, 3) == merges[:4]
    assert token_prefix(merges, 4) == merges
    assert token_prefix(merges, 5) is None


@pytest.mark.parametrize("engine", ENGINES)
def test_small_official_vocab_is_what_hf_makes(tmp_path, shared_data, engine):
    """Below 256 + specials (the alphabet is the bytes seen), and even below the alphabet, as HF does."""
    corpus = shared_data / "corpus.en"  # 108 bytes seen
    for vocab_size in (60, 108, 109, 200):
        hf = tmp_path / f"hf{vocab_size}"
        hf.mkdir()
        hf_stage1(corpus, vocab_size, hf)
        ours = _run(tmp_path / f"ours{vocab_size}", corpus, cache=None, vocab_size=vocab_size, engine=engine,
                    schedule=ScheduleConfig())  # fmt: skip
        assert _files(ours) == _files(hf), vocab_size


def test_small_official_vocab_checks_the_schedule_against_the_bytes_seen(tmp_path, shared_data):
    corpus = shared_data / "corpus.en"  # 108 bytes seen: vocab 200 leaves 92 merges
    out = _run(tmp_path / "sb", corpus, cache=None, vocab_size=200, schedule=superbpe_schedule(50))
    assert len(json.loads((out / VOCAB_FILE).read_text())) == 200
    with pytest.raises(ConfigError, match="leaves 92 merges after the 108 bytes seen"):
        _run(tmp_path / "late", corpus, cache=None, vocab_size=200, schedule=superbpe_schedule(92))
    assert not (tmp_path / "late" / MERGES_FILE).exists()
    with pytest.raises(ConfigError, match="is a fraction, but with compat.alphabet=seen"):
        _run(tmp_path / "fraction", corpus, cache=None, vocab_size=1500, schedule=superbpe_schedule(0.5))  # type: ignore[arg-type]


def test_official_memory_estimate_counts_every_byte_as_a_symbol(tmp_path, shared_data):
    """The official build keeps a symbol slot (4 bytes) and an initial pair position (4 bytes) for every
    byte of every piece, plus 8 per piece, before any inherited merge is applied: the estimate of
    stage 2 is at least that (ours replays first and holds far less)."""
    out = _run(tmp_path / "sb", shared_data / "corpus.en", cache=None)
    stages = json.loads((out / "metrics.json").read_text())["stages"]
    stage2 = stages[-1]
    floor = 8 * (stage2["distinct_bytes"] + stage2["distinct_pieces"])
    assert stage2["estimated_build_bytes"] >= floor


def test_official_memory_estimate_from_samples_is_at_least_the_build_floor():
    """Above the sampling size (two sample trainers, pairs extrapolated), the same floor holds."""
    import random

    from superbpe.core.counts import PieceCounts
    from superbpe.core.rules import MergeRules
    from superbpe.engines.native import NativeEngine

    rng = random.Random(7)
    words = ["the ", "cat ", "sat ", "on ", "a ", "mat ", "and ", "dog ", "ran ", "far "]
    lines = ("".join(rng.choices(words, k=rng.randint(3, 12))).encode() for _ in range(90_000))
    counts = {line: rng.randint(1, 9) for line in lines}
    pieces = [piece for piece in counts if len(piece) >= 2]
    replay = [(b"t", b"h"), (b"th", b"e"), (b"a", b"t"), (b" ", b"c")]
    native = NativeEngine()
    official = MergeRules(tie_break="ids", duplicates="merge", absent_inherited="drop")
    need = native.train_memory(PieceCounts(counts, {}), replay, official)
    ours = native.train_memory(PieceCounts(counts, {}), replay)
    assert need.pieces == len(pieces) > 65_536  # sampled
    assert need.build_bytes >= 8 * (need.piece_bytes + need.pieces) > ours.build_bytes


def test_a_stage_that_drops_inherited_merges_counts_its_own(tmp_path: Path, sample_texts: Path) -> None:
    """Stage 2 on text that never makes most of the source's merges drops them (absent_inherited: drop):
    its merges were counted from the inherited end, fewer than none."""
    import superbpe  # reason: trains the source tokenizer

    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 800, [], compat="official")
    superbpe.Tokenizer(vocab, merges, []).save(tmp_path / "source")
    schedule = superbpe_schedule(len(merges), from_tokenizer=str(tmp_path / "source"))
    out = _run(tmp_path / "out", sample_texts / "german.txt", cache=None, vocab_size=900, schedule=schedule)
    metrics = json.loads((out / "metrics.json").read_text())
    learned = metrics["stages"][1]["merges"]
    kept = len((out / MERGES_FILE).read_text(encoding="utf-8").splitlines()) - 1 - learned  # "#version"
    assert learned > 0 and 0 < kept < len(merges)  # some inherited merges were dropped, some kept
