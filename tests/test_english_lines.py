"""SuperBPE on English-like lines that almost never repeat, as in deduplicated web text.

Stage 2's pieces are whole lines cut at numbers, punctuation and space runs, so on such text nearly
every piece is distinct and counted once, pairs are many and rare, and a line's words repeat while the
line does not. The corpus comes from ``benchmarks/make_english_corpus.py`` (the generator the benchmarks
use), spliced from the standard library's docstrings so the tests need no shared data. Both engines must
choose the same merges on it, and a stage 2 stopped half way and continued must equal one run through.
"""

from __future__ import annotations

import sys
from pathlib import Path

import fixture_texts
import pytest

from superbpe.core.pretokenize import get_pretokenizer
from superbpe.core.rules import MergeRules
from superbpe.engines import native as native_engine
from superbpe.engines.python import PythonEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from make_english_corpus import Chain, main, write_corpus  # noqa: E402  (benchmarks/ holds scripts, not a package)

EOT = "<|endoftext|>"
RULES = MergeRules(max_words_per_token=4, forbidden_substrings=(b": ",))
STAGE1_MERGES = 300
TOTAL_MERGES = 800


@pytest.fixture(scope="module")
def english_lines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    paragraphs = [" ".join(doc.split()) for doc in fixture_texts.stdlib_docstrings(300_000)]
    path = tmp_path_factory.mktemp("english") / "lines.txt"
    write_corpus(Chain(paragraphs), path, 250_000, seed=11, workers=1)
    return path


def engines() -> list:
    found = [PythonEngine()]
    if native_engine.available():
        found.append(native_engine.NativeEngine())
    return found


def test_the_generated_lines_are_english_and_almost_all_distinct(english_lines: Path) -> None:
    lines = [line for line in english_lines.read_text(encoding="utf-8").splitlines() if line != EOT]
    assert len(lines) > 300
    assert len(set(lines)) >= 0.98 * len(lines)
    words = " ".join(lines).split()
    assert sum(w.lower() in ("the", "of", "a", "to", "is") for w in words) > 0.05 * len(words)


def test_the_generator_is_deterministic(tmp_path: Path) -> None:
    paragraphs = [" ".join(doc.split()) for doc in fixture_texts.stdlib_docstrings(100_000)]
    chain = Chain(paragraphs)
    a, b, c = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "c.txt"
    write_corpus(chain, a, 50_000, seed=3, workers=1)
    write_corpus(chain, b, 50_000, seed=3, workers=2)
    write_corpus(chain, c, 50_000, seed=4, workers=1)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    assert 49_000 < len(a.read_bytes()) <= 50_000 and a.read_bytes().endswith(b"\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{tmp}/missing/out.txt"], "its directory does not exist"),
        (["{tmp}/out.txt", "--size", "lots"], "expected bytes such as"),
        (["{tmp}/out.txt", "--workers", "0"], "must be at least 1"),
        (["{tmp}/out.txt", "--source", "{tmp}/none.txt"], "no such source file"),
    ],
)
def test_the_generator_refuses_bad_arguments_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not list(tmp_path.glob("*out.txt*")) and not list(tmp_path.glob(".out*"))


@pytest.mark.skipif(not native_engine.available(), reason="superbpe._native is not built")
@pytest.mark.parametrize("stage2_pattern", ["superbpe", "superbpe-paper"])
def test_native_stage2_equals_python_on_distinct_english_lines(
    english_lines: Path, stage2_pattern: str
) -> None:
    python, native = PythonEngine(), native_engine.NativeEngine()
    stage1_pre = get_pretokenizer("superbpe-stage1")
    stage1 = python.train(python.count(english_lines, stage1_pre, [EOT]), STAGE1_MERGES).merges
    assert native.train(native.count(english_lines, stage1_pre, [EOT]), STAGE1_MERGES).merges == stage1
    pre = get_pretokenizer(stage2_pattern)
    python_counts = python.count(english_lines, pre, [EOT])
    assert python_counts.to_dict() == native.count(english_lines, pre, [EOT]).to_dict()
    for transition in (0, 180, STAGE1_MERGES):
        expected = python.train(python_counts, TOTAL_MERGES, rules=RULES, replay=stage1[:transition])
        got = native.train(
            native.count(english_lines, pre, [EOT]), TOTAL_MERGES, rules=RULES, replay=stage1[:transition]
        )
        assert got.merges == expected.merges, f"transition {transition}"
        assert len(got.merges) == TOTAL_MERGES


@pytest.mark.parametrize("engine", engines(), ids=lambda e: e.name)
def test_stage2_continued_half_way_equals_one_run(english_lines: Path, engine) -> None:
    stage1 = engine.train(engine.count(english_lines, get_pretokenizer("superbpe-stage1"), [EOT]), 240).merges
    pre = get_pretokenizer("superbpe")
    whole = engine.train(engine.count(english_lines, pre, [EOT]), TOTAL_MERGES, rules=RULES, replay=stage1)
    for stop in (241, 500):
        part = engine.train(engine.count(english_lines, pre, [EOT]), stop, rules=RULES, replay=stage1)
        assert part.merges == whole.merges[:stop]
        rest = engine.train(
            engine.count(english_lines, pre, [EOT]), TOTAL_MERGES, rules=RULES, replay=part.merges
        )
        assert rest.merges == whole.merges, f"continued after {stop}"


@pytest.mark.skipif(not native_engine.available(), reason="superbpe._native is not built")
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc/self/maps")
def test_stage2_counts_that_borrow_the_file_equal_copied_counts(
    english_lines: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows of distinct English lines leave their lines in the mapped file, windows of repeated
    code-like lines copy theirs; counts, merges and the counts file are the same as when every
    piece is copied, and stay so once the file is gone. Counts that borrow keep the file mapped
    while they live; counts of code alone copy every piece and keep nothing."""
    code = "".join(f"    x = f({i % 40}, y)  # {i % 3}\n" for i in range(4000))
    english = english_lines.read_text(encoding="utf-8")
    mixed = tmp_path / "mixed.txt"
    mixed.write_text(english + code + english[: len(english) // 2] + code, encoding="utf-8")
    monkeypatch.setattr(native_engine, "MAP_WINDOW_BYTES", 8192)
    native, pre = native_engine.NativeEngine(), get_pretokenizer("superbpe")
    stage1 = native.train(native.count(mixed, get_pretokenizer("superbpe-stage1"), [EOT]), 240).merges
    copied = native.count(mixed, pre, [EOT], workers=2)
    expected = PythonEngine().count(mixed, pre, [EOT]).to_dict()
    assert copied.to_dict() == expected
    whole = native.train(copied, TOTAL_MERGES, rules=RULES, replay=stage1).merges
    copied.save(tmp_path / "copied.counts")
    for workers in (1, 2):
        borrowed = native.count(mixed, pre, [EOT], workers=workers, borrow_files=True)
        assert borrowed.to_dict() == expected
        borrowed.save(tmp_path / "borrowed.counts")
        assert (tmp_path / "borrowed.counts").read_bytes() == (tmp_path / "copied.counts").read_bytes()
        assert native.train(borrowed, TOTAL_MERGES, rules=RULES, replay=stage1).merges == whole
    # Several files: each is borrowed window by window in turn, and counted as one corpus.
    both = [mixed, english_lines]
    several = native.count(both, pre, [EOT], borrow_files=True)
    assert several.to_dict() == PythonEngine().count(both, pre, [EOT]).to_dict()
    del several
    borrowed = native.count(mixed, pre, [EOT], borrow_files=True)
    mixed.unlink()
    assert mapped(mixed)
    assert borrowed.to_dict() == expected
    assert native.train(borrowed, TOTAL_MERGES, rules=RULES, replay=stage1).merges == whole
    del borrowed
    assert not mapped(mixed)
    code_only = tmp_path / "code.txt"
    code_only.write_text(code * 3, encoding="utf-8")
    kept = native.count(code_only, pre, [EOT], borrow_files=True)
    assert kept.to_dict() == PythonEngine().count(code_only, pre, [EOT]).to_dict()
    assert not mapped(code_only)


def mapped(path: Path) -> bool:
    """Whether this process maps ``path`` (Linux: /proc/self/maps)."""
    return str(path) in Path("/proc/self/maps").read_text()


@pytest.mark.parametrize("engine", engines(), ids=lambda e: e.name)
def test_counts_larger_than_a_share_of_the_corpus_are_not_cached(
    english_lines: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    engine,
) -> None:
    """Stage 2's counts of distinct lines make a file nearly the size of the corpus: it is not cached
    (reading it back saves no time over counting again) while stage 1's smaller one is, and the runs that
    count again train the same merges."""
    from run_helpers import superbpe_schedule

    from superbpe.training import cache as run_cache
    from superbpe.training.config import DataConfig, EngineConfig, PretokenizerConfig, TrainConfig
    from superbpe.training.run import run_training

    sizes = [
        engine.count(english_lines, get_pretokenizer(name), [EOT]).file_size()
        for name in ("superbpe-stage1", "superbpe")
    ]
    assert sizes[1] > run_cache.COUNTS_MAX_SHARE * english_lines.stat().st_size
    # This corpus is small: what is always cached is set between the two stages' files.
    monkeypatch.setattr(run_cache, "COUNTS_ALWAYS_BYTES", (sizes[0] + sizes[1]) // 2)
    assert sizes[0] <= run_cache.COUNTS_ALWAYS_BYTES < sizes[1]

    def run(name: str, cache_dir: Path | None) -> bytes:
        cfg = TrainConfig(
            data=DataConfig(paths=[str(english_lines)]),
            pretokenizer=PretokenizerConfig(name="superbpe-stage1"),
            engine=EngineConfig(name=engine.name),
            schedule=superbpe_schedule(STAGE1_MERGES),
            vocab_size=256 + 1 + TOTAL_MERGES,
            special_tokens=[EOT],
            cache_dir=None if cache_dir is None else str(cache_dir),
            output_dir=str(tmp_path / name),
            progress=False,
        )
        return (run_training(cfg).output_dir / "merges.txt").read_bytes()

    uncached = run("uncached", None)
    with caplog.at_level("INFO", logger="superbpe"):
        assert run("first", tmp_path / "cache") == uncached
        assert run("again", tmp_path / "cache") == uncached
    cached = list((tmp_path / "cache").rglob("*.counts"))
    assert len(cached) == 1 and cached[0].stat().st_size == sizes[0]
    skipped = [r.getMessage() for r in caplog.records if "piece counts not cached" in r.getMessage()]
    assert len(skipped) == 2 and all(m.startswith("stage stage2: ") for m in skipped)
    assert "reading it back saves no time over counting again" in skipped[0]
    assert sum("piece counts from cache" in r.getMessage() for r in caplog.records) == 1
