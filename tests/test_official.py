"""compat=official: the official SuperBPE scripts' files byte for byte; their tokenizers encode as theirs.

The reference files in ../shared/official were written by the official scripts (HF tokenizers and the
SuperBPE fork); stock HF ``tokenizers`` stands in for their encoder and for their stage-1 trainer.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from script_helpers import ROOT, run_script

from superbpe import Tokenizer, files, train_bpe
from superbpe.compat import OFFICIAL, PRESETS, alphabet_order, hf_vocab
from superbpe.config import (
    CompatConfig,
    DataConfig,
    EngineConfig,
    PretokenizerConfig,
    ScheduleConfig,
    StageConfig,
    TrainConfig,
)
from superbpe.engine import get_engine
from superbpe.errors import ConfigError, InputError
from superbpe.pretokenize import PATTERNS, get_pretokenizer
from superbpe.run import run_training
from superbpe.trainer import MergeRules

tokenizers = pytest.importorskip("tokenizers")

ENGINES = ["python", "native"]


def _superbpe_schedule(transition: int, **source: str) -> ScheduleConfig:
    """The built-in superbpe schedule as conf/schedule/superbpe.yaml composes it."""
    stage2 = StageConfig(
        name="stage2",
        pretokenizer=PretokenizerConfig(name="superbpe"),
        max_words_per_token=4,
        forbidden_substrings=[": "],
    )
    return ScheduleConfig(
        name="superbpe",
        transition=transition,
        stages=[StageConfig(name="stage1", until=transition), stage2],
        **source,
    )


def _official_run(tmp_path: Path, corpus: Path, engine: str, schedule: ScheduleConfig, name: str) -> Path:
    cfg = TrainConfig(
        data=DataConfig(paths=[str(corpus)]),
        pretokenizer=PretokenizerConfig(name="superbpe-stage1"),
        engine=EngineConfig(name=engine),
        schedule=schedule,
        compat=OFFICIAL,
        vocab_size=1500,
        special_tokens=[],
        output_dir=str(tmp_path / name),
        progress=False,
    )
    return run_training(cfg).output_dir


def _assert_same_files(ours: Path, theirs: Path) -> None:
    for name in (files.MERGES_FILE, files.VOCAB_FILE):
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name


@pytest.mark.parametrize("engine", ENGINES)
def test_official_bpe_writes_their_files(tmp_path, shared_data, official_data, engine):
    out = _official_run(tmp_path, shared_data / "corpus.en", engine, ScheduleConfig(), "bpe")
    _assert_same_files(out, official_data / "corpus_en" / "bpe")


@pytest.mark.parametrize("engine", ENGINES)
def test_official_superbpe_writes_their_files(tmp_path, shared_data, official_data, engine):
    corpus = shared_data / "corpus.en"
    theirs = official_data / "corpus_en"
    both = _official_run(tmp_path, corpus, engine, _superbpe_schedule(1000), "both")
    _assert_same_files(both, theirs / "superbpe")
    extended = _superbpe_schedule(1000, from_tokenizer=str(theirs / "bpe"))
    from_tokenizer = _official_run(tmp_path, corpus, engine, extended, "from-tokenizer")
    _assert_same_files(from_tokenizer, theirs / "superbpe")
    stage1 = _official_run(tmp_path, corpus, engine, ScheduleConfig(), "stage1")
    from_run = _superbpe_schedule(1000, from_run=str(stage1))
    _assert_same_files(_official_run(tmp_path, corpus, engine, from_run, "from-run"), theirs / "superbpe")


def test_official_tokenizer_encodes_like_theirs(tmp_path, shared_data, official_data):
    """Ours (trained, reloaded, and its tokenizer.json in HF) and theirs loaded give HF's ids for theirs."""
    theirs_dir = official_data / "corpus_en" / "superbpe"
    ours_dir = _official_run(tmp_path, shared_data / "corpus.en", "native", _superbpe_schedule(1000), "sb")
    text = (shared_data / "corpus.en").read_text(encoding="utf-8")
    expected = tokenizers.Tokenizer.from_file(str(theirs_dir / files.HF_FILE)).encode(text).ids
    assert tokenizers.Tokenizer.from_file(str(ours_dir / files.HF_FILE)).encode(text).ids == expected
    for engine in ENGINES:
        assert Tokenizer.load(ours_dir, engine=engine).encode(text) == expected
        loaded = Tokenizer.load(theirs_dir, engine=engine)
        assert not loaded.pretokenizer.line_units and not loaded.whole_pieces
        assert loaded.encode(text) == expected


@pytest.mark.parametrize("engine", ENGINES)
def test_train_bpe_compat_official_gives_their_vocab_and_merges(shared_data, official_data, engine):
    vocab, merges = train_bpe(
        shared_data / "corpus.en", 1500, pretokenizer="superbpe-stage1", engine=engine, compat="official"
    )
    theirs = official_data / "corpus_en" / "bpe"
    assert vocab == files.read_vocab(theirs / files.VOCAB_FILE)
    assert merges == files.read_merges(theirs / files.MERGES_FILE)


def test_script_compat_official_writes_their_files(tmp_path, shared_data, official_data):
    proc = run_script(
        "train.py",
        "compat=official",
        "schedule=superbpe",
        "schedule.transition=1000",
        f"data.paths=[{shared_data / 'corpus.en'}]",
        "vocab_size=1500",
        f"output_dir={tmp_path / 'out'}",
        "cache_dir=null",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    _assert_same_files(tmp_path / "out", official_data / "corpus_en" / "superbpe")


def test_compat_presets_match_their_yaml():
    for name, preset in PRESETS.items():
        loaded = OmegaConf.load(ROOT / "conf" / "compat" / f"{name}.yaml")
        fields = loaded.get("compat", loaded)
        assert CompatConfig(**OmegaConf.to_object(fields)) == preset


def test_vocab_below_the_seen_alphabet_gives_the_alphabet_as_hf_does(shared_data):
    vocab, merges = train_bpe(shared_data / "corpus.en", 120, compat="official")  # 108 bytes seen
    assert (len(vocab), len(merges)) == (120, 12)
    vocab, merges = train_bpe(shared_data / "corpus.en", 100, compat="official")
    assert (len(vocab), merges) == (108, [])  # HF's BpeTrainer keeps every character seen


def test_bad_compat_value_is_one_line_error():
    with pytest.raises(ConfigError, match="compat.tie_break"):
        from superbpe.compat import check_compat

        check_compat(CompatConfig(tie_break="random"))
    with pytest.raises(ConfigError, match="duplicates"):
        MergeRules(duplicates="maybe")


def _hf_stage1(path: Path, vocab_size: int, out: Path) -> None:
    """Stock HF BpeTrainer as the official train_tokenizer.py sets it up (stage 1)."""
    hf = tokenizers.Tokenizer(tokenizers.models.BPE())
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Split(tokenizers.Regex(PATTERNS["superbpe-stage1"]), "isolated"),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.train([str(path)], tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False))
    hf.model.save(str(out))


@pytest.mark.parametrize("engine", ENGINES)
def test_hf_tie_break_and_alphabet_match_stock_hf_on_random_text(tmp_path, engine):
    """Small random texts are full of count ties: every merge and id must still be HF's."""
    pre = get_pretokenizer("superbpe-stage1", line_units=True)
    rules = MergeRules(tie_break="ids", duplicates="merge")
    for seed in range(40):
        rng = random.Random(seed)
        chars = rng.choice(["ab c", "abc d\n", "aab é.\n", "xy z:\n"])
        lines = ["".join(rng.choices(chars, k=rng.randint(0, 30))) for _ in range(rng.randint(1, 30))]
        path = tmp_path / f"{seed}.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        counts = get_engine(engine).count([path], pre, [])
        alphabet = alphabet_order(counts.bytes_seen())
        vocab_size = len(alphabet) + rng.randint(1, 60)
        out = tmp_path / f"hf{seed}"
        out.mkdir()
        _hf_stage1(path, vocab_size, out)
        merges = get_engine(engine).train(counts, vocab_size - len(alphabet), rules=rules).merges
        assert files.merges_to_text(merges) == (out / files.MERGES_FILE).read_text(encoding="utf-8"), seed
        vocab = files.vocab_to_json_text(hf_vocab(alphabet, merges), "hf")
        assert vocab == (out / files.VOCAB_FILE).read_text(encoding="utf-8"), seed


@pytest.mark.parametrize("engine", ENGINES)
def test_absent_inherited_merges_are_dropped_with_their_dependents(engine):
    """A replayed merge whose pair never occurs is left out, and so is any merge that needs its token."""
    counts = {b"abab": 3, b"cd": 2}
    replay = [(b"x", b"y"), (b"a", b"b"), (b"xy", b"z"), (b"ab", b"ab")]
    rules = MergeRules(absent_inherited="drop", tie_break="ids", duplicates="merge")
    engine_ = get_engine(engine)
    from superbpe.counting import PieceCounts

    result = engine_.train(PieceCounts(counts, {}), 4, rules=rules, replay=replay)
    assert result.merges == [(b"a", b"b"), (b"ab", b"ab"), (b"c", b"d")]
    kept = engine_.train(PieceCounts(counts, {}), 5, rules=MergeRules(), replay=replay)
    assert kept.merges[:4] == replay


@pytest.mark.parametrize("engine", ENGINES)
def test_a_missing_byte_is_an_error_only_when_a_text_needs_it(engine):
    vocab = {i: bytes([i]) for i in range(256) if i != 0xC3}  # the first byte of "é"
    vocab[256] = b"ab"
    tok = Tokenizer(vocab, [(b"a", b"b")], engine=engine)
    assert tok.encode("ab cab") == [256, 32, 99, 256]
    with pytest.raises(InputError, match="byte 0xc3"):
        tok.encode("café")


def test_gpt2_files_keep_ids_and_endoftext_is_special(shared_data):
    tok = Tokenizer.from_files(shared_data / "gpt2_vocab.json", shared_data / "gpt2_merges.txt")
    assert tok.special_tokens == ["<|endoftext|>"]
    assert tok.encode("Hello<|endoftext|>") == [15496, 50256]
    assert tok.encode_ordinary("<|endoftext|>") != [50256]


def test_hf_added_tokens_load_as_special(tmp_path, shared_data):
    hf = tokenizers.Tokenizer(tokenizers.models.BPE())
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<pad>"],
                                             show_progress=False)
    hf.train([str(shared_data / "corpus.en")], trainer)
    hf.save(str(tmp_path / files.HF_FILE))
    tok = Tokenizer.load(tmp_path)
    assert tok.special_tokens == ["<|endoftext|>", "<pad>"]
    assert tok.vocab_size == hf.get_vocab_size()
    text = "the end<|endoftext|><pad> of it"
    assert tok.encode(text) == hf.encode(text).ids


def _shared_texts(shared_data: Path) -> dict[str, str]:
    texts = {}
    for path in sorted(shared_data.iterdir()):
        if path.name.endswith((".json", "merges.txt")):
            continue
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as handle:
            texts[path.name] = handle.read()
    return texts


@pytest.mark.slow
def test_released_200k_tokenizer_loads_unpadded_and_encodes_like_hf(shared_data, official_data):
    """Their released 180K->200K tokenizer (13 bytes missing), read the way their code reads it."""
    released = official_data / "released_180K_200K"
    hf = tokenizers.Tokenizer(
        tokenizers.models.BPE.from_file(str(released / files.VOCAB_FILE), str(released / files.MERGES_FILE))
    )
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Split(tokenizers.Regex(PATTERNS["superbpe"]), "isolated"),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    texts = _shared_texts(shared_data)
    for engine in ENGINES:
        tok = Tokenizer.load(released, engine=engine, compat="official")
        assert tok.vocab_size == 200_000 and tok.special_tokens == []
        assert tok.vocab == {i: t for i, t in files.read_vocab(released / files.VOCAB_FILE).items()}
        for name, text in texts.items():
            if engine == "python":
                text = text[:100_000]  # the python engine is the slow reference
            assert tok.encode(text) == hf.encode(text).ids, (engine, name)
    ids = json.loads((released / files.VOCAB_FILE).read_text(encoding="utf-8"))
    assert ids["Ġthe"] == tok.token_to_id(" the")
