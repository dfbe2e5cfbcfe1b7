"""The plain library API: the CS336 reference, engines, and one clear error per bad input."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import superbpe
from superbpe.core.byte_table import token_str_to_bytes
from superbpe.core.errors import ConfigError, InputError, SuperBPEError

EOT = "<|endoftext|>"


def reference_merges(shared_data: Path) -> list[tuple[bytes, bytes]]:
    lines = (shared_data / "train-bpe-reference-merges.txt").read_text(encoding="utf-8").splitlines()
    return [tuple(token_str_to_bytes(part) for part in line.split(" ")) for line in lines if line]  # type: ignore[misc]


def test_cs336_reference_is_reproduced(shared_data: Path) -> None:
    """Speed is measured in BENCHMARKS.md (corpus.en, vocab 500), not asserted here."""
    vocab, merges = superbpe.train_bpe(shared_data / "corpus.en", 500, [EOT])
    assert merges == reference_merges(shared_data)
    expected = {
        token_str_to_bytes(t) if t != EOT else EOT.encode()
        for t in json.loads((shared_data / "train-bpe-reference-vocab.json").read_text(encoding="utf-8"))
    }
    assert set(vocab.values()) == expected
    assert len(vocab) == 500


def test_python_engine_reproduces_reference_too(shared_data: Path) -> None:
    _, merges = superbpe.train_bpe(str(shared_data / "corpus.en"), 500, [EOT], engine="python", workers=2)
    assert merges == reference_merges(shared_data)


def test_ids_are_bytes_then_merges_then_specials(sample_texts: Path) -> None:
    vocab, merges = superbpe.train_bpe(sample_texts / "tinystories_sample.txt", 300, [EOT, "<pad>"])
    assert [vocab[i] for i in range(256)] == [bytes([i]) for i in range(256)]
    assert [vocab[256 + i] for i in range(len(merges))] == [a + b for a, b in merges]
    assert vocab[298] == EOT.encode() and vocab[299] == b"<pad>"


def test_a_tokenizer_made_without_the_special_tokens_it_was_trained_with_warns(sample_texts: Path) -> None:
    """train_bpe(..., [EOT]) then Tokenizer(vocab, merges): EOT was encoded byte by byte, so a corpus encoded
    with it had no document separators, without a word."""
    vocab, merges = superbpe.train_bpe(sample_texts / "tinystories_sample.txt", 300, [EOT])
    with pytest.warns(UserWarning, match=r"no merge makes, such as '<\|endoftext\|>', but no special_tokens"):
        superbpe.Tokenizer(vocab, merges)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        superbpe.Tokenizer(vocab, merges, [EOT])
        superbpe.Tokenizer(vocab, merges, [])  # none, said outright
        whole = {i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b"abc"}
        assert superbpe.Tokenizer(whole, [(b"a", b"b")]).encode("abc") == [257]  # a whole piece: it is given


def test_training_from_saved_counts_equals_training_from_text(shared_data: Path, tmp_path: Path) -> None:
    counts = superbpe.count(shared_data / "corpus.en", [EOT])
    counts.save(tmp_path / "c.counts")
    loaded = superbpe.PieceCounts.load(tmp_path / "c.counts")
    assert superbpe.train_bpe(loaded, 500, [EOT])[1] == reference_merges(shared_data)


def test_counts_are_trained_as_they_were_made(sample_texts: Path) -> None:
    counts = superbpe.count(sample_texts / "german.txt", [EOT], pretokenizer="o200k")
    _, merges = superbpe.train_bpe(counts, 300, [EOT])
    assert superbpe.train_bpe(counts, 300, [EOT], pretokenizer="o200k")[1] == merges
    with pytest.raises(ConfigError, match="made with pretokenizer o200k, not gpt2"):
        superbpe.train_bpe(counts, 300, [EOT], pretokenizer="gpt2")
    with pytest.raises(ConfigError, match="train_superbpe needs the corpus"):
        superbpe.train_superbpe(counts, 300, 0.5, [EOT])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"cut at special tokens \['<\|endoftext\|>'\], not \['<\|x\|>'\]"):
        superbpe.train_bpe(counts, 300, ["<|x|>"])



@pytest.mark.parametrize("engine", ["python", "native"])
@pytest.mark.parametrize(
    ("counts", "message"),
    [({"hello": 3}, r"^piece counts map bytes to counts, not str: 'hello' \(encode text"),
     ({b"hello": 3.5}, r"^piece b'hello' has a count that is not an integer: 3.5"),
     ({b"hello": None}, r"^piece b'hello' has a count that is not an integer: None")],
)  # fmt: skip
def test_piece_counts_made_by_hand_are_checked_alike_by_both_engines(
    engine: str, counts: dict, message: str
) -> None:
    """A str piece or a count that is no integer failed deep inside either engine (AttributeError, TypeError),
    and the python engine trained on a float count that the native one refused."""
    if engine == "native":
        pytest.importorskip("superbpe._native")
    with pytest.raises(SuperBPEError, match=message):
        superbpe.train_bpe(superbpe.PieceCounts(counts), 258, engine=engine)
    assert superbpe.train_bpe(superbpe.PieceCounts({b"hello": np.int64(3)}), 258, engine=engine)[1] == [
        (b"l", b"o"), (b"l", b"lo")]  # fmt: skip


def test_counts_for_compat_official_are_counted_line_by_line(tmp_path: Path, sample_texts: Path) -> None:
    """compat="official" trains on each line apart: counts made otherwise trained other merges than the same
    corpus given as a file, without a word. count(compat=...) makes counts that train alike."""
    corpus = tmp_path / "c.txt"
    corpus.write_text((sample_texts / "german.txt").read_text(encoding="utf-8") + "x  \n  y\t\n\n z \n" * 200,
                      encoding="utf-8")  # fmt: skip
    with pytest.raises(ConfigError, match=r"^compat official trains on each line apart, but these counts"):
        superbpe.train_bpe(superbpe.count(corpus), 100, compat="official")
    counts = superbpe.count(corpus, compat="official")
    trained = superbpe.train_bpe(counts, 100, compat="official")
    assert trained == superbpe.train_bpe(corpus, 100, compat="official")


@pytest.mark.parametrize("engine", ["python", "native"])
def test_numpy_integers_are_taken_for_every_whole_number_option(sample_texts: Path, engine: str) -> None:
    """A sweep's np.arange gives numpy integers: vocab_size, workers and callback_every took them while the
    rules refused them as "min_frequency must be an integer >= 1, not np.int64(2)"."""
    if engine == "native":
        pytest.importorskip("superbpe._native")
    rules = {"min_frequency": 2, "max_token_bytes": 4, "max_words_per_token": 1}
    given = {name: np.int64(value) for name, value in rules.items()}
    corpus = sample_texts / "german.txt"
    expected = superbpe.train_bpe(corpus, 300, [EOT], engine=engine, **rules)  # type: ignore[arg-type]
    assert superbpe.train_bpe(corpus, 300, [EOT], engine=engine, **given) == expected  # type: ignore[arg-type]
    assert superbpe.MergeRules(min_frequency=np.int64(3)).min_frequency.__class__ is int  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"vocab_size": 256}, ConfigError, r"vocab_size 256 is below 256 bytes \+ 1 special tokens = 257"),
        ({"vocab_size": "500"}, ConfigError, "vocab_size must be an integer"),
        ({"vocab_size": 10**12}, ConfigError, "vocab_size 1,000,000,000,000 is above 1,114,112, the largest"),
        ({"special_tokens": [EOT, ""]}, ConfigError, "special tokens must be non-empty"),
        ({"pretokenizer": "gtp2"}, ConfigError, "unknown pre-tokenizer 'gtp2'"),
        ({"engine": "fast"}, ConfigError, "unknown engine 'fast'"),
        ({"min_frequncy": 2}, ConfigError, "unknown train_bpe option"),
        ({"min_frequency": 0}, ConfigError, "min_frequency must be an integer >= 1"),
        ({"forbidden_substrings": [""]}, ConfigError, "forbidden_substrings must be non-empty"),
        ({"workers": 0}, SuperBPEError, "workers must be an integer >= 1"),
        ({"special_tokens": EOT}, ConfigError, r"special_tokens takes a list of strings: \['<\|endoftext"),
        ({"special_tokens": 5}, ConfigError, "special_tokens takes a list of strings, not int"),
        # A set's order, and so the specials' ids, changed with the process's hash seed.
        ({"special_tokens": {EOT}}, ConfigError, r"not a set: their order gives their ids.*\['<\|endoftext"),
        ({"special_tokens": [EOT, EOT]}, ConfigError, r"special token '<\|endoftext\|>' is given twice"),
        ({"forbidden_substrings": ": "}, ConfigError, r"takes a list of strings: \[': '\]"),
        ({"forbidden_substrings": [5]}, ConfigError, r"forbidden_substrings takes strings, not int \(5\)"),
        ({"chunk_bytes": 1.5}, ConfigError, "chunk_bytes must be an integer >= 1, not 1.5"),
        ({"chunk_bytes": 0}, ConfigError, "chunk_bytes must be an integer >= 1, not 0"),
        ({"callback": 5}, ConfigError, "callback must be a function of the merges so far, not int"),
        ({"callback_every": 2.5}, ConfigError, "callback_every must be an integer >= 1, not 2.5"),
        ({"pretokenizer": 5}, ConfigError, "pretokenizer takes a built-in name, 'custom:<regex>'"),
        ({"input_path": b"corpus.txt"}, InputError, "not bytes: 'corpus.txt'"),
        ({"input_path": {"text": "hello"}}, InputError, r"a row of text goes in a list, \[row\]"),
        ({"input_path": ["corpus.txt", 5]}, InputError, r"inputs\[1\] is of type int, not a path"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    sample_texts: Path, kwargs: dict, error: type, message: str
) -> None:
    args = {"input_path": sample_texts / "german.txt", "vocab_size": 300, "special_tokens": [EOT], **kwargs}
    with pytest.raises(error, match=message) as info:
        superbpe.train_bpe(**args)
    assert "\n" not in str(info.value)


def test_bad_corpus_paths_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file or directory"):
        superbpe.train_bpe(tmp_path / "missing.txt", 300, [EOT])
    (tmp_path / "bad.txt").write_bytes(b"ok \xc3\x28 bad")
    with pytest.raises(InputError, match=r"bad.txt: invalid UTF-8 at byte 3; .*errors='replace' \(library\)"):
        superbpe.train_bpe(tmp_path / "bad.txt", 300, [EOT])
    _, merges = superbpe.train_bpe(tmp_path / "bad.txt", 260, [EOT], errors="replace")
    assert merges


def test_the_public_names_and_the_compat_presets_are_handed_out_by_the_package() -> None:
    """``superbpe.X`` for every exported name, and ``superbpe.compat.OFFICIAL`` as the README writes it."""
    for name in superbpe.__all__:
        assert getattr(superbpe, name) is not None
    # What dir() and completion offer: every public name (each one resolves), no imported helper.
    listed = {name for name in dir(superbpe) if not name.startswith("__")}
    assert listed == set(superbpe.__all__) | {"compat"}
    assert "__version__" in dir(superbpe)
    assert all(getattr(superbpe, name) is not None for name in listed)
    assert superbpe.compat.OFFICIAL.name == "official"
    assert isinstance(superbpe.compat.OFFICIAL, superbpe.CompatConfig)
    with pytest.raises(AttributeError):
        superbpe.no_such_name  # noqa: B018


@pytest.mark.parametrize(
    "name, meant",
    [
        ("train", "did you mean train_bpe or train_superbpe?"),
        ("Tokeniser", "did you mean Tokenizer?"),
        ("count_pieces", "did you mean count?"),
        ("PieceCount", "did you mean PieceCounts?"),
    ],
)
def test_a_name_the_package_lacks_names_the_public_ones_meant(name: str, meant: str) -> None:
    """A mistyped or shortened name says which public names it may have meant; ``train`` is too far
    from ``train_bpe`` for Python's own suggestions. A name with nothing near says only that."""
    with pytest.raises(AttributeError) as raised:
        getattr(superbpe, name)
    assert str(raised.value) == f"module 'superbpe' has no attribute {name!r}; {meant}"
    with pytest.raises(AttributeError) as raised:
        superbpe.xyzzy  # noqa: B018
    assert str(raised.value) == "module 'superbpe' has no attribute 'xyzzy'"


def test_reprs_say_what_they_hold_in_one_short_line(sample_texts: Path) -> None:
    counts = superbpe.count(sample_texts / "german.txt", [EOT], pretokenizer="o200k")
    assert repr(counts).endswith(f"({len(counts)} distinct of {counts.total()} pieces, pretokenizer o200k)")
    vocab, merges = superbpe.train_bpe(counts, 300, [EOT])
    reserved = [f"<|reserved_{i}|>" for i in range(100)]
    shown = repr(superbpe.Tokenizer(vocab, merges, [EOT, *reserved]))
    assert "<|reserved_2|>', ... (101 in all)]" in shown and "reserved_3|" not in shown


def test_arguments_of_the_wrong_kind_are_one_line_library_errors(sample_texts: Path) -> None:
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"ab"}
    merges = [(b"a", b"b")]
    plain = superbpe.Tokenizer(vocab, merges)
    cases = {
        "merge #0 must be two non-empty bytes objects": lambda: superbpe.Tokenizer(vocab, [("a", "b")]),
        "merge #0 must be two non-empty bytes": lambda: superbpe.Tokenizer(vocab, [(b"a", b"b", b"c")]),
        "vocab must map ids to bytes": lambda: superbpe.Tokenizer([b"a"], merges),
        "merges must be a list": lambda: superbpe.Tokenizer(vocab, None),
        "got 1099511627776 .below 2..32.": lambda: superbpe.Tokenizer({**vocab, 2**40: b"x"}, merges),
        "holds a lone surrogate": lambda: superbpe.Tokenizer(vocab, merges, ["<|\ud800|>"]),
        "compat must be a preset": lambda: superbpe.Tokenizer.load(sample_texts, compat=5),
        "decode takes token ids": lambda: superbpe.Tokenizer(vocab, merges).decode(None),
        "inputs are a path or a list of paths, not int": lambda: superbpe.count(5),
        "this one maps strings to ids, as a vocab.json does: load such files with Tokenizer.from_files": (
            lambda: superbpe.Tokenizer({"a": 0}, [])
        ),
        "encode_file takes a path .str or Path., not bytes": lambda: plain.encode_file(b"corpus.txt"),
        "encode_batch takes a list of str, not a dict": lambda: plain.encode_batch({"a": 1}),
        "pretokenizer takes a built-in name": lambda: superbpe.Tokenizer(vocab, merges, pretokenizer=5),
    }
    for message, call in cases.items():
        with pytest.raises(SuperBPEError, match=message):
            call()


def test_numpy_integers_and_none_are_taken_where_python_ones_are(sample_texts: Path) -> None:
    """A size or count from numpy works as the int it holds; None special tokens or pretokenizer mean the
    defaults, as elsewhere in the API."""
    corpus = sample_texts / "german.txt"
    want = superbpe.train_bpe(corpus, 300, None, chunk_bytes=4096)
    assert superbpe.train_bpe(corpus, np.int64(300), None, chunk_bytes=np.int64(4096)) == want
    tok = superbpe.Tokenizer(*want, pretokenizer=None)
    assert tok.encode_batch(["ab cd"], threads=np.int64(2)) == [tok.encode("ab cd")]


def test_a_save_into_a_directory_removes_what_an_earlier_save_left_of_another_tokenizer(
    sample_texts: Path, tmp_path: Path
) -> None:
    """tiktoken files from an earlier save with ``tiktoken=True`` would encode as the earlier tokenizer."""
    first = superbpe.Tokenizer(*superbpe.train_bpe(sample_texts / "german.txt", 300, [EOT]), [EOT])
    second = superbpe.Tokenizer(*superbpe.train_bpe(sample_texts / "german.txt", 280, [EOT]), [EOT])
    first.save(tmp_path / "tok", tiktoken=True)
    assert (tmp_path / "tok" / "tokenizer.tiktoken").is_file()
    second.save(tmp_path / "tok")
    assert not (tmp_path / "tok" / "tokenizer.tiktoken").exists()
    assert not (tmp_path / "tok" / "tiktoken.json").exists()
    assert superbpe.Tokenizer.load(tmp_path / "tok").vocab_size == second.vocab_size


def test_a_save_where_nothing_can_be_written_is_a_library_error(sample_texts: Path, tmp_path: Path) -> None:
    tok = superbpe.Tokenizer(*superbpe.train_bpe(sample_texts / "german.txt", 300, [EOT]), [EOT])
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match=r"file/tok: cannot write the tokenizer there \(Not a directory\)"):
        tok.save(tmp_path / "file" / "tok")
