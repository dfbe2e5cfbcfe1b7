"""Tokenizer files: byte table, vocab.json/merges.txt, HF tokenizer.json parity, manifest, errors."""

from __future__ import annotations

import json
import multiprocessing
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import tokenizers
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import superbpe
from superbpe.api.tokenizer import Tokenizer
from superbpe.core.byte_table import byte_to_unicode, bytes_to_token_str, token_str_to_bytes
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.pretokenize import PATTERNS, get_pretokenizer
from superbpe.formats import gpt2 as gpt2_files
from superbpe.formats import hf as hf_files
from superbpe.formats.gpt2 import (
    MERGES_FILE,
    VOCAB_FILE,
    check_merges,
    read_merges,
    read_vocab,
    vocab_from_mapping,
    write_merges,
    write_vocab,
)
from superbpe.formats.hf import (
    HF_CONFIG_FILE,
    HF_FILE,
    HF_SPECIAL_MAP_FILE,
    pretokenizer_from_hf,
    read_hf_tokenizer,
)
from superbpe.formats.hf import _hf_merges as hf_merges
from superbpe.formats.json_files import read_json
from superbpe.formats.manifest import MANIFEST_FILE, read_manifest
from superbpe.formats.tokenizer_dir import save_tokenizer_dir

EOT = "<|endoftext|>"
#: The start of the warning a tokenizer gives when its pattern splits one of its last merges.
SPLIT_MERGE_WARNING = "merge .* makes a token that pretokenizer"
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
Merge = tuple[bytes, bytes]


@pytest.fixture(scope="module")
def gpt2(shared_data: Path) -> Tokenizer:
    return Tokenizer.from_files(shared_data / "gpt2_vocab.json", shared_data / "gpt2_merges.txt", [EOT],
                                engine="python")


@pytest.fixture(scope="module")
def superword(sample_texts: Path) -> Tokenizer:
    """A SuperBPE-pattern tokenizer (line units on) trained so that it has multi-word tokens."""
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 900, [EOT], pretokenizer="superbpe",
                                       max_words_per_token=4, forbidden_substrings=[": "], engine="python")
    return Tokenizer(vocab, merges, [EOT], pretokenizer="superbpe", engine="python")


def hf_from(tok: Tokenizer, directory: Path) -> tokenizers.Tokenizer:
    tok.save(directory)
    return tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))


def corpus_samples(sample_texts: Path, multilingual_text: str, wikitext_text: str) -> list[str]:
    small = [(sample_texts / name).read_text(encoding="utf-8")
             for name in ("tinystories_sample.txt", "address.txt", "german.txt", "corpus.en")]
    return [*small, multilingual_text[:100_000], wikitext_text[:150_000]]


# -- byte table ------------------------------------------------------------------------------------------


def test_byte_table_matches_gpt2_layout(shared_data: Path) -> None:
    table = byte_to_unicode()
    assert len(set(table)) == 256
    assert all(char.isprintable() and not char.isspace() for char in table)
    assert [table[byte] for byte in b" \na\x00"] == ["\u0120", "\u010a", "a", "\u0100"]
    gpt2_vocab = json.loads((shared_data / "gpt2_vocab.json").read_text(encoding="utf-8"))
    single = sorted((token_id, text) for text, token_id in gpt2_vocab.items() if token_id < 256)
    # GPT-2 numbers its byte tokens in table order: the 188 printable bytes first, then the shifted ones.
    printable_first = sorted(range(256), key=lambda byte: (ord(table[byte]) >= 256, byte))
    assert [text for _, text in single] == [table[byte] for byte in printable_first]


@given(st.binary(max_size=40))
def test_token_strings_round_trip(data: bytes) -> None:
    text = bytes_to_token_str(data)
    assert len(text) == len(data)
    assert token_str_to_bytes(text) == data


@pytest.mark.parametrize("text", ["a b", "\u4e2d", "tab\there"])
def test_characters_outside_the_table_are_rejected(text: str) -> None:
    with pytest.raises(KeyError):
        token_str_to_bytes(text)


# -- vocab.json and merges.txt -----------------------------------------------------------------------------


def test_gpt2_files_round_trip_byte_for_byte(shared_data: Path, tmp_path: Path) -> None:
    vocab = read_vocab(shared_data / "gpt2_vocab.json")
    merges = read_merges(shared_data / "gpt2_merges.txt", vocab)
    assert len(vocab) == 50257 and len(merges) == 50000
    assert merges[0] == (b" ", b"t")
    write_merges(tmp_path / "merges.txt", merges)
    written = (tmp_path / "merges.txt").read_text(encoding="utf-8")
    assert written.startswith("#version: 0.2\n")
    original = (shared_data / "gpt2_merges.txt").read_text(encoding="utf-8")
    assert written.splitlines()[1:] == original.splitlines()
    write_vocab(tmp_path / "vocab.json", vocab)
    assert json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8")) == json.loads(
        (shared_data / "gpt2_vocab.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("header", [True, False])
def test_merges_read_with_or_without_header(tmp_path: Path, header: bool) -> None:
    vocab = {i: bytes([i]) for i in range(256)} | {256: b" \n", 257: b"\xff\xfe", 258: b" \n\xff\xfe"}
    merges = [(b" ", b"\n"), (b"\xff", b"\xfe"), (b" \n", b"\xff\xfe")]
    write_vocab(tmp_path / "vocab.json", vocab)
    write_merges(tmp_path / "merges.txt", merges)
    if not header:
        lines = (tmp_path / "merges.txt").read_text(encoding="utf-8").splitlines()
        (tmp_path / "merges.txt").write_text("\n".join(lines[1:]), encoding="utf-8")  # no trailing newline
    assert read_vocab(tmp_path / "vocab.json") == vocab
    assert read_merges(tmp_path / "merges.txt", vocab) == merges


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a b c\n", "line 1: expected two tokens"),
        ("#version: 0.2\na\n", "line 2: expected two tokens"),
        ("a  b\n", "expected two tokens"),
        ("a \u4e2d\n", "outside the byte table"),
        ("a q\n", "merge part 'q' is not in the vocab"),
        ("a b\n", "merged token 'ab' is not in the vocab"),
    ],
)
def test_malformed_merges(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "merges.txt"
    path.write_text(content, encoding="utf-8")
    vocab = {0: b"a", 1: b"b", 2: b"c"}
    with pytest.raises(InputError, match=message) as caught:
        read_merges(path, vocab)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"a": 0,', "malformed JSON"),
        ('["a"]', "expected a JSON object"),
        ('{"a": "0"}', "non-negative integer"),
        ('{"a": -1}', "non-negative integer"),
        ('{"a": 0, "b": 0}', "duplicate id 0"),
        ('{"a": 0, "a": 1}', "duplicate key 'a'"),
        ('{"a b": 0}', "outside the byte table"),
    ],
)
def test_malformed_vocab(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "vocab.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match=message) as caught:
        read_vocab(path)
    assert str(path) in str(caught.value)


def test_duplicate_token_via_verbatim_special(tmp_path: Path) -> None:
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps({"<s>": 0, "<s> ": 1, "<s>\u0120": 2}), encoding="utf-8")
    with pytest.raises(InputError, match="duplicate token"):
        read_vocab(path, special_tokens=["<s> "])


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="file not found"):
        read_vocab(tmp_path / "nope.json")
    with pytest.raises(InputError, match="file not found"):
        read_merges(tmp_path / "nope.txt")
    with pytest.raises(InputError, match="is a directory"):
        read_hf_tokenizer(tmp_path)
    (tmp_path / "latin1.txt").write_bytes(b"a \xe9\n")
    with pytest.raises(InputError, match="invalid UTF-8"):
        read_merges(tmp_path / "latin1.txt")
    with pytest.raises(InputError, match="file not found"):
        Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt")


# Token strings from a few table characters and a few that are not (space, tab, soft hyphen, CJK), so
# that random files are sometimes refused.
_TOKEN_TEXT = st.text(alphabet=st.sampled_from([*"abĠĊé!", " ", "\t", "\u00ad", "\u4e2d"]), max_size=3)


def _read_with_and_without_native(read: Callable[[], object]) -> list[tuple[str, object]]:
    """``read()`` with the extension's decoding and with Python's alone: the result, or the error."""
    results: list[tuple[str, object]] = []
    for native in (gpt2_files._native, None):
        with mock.patch.object(gpt2_files, "_native", native), mock.patch.object(hf_files, "_native", native):
            try:
                results.append(("read", read()))
            except InputError as exc:
                results.append(("error", str(exc)))
    return results


needs_native = pytest.mark.skipif(gpt2_files._native is None, reason="the extension is not built")


@needs_native
@SETTINGS
@example(entries=[(" ", 0), ("Ġ", 1)], specials=[" "], from_hf=True)  # one token verbatim, one in the table
@given(
    entries=st.lists(st.tuples(_TOKEN_TEXT, st.one_of(st.integers(-1, 12), st.just("3"), st.booleans())),
                     max_size=8),
    specials=st.lists(_TOKEN_TEXT, max_size=2),
    from_hf=st.booleans(),
)
def test_vocab_read_alike_with_and_without_the_extension(
    tmp_path_factory: pytest.TempPathFactory,
    entries: list[tuple[str, object]],
    specials: list[str],
    from_hf: bool,
) -> None:
    mapping = dict(entries)
    path = tmp_path_factory.mktemp("vocab") / "vocab.json"
    path.write_text(json.dumps(mapping), encoding="utf-8")
    # tokenizer.json marks its added tokens (written verbatim) by id.
    verbatim = {text: mapping[text] for text in specials if text in mapping} if from_hf else None
    first, second = _read_with_and_without_native(
        lambda: vocab_from_mapping(path, read_json(path), specials, verbatim))
    assert first == second


@needs_native
@SETTINGS
@example(document='{"a": 0, "a": 1}', specials=[])
@example(document='{"\\u0120the": 1, "\\ud83d\\ude00": 2, "\\/": 3}', specials=[])
@given(
    document=st.one_of(
        st.builds(
            lambda entries, ascii_only, indent: json.dumps(dict(entries), ensure_ascii=ascii_only,
                                                           indent=indent),
            st.lists(st.tuples(st.one_of(_TOKEN_TEXT, st.text(max_size=3)),
                               st.one_of(st.integers(-1, 10**19), st.floats(0, 9), st.just(None))),
                     max_size=6),
            st.booleans(),
            st.sampled_from([None, 0, 2]),
        ),
        st.text(alphabet=st.sampled_from([*'{}[]":, 0129aĠ\\u-.e\n']), max_size=20),
    ),
    specials=st.lists(_TOKEN_TEXT, max_size=1),
)
def test_vocab_json_parsed_alike_with_and_without_the_extension(
    tmp_path_factory: pytest.TempPathFactory, document: str, specials: list[str]
) -> None:
    """The extension parses ``vocab.json`` itself: any text, well formed or not, reads as Python's
    ``json`` reads it, or fails with the same error."""
    path = tmp_path_factory.mktemp("vocab") / "vocab.json"
    path.write_text(document, encoding="utf-8")
    first, second = _read_with_and_without_native(lambda: read_vocab(path, specials))
    assert first == second


def _with_flaw(items: list[Any], flaw: object, data: st.DataObject) -> list[Any]:
    """``items`` with ``flaw``, when there is one, inserted at a drawn place."""
    if flaw is not None:
        items.insert(data.draw(st.integers(0, len(items))), flaw)
    return items


_TABLE_TOKEN = st.text(alphabet=st.sampled_from([*"abĠĊé!"]), min_size=1, max_size=3)


@needs_native
@SETTINGS
@given(
    pairs=st.lists(st.tuples(_TABLE_TOKEN, _TABLE_TOKEN), max_size=6),
    header=st.booleans(),
    ending=st.sampled_from(["\n", "\r\n", "\n\n"]),
    flaw=st.sampled_from([None, "a", "a  b", "a b c", " a", "a \u4e2d", "a\tb c", "#version: 0.2"]),
    data=st.data(),
)
def test_merges_read_alike_with_and_without_the_extension(
    tmp_path_factory: pytest.TempPathFactory,
    pairs: list[tuple[str, str]],
    header: bool,
    ending: str,
    flaw: str | None,
    data: st.DataObject,
) -> None:
    # One malformed line, or a header that is not on the first line.
    lines = _with_flaw([f"{left} {right}" for left, right in pairs], flaw, data)
    text = "#version: 0.2" * header + ending + ending.join(lines)
    path = tmp_path_factory.mktemp("merges") / "merges.txt"
    path.write_text(text, encoding="utf-8", newline="")
    # A vocab of every part and every token a merge makes, or of some of them, or none to check against.
    made = {token_str_to_bytes(text) for left, right in pairs for text in (left, right, left + right)}
    kept = data.draw(st.sets(st.sampled_from(sorted(made)))) if made else set()
    vocab = data.draw(st.sampled_from([None, dict(enumerate(sorted(made))), dict(enumerate(sorted(kept)))]))
    first, second = _read_with_and_without_native(lambda: read_merges(path, vocab))
    assert first == second


@needs_native
@SETTINGS
@given(
    pairs=st.lists(st.tuples(_TABLE_TOKEN, _TABLE_TOKEN), max_size=6),
    as_lists=st.booleans(),
    flaw=st.sampled_from([None, "", "a", "a  b", "a b c", "#version: 0.2", "a\nb c", "a b\r", ["a"],
                          ["a", ""], ["a", "b", "c"], ["a", 1], 3, ["a b", "c"], ["a", "\u4e2d"]]),
    data=st.data(),
)
def test_tokenizer_json_merges_read_alike_with_and_without_the_extension(
    tmp_path_factory: pytest.TempPathFactory,
    pairs: list[tuple[str, str]],
    as_lists: bool,
    flaw: object,
    data: st.DataObject,
) -> None:
    items = [[left, right] if as_lists else f"{left} {right}" for left, right in pairs]
    items = _with_flaw(items, flaw, data)
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    made = {token_str_to_bytes(text) for left, right in pairs for text in (left, right, left + right)}
    vocab = dict(enumerate(sorted(made)))

    def read() -> object:
        merges, where = hf_merges(path, items)
        check_merges(path, merges, vocab, where)
        return merges

    first, second = _read_with_and_without_native(read)
    assert first == second


@needs_native
@SETTINGS
@example(tokens=["", "a", "b", "ab"], pairs=[("a", "b")], order=[2, 0, 3, 1], specials=None)  # an empty token
@example(tokens=["ab", "a", "b", "é", "aé", "<s>"], pairs=[("a", "b")], order=[5, 4, 3, 2, 1, 0],
         specials=None)
@example(tokens=["a", "b", "ab", "<s> "], pairs=[("a", "b")], order=[0, 1, 2, 3], specials=["<s> "])
@example(tokens=["a", "b", "ab"], pairs=[("a", "b")], order=list(range(10)), specials=["ab"])  # merged
@given(
    tokens=st.lists(_TABLE_TOKEN, min_size=1, max_size=10, unique=True),
    pairs=st.lists(st.tuples(_TABLE_TOKEN, _TABLE_TOKEN), max_size=6),
    order=st.permutations(range(10)),
    specials=st.one_of(st.none(), st.lists(st.sampled_from(["a", "<s>", "ab"]), max_size=2, unique=True)),
)
def test_gpt2_files_load_alike_with_and_without_the_extension(
    tmp_path_factory: pytest.TempPathFactory,
    tokens: list[str],
    pairs: list[tuple[str, str]],
    order: list[int],
    specials: list[str] | None,
) -> None:
    """``Tokenizer.from_files`` takes files the extension found valid without checking them again, and
    finds the unmade tokens (the special tokens) with it: the same tokenizer as Python's reading, or the
    same error. Ids come in a shuffled file order, some tokens are not UTF-8 (``é`` is byte 0xE9), and
    some merges make a token outside the vocab."""
    ids = [i for i in order if i < len(tokens)]
    directory = tmp_path_factory.mktemp("gpt2")
    vocab = {text: token_id for token_id, text in zip(ids, tokens, strict=True)}
    (directory / VOCAB_FILE).write_text(json.dumps(vocab), encoding="utf-8")
    lines = "".join(f"{left} {right}\n" for left, right in pairs)
    (directory / MERGES_FILE).write_text(lines, encoding="utf-8")

    def load() -> object:
        try:
            tok = Tokenizer.from_files(directory / VOCAB_FILE, directory / MERGES_FILE, specials)
        except ConfigError as exc:
            return str(exc)
        # A special token's text encodes as ordinary text the same way too: it becomes its own id only
        # when a merge makes it (the extension's reading knows which tokens no merge makes).
        return tok.vocab, tok.merges, tok.special_tokens, [tok.encode_ordinary(s) for s in tok.special_tokens]

    first, second = _read_with_and_without_native(load)
    assert first == second


@needs_native
@SETTINGS
@example(tokens=["", "a", "b", "ab"], pairs=[("a", "b")], as_lists=False, added=[])  # an empty token
@example(tokens=["a", "b", "ab"], pairs=[("a", "b"), ("b", "a")], as_lists=True, added=["<s>"])
@given(
    tokens=st.lists(_TABLE_TOKEN, min_size=1, max_size=8, unique=True),
    pairs=st.lists(st.tuples(_TABLE_TOKEN, _TABLE_TOKEN), max_size=5),
    as_lists=st.booleans(),
    added=st.lists(st.sampled_from(["<s>", "a", "ab", "é"]), max_size=2, unique=True),
)
def test_tokenizer_json_loads_alike_with_and_without_the_extension(
    tmp_path_factory: pytest.TempPathFactory,
    tokens: list[str],
    pairs: list[tuple[str, str]],
    as_lists: bool,
    added: list[str],
) -> None:
    """A ``tokenizer.json`` alone: the extension checks its merges against the vocab as it decodes them,
    and the tokenizer takes what was read without checking it again; the same tokenizer as Python's
    reading, or the same error. Added tokens may be in the model vocab (verbatim) or not."""
    vocab = {text: token_id for token_id, text in enumerate(tokens)}
    added_tokens = [{"id": vocab.get(text, len(tokens) + i), "content": text, "special": True}
                    for i, text in enumerate(added)]
    merges = [[left, right] if as_lists else f"{left} {right}" for left, right in pairs]
    document = {"added_tokens": added_tokens, "model": {"type": "BPE", "vocab": vocab, "merges": merges}}
    directory = tmp_path_factory.mktemp("hf")
    (directory / HF_FILE).write_text(json.dumps(document), encoding="utf-8")

    def load() -> object:
        try:
            tok = Tokenizer.load(directory)
        except ConfigError as exc:
            return str(exc)
        # A special token's text encodes as ordinary text the same way too: it becomes its own id only
        # when a merge makes it (the extension's reading knows which tokens no merge makes).
        return tok.vocab, tok.merges, tok.special_tokens, [tok.encode_ordinary(s) for s in tok.special_tokens]

    first, second = _read_with_and_without_native(load)
    assert first == second


# Edits of a tokenizer.json's text that the extension must leave to Python (or read as Python does).
_DOCUMENT_EDITS: dict[str, Callable[[str], str]] = {
    "none": lambda text: text,
    "vocab twice": lambda text: text.replace('"vocab": {', '"vocab": {}, "vocab": {', 1),
    "merges twice": lambda text: text.replace('"merges": [', '"merges": [], "merges": [', 1),
    "model twice": lambda text: text[:-1] + ', "model": {"vocab": {}}}',
    "escaped key": lambda text: text.replace('"model"', '"\\u006dodel"', 1),
    "no vocab": lambda text: text.replace('"vocab": {', '"vocab_": {', 1),
    "merges an object": lambda text: text.replace('"merges": [', '"merges": {"x": 1}, "merges_": [', 1),
    "trailing text": lambda text: text + " x",
    "truncated": lambda text: text[:-2],
    "a float id": lambda text: text.replace(": 0,", ": 0.0,", 1),
    "a bool id": lambda text: text.replace(": 0,", ": true,", 1),
    "a dangling comma": lambda text: text.replace('"ignore_merges"', ', "ignore_merges"', 1),
    "model not an object": lambda text: text.replace('"model": {', '"model": [{', 1)[:-1] + "]}",
}


@needs_native
@SETTINGS
@example(tokens=["a", "b", "ab"], pairs=[("a", "b")], as_lists=True, added=["é"], verbatim=[], indent=None,
         ascii=False, edit="none")
@example(tokens=["a", "b", "ab"], pairs=[("a", "b")], as_lists=False, added=["<pad token>", "\u4e2d"],
         verbatim=["<pad token>", "\u4e2d"], indent=1, ascii=True, edit="none")
@example(tokens=["a", "b", "ab"], pairs=[], as_lists=False, added=[], verbatim=["x y"], indent=None,
         ascii=False, edit="none")  # not a special token: refused
@example(tokens=["a", "<padĠtoken>"], pairs=[], as_lists=False, added=["<pad token>"],
         verbatim=["<pad token>"], indent=None, ascii=False, edit="none")  # same bytes twice: refused
@given(
    tokens=st.lists(_TABLE_TOKEN, min_size=1, max_size=8, unique=True),
    pairs=st.lists(st.tuples(_TABLE_TOKEN, _TABLE_TOKEN), max_size=5),
    as_lists=st.booleans(),
    added=st.lists(st.sampled_from(["<s>", "a", "ab", "é", "Ġx", "<pad token>", "\u4e2d"]), max_size=3,
                   unique=True),
    verbatim=st.lists(st.sampled_from(["<pad token>", "\u4e2d", "<s>", "x y"]), max_size=2, unique=True),
    indent=st.sampled_from([None, 1]),
    ascii=st.booleans(),
    edit=st.sampled_from(sorted(_DOCUMENT_EDITS)),
)
def test_tokenizer_json_documents_read_alike_with_and_without_the_extension(
    tmp_path_factory: pytest.TempPathFactory,
    tokens: list[str],
    pairs: list[tuple[str, str]],
    as_lists: bool,
    added: list[str],
    verbatim: list[str],
    indent: int | None,
    ascii: bool,
    edit: str,
) -> None:
    """The extension finds the model's vocab and merges in the document's text and reads them there: the
    same result as Python's reading of the whole document, or the same error, whatever the layout and
    escapes, with keys repeated or misplaced and values malformed. ``verbatim`` strings are in the model's
    vocab as they are (as HF writes special tokens), each a special token or not."""
    vocab = {text: token_id for token_id, text in enumerate([*tokens, *verbatim])}
    added_tokens = [{"id": vocab.get(text, len(vocab) + i), "content": text, "special": True}
                    for i, text in enumerate(added)]
    merges = [[left, right] if as_lists else f"{left} {right}" for left, right in pairs]
    document = {"version": "1.0", "added_tokens": added_tokens, "pre_tokenizer": {"type": "ByteLevel"},
                "model": {"type": "BPE", "vocab": vocab, "merges": merges, "ignore_merges": False}}
    text = _DOCUMENT_EDITS[edit](json.dumps(document, indent=indent, ensure_ascii=ascii))
    path = tmp_path_factory.mktemp("hf") / HF_FILE
    path.write_text(text, encoding="utf-8")
    first, second = _read_with_and_without_native(lambda: read_hf_tokenizer(path))
    assert first == second


@needs_native
def test_the_extension_reads_the_model_of_a_saved_tokenizer_json(tmp_path: Path) -> None:
    """The fast path is taken for the files we write (the alike tests above would pass without it), special
    tokens outside the byte table (``<pad token>``, with its space) included."""
    _hand_made("gpt2").save(tmp_path)
    path = tmp_path / HF_FILE
    read = hf_files._model_read_natively(path, path.read_text(encoding="utf-8"))
    assert read is not None
    document, vocab, merges = read
    assert document["model"]["vocab"] == {} and document["model"]["merges"] == []
    with mock.patch.object(hf_files, "_native", None):
        python = read_hf_tokenizer(path)
    assert (vocab, merges) == (python.vocab, python.merges)


@needs_native
def test_the_extension_makes_merges_of_the_vocabs_own_tokens(tmp_path: Path) -> None:
    """Merges read by the extension hold the vocab's token objects, not a copy of each part: the released
    200K vocab's 400K merge parts would otherwise be as many more ``bytes`` objects."""
    _hand_made("gpt2").save(tmp_path)
    path = tmp_path / HF_FILE
    read = hf_files._model_read_natively(path, path.read_text(encoding="utf-8"))
    assert read is not None
    files = gpt2_files.read_gpt2_files(tmp_path / VOCAB_FILE, tmp_path / MERGES_FILE)
    assert files.valid
    for vocab, merges in [(read[1], read[2]), (files.vocab, files.merges)]:
        objects = {id(token) for token in vocab.values()}
        assert merges and all(id(left) in objects and id(right) in objects for left, right in merges)


def _vocab_size_of(directory: str) -> int:
    return Tokenizer.load(directory).vocab_size


@needs_native
@pytest.mark.filterwarnings(f"ignore:{SPLIT_MERGE_WARNING}")
def test_a_tokenizer_json_loads_in_a_forked_worker(tmp_path: Path) -> None:
    """Encoding jobs fork their workers from a process whose thread pool runs (rayon's, started by a batch
    encode): a worker loading a tokenizer must not wait on that pool, which the fork did not copy."""
    _hand_made("gpt2").save(tmp_path)
    directory = tmp_path / "json_only"
    directory.mkdir()
    (tmp_path / HF_FILE).rename(directory / HF_FILE)
    path = directory / HF_FILE  # read by the extension (its merges on a thread of their own), not by Python
    assert hf_files._model_read_natively(path, path.read_text(encoding="utf-8")) is not None
    loaded = Tokenizer.load(directory, engine="native")
    loaded.encode_batch(["the pool starts here"] * 256, threads=2)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(_vocab_size_of, (str(directory),)).get(timeout=120) == loaded.vocab_size


@pytest.mark.parametrize("engine", ["python", pytest.param("native", marks=needs_native)])
def test_a_merge_making_a_token_not_in_the_vocab_is_named(engine: str) -> None:
    # Runs of x doubled up to 32 bytes: tokens past 15 bytes take the encoder's other table.
    runs = [b"x" * 2**k for k in range(6)]
    vocab = {i: bytes([i]) for i in range(256)} | dict(enumerate(runs[1:], start=256)) | {300: b"ab"}
    merges = [(run, run) for run in runs[:-1]] + [(b"a", b"b"), (b"b", b"c")]
    with pytest.raises(ConfigError, match=r"^merge #6 \(b'b', b'c'\) makes a token not in the vocab$"):
        Tokenizer(vocab, merges, engine=engine)
    assert Tokenizer(vocab, merges[:-1], engine=engine).encode("x" * 48 + "ab") == [260, 259, 300]


def test_tokenizer_copies_a_vocab_and_merges_of_other_byte_types() -> None:
    """Whole-list checks let plain bytes through as they are; anything else is copied to bytes."""
    vocab = {0: bytearray(b"a"), 1: b"b", 2: b"ab"}
    tok = Tokenizer(vocab, [(bytearray(b"a"), b"b")], engine="python")
    assert tok.vocab == {0: b"a", 1: b"b", 2: b"ab"}
    assert all(type(token) is bytes for token in tok.vocab.values())
    assert tok.merges == [(b"a", b"b")] and type(tok.merges[0][0]) is bytes
    assert tok.encode("ab") == [2]
    with pytest.raises(ConfigError, match=r"token b'a' is in the vocab twice \(ids 0 and 3\)"):
        Tokenizer({0: b"a", 1: b"b", 3: b"a"}, [], engine="python")
    with pytest.raises(ConfigError, match="non-negative integers, got True"):
        Tokenizer({True: b"a"}, [], engine="python")


# -- tokenizer.json ------------------------------------------------------------------------------------------


def test_hf_loads_gpt2_export_and_encodes_identically(tmp_path: Path, gpt2: Tokenizer, sample_texts: Path,
                                                      multilingual_text: str, wikitext_text: str) -> None:
    hf = hf_from(gpt2, tmp_path)
    assert hf.get_vocab_size() == gpt2.vocab_size
    for text in corpus_samples(sample_texts, multilingual_text, wikitext_text[:100_000]):
        text = text[:60_000] + EOT + text[-2000:]
        encoded = hf.encode(text)
        assert encoded.ids == gpt2.encode(text)
        assert hf.decode(encoded.ids, skip_special_tokens=False) == text


def test_hf_matches_superword_tokenizer(tmp_path: Path, superword: Tokenizer, sample_texts: Path,
                                        multilingual_text: str, wikitext_text: str) -> None:
    multi_word = [t for t in superword.vocab.values() if b" " in t.strip(b" ")]
    assert len(multi_word) > 20  # superword tokens really exist
    hf = hf_from(superword, tmp_path)
    document = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    first = document["pre_tokenizer"]["pretokenizers"][0]
    assert (first["pattern"], first["behavior"]) == ({"String": "\n"}, "MergedWithPrevious")
    for text in corpus_samples(sample_texts, multilingual_text, wikitext_text):
        sample = text[:80_000] + EOT + "tail of: the text\n"
        ids = superword.encode(sample)
        assert hf.encode(sample).ids == ids
        assert superword.decode(ids) == sample
    assert any(superword.id_to_token(i) in multi_word for i in superword.encode(sample_texts.joinpath(
        "corpus.en").read_text(encoding="utf-8")[:5000]))


def _hand_made(pretokenizer: str) -> Tokenizer:
    """Byte tokens plus merges that cross spaces, newlines and digits (no trainer needed), under any
    pattern: the warning that a word-level one splits ``of the`` is expected here."""
    pieces = [(b"t", b"h"), (b"th", b"e"), (b" ", b"the"), (b"e", b" "), (b"the", b" "), (b"1", b"2"),
              (b"\n", b"\n"), (b" ", b" "), (b"o", b"f"), (b"of", b" "), (b"of ", b"the"), (b"\xe4", b"\xb8")]
    vocab = {i: bytes([i]) for i in range(256)}
    for left, right in pieces:
        vocab[len(vocab)] = left + right
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", SPLIT_MERGE_WARNING, UserWarning)
        return Tokenizer(vocab, pieces, ["<s>", "<pad token>"], pretokenizer=pretokenizer, engine="python")


# Code points unassigned in Python's Unicode 14 ("Cn") are left out: the pinned `regex` knows Unicode 17
# (e.g. CJK Extension J, U+323B0...), HF follows Unicode 16, so HF splits Unicode 17's additions
# differently. Characters assigned by Unicode 16 all agree.
_hf_text = st.lists(st.one_of(st.text(st.characters(blacklist_categories=("Cs", "Cn")), max_size=12),
                              st.sampled_from(["the ", "of the", " 123456", "\n\n", "  ", "\r\n", "'s", "<s>",
                                               "<pad token>", "\u4e2d", "\t", "\u00a0", "\u2028", "\x1c"])),
                    max_size=12).map("".join)


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_hf_matches_every_builtin_pattern(tmp_path: Path, pattern: str) -> None:
    tok = _hand_made(pattern)
    hf = hf_from(tok, tmp_path)

    @SETTINGS
    @given(text=_hf_text)
    def agree(text: str) -> None:
        assert hf.encode(text).ids == tok.encode(text)

    agree()


def test_read_hf_tokenizer_round_trip(tmp_path: Path) -> None:
    tok = _hand_made("superbpe")
    tok.save(tmp_path)
    data = read_hf_tokenizer(tmp_path / "tokenizer.json")
    assert data.vocab == tok.vocab
    assert data.merges == tok.merges
    assert data.special_tokens == ["<s>", "<pad token>"]
    assert (data.pattern, data.line_units) == (PATTERNS["superbpe"], True)
    assert pretokenizer_from_hf(data) == tok.pretokenizer


def test_read_tokenizer_json_saved_by_hf(tmp_path: Path) -> None:
    """HF rewrites the file in its own style (merges as pairs in recent versions): we still read it."""
    tok = _hand_made("gpt2")
    hf = hf_from(tok, tmp_path / "ours")
    hf.save(str(tmp_path / "hf.json"))
    data = read_hf_tokenizer(tmp_path / "hf.json")
    assert data.vocab == tok.vocab
    assert data.merges == tok.merges
    assert data.special_tokens == tok.special_tokens
    assert pretokenizer_from_hf(data).name == "gpt2"


def test_custom_pattern_survives_tokenizer_json(tmp_path: Path) -> None:
    pre = get_pretokenizer(r"custom:\d+|[a-z]+")
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], pretokenizer=pre, engine="python")
    tok.save(tmp_path)
    (tmp_path / "superbpe.json").unlink()
    assert Tokenizer.load(tmp_path).pretokenizer == pre


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("model"), "not a BPE tokenizer.json"),
        (lambda d: d["model"].update(type="WordPiece"), "not a BPE tokenizer.json"),
        (lambda d: d["model"]["merges"].append("t zz"), "merge part 'zz' is not in the vocab"),
        (lambda d: d["model"]["merges"].append(["a", "b", "c"]), "is not two tokens"),
        (lambda d: d["added_tokens"].append({"id": 0, "content": "<x>", "special": True}), "clashes"),
        (lambda d: d.update(added_tokens={}), "added_tokens must be a list"),
    ],
)
def test_malformed_tokenizer_json(tmp_path: Path, edit, message: str) -> None:  # noqa: ANN001
    _hand_made("gpt2").save(tmp_path)
    path = tmp_path / "tokenizer.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    edit(document)
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(InputError, match=message) as caught:
        read_hf_tokenizer(path)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize("engine", ["python", pytest.param("native", marks=needs_native)])
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["model"]["vocab"].update({"": 900}), "non-empty bytes"),
        (lambda d: d["added_tokens"].append({"id": -1, "content": "<x>", "special": True}), "non-negative"),
    ],
)
def test_tokenizer_json_faults_left_to_the_tokenizer_are_refused_on_load(
    tmp_path: Path, engine: str, edit, message: str  # noqa: ANN001
) -> None:
    """What the reader leaves to the tokenizer to check (an empty token, an added token's negative id)
    is checked on load."""
    _hand_made("gpt2").save(tmp_path)
    path = tmp_path / HF_FILE
    document = json.loads(path.read_text(encoding="utf-8"))
    edit(document)
    path.write_text(json.dumps(document), encoding="utf-8")
    directory = tmp_path / "json_only"
    directory.mkdir()
    path.rename(directory / HF_FILE)
    assert not read_hf_tokenizer(directory / HF_FILE).valid
    with pytest.raises(ConfigError, match=message):
        Tokenizer.load(directory, engine=engine)


# -- manifest and directories -----------------------------------------------------------------------------


def test_save_writes_six_files_and_manifest(tmp_path: Path) -> None:
    tok = _hand_made("superbpe")
    stages = [{"num_merges": 12}]
    tok.save(tmp_path / "out", manifest_extra={"run": 7}, stages=stages, training={"vocab_size": 268})
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        [VOCAB_FILE, MERGES_FILE, HF_FILE, MANIFEST_FILE, HF_CONFIG_FILE,
         HF_SPECIAL_MAP_FILE])
    manifest = read_manifest(tmp_path / "out" / MANIFEST_FILE)
    assert manifest.pretokenizer == tok.pretokenizer.spec()
    assert manifest.special_tokens == ["<s>", "<pad token>"]
    assert (manifest.vocab_size, manifest.stages, manifest.training, manifest.extra) == (
        tok.vocab_size, [{"num_merges": 12}], {"vocab_size": 268}, {"run": 7})
    assert Tokenizer.load(tmp_path / "out").encode("of the <pad token>") == tok.encode("of the <pad token>")


def test_nothing_is_written_when_the_export_is_invalid(tmp_path: Path) -> None:
    vocab = {i: bytes([i]) for i in range(256)}
    with pytest.raises(ConfigError, match="special token"):
        save_tokenizer_dir(tmp_path / "out", vocab, [], ["<missing>"], get_pretokenizer("gpt2"))
    assert not (tmp_path / "out").exists()


def test_paths_starting_with_a_tilde_are_the_home_directory_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """count("~/corpus.txt") read the home directory's file, while tok.save("~/tok") made a directory named
    "~" where the code ran (and load, encode_file and the counts' save and load looked there too)."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    (home / "c.txt").write_text("the cat sat on the mat\n" * 20, encoding="utf-8")
    tok = _hand_made("superbpe")
    tok.save("~/tok")
    assert (home / "tok" / MANIFEST_FILE).is_file()
    assert Tokenizer.load("~/tok").vocab == tok.vocab
    files = ("~/tok/vocab.json", "~/tok/merges.txt")
    assert Tokenizer.from_files(*files, tok.special_tokens, "superbpe").vocab == tok.vocab
    assert tok.encode_file("~/c.txt").tolist() == tok.encode((home / "c.txt").read_text(encoding="utf-8"))
    counts = superbpe.count("~/c.txt", engine="python")
    counts.save("~/c.counts")
    assert superbpe.PieceCounts.load("~/c.counts").to_dict() == counts.to_dict()
    assert not list(work.iterdir())


def test_a_tilde_of_no_user_is_one_line_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``~name`` of no user (a typo for ``~/name``) raised Path.expanduser's RuntimeError, a traceback; left
    unexpanded it would have been a directory named ``~name`` where the code ran."""
    monkeypatch.chdir(tmp_path)
    tok, nobody = _hand_made("gpt2"), "~no_such_user_4f1c/tok"
    calls = [
        lambda: tok.save(nobody),
        lambda: Tokenizer.load(nobody),
        lambda: tok.encode_file(nobody),
        lambda: superbpe.PieceCounts.load(nobody),
        lambda: superbpe.open_tokens(nobody),
        lambda: superbpe.count(iter(["the cat sat"]), engine="python").save(nobody),
    ]
    said = r"^~no_such_user_4f1c/tok: ~no_such_user_4f1c is no user's home directory"
    for call in calls:
        with pytest.raises(InputError, match=said):
            call()
    assert not list(tmp_path.iterdir())


def test_a_save_into_no_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """"" is Path("."): a save into an unset variable wrote the six files into the working directory."""
    monkeypatch.chdir(tmp_path)
    for nowhere in ["", None]:
        with pytest.raises(InputError, match=r"^the tokenizer is saved into a directory; give its path"):
            _hand_made("gpt2").save(nowhere)  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "records",
    [{"manifest_extra": {"made_from": Path("corpus.txt")}}, {"manifest_extra": [1]}, {"stages": [1]},
     {"training": 5}],
)  # fmt: skip
def test_manifest_records_that_are_not_json_are_refused_before_a_file_is_written(
    tmp_path: Path, records: dict[str, Any]
) -> None:
    with pytest.raises(ConfigError, match=r"^the manifest's records .* must be JSON objects of JSON values"):
        _hand_made("gpt2").save(tmp_path / "out", **records)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"format": "other"}, "not a superbpe manifest"),
        ({"format": "superbpe-tokenizer", "format_version": 99}, "format_version 99"),
        ({"format": "superbpe-tokenizer", "format_version": 1, "pretokenizer": "gpt2"}, "'pretokenizer'"),
        ({"format": "superbpe-tokenizer", "format_version": 1, "pretokenizer": {"name": "x", "pattern": "a"},
          "special_tokens": [""], "vocab_size": 3}, "'special_tokens'"),
        ({"format": "superbpe-tokenizer", "format_version": 1, "pretokenizer": {"name": "x", "pattern": "a"},
          "special_tokens": [], "vocab_size": "3"}, "'vocab_size'"),
        ({"format": "superbpe-tokenizer", "format_version": 1, "pretokenizer": {"name": "x", "pattern": "a"},
          "special_tokens": [], "vocab_size": 3, "stages": {}}, "'stages'"),
    ],
)
def test_malformed_manifest(tmp_path: Path, document: dict, message: str) -> None:
    path = tmp_path / MANIFEST_FILE
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(InputError, match=message):
        read_manifest(path)


def test_manifest_with_bad_pattern_fails_on_load(tmp_path: Path) -> None:
    _hand_made("gpt2").save(tmp_path)
    path = tmp_path / MANIFEST_FILE
    document = json.loads(path.read_text(encoding="utf-8"))
    document["pretokenizer"]["pattern"] = "(unclosed"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(InputError, match="bad pretokenizer"):
        Tokenizer.load(tmp_path)


def test_special_token_spelled_like_a_byte_token_cannot_be_exported(tmp_path: Path) -> None:
    """Special "é" is also the byte-table spelling of byte 0xE9: HF would give it that id, so refuse."""
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], ["\u00e9", "<s>"], engine="python")
    assert tok.encode("caf\u00e9<s>") == [99, 97, 102, 256, 257]
    with pytest.raises(ConfigError, match="spelled like token id 233"):
        tok.save(tmp_path / "out")
    assert not (tmp_path / "out").exists()
