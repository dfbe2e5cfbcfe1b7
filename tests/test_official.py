"""compat=official: the official SuperBPE scripts' files byte for byte; their tokenizers encode as theirs.

The reference files in ../shared/official were written by the official scripts (HF tokenizers and the
SuperBPE fork); stock HF ``tokenizers`` stands in for their encoder and for their stage-1 trainer.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import warnings
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from run_helpers import hf_stage1, official_run, superbpe_schedule
from script_helpers import ROOT, run_script

from superbpe import Tokenizer, train_bpe
from superbpe.core.byte_table import byte_to_unicode
from superbpe.core.compat import OFFICIAL, PRESETS, CompatConfig, training_rules
from superbpe.core.counts import PieceCounts
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.pretokenize import PATTERNS, get_pretokenizer
from superbpe.core.rules import MergeRules
from superbpe.core.types import Merge
from superbpe.core.vocab import alphabet_order, hf_vocab
from superbpe.engines.interface import get_engine
from superbpe.formats.gpt2 import (
    MERGES_FILE,
    VOCAB_FILE,
    merges_to_text,
    read_merges,
    read_vocab,
    vocab_to_json_text,
)
from superbpe.formats.hf import HF_FILE
from superbpe.training.config import ScheduleConfig

tokenizers = pytest.importorskip("tokenizers")

ENGINES = ["python", "native"]


def _assert_same_files(ours: Path, theirs: Path) -> None:
    for name in (MERGES_FILE, VOCAB_FILE):
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name


@pytest.mark.parametrize("engine", ENGINES)
def test_official_bpe_writes_their_files(tmp_path, shared_data, official_data, engine):
    out = official_run(tmp_path, shared_data / "corpus.en", engine, ScheduleConfig(), "bpe")
    _assert_same_files(out, official_data / "corpus_en" / "bpe")


@pytest.mark.parametrize("engine", ENGINES)
def test_official_superbpe_writes_their_files(tmp_path, shared_data, official_data, engine):
    corpus = shared_data / "corpus.en"
    theirs = official_data / "corpus_en"
    both = official_run(tmp_path, corpus, engine, superbpe_schedule(1000), "both")
    _assert_same_files(both, theirs / "superbpe")
    extended = superbpe_schedule(1000, from_tokenizer=str(theirs / "bpe"))
    from_tokenizer = official_run(tmp_path, corpus, engine, extended, "from-tokenizer")
    _assert_same_files(from_tokenizer, theirs / "superbpe")
    stage1 = official_run(tmp_path, corpus, engine, ScheduleConfig(), "stage1")
    from_run = superbpe_schedule(1000, from_run=str(stage1))
    _assert_same_files(official_run(tmp_path, corpus, engine, from_run, "from-run"), theirs / "superbpe")


def test_official_tokenizer_encodes_like_theirs(tmp_path, shared_data, official_data):
    """Ours (trained, reloaded, and its tokenizer.json in HF) and theirs loaded give HF's ids for theirs."""
    theirs_dir = official_data / "corpus_en" / "superbpe"
    ours_dir = official_run(tmp_path, shared_data / "corpus.en", "native", superbpe_schedule(1000), "sb")
    text = (shared_data / "corpus.en").read_text(encoding="utf-8")
    expected = tokenizers.Tokenizer.from_file(str(theirs_dir / HF_FILE)).encode(text).ids
    assert tokenizers.Tokenizer.from_file(str(ours_dir / HF_FILE)).encode(text).ids == expected
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
    assert vocab == read_vocab(theirs / VOCAB_FILE)
    assert merges == read_merges(theirs / MERGES_FILE)


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
        from superbpe.core.compat import check_compat

        check_compat(CompatConfig(tie_break="random"))
    with pytest.raises(ConfigError, match="duplicates"):
        MergeRules(duplicates="maybe")


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
        hf_stage1(path, vocab_size, out)
        merges = get_engine(engine).train(counts, vocab_size - len(alphabet), rules=rules).merges
        assert merges_to_text(merges) == (out / MERGES_FILE).read_text(encoding="utf-8"), seed
        vocab = vocab_to_json_text(hf_vocab(alphabet, merges), "hf")
        assert vocab == (out / VOCAB_FILE).read_text(encoding="utf-8"), seed


# Units whose repeats make runs ("aaaa", "    ", "\n\n") and overlapping pairs ("abab", "aab"): the shapes
# where a merge meets the pair it just made, and where HF's bookkeeping (one queue entry per pair, its
# count never reset after the merge) could differ from merging every occurrence.
_RUN_UNITS = [["a"], ["a", "b"], ["ab", "a"], ["aa", "b", " "], ["a", " ", "\n"], ["ab", "ba", " "],
              ["1", "a", " "], ["é", "e", " "], ["a", ":", " "], [" ", "\n", "x"]]


def _runs_text(rng: random.Random) -> str:
    units = rng.choice(_RUN_UNITS)
    lines = [
        "".join(rng.choice(units) * rng.choice([1, 1, 2, 3, 4, 7]) for _ in range(rng.randint(0, 12)))
        for _ in range(rng.randint(1, 25))
    ]
    return "\n".join(lines) + "\n"


def test_stock_hf_makes_no_duplicate_merge_and_both_engines_match_it_on_runs(tmp_path):
    """Runs and overlapping pairs, trained until no pair is left: HF's merges and ids exactly.

    HF records a merge whose token exists, merges a pair only in the words its queue entry lists and
    never resets a merged pair's count; none of that shows unless a token can be made twice, which
    merging every occurrence of each pair in turn (what HF's single entry per pair amounts to) never
    allows. The duplicate-free HF output is asserted too, since our equality rests on it.
    """
    pre = get_pretokenizer("superbpe-stage1", line_units=True)
    rules = MergeRules(tie_break="ids", duplicates="merge")
    for seed in range(200):
        rng = random.Random(seed)
        path = tmp_path / f"{seed}.txt"
        path.write_text(_runs_text(rng), encoding="utf-8")
        out = tmp_path / f"hf{seed}"
        out.mkdir()
        counts = get_engine("python").count([path], pre, [])
        alphabet = alphabet_order(counts.bytes_seen())
        vocab_size = len(alphabet) + rng.choice([rng.randint(1, 40), 1000])  # 1000: until no pair is left
        hf_stage1(path, vocab_size, out)
        theirs = (out / MERGES_FILE).read_text(encoding="utf-8")
        assert len(set(theirs.splitlines())) == len(theirs.splitlines()), seed
        for engine in ENGINES:
            merges = get_engine(engine).train(counts, vocab_size - len(alphabet), rules=rules).merges
            assert merges_to_text(merges) == theirs, (seed, engine)
            vocab = vocab_to_json_text(hf_vocab(alphabet, merges), "hf")
            assert vocab == (out / VOCAB_FILE).read_text(encoding="utf-8"), (seed, engine)


def _random_inherited(rng: random.Random, alphabet: bytes, size: int) -> list[tuple[bytes, bytes]]:
    """Merges of random existing tokens, each making a new one: many never occur, and some make a token
    that the text can only reach by another pair (a duplicate, unless the absent merge is dropped)."""
    tokens = [bytes([b]) for b in alphabet]
    merges: list[tuple[bytes, bytes]] = []
    for _ in range(size):
        left, right = rng.choice(tokens), rng.choice(tokens)
        if left + right not in tokens:
            tokens.append(left + right)
            merges.append((left, right))
    return merges


def test_inherited_lists_make_duplicates_only_when_absent_merges_are_kept():
    """With absent inherited merges dropped (the official recipe) no duplicate merge can arise; kept
    (``compat.duplicates=merge`` set alone), it does, and both engines still agree merge for merge."""
    duplicates = {"keep": 0, "drop": 0}
    for seed in range(300):
        rng = random.Random(seed)
        alphabet = rng.choice([b"ab", b"abc", b"ab ", b"a"])
        counts: dict[bytes, int] = {}
        for _ in range(rng.randint(1, 25)):
            piece = bytes(rng.choices(alphabet, k=rng.randint(2, 16)))
            counts[piece] = counts.get(piece, 0) + rng.randint(1, 5)
        replay = _random_inherited(rng, alphabet, rng.randint(0, 20))
        absent = rng.choice(["keep", "drop"])
        tie_break = rng.choice(["ids", "bytes"])
        rules = MergeRules(tie_break=tie_break, duplicates="merge", absent_inherited=absent)
        num_merges = len(replay) + rng.randint(1, 40)
        python, native = (
            get_engine(name).train(PieceCounts(counts, {}), num_merges, rules=rules, replay=replay).merges
            for name in ENGINES
        )
        assert python == native, seed
        duplicates[absent] += len({left + right for left, right in python}) != len(python)
    assert duplicates["drop"] == 0 and duplicates["keep"] > 0, duplicates


def _fork_train(
    fork: Path, counts: PieceCounts, vocab_size: int, inherited: list[Merge] | None, work: Path
) -> tuple[str, str]:
    """(merges.txt, vocab.json) as the official fork writes them for these piece counts: stage 1, or
    stage 2 extending ``inherited`` (the fork reads them from ``merges.txt`` in its working directory)."""
    table = byte_to_unicode()
    work.mkdir()
    words = work / "words.tsv"
    lines = (f"{count}\t{''.join(table[b] for b in piece)}\n" for piece, count in counts.items())
    words.write_text("".join(lines), encoding="utf-8")
    cwd, out = work / "cwd", work / "out"
    cwd.mkdir()
    out.mkdir()
    if inherited is not None:
        (cwd / MERGES_FILE).write_text(merges_to_text(inherited), encoding="utf-8")
    command = [str(fork), str(words), str(vocab_size), str(out)]
    subprocess.run(command, cwd=cwd, check=True, capture_output=True)
    merges, vocab = (out / MERGES_FILE, out / VOCAB_FILE)
    return merges.read_text(encoding="utf-8"), vocab.read_text(encoding="utf-8")


def _official_texts(alphabet: bytes, merges: list[Merge]) -> tuple[str, str]:
    """(merges.txt, vocab.json) as a compat=official run writes them (no special tokens)."""
    return merges_to_text(merges), vocab_to_json_text(hf_vocab(alphabet, merges), "hf")


def _official_fork() -> Path:
    """The official fork's trainer built from tests/official_fork (see its Cargo.toml), or skip."""
    fork = os.environ.get("SUPERBPE_OFFICIAL_FORK")
    if not fork:
        pytest.skip("needs the official fork's trainer (tests/official_fork) in SUPERBPE_OFFICIAL_FORK")
    return Path(fork)


def test_official_fork_harness_writes_their_reference_files(tmp_path, shared_data, official_data):
    """The harness is the fork as their scripts ran it: it writes their corpus.en files, both stages."""
    fork, theirs = _official_fork(), official_data / "corpus_en"
    corpus = shared_data / "corpus.en"
    stage1 = get_engine("native").count([corpus], get_pretokenizer("superbpe-stage1", line_units=True), [])
    stage2 = get_engine("native").count([corpus], get_pretokenizer("superbpe", line_units=True), [])
    inherited = read_merges(theirs / "bpe" / MERGES_FILE)[:1000]
    for name, counts, merges in (("bpe", stage1, None), ("superbpe", stage2, inherited)):
        merges_text, vocab_text = (theirs / name / MERGES_FILE, theirs / name / VOCAB_FILE)
        expected = merges_text.read_text(encoding="utf-8"), vocab_text.read_text(encoding="utf-8")
        assert _fork_train(fork, counts, 1500, merges, tmp_path / name) == expected, name


def test_stage2_matches_the_official_fork(tmp_path):
    """Both stages against the official fork itself (built from tests/official_fork), inheriting a
    stage 1 of the same text or a random list: runs, overlapping pairs, and the skip rules at work."""
    fork = _official_fork()
    stage1_pre = get_pretokenizer("superbpe-stage1", line_units=True)
    stage2_pre = get_pretokenizer("superbpe", line_units=True)
    stage1_rules = training_rules(MergeRules(), OFFICIAL)
    stage2_rules = training_rules(MergeRules(max_words_per_token=4, forbidden_substrings=(b": ",)), OFFICIAL)
    for seed in range(120):
        rng = random.Random(seed)
        path = tmp_path / f"{seed}.txt"
        path.write_text(_runs_text(rng) if seed % 2 else _words_text(rng), encoding="utf-8")
        for engine in ENGINES:
            counts = get_engine(engine).count([path], stage1_pre, [])
            alphabet = alphabet_order(counts.bytes_seen())
            vocab_size = len(alphabet) + rng.randint(1, 80)
            stage1 = get_engine(engine).train(counts, vocab_size - len(alphabet), rules=stage1_rules).merges
            theirs = _fork_train(fork, counts, vocab_size, None, tmp_path / f"{seed}-{engine}-1")
            assert _official_texts(alphabet, stage1) == theirs, (seed, engine)
            inherited = stage1[: rng.randint(0, len(stage1))]
            if seed % 3 == 0:
                inherited = _random_inherited(rng, alphabet, rng.randint(1, 30))
            counts = get_engine(engine).count([path], stage2_pre, [])
            alphabet = alphabet_order(counts.bytes_seen())
            vocab_size = len(alphabet) + len(inherited) + rng.randint(1, 80)
            theirs = _fork_train(fork, counts, vocab_size, inherited, tmp_path / f"{seed}-{engine}-2")
            their_merges = theirs[0].splitlines()
            assert len(set(their_merges)) == len(their_merges), (seed, "the fork made a duplicate merge")
            merges = get_engine(engine).train(
                counts, vocab_size - len(alphabet), rules=stage2_rules, replay=inherited
            ).merges
            assert _official_texts(alphabet, merges) == theirs, (seed, engine)


def _words_text(rng: random.Random) -> str:
    """Lines of short words over a tiny alphabet, with the spaces and ": " the stage-2 skip rules watch."""
    chars = rng.choice(["ab c", "a b", "ab  c: ", "a a b", "xy z:\n"])
    lines = ["".join(rng.choices(chars, k=rng.randint(0, 40))) for _ in range(rng.randint(1, 40))]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("engine", ENGINES)
def test_absent_inherited_merges_are_dropped_with_their_dependents(engine):
    """A replayed merge whose pair never occurs is left out, and so is any merge that needs its token."""
    counts = {b"abab": 3, b"cd": 2}
    replay = [(b"x", b"y"), (b"a", b"b"), (b"xy", b"z"), (b"ab", b"ab")]
    rules = MergeRules(absent_inherited="drop", tie_break="ids", duplicates="merge")
    engine_ = get_engine(engine)
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
    hf.save(str(tmp_path / HF_FILE))
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
        tokenizers.models.BPE.from_file(str(released / VOCAB_FILE), str(released / MERGES_FILE))
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
        assert tok.vocab == {i: t for i, t in read_vocab(released / VOCAB_FILE).items()}
        for name, text in texts.items():
            if engine == "python":
                text = text[:100_000]  # the python engine is the slow reference
            assert tok.encode(text) == hf.encode(text).ids, (engine, name)
    ids = json.loads((released / VOCAB_FILE).read_text(encoding="utf-8"))
    assert ids["Ġthe"] == tok.token_to_id(" the")


def test_released_200k_files_read_with_a_word_level_pattern_warn(official_data):
    """Read without ``compat="official"``, their bare files would encode under the default gpt2 pattern,
    which never makes their superwords: a warning says so and how to read them; with it, none."""
    released = official_data / "released_180K_200K"
    with pytest.warns(UserWarning, match=r"pretokenizer 'gpt2' splits.*load them with compat=official"):
        Tokenizer.load(released)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Tokenizer.load(released, compat="official")
