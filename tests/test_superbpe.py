"""SuperBPE via run_training: word-bounded before the transition, superwords after, resumable from runs."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from superbpe.core.errors import ConfigError, InputError
from superbpe.core.pretokenize import get_pretokenizer
from superbpe.core.rules import count_words
from superbpe.engines.interface import native_available
from superbpe.formats.gpt2 import read_merges
from superbpe.training.config import DataConfig, EngineConfig, PretokenizerConfig, TrainConfig, to_dataclass
from superbpe.training.run import run_training
from superbpe.training.summary import collect, table, timing_note

VOCAB = 1200
TRANSITION = 500


@pytest.fixture(scope="module")
def wiki(tmp_path_factory, wikitext_text) -> Path:
    """~250 KB of English Wikipedia prose (or its generated stand-in)."""
    path = tmp_path_factory.mktemp("corpus") / "wiki.txt"
    path.write_text(wikitext_text[:250_000], encoding="utf-8")
    return path


def config(corpus: Path, out: Path, schedule: str = "bpe", **schedule_options) -> TrainConfig:
    from omegaconf import OmegaConf

    stages = {
        "bpe": [{"name": "bpe", "until": None}],
        "superbpe": [
            {"name": "stage1", "until": schedule_options.get("transition")},
            {
                "name": "stage2",
                "pretokenizer": {"name": schedule_options.get("stage2_pattern", "superbpe")},
                "max_words_per_token": 4,
                "forbidden_substrings": [": "],
            },
        ],
    }[schedule]
    raw = {"name": schedule, **schedule_options, "stages": stages}
    cfg = TrainConfig(
        data=DataConfig(paths=[str(corpus)]),
        pretokenizer=PretokenizerConfig("gpt2"),
        engine=EngineConfig("python"),
        vocab_size=VOCAB,
        output_dir=str(out),
        cache_dir=None,
    )
    merged = OmegaConf.merge(OmegaConf.structured(cfg), {"schedule": raw})
    return to_dataclass(merged, TrainConfig)


@pytest.fixture(scope="module")
def superbpe_run(wiki, tmp_path_factory):
    out = tmp_path_factory.mktemp("superbpe")
    return run_training(config(wiki, out, "superbpe", transition=TRANSITION)), out


@pytest.fixture(scope="module")
def bpe_run(wiki, tmp_path_factory):
    out = tmp_path_factory.mktemp("bpe")
    return run_training(config(wiki, out)), out


def tokens(merges):
    return [left + right for left, right in merges]


def test_no_token_spans_words_before_the_transition(superbpe_run):
    result, _ = superbpe_run
    assert result.stage_ends == [TRANSITION, VOCAB - 257]
    gpt2 = get_pretokenizer("gpt2")
    for token in tokens(result.merges[:TRANSITION]):
        text = token.decode("utf-8", "ignore")
        assert len(gpt2.split(text)) <= 1, token  # one pre-token: never across a word boundary


def test_superword_tokens_appear_after_the_transition(superbpe_run):
    result, _ = superbpe_run
    after = tokens(result.merges[TRANSITION:])
    superwords = [t for t in after if count_words(t) >= 2]
    assert len(superwords) >= 50, superwords[:10]
    assert any(t.strip().count(b" ") >= 2 for t in superwords)  # three-word tokens too


def test_no_token_breaks_the_stage2_rules(superbpe_run):
    result, _ = superbpe_run
    for token in tokens(result.merges):
        assert count_words(token) <= 4, token
        assert b": " not in token, token


def test_metrics_and_manifest_describe_both_stages(superbpe_run):
    _, out = superbpe_run
    metrics = json.loads((out / "metrics.json").read_text())
    assert [s["merges"] for s in metrics["stages"]] == [TRANSITION, VOCAB - 257 - TRANSITION]
    assert [s["pretokenizer"]["name"] for s in metrics["stages"]] == ["gpt2", "superbpe"]
    assert all(s["seconds"] > 0 and s["peak_rss_bytes"] > 0 for s in metrics["stages"])
    manifest = json.loads((out / "superbpe.json").read_text())
    assert manifest["pretokenizer"]["name"] == "superbpe"  # encoding uses the stage-2 pattern
    assert [s["num_merges"] for s in manifest["stages"]] == [TRANSITION, VOCAB - 257 - TRANSITION]


def test_resuming_a_bpe_run_at_t_keeps_exactly_its_first_t_merges(bpe_run, superbpe_run, wiki, tmp_path):
    bpe, bpe_dir = bpe_run
    result = run_training(
        config(wiki, tmp_path / "out", "superbpe", transition=TRANSITION, from_run=str(bpe_dir))
    )
    assert result.merges[:TRANSITION] == bpe.merges[:TRANSITION]
    assert result.merges[TRANSITION] != bpe.merges[TRANSITION]
    assert len(result.merges) == VOCAB - 257
    # Stage 1 is greedy, so taking it from the run equals training both stages in one go.
    assert result.merges == superbpe_run[0].merges
    assert read_merges(tmp_path / "out" / "merges.txt") == result.merges


@pytest.mark.skipif(not native_available(), reason="superbpe._native is not built")
def test_a_stage_taken_from_the_cache_names_the_engine_that_chose_it(wiki, tmp_path):
    """A stage taken whole from the cache named this run's engine, which chose none of it: in a sweep over
    engine=native,python the python jobs said python for merges the native ones had chosen."""
    cache = tmp_path / "cache"

    def stages(out: str, engine: str) -> list[tuple[str, str | None]]:
        cfg = config(wiki, tmp_path / out, "superbpe", transition=TRANSITION)
        run_training(dataclasses.replace(cfg, engine=EngineConfig(engine), cache_dir=str(cache)))
        metrics = json.loads((tmp_path / out / "metrics.json").read_text())
        return [(stage["from"], stage["engine"]) for stage in metrics["stages"]]

    assert stages("native", "native") == [("trained", "native")] * 2
    assert stages("python", "python") == [("cache", "native")] * 2
    # An entry that does not say (written before it was recorded) names none rather than a wrong one.
    for entry in (cache / "merges").glob("*.json"):
        data = json.loads(entry.read_text())
        del data["about"]["engine"]
        entry.write_text(json.dumps(data))
    assert stages("older", "python") == [("cache", None)] * 2


def test_a_stage_taken_from_a_run_names_the_engine_that_trained_it_there(bpe_run, wiki, tmp_path):
    """``stages[0].engine`` named this run's engine, which never trained that stage."""
    _, bpe_dir = bpe_run  # trained on the python engine
    cfg = config(wiki, tmp_path / "out", "superbpe", transition=TRANSITION, from_run=str(bpe_dir))
    run_training(dataclasses.replace(cfg, engine=EngineConfig("native")))
    stages = json.loads((tmp_path / "out" / "metrics.json").read_text())["stages"]
    assert [(stage["from"], stage["engine"]) for stage in stages] == [
        (f"run {bpe_dir}", "python"),
        ("trained", "native"),
    ]
    # A source whose metrics.json is gone does not say which engine trained it.
    source = tmp_path / "source"
    shutil.copytree(bpe_dir, source)
    (source / "metrics.json").unlink()
    cfg = config(wiki, tmp_path / "again", "superbpe", transition=TRANSITION, from_run=str(source))
    run_training(dataclasses.replace(cfg, engine=EngineConfig("native")))
    stages = json.loads((tmp_path / "again" / "metrics.json").read_text())["stages"]
    assert [stage["engine"] for stage in stages] == [None, "native"]
    # superbpe-summarize reads both, their seconds marked as not all training.
    rows = collect(tmp_path)
    assert len(rows) == 2 and all(row.untimed for row in rows) and timing_note(rows) is not None
    assert "*" in table(rows)


def test_fractional_transition_from_run(bpe_run, wiki, tmp_path):
    bpe, bpe_dir = bpe_run
    result = run_training(
        config(
            wiki,
            tmp_path / "out",
            "superbpe",
            transition=0.25,
            from_run=str(bpe_dir),
            stage2_pattern="superbpe-paper",
        )
    )
    t = round(0.25 * (VOCAB - 257))
    assert result.stage_ends == [t, VOCAB - 257]
    assert result.merges[:t] == bpe.merges[:t]


def test_transition_beyond_the_runs_merges_is_refused_before_writing(bpe_run, wiki, tmp_path):
    _, bpe_dir = bpe_run
    cfg = config(wiki, tmp_path / "out", "superbpe", transition=VOCAB - 256, from_run=str(bpe_dir))
    cfg.vocab_size = VOCAB + 100
    with pytest.raises(ConfigError, match=f"has only {VOCAB - 257}"):
        run_training(cfg)
    assert not (tmp_path / "out").exists()


def test_a_from_run_that_is_missing_or_not_a_run_is_named(wiki, tmp_path):
    stopped = tmp_path / "stopped"  # a run killed before its tokenizer: its checkpoint says so
    stopped.mkdir()
    (stopped / "checkpoint.json").write_text("{}")
    (stopped / "merges.txt").write_text("#version: 0.2\n")  # a file of a run was "no such directory"
    cases = (
        (tmp_path / "nope", "no such directory"),
        (stopped / "merges.txt", rf"a file; give the run's directory \({stopped}\), or the files with"),
        (tmp_path, r"no superbpe.json \(not a"),
        (stopped, rf"a run that has not finished; finish it first \(superbpe-train resume={stopped}\)"),
    )
    for run_dir, message in cases:
        cfg = config(wiki, tmp_path / "out", "superbpe", transition=100, from_run=str(run_dir))
        with pytest.raises(InputError, match=f"schedule.from_run {run_dir}: {message}"):
            run_training(cfg)
    assert not (tmp_path / "out").exists()


def test_resuming_a_run_whose_from_run_was_moved_says_the_resume_needs_it(bpe_run, wiki, tmp_path):
    """The source's bare "no such directory" did not say that it was the resumed run's own stage 1."""
    source = tmp_path / "bpe"
    shutil.copytree(bpe_run[1], source)
    cfg = config(wiki, tmp_path / "out", "superbpe", transition=100, from_run=str(source))
    first = run_training(cfg)
    source.rename(tmp_path / "moved")
    again = dataclasses.replace(cfg, resume=str(tmp_path / "out"), output_dir=None)
    named = rf"cannot resume {tmp_path / 'out'}: schedule.from_run {source}: no such directory \(its first"
    with pytest.raises(InputError, match=named):
        run_training(again)
    (tmp_path / "moved").rename(source)
    assert run_training(again).merges == first.merges


def test_a_from_tokenizer_naming_one_file_of_a_directory_names_the_directory(wiki, tmp_path):
    """``vocab.json`` alone was read as an HF tokenizer.json ("no model of type BPE")."""
    source = tmp_path / "gpt2-dir"
    source.mkdir()
    (source / "vocab.json").write_text("{}")
    (source / "merges.txt").write_text("#version: 0.2\n")
    for name in ("vocab.json", "merges.txt"):
        cfg = config(wiki, tmp_path / "out", "superbpe", transition=100, from_tokenizer=str(source / name))
        named = rf"a file of a tokenizer directory; give the directory \({source}\)"
        with pytest.raises(InputError, match=named):
            run_training(cfg)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_extend_gpt2_files_with_superwords(shared_data, tmp_path):
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    shutil.copy(shared_data / "gpt2_vocab.json", gpt2 / "vocab.json")
    shutil.copy(shared_data / "gpt2_merges.txt", gpt2 / "merges.txt")
    original = read_merges(gpt2 / "merges.txt")
    corpus = shared_data / "corpus.en"
    cfg = config(corpus, tmp_path / "out", "superbpe", transition=len(original), from_tokenizer=str(gpt2))
    cfg.vocab_size = 256 + len(original) + 1 + 60
    result = run_training(cfg)
    assert result.merges[: len(original)] == original
    added = tokens(result.merges[len(original) :])
    assert len(added) == 60 and sum(count_words(t) >= 2 for t in added) >= 30


def test_extend_a_tokenizer_json(superbpe_run, bpe_run, wiki, tmp_path):
    bpe, bpe_dir = bpe_run
    result = run_training(
        config(
            wiki, tmp_path / "out", "superbpe", transition=300, from_tokenizer=str(bpe_dir / "tokenizer.json")
        )
    )
    assert result.merges[:300] == bpe.merges[:300]
    assert result.stage_ends == [300, VOCAB - 257]


def test_native_run_counts_stage2_ahead_with_the_same_merges(superbpe_run, wiki, tmp_path, caplog):
    from superbpe.engines import native as native_engine

    if not native_engine.available():
        pytest.skip("superbpe._native is not built")
    cfg = config(wiki, tmp_path / "native", "superbpe", transition=TRANSITION)
    cfg.engine = EngineConfig("native")
    with caplog.at_level("INFO", logger="superbpe"):
        result = run_training(cfg)
    assert any("counted while the previous stage trained" in r.getMessage() for r in caplog.records)
    assert result.merges == superbpe_run[0].merges
    assert result.stage_ends == superbpe_run[0].stage_ends


def test_inherited_merges_dropped_by_the_rules_are_logged_as_such_not_as_a_mismatch(caplog) -> None:
    from types import SimpleNamespace

    from superbpe.core.rules import MergeRules
    from superbpe.training import run

    known = [(b" ", b"\n"), (b"a", b"b")]
    chosen = [(b"a", b"b"), (b"c", b"d")]
    for absent_inherited, level in (("drop", "INFO"), ("keep", "WARNING")):
        caplog.clear()
        plan = SimpleNamespace(name="stage2", rules=MergeRules(absent_inherited=absent_inherited))
        with caplog.at_level("INFO", logger="superbpe"):
            run._check_chosen_again(plan, known, chosen)  # type: ignore[arg-type]
        assert [record.levelname for record in caplog.records] == [level], absent_inherited
    assert "1 inherited merge(s) never occur" not in caplog.text and "as known before" in caplog.text
