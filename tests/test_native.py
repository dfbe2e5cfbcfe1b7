"""The native engine against the python engine and the references: pieces, counts, merges, vocab, ids.

Every check here compares the Rust engine with an independent implementation (the ``regex`` module, the
python engine, tiktoken, the shared reference merges), so a divergence in either shows up as a failure.
"""

from __future__ import annotations

import gzip
import json
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import regex
import tiktoken

from superbpe.core.counts import PieceCounts
from superbpe.core.errors import ConfigError, InputError, SuperBPEError
from superbpe.core.pretokenize import PATTERNS, get_pretokenizer
from superbpe.core.rules import MergeRules
from superbpe.core.sources import REPLACE_HINT
from superbpe.core.vocab import build_vocab
from superbpe.engines import native as native_engine
from superbpe.engines.interface import get_engine
from superbpe.engines.python import PythonEngine
from superbpe.formats.gpt2 import read_merges, read_vocab

pytestmark = pytest.mark.skipif(
    not native_engine.available(), reason="superbpe._native is not built (run `pip install -e .`)"
)

EOT = "<|endoftext|>"
Merge = tuple[bytes, bytes]
Native = native_engine.NativeEngine
SMALL_TEXTS = ["corpus.en", "tinystories_sample.txt", "address.txt", "german.txt"]


@pytest.fixture(scope="module")
def native() -> native_engine.NativeEngine:
    return native_engine.NativeEngine()


@pytest.fixture(scope="module")
def python() -> PythonEngine:
    return PythonEngine()


@pytest.fixture(scope="module")
def corpora(sample_texts: Path, multilingual_text: str, wikitext_text: str) -> dict[str, str]:
    """Every shared text: the small files whole, the big ones as the conftest slices."""
    texts = {name: (sample_texts / name).read_text(encoding="utf-8") for name in SMALL_TEXTS}
    texts["multilingual"] = multilingual_text
    texts["wikitext"] = wikitext_text
    return texts


def gpt2_unicode_to_bytes() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted (written from its published definition)."""
    ranges = [(ord("!"), ord("~")), (ord("¡"), ord("¬")), (ord("®"), ord("ÿ"))]
    printable = [b for low, high in ranges for b in range(low, high + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def read_reference_merges(path: Path) -> list[Merge]:
    table = gpt2_unicode_to_bytes()
    merges = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            left, right = line.split(" ")
            merges.append((bytes(table[c] for c in left), bytes(table[c] for c in right)))
    return merges


# -- pre-tokenization -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PATTERNS))
def test_builtin_patterns_have_scanners(name: str) -> None:
    assert native_engine._native.has_scanner(PATTERNS[name])


@pytest.mark.parametrize("name", list(PATTERNS))
def test_pieces_match_regex_on_shared_corpora(name: str, corpora: dict[str, str]) -> None:
    for line_units in (False, True):
        pre = get_pretokenizer(name, line_units=line_units)
        for text_name, text in corpora.items():
            got = native_engine._native.pretokenize(pre.pattern, line_units, text)
            assert got == pre.split(text), (name, line_units, text_name)


@pytest.mark.parametrize(
    "text",
    [
        "I'M can't WE'LL ſ 'ſ 'Ve x'LL",
        "a \n\n b\r\n\r\nc \t\u3000\u2028\u0085d\xa0 e  ",
        "HELLOworld ǅungla ʰʰa Σίσυφος ΑΒΓδ e\u0301\u0301 \u0301x 中文字 한국어",
        "١٢٣٤٥ ½¾ Ⅻ 1234567 x12y 0.5 ١٢٣4",
        "emoji 😀👍🏽 zwj 👨‍👩‍👧 flag 🇩🇪 !!//\n// ...\r\n",
        "\x1c\x1d\x1e\x1f \x00 \ufeff\u00ad soft",
    ],
)
def test_pieces_match_regex_on_weird_unicode(text: str) -> None:
    for name, pattern in PATTERNS.items():
        for line_units in (False, True):
            pre = get_pretokenizer(name, line_units=line_units)
            assert native_engine._native.pretokenize(pattern, line_units, text) == pre.split(text), name


@pytest.mark.parametrize(
    "pattern",
    [r"\p{L}+|\p{N}", r"\s+|[^\s]{1,4}", r"(?i)the|and", r"\d{2}(?=\d)", r"(?<=a)b+", r"x*"],
)
def test_custom_patterns_use_isolated_split(pattern: str, corpora: dict[str, str]) -> None:
    pre = get_pretokenizer(f"custom:{pattern}")
    text = corpora["german.txt"] + corpora["address.txt"] + "aabbb xx x1234"
    assert not native_engine._native.has_scanner(pattern)
    assert native_engine._native.pretokenize(pattern, False, text) == pre.split(text)


@pytest.mark.parametrize("pattern", [r"(?:the){e<=1}", r"\X", r"\p{L}+|\p{N}"])
def test_native_never_splits_a_custom_pattern_and_auto_says_it_picks_python(
    pattern: str, sample_texts: Path, native: Native, caplog: pytest.LogCaptureFixture
) -> None:
    """No probe text proves that fancy-regex agrees with `regex` on a whole corpus, so ``native`` refuses
    a custom pattern (for counting and encoding alike) and ``auto`` picks python, saying so."""
    pre = get_pretokenizer(f"custom:{pattern}")
    assert not native_engine.splits_exactly(pre)
    path = sample_texts / "tinystories_sample.txt"
    with pytest.raises(ConfigError, match="splits only the built-in patterns"):
        native.count(path, pre, [])
    with pytest.raises(ConfigError, match="splits only the built-in patterns"):
        native.encoder({bytes([b]): b for b in range(256)}, [], pre)
    with pytest.raises(ConfigError, match="use engine=python"):
        get_engine("native", [pre])
    with caplog.at_level("INFO", logger="superbpe"):
        assert get_engine("auto", [pre]).name == "python"
    assert "no exact splitter" in caplog.text
    assert get_engine("auto", [get_pretokenizer("gpt2")]).name == "native"


def test_unicode_tables_match_installed_regex() -> None:
    """The scanners' classes were generated from `regex`; an upgrade that changes Unicode data fails here."""
    table = native_engine._native.char_classes()
    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    expected = bytearray(0x110000)
    classes = [r"\p{Lu}", r"\p{Ll}", r"\p{Lt}", r"\p{Lm}", r"\p{Lo}", r"\p{M}", r"\p{N}", r"\s"]
    for code, pattern in enumerate(classes):
        for match in regex.finditer(pattern, text):
            expected[ord(match.group())] = code + 1
    assert table == bytes(expected)


# -- counting ---------------------------------------------------------------------------------------------


def assert_same_counts(a: PieceCounts, b: PieceCounts) -> None:
    assert a.meta == b.meta
    assert len(a) == len(b)
    assert a.total() == b.total()
    assert a.to_dict() == b.to_dict()


@pytest.mark.parametrize("name", list(PATTERNS))
def test_counts_match_python_engine(
    name: str, tmp_path: Path, corpora: dict[str, str], native: Native, python: PythonEngine
) -> None:
    path = tmp_path / "corpus.txt"
    text = EOT.join([corpora["multilingual"][:200_000], corpora["wikitext"][:100_000], corpora["corpus.en"]])
    path.write_text(text, encoding="utf-8")
    pre = get_pretokenizer(name)
    expected = python.count(path, pre, [EOT], workers=1)
    for workers, chunk_bytes in [(1, 1 << 22), (2, 4096), (3, 97)]:
        got = native.count(path, pre, [EOT], workers=workers, chunk_bytes=chunk_bytes)
        assert_same_counts(got, expected)


@pytest.mark.parametrize("name", ["gpt2", "o200k", "superbpe", "superbpe-paper", r"custom:\s+\S|[a-z]+"])
def test_counts_do_not_depend_on_file_block_size(
    name: str, tmp_path: Path, corpora: dict[str, str], python: PythonEngine
) -> None:
    """Plain files are counted in blocks: tiny blocks (documents far longer than a block, special tokens
    and multi-byte characters across block edges) give exactly the counts of the python engine."""
    lib = native_engine._require_native()
    long_doc = "x" + "long doc without newline " * 40
    docs = [corpora["multilingual"][:3000], long_doc, "", corpora["corpus.en"][:2000]]
    text = (EOT + "\n").join(docs) + EOT + " \n\n trailing ÿ\u4e2d\U0001f600 no newline"
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    pre = get_pretokenizer(name)
    expected = python.count(path, pre, [EOT, EOT + "\n"], workers=1).to_dict()
    for workers, block in [(1, 1), (2, 7), (1, 64), (2, 1000), (1, 1 << 26)]:
        counter = lib.Counter(pre.pattern, pre.line_units, [EOT.encode(), (EOT + "\n").encode()], 50, workers)
        counter.count_file(str(path), False, block)
        assert counter.take().to_dict() == expected, (workers, block)


def test_invalid_utf8_offset_with_tiny_blocks(tmp_path: Path) -> None:
    lib = native_engine._require_native()
    path = tmp_path / "bad.txt"
    good = "a\U0001f600b\n<|e|>\u4e2d\n".encode() * 5
    path.write_bytes(good + b"ok \xe4\xb8 x\n")
    for block in (1, 2, 3, 5, 1 << 20):
        counter = lib.Counter(PATTERNS["gpt2"], False, [b"<|e|>"], 8, 1)
        with pytest.raises(lib.InvalidUtf8) as err:
            counter.count_file(str(path), False, block)
        assert err.value.args[0] == len(good) + 3, block


def test_counts_of_jsonl_gzip_and_directories(
    tmp_path: Path, corpora: dict[str, str], native: Native, python: PythonEngine
) -> None:
    docs = [corpora["german.txt"], "x" + EOT + "y", corpora["address.txt"], "", "end"]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"body": d}) for d in docs) + "\n\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write(corpora["tinystories_sample.txt"])
    with gzip.open(tmp_path / "c.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write(json.dumps({"body": corpora["corpus.en"][:5000]}) + "\n")
    (tmp_path / "d.txt").write_text(corpora["corpus.en"][5000:9000])
    for name in ("gpt2", "superbpe"):
        pre = get_pretokenizer(name)
        expected = python.count(tmp_path, pre, [EOT], text_field="body")
        assert_same_counts(native.count(tmp_path, pre, [EOT], text_field="body"), expected)


def test_longest_special_token_wins(tmp_path: Path, native: Native, python: PythonEngine) -> None:
    path = tmp_path / "s.txt"
    path.write_text("a<s>b<s><t>c<s><t>d<t>e<s><t<s>")
    pre = get_pretokenizer("gpt2")
    specials = ["<s>", "<s><t>", "<t>"]
    assert_same_counts(native.count(path, pre, specials), python.count(path, pre, specials))


def test_invalid_utf8_is_reported_like_the_python_engine(
    tmp_path: Path, native: Native, python: PythonEngine
) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine text\n" * 50 + b"caf\xc3 bad \xff\xfe end\n" + b"more\n")
    pre = get_pretokenizer("gpt2")
    with pytest.raises(InputError) as theirs:
        python.count(path, pre, [])
    with pytest.raises(InputError) as ours:
        native.count(path, pre, [])
    assert str(ours.value) == str(theirs.value) == f"{path}: invalid UTF-8 at byte 503; {REPLACE_HINT}"
    replaced = native.count(path, pre, [], errors="replace")
    assert_same_counts(replaced, python.count(path, pre, [], errors="replace"))
    assert "\ufffd".encode() in replaced and " \ufffd\ufffd".encode() in replaced


def test_counts_file_is_byte_identical_and_loads(
    tmp_path: Path, native: Native, python: PythonEngine, sample_texts: Path
) -> None:
    pre = get_pretokenizer("o200k")
    ours = native.count(sample_texts / "corpus.en", pre, [EOT])
    theirs = python.count(sample_texts / "corpus.en", pre, [EOT])
    ours.save(tmp_path / "ours.counts")
    theirs.save(tmp_path / "theirs.counts")
    assert (tmp_path / "ours.counts").read_bytes() == (tmp_path / "theirs.counts").read_bytes()
    loaded = native_engine.load_counts(tmp_path / "theirs.counts")
    assert_same_counts(loaded, theirs)
    assert_same_counts(PieceCounts.load(tmp_path / "ours.counts"), theirs)
    assert_same_counts(pickle.loads(pickle.dumps(ours)), theirs)
    (tmp_path / "broken.counts").write_bytes((tmp_path / "ours.counts").read_bytes()[:-3])
    with pytest.raises(InputError, match="not a valid piece-counts file"):
        native_engine.load_counts(tmp_path / "broken.counts")


def test_native_counts_materialise_and_update(native: Native, sample_texts: Path) -> None:
    pre = get_pretokenizer("gpt2")
    a = native.count(sample_texts / "german.txt", pre, [])
    b = native.count(sample_texts / "address.txt", pre, [])
    expected = a.to_dict()
    for piece, n in b.to_dict().items():
        expected[piece] = expected.get(piece, 0) + n
    # Fresh counts are only listed until a lookup or a merge indexes them; both read the same.
    assert all(b.native().get(piece) == n for piece, n in b.to_dict().items())
    assert b.native().get(b"\x00 not counted") == 0
    a.update(b)
    assert a.to_dict() == expected
    assert a.total() == sum(expected.values())


# -- training ---------------------------------------------------------------------------------------------


def test_reference_merges_and_vocab(native: Native, shared_data: Path) -> None:
    counts = native.count(shared_data / "corpus.en", get_pretokenizer("gpt2"), [EOT])
    result = native.train(counts, 500 - 256 - 1)
    assert result.merges == read_reference_merges(shared_data / "train-bpe-reference-merges.txt")
    reference_vocab = json.loads((shared_data / "train-bpe-reference-vocab.json").read_text(encoding="utf-8"))
    table = gpt2_unicode_to_bytes()
    expected_tokens = {bytes(table[c] for c in token) for token in reference_vocab}
    expected_tokens = {t for t in expected_tokens if t != EOT.encode()} | {EOT.encode()}
    assert set(build_vocab(result.merges, [EOT]).values()) == expected_tokens


RULES = [
    MergeRules(),
    MergeRules(min_frequency=3),
    MergeRules(max_token_bytes=5),
    MergeRules(max_words_per_token=1),
    MergeRules(max_words_per_token=2, forbidden_substrings=(b". ", b"\n", b"th")),
]


@pytest.mark.parametrize("rules", RULES, ids=[str(i) for i in range(len(RULES))])
def test_merges_match_python_engine(
    rules: MergeRules, corpora: dict[str, str], tmp_path: Path, native: Native,
    python: PythonEngine,
) -> None:  # fmt: skip
    path = tmp_path / "c.txt"
    path.write_text(corpora["wikitext"][:150_000] + EOT + corpora["multilingual"][:50_000])
    counts = python.count(path, get_pretokenizer("gpt2"), [EOT])
    expected = python.train(counts, 800, rules=rules)
    assert native.train(counts, 800, rules=rules).merges == expected.merges
    assert native.train(native.count(path, get_pretokenizer("gpt2"), [EOT]), 800, rules=rules) == expected


def test_superbpe_stage2_with_replay_matches_python_engine(
    corpora: dict[str, str], tmp_path: Path, native: Native, python: PythonEngine
) -> None:
    path = tmp_path / "c.txt"
    path.write_text(corpora["wikitext"][:60_000] + EOT + corpora["tinystories_sample.txt"] * 5)
    stage1 = native.train(native.count(path, get_pretokenizer("superbpe-stage1"), [EOT]), 300).merges
    assert stage1 == python.train(python.count(path, get_pretokenizer("superbpe-stage1"), [EOT]), 300).merges
    rules = MergeRules(max_words_per_token=4)
    for name in ("superbpe", "superbpe-paper"):
        pre = get_pretokenizer(name)
        py_counts = python.count(path, pre, [EOT])
        expected = python.train(py_counts, 600, rules=rules, replay=stage1[:200])
        got = native.train(native.count(path, pre, [EOT]), 600, rules=rules, replay=stage1[:200])
        assert got.merges == expected.merges
        assert any(b" " in left + right.strip() for left, right in got.merges[200:]), "no superword formed"


def test_replay_keeps_ids_of_pairs_that_never_occur(native: Native, python: PythonEngine) -> None:
    counts = PieceCounts({b"hello": 5, b"help": 3, b"zz": 1})
    replay = [(b"q", b"q"), (b"h", b"e"), (b"qq", b"q")]
    expected = python.train(counts, 6, replay=replay)
    got = native.train(counts, 6, replay=replay)
    assert got == expected
    assert got.merges[:3] == replay


@pytest.mark.parametrize(
    ("replay", "message"),
    [
        ([(b"ab", b"c")], "is not a token yet"),
        ([(b"a", b"b"), (b"a", b"b")], "already exists"),
        ([(b"a",)], "is not a pair of bytes"),
    ],
)
def test_bad_replay_errors_match(
    replay: list[Merge], message: str, native: Native, python: PythonEngine
) -> None:
    counts = PieceCounts({b"abc": 2})
    with pytest.raises(SuperBPEError, match=message) as theirs:
        python.train(counts, 5, replay=replay)
    with pytest.raises(SuperBPEError) as ours:
        native.train(counts, 5, replay=replay)
    assert str(ours.value) == str(theirs.value)


def test_bad_train_arguments(native: Native) -> None:
    counts = PieceCounts({b"ab": 1})
    with pytest.raises(ConfigError, match="num_merges"):
        native.train(counts, -1)
    with pytest.raises(ConfigError, match="callback_every"):
        native.train(counts, 3, callback_every=0)
    with pytest.raises(SuperBPEError, match="negative count"):
        native.train(PieceCounts({b"ab": -1}), 3)


def test_callback_stops_and_resume_is_exact(native: Native, sample_texts: Path) -> None:
    counts = native.count(sample_texts / "corpus.en", get_pretokenizer("gpt2"), [EOT])
    full = native.train(counts, 400)
    seen: list[int] = []

    def stop_at_150(merges: Sequence[Merge]) -> bool:
        seen.append(len(merges))
        return len(merges) >= 150

    first = native.train(counts, 400, callback=stop_at_150, callback_every=50)
    assert first.stopped and seen == [50, 100, 150]
    assert first.merges == full.merges[:150]
    rest = native.train(counts, 400, replay=first.merges)
    assert rest.merges == full.merges and not rest.stopped


def test_callback_errors_propagate(native: Native) -> None:
    def boom(merges: Sequence[Merge]) -> bool:
        raise KeyError("from callback")

    with pytest.raises(KeyError, match="from callback"):
        native.train(PieceCounts({b"abcdef": 3}), 5, callback=boom, callback_every=1)


def test_panic_becomes_python_exception() -> None:
    with pytest.raises(RuntimeError, match="native engine panicked: deliberate test panic"):
        native_engine._native._panic_for_test()


# -- encoding ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_files(shared_data: Path) -> tuple[dict[int, bytes], list[Merge]]:
    vocab = read_vocab(shared_data / "gpt2_vocab.json")
    return vocab, read_merges(shared_data / "gpt2_merges.txt", vocab)


@pytest.fixture(scope="module")
def gpt2_native(gpt2_files: tuple[dict[int, bytes], list[Merge]]) -> native_engine.NativeEncoder:
    vocab, merges = gpt2_files
    ids = {token: i for i, token in vocab.items() if i < 50256}
    return native_engine.NativeEngine().encoder(ids, merges, get_pretokenizer("gpt2"))


@pytest.fixture(scope="module")
def gpt2_tiktoken(gpt2_files: tuple[dict[int, bytes], list[Merge]]) -> tiktoken.Encoding:
    vocab, _ = gpt2_files
    ranks = {token: i for i, token in vocab.items() if i < 50256}
    return tiktoken.Encoding("gpt2-local", pat_str=PATTERNS["gpt2"], mergeable_ranks=ranks, special_tokens={})


def test_gpt2_ids_match_tiktoken(
    gpt2_native: native_engine.NativeEncoder, gpt2_tiktoken: tiktoken.Encoding, corpora: dict[str, str]
) -> None:
    for name, text in corpora.items():
        assert gpt2_native.encode_ordinary(text) == gpt2_tiktoken.encode_ordinary(text), name
    long_piece = "a" * 3000 + "b" * 999 + "ab" * 700
    assert gpt2_native.encode_ordinary(long_piece) == gpt2_tiktoken.encode_ordinary(long_piece)


def test_batch_and_array_encoding(
    gpt2_native: native_engine.NativeEncoder,
    gpt2_tiktoken: tiktoken.Encoding,
    corpora: dict[str, str],
    gpt2_files: tuple[dict[int, bytes], list[Merge]],
) -> None:
    texts = [corpora["german.txt"], "", corpora["address.txt"], corpora["wikitext"][:20_000]]
    expected = [gpt2_tiktoken.encode_ordinary(t) for t in texts]
    for dtype in ("uint16", "uint32"):
        ids, ends = gpt2_native.encode_batch(texts, dtype)
        assert ids.dtype == np.dtype(dtype) and ends.dtype == np.uint64
        assert ends.tolist() == np.cumsum([len(e) for e in expected]).tolist()
        assert ids.tolist() == [i for e in expected for i in e]
    vocab = {token: i for i, token in gpt2_files[0].items() if i < 50256}
    for workers in (1, 2):  # one thread encodes the batch as one part, handed on as it is
        encoder = native_engine.NativeEncoder(vocab, gpt2_files[1], get_pretokenizer("gpt2"), workers=workers)
        for dtype in ("uint32", "uint16"):
            ids, ends = encoder.encode_batch(texts, dtype)
            assert ids.dtype == np.dtype(dtype) and ids.tolist() == [i for e in expected for i in e]
            assert ends.tolist() == np.cumsum([len(e) for e in expected]).tolist()
    text = corpora["wikitext"]
    for dtype in ("uint16", "uint32"):  # many chunks, joined by the pool's threads in either width
        array = gpt2_native.encode_array(text, dtype, chunk_bytes=4096)
        assert array.dtype == np.dtype(dtype) and array.tolist() == gpt2_tiktoken.encode_ordinary(text)
    with pytest.raises(ConfigError, match="dtype"):
        gpt2_native.encode_batch(texts, "int8")


def test_per_document_arrays_match_tiktoken(
    gpt2_native: native_engine.NativeEncoder, gpt2_tiktoken: tiktoken.Encoding, corpora: dict[str, str]
) -> None:
    """``encode_ordinary_array`` per document (lines of every corpus, twice: cold and cached pieces)
    gives tiktoken's ids in both dtypes, as ``encode_ordinary`` does."""
    documents = [line for text in corpora.values() for line in text[:60_000].splitlines(keepends=True)]
    documents += ["", "x", " " * 40, "a" * 3000 + "b" * 999]
    for dtype in ("uint16", "uint32", "uint16"):
        for text in documents:
            array = gpt2_native.encode_ordinary_array(text, dtype)
            assert array.dtype == np.dtype(dtype)
            assert array.tolist() == gpt2_tiktoken.encode_ordinary(text), repr(text[:80])
    with pytest.raises(InputError, match="unpaired surrogate"):
        gpt2_native.encode_ordinary_array("ok \ud800 no", "uint16")
    wide = native_engine.NativeEncoder({bytes([b]): b for b in range(256)} | {b"ab": 70_000}, [(b"a", b"b")],
                                       get_pretokenizer("gpt2"))
    assert wide.encode_ordinary_array("abc", "uint32").tolist() == [70_000, ord("c")]
    with pytest.raises(ValueError, match="id 70000 does not fit in uint16"):
        wide.encode_ordinary_array("abc", "uint16")
    with pytest.raises(ValueError, match="id 70000 does not fit in uint16"):  # a joined batch, too
        wide.encode_batch(["xyz", "abc"] * 200, "uint16")


def test_native_encoder_refuses_a_merge_whose_part_is_not_a_token() -> None:
    """NativeEncoder is used directly (benchmarks do): built with such a merge, it never applied it, where
    the python encoder, starting from bytes, does (the Tokenizer refuses it before either is made)."""
    pre = get_pretokenizer("gpt2")
    vocab = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"xb": 4, b"abc": 5}
    with pytest.raises(ConfigError, match=r"^merge #1 \(b'x', b'b'\) joins b'x', which is not in the vocab$"):
        native_engine.NativeEncoder(vocab, [(b"a", b"b"), (b"x", b"b")], pre)
    unmade = r"^merge #0 \(b'a', b'bc'\) joins b'bc', which is not in the vocab$"
    with pytest.raises(ConfigError, match=unmade):  # named before the later merge that makes no token
        native_engine.NativeEncoder(vocab, [(b"a", b"bc"), (b"a", b"c")], pre)
    with pytest.raises(ConfigError, match=r"^merge #1 \(b'a', b'c'\) makes a token not in the vocab$"):
        native_engine.NativeEncoder(vocab, [(b"a", b"b"), (b"a", b"c")], pre)
    # The extension's own class (what the wrapper calls) refuses it too, naming the merge and the part.
    core = native_engine._require_native().Encoder
    with pytest.raises(ValueError, match=r'merge #1 \(b"x", b"b"\) joins b"x", which is not in the vocab'):
        core(vocab, [(b"a", b"b"), (b"x", b"b")], pre.pattern, pre.line_units)
    encoder = native_engine.NativeEncoder(vocab, [(b"a", b"b"), (b"ab", b"c")], pre)
    assert encoder.encode_ordinary("abcab") == [5, 3]


def test_ids_match_python_encoder_for_superbpe_tokenizer(
    corpora: dict[str, str], tmp_path: Path, native: Native, python: PythonEngine
) -> None:
    path = tmp_path / "c.txt"
    path.write_text(corpora["wikitext"][:80_000])
    pre = get_pretokenizer("superbpe")
    merges = native.train(native.count(path, pre, []), 1500).merges
    vocab = {token: i for i, token in build_vocab(merges).items()}
    ours = native.encoder(vocab, merges, pre)
    theirs = python.encoder(vocab, merges, pre)
    for text in corpora.values():
        assert ours.encode_ordinary(text[:50_000]) == theirs.encode_ordinary(text[:50_000])


def test_encoder_errors_match_python(gpt2_native: native_engine.NativeEncoder) -> None:
    with pytest.raises(InputError, match="unpaired surrogate"):
        gpt2_native.encode_ordinary("ok \ud800 no")
    lacking = native_engine.NativeEncoder({b"a": 0}, [], get_pretokenizer("gpt2"))
    assert lacking.encode_ordinary("aa") == [0, 0]
    with pytest.raises(InputError, match="byte 0x62"):
        lacking.encode_ordinary("ab")
