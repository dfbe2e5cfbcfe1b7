"""The opt-in approximation ``approx_sample``: a stage counts an evenly spread share of the corpus.

What must hold: the share is chosen from the files alone (not from workers or executor), what is
counted is exactly the kept blocks, both engines agree, bad values and inputs are one-line errors,
and a stage without it is exactly what it was.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from fixture_texts import long_lines_corpus

from superbpe.core.counts import PieceCounts
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.pretokenize import get_pretokenizer
from superbpe.engines.native import available as native_available
from superbpe.engines.python import PythonEngine
from superbpe.jobs import count as sharded
from superbpe.jobs.executors import ExecutorSpec, LocalExecutor
from superbpe.jobs.shards import Shard, plan_shards, sample_evenly
from superbpe.training.config import DataConfig, EngineConfig, PretokenizerConfig, TrainConfig, to_dataclass
from superbpe.training.run import prepare, run_training

EOT = "<|endoftext|>"
ENGINES = ["python", *(["native"] if native_available() else [])]


def _blocks(n: int) -> list[Shard]:
    return [Shard("f", i, i + 1, i == n - 1) for i in range(n)]


@pytest.mark.parametrize(
    ("n", "fraction", "kept"),
    [
        (12, 0.25, [0, 4, 8]),
        (10, 0.5, [0, 2, 4, 6, 8]),
        (7, 1.0, list(range(7))),
        (5, 0.01, [0]),
        (9, 1 / 3, [0, 3, 6]),
        (4, 1e-7, [0]),
    ],
)
def test_sample_evenly_keeps_an_even_share_from_the_first_block(
    n: int, fraction: float, kept: list[int]
) -> None:
    assert [block.start for block in sample_evenly(_blocks(n), fraction)] == kept


def test_sample_evenly_has_no_rounding_drift() -> None:
    # 0.1 * 10 is not 1.0 in floating point; exact fractions keep the share exact over long runs.
    assert len(sample_evenly(_blocks(100_000), 0.1)) == 10_000
    assert len(sample_evenly(_blocks(1000), 0.7)) == 700
    with pytest.raises(ValueError):
        sample_evenly(_blocks(3), 0.0)


@pytest.fixture()
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> int:
    """Blocks of 4 KiB, so a test corpus of a few hundred KB has many of them."""
    monkeypatch.setattr(sharded, "SAMPLE_BLOCK_BYTES", 4096)
    return 4096


def _corpus(tmp_path: Path, sample_texts: Path) -> Path:
    text = (sample_texts / "corpus.en").read_text(encoding="utf-8")
    path = tmp_path / "corpus.txt"
    path.write_text((text + EOT) * 3, encoding="utf-8")
    return path


def _kept_blocks_counted_one_by_one(
    path: Path, fraction: float, block_bytes: int, pattern: str
) -> PieceCounts:
    pre = get_pretokenizer(pattern)
    planned = plan_shards([path], [EOT], block_bytes, line_cuts=pre.safe_cuts_hold, pretokenizer=pre)
    blocks = sample_evenly(planned, fraction)
    total: PieceCounts | None = None
    data = path.read_bytes()
    for i, block in enumerate(blocks):
        piece = path.parent / f"block{i}.txt"
        piece.write_bytes(data[block.start : block.end])
        counts = PythonEngine().count(piece, pre, [EOT])
        total = counts if total is None else (total.update(counts) or total)
    assert total is not None
    return total


def _wiki_style(tmp_path: Path, sample_texts: Path) -> Path:
    """corpus.en with every line ending in " \n", as WikiText's do: no line cut there is safe."""
    text = (sample_texts / "corpus.en").read_text(encoding="utf-8").replace(EOT, " ")  # no cut before one
    path = tmp_path / "wiki_style.txt"
    path.write_text("".join(f" {line.strip()} \n" for line in text.splitlines() if line.strip()) * 3)
    return path


@pytest.mark.parametrize("pattern", ["superbpe", "gpt2"])
@pytest.mark.parametrize("make", [_corpus, _wiki_style], ids=["lines", "lines ending in a space"])
def test_a_sampled_count_is_the_count_of_the_kept_blocks_in_both_engines(
    tmp_path: Path, sample_texts: Path, small_blocks: int, pattern: str, make: Any
) -> None:
    """Also where no line cut is safe: such a file was one block, so every share counted all of it while
    the run said it sampled; the pre-tokenizer's local rules cut it."""
    path = make(tmp_path, sample_texts)
    expected = _kept_blocks_counted_one_by_one(path, 0.3, small_blocks, pattern)
    whole = PythonEngine().count(path, get_pretokenizer(pattern), [EOT])
    for engine in ENGINES:
        got = sharded.count_sample(path, pattern, [EOT], 0.3, engine=engine)
        assert dict(got.counts) == dict(expected.counts), engine
    assert 0.2 * whole.total() < expected.total() < 0.4 * whole.total()


def test_a_share_the_corpus_is_too_small_to_give_is_a_warning(
    tmp_path: Path, sample_texts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A corpus of two blocks counted one of them for a share of 0.25 and for one of 0.5 alike; the runs
    were recorded with different shares and the same merges."""
    path = tmp_path / "two_blocks.txt"
    path.write_text("a line of words\n" * (sharded.SAMPLE_BLOCK_BYTES * 3 // 2 // 16))
    with caplog.at_level("WARNING", logger="superbpe"):
        sharded.count_sample(path, "gpt2", [EOT], 0.25, engine="python")
    assert "counted for a share of 25%: it has only 2 blocks" in caplog.text


def test_a_sampled_count_does_not_depend_on_workers_or_executor(
    tmp_path: Path, sample_texts: Path, small_blocks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _corpus(tmp_path, sample_texts)
    engine = ENGINES[-1]
    one = sharded.count_sample(path, "superbpe", [EOT], 0.5, engine=engine, workers=1)
    two = sharded.count_sample(path, "superbpe", [EOT], 0.5, engine=engine, workers=2)
    # The task path (what Ray runs), here on local worker processes in tasks of ~20 KB.
    monkeypatch.setattr(sharded, "get_executor", lambda spec, workers: LocalExecutor(2))
    tasks = sharded.count_sample(
        path, "superbpe", [EOT], 0.5, engine=engine, executor=ExecutorSpec("ray", shard_bytes=20_000)
    )
    assert dict(one.counts) == dict(two.counts) == dict(tasks.counts)


def test_inputs_that_cannot_be_cut_are_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write("hello world\n" * 100)
    with pytest.raises(InputError, match="cuts files into byte ranges") as refused:
        sharded.count_sample(path, "superbpe", [EOT], 0.5, engine="python")
    assert "\n" not in str(refused.value)


def _config(corpus: Path, out: Path, sample: object, cache_dir: Path | None = None) -> TrainConfig:
    from omegaconf import OmegaConf

    cfg = TrainConfig(
        data=DataConfig(paths=[str(corpus)]),
        pretokenizer=PretokenizerConfig("superbpe-stage1"),
        engine=EngineConfig(ENGINES[-1]),
        vocab_size=900,
        output_dir=str(out),
        cache_dir=None if cache_dir is None else str(cache_dir),
    )
    schedule = {
        "name": "superbpe",
        "stages": [
            {"name": "stage1", "until": 400},
            {"name": "stage2", "pretokenizer": {"name": "superbpe"}, "approx_sample": sample},
        ],
    }
    return to_dataclass(OmegaConf.merge(OmegaConf.structured(cfg), {"schedule": schedule}), TrainConfig)


def test_a_sampled_stage_trains_on_its_share_and_says_so(tmp_path: Path, small_blocks: int) -> None:
    corpus = long_lines_corpus(tmp_path / "lines.txt")
    exact = run_training(_config(corpus, tmp_path / "exact", None))
    whole = run_training(_config(corpus, tmp_path / "whole", 1.0))
    sampled = run_training(_config(corpus, tmp_path / "sampled", 0.25))
    assert whole.merges == exact.merges  # a share of 1 is the whole corpus, exactly
    stage1_end = exact.stage_ends[0]
    assert sampled.merges[:stage1_end] == exact.merges[:stage1_end]  # stage 1 is not sampled
    assert sampled.merges != exact.merges
    stages = json.loads((tmp_path / "sampled" / "metrics.json").read_text())["stages"]
    assert "approx_sample" not in stages[0] and stages[1]["approx_sample"] == 0.25
    # What was counted, beside what was asked: whole blocks are taken (a small corpus strays further).
    assert 0.15 < stages[1]["approx_sample_counted"] < 0.35 and stages[1]["approx_sample_counted"] != 0.25
    whole_stages = json.loads((tmp_path / "whole" / "metrics.json").read_text())["stages"]
    assert "approx_sample_counted" not in whole_stages[1]  # a share of 1 is the exact count
    exact_stages = json.loads((tmp_path / "exact" / "metrics.json").read_text())["stages"]
    assert "approx_sample" not in exact_stages[1]
    assert stages[1]["distinct_pieces"] < exact_stages[1]["distinct_pieces"]


def test_a_sampled_stage_of_a_corpus_it_cannot_sample_is_refused_before_training(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as out:
        out.write("hello world\n" * 100)
    with pytest.raises(InputError, match="cuts files into byte ranges"):
        prepare(_config(corpus, tmp_path / "out", 0.25))
    assert not (tmp_path / "out").exists()


def test_the_cache_keeps_sampled_and_exact_stages_apart(tmp_path: Path, small_blocks: int) -> None:
    corpus = long_lines_corpus(tmp_path / "lines.txt")
    cache = tmp_path / "cache"
    sampled = run_training(_config(corpus, tmp_path / "sampled", 0.25)).merges
    exact = run_training(_config(corpus, tmp_path / "exact", None)).merges
    assert run_training(_config(corpus, tmp_path / "a", None, cache)).merges == exact
    assert run_training(_config(corpus, tmp_path / "b", 0.25, cache)).merges == sampled
    assert run_training(_config(corpus, tmp_path / "c", 0.5, cache)).merges not in (sampled, exact)
    assert run_training(_config(corpus, tmp_path / "d", None, cache)).merges == exact


@pytest.mark.parametrize("bad", [0, -0.5, 1.5])
def test_a_bad_share_is_a_one_line_config_error(tmp_path: Path, bad: object) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world\n" * 50, encoding="utf-8")
    with pytest.raises((ConfigError, ValueError)) as refused:
        run_training(_config(corpus, tmp_path / "out", bad))
    assert "approx_sample" in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", ["sample", "shards"])
def test_a_file_cut_after_its_blocks_are_planned_is_refused(tmp_path: Path, monkeypatch, how: str) -> None:
    text = tmp_path / "cut.txt"
    text.write_text("hello world\n" * 5000)

    def plan_then_cut(*args: Any, **kwargs: Any) -> list[Shard]:  # another process cutting the file
        shards = plan_shards(*args, **kwargs)
        with text.open("r+") as stream:
            stream.truncate(1200)
        return shards

    monkeypatch.setattr(sharded, "plan_shards", plan_then_cut)
    with pytest.raises(InputError, match=r"cut\.txt: changed while it was counted \(60000 bytes then"):
        if how == "sample":
            sharded.count_sample([text], "gpt2", [EOT], 0.5, engine="python")
        else:
            sharded.count_on_executor([text], "gpt2", [EOT], executor=ExecutorSpec(shard_bytes=20_000))
