"""Tokenizer and PythonEncoder: GPT-2 parity with tiktoken, special tokens, streaming, files, errors."""

from __future__ import annotations

import collections
import gzip
import itertools
import json
import tracemalloc
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import superbpe
import superbpe.api.tokenizer as tokenizer_module
import superbpe.core.pretokenize as pretokenize_module
from superbpe.api.tokenizer import Tokenizer
from superbpe.core.byte_table import bytes_to_token_str
from superbpe.core.errors import ConfigError, InputError, SuperBPEError
from superbpe.core.pretokenize import PATTERNS, get_pretokenizer
from superbpe.engines import native as native_engine
from superbpe.engines.interface import native_available
from superbpe.engines.python_encoder import HEAP_THRESHOLD, PythonEncoder
from superbpe.formats.gpt2 import read_merges, read_vocab
from superbpe.jobs.evaluate import evaluate

EOT = "<|endoftext|>"
SMALL_TEXTS = ["tinystories_sample.txt", "address.txt", "german.txt", "corpus.en"]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Merge = tuple[bytes, bytes]
Gpt2Files = tuple[dict[int, bytes], list[Merge]]


@pytest.fixture(scope="module")
def gpt2_files(shared_data: Path) -> Gpt2Files:
    vocab = read_vocab(shared_data / "gpt2_vocab.json")
    return vocab, read_merges(shared_data / "gpt2_merges.txt", vocab)


@pytest.fixture(scope="module")
def gpt2(gpt2_files: Gpt2Files) -> Tokenizer:
    vocab, merges = gpt2_files
    return Tokenizer(vocab, merges, [EOT], engine="python")


@pytest.fixture(scope="module")
def reference(gpt2_files: Gpt2Files) -> tiktoken.Encoding:
    """GPT-2 as tiktoken, built only from the shared files (ranks = ids, which tiktoken merges by)."""
    vocab, _ = gpt2_files
    ranks = {token: token_id for token_id, token in vocab.items() if token_id < 50256}
    return tiktoken.Encoding("gpt2-local", pat_str=PATTERNS["gpt2"], mergeable_ranks=ranks,
                             special_tokens={EOT: 50256})


def reference_bpe(data: bytes, ranks: dict[Merge, int]) -> list[bytes]:
    """The contract's merge rule, written as plainly as possible: lowest rank, leftmost, one at a time."""
    parts = [bytes([b]) for b in data]
    while len(parts) > 1:
        pairs = enumerate(zip(parts, parts[1:], strict=False))
        candidates = [(ranks[pair], i) for i, pair in pairs if pair in ranks]
        if not candidates:
            break
        _, at = min(candidates)
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts


# -- GPT-2 parity ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SMALL_TEXTS)
def test_matches_tiktoken_on_small_texts(name: str, shared_data: Path, gpt2: Tokenizer,
                                         reference: tiktoken.Encoding) -> None:
    text = (shared_data / name).read_text(encoding="utf-8")
    ids = gpt2.encode(text)
    assert ids == reference.encode(text, allowed_special="all")
    assert gpt2.decode(ids) == text


def test_matches_tiktoken_on_corpus_slices(multilingual_text: str, wikitext_text: str, gpt2: Tokenizer,
                                           reference: tiktoken.Encoding) -> None:
    for text in (multilingual_text[:150_000], wikitext_text[:200_000]):
        ids = gpt2.encode(text)
        assert ids == reference.encode(text, allowed_special="all")
        assert gpt2.decode(ids) == text


@pytest.mark.slow
@pytest.mark.parametrize("name", ["multilingual_fortunes.txt.gz", "wikitext103_valid_test.txt.gz"])
def test_matches_tiktoken_on_whole_corpora(name: str, shared_data: Path, gpt2: Tokenizer,
                                           reference: tiktoken.Encoding) -> None:
    with gzip.open(shared_data / name, "rt", encoding="utf-8", newline="") as handle:
        text = handle.read()
    assert gpt2.encode(text) == reference.encode(text, allowed_special="all")


def test_special_token_in_text_gets_its_id(gpt2: Tokenizer, reference: tiktoken.Encoding) -> None:
    text = f"Hello{EOT} world{EOT}{EOT}\n"
    ids = gpt2.encode(text)
    assert ids.count(50256) == 3
    assert ids == reference.encode(text, allowed_special="all")
    assert gpt2.encode_ordinary(text) == reference.encode_ordinary(text)  # specials as plain text
    assert 50256 not in gpt2.encode_ordinary(text)


_unicode_text = st.text(st.characters(blacklist_categories=("Cs", "Cn")), max_size=60)
_pieces = st.sampled_from([EOT, " ", "\n", "\r\n", "  \n", "'s", "123"])
_mixed_text = st.lists(st.one_of(_unicode_text, _pieces), max_size=8).map("".join)


@SETTINGS
@given(text=_mixed_text)
def test_random_unicode_matches_tiktoken_and_round_trips(text: str, gpt2: Tokenizer,
                                                         reference: tiktoken.Encoding) -> None:
    ids = gpt2.encode(text)
    assert ids == reference.encode(text, allowed_special="all")
    assert gpt2.decode(ids) == text


# -- the BPE rule itself ------------------------------------------------------------------------------------


@SETTINGS
@given(data=st.binary(min_size=1, max_size=3 * HEAP_THRESHOLD))
def test_both_merge_loops_follow_the_rule(data: bytes, gpt2_files: Gpt2Files) -> None:
    vocab, merges = gpt2_files
    encoder = _gpt2_encoder(vocab, merges)
    expected = reference_bpe(data, encoder._ranks)
    assert encoder._merge_by_scan(data) == expected
    assert encoder._merge_with_heap(data) == expected


_gpt2_encoders: dict[int, PythonEncoder] = {}


def _gpt2_encoder(vocab: dict[int, bytes], merges: list[Merge]) -> PythonEncoder:
    if not _gpt2_encoders:
        ids = {token: token_id for token_id, token in vocab.items()}
        _gpt2_encoders[0] = PythonEncoder(ids, merges, get_pretokenizer("gpt2"))
    return _gpt2_encoders[0]


def test_out_of_order_merges_still_merge_one_at_a_time() -> None:
    """A hand-made list where a merge uses a token that a *later* merge makes: rank order still decides."""
    merges = [(b"ab", b"a"), (b"a", b"b"), (b"b", b"a")]
    vocab = _byte_vocab([b"aba", b"ab", b"ba"])
    encoder = PythonEncoder(vocab, merges, get_pretokenizer("gpt2"))
    ranks = {pair: rank for rank, pair in enumerate(merges)}
    for word in (b"abab", b"ababa", b"aaba", b"bababab" * 10):
        expected = reference_bpe(word, ranks)
        assert encoder._merge_by_scan(word) == expected
        assert encoder._merge_with_heap(word) == expected
    assert encoder.merge_bytes(b"ababa") == [b"aba", b"ba"]  # ab first, then (ab, a) beats (b, a)


def test_whole_piece_token_wins_over_merges() -> None:
    """A piece that is itself a token maps to it even if the merges would split it differently."""
    vocab = _byte_vocab([b"ab", b"abc"])
    tok = Tokenizer({i: t for t, i in vocab.items()}, [(b"a", b"b")], engine="python")
    assert tok.encode("abc") == [vocab[b"abc"]]
    assert tok.encode("abcd") == [vocab[b"ab"], ord("c"), ord("d")]


def test_long_pieces_use_the_heap_and_agree(gpt2: Tokenizer, reference: tiktoken.Encoding) -> None:
    text = "x" * 5000 + " " + "\u4e2d\u6587" * 700 + " " + "ab" * 3000
    assert gpt2.encode(text) == reference.encode(text)


def _byte_vocab(extra: Sequence[bytes]) -> dict[bytes, int]:
    vocab = {bytes([b]): b for b in range(256)}
    for token in extra:
        vocab[token] = len(vocab)
    return vocab


# -- special tokens --------------------------------------------------------------------------------------


def test_overlapping_special_tokens_prefer_the_longest(gpt2_files: Gpt2Files) -> None:
    vocab, merges = gpt2_files
    double = EOT + EOT
    tok = Tokenizer(vocab, merges, [EOT, double], engine="python")
    assert tok.vocab_size == 50258
    ids = tok.encode(f"a{double}b{EOT}c")
    assert ids.count(tok.token_to_id(double)) == 1
    assert ids.count(50256) == 1
    assert tok.decode(ids) == f"a{double}b{EOT}c"


def test_new_special_tokens_get_appended_ids() -> None:
    vocab = {i: bytes([i]) for i in range(256)}
    tok = Tokenizer(vocab, [], ["<pad>", "<eos>"], engine="python")
    assert tok.vocab_size == 258
    assert tok.encode("a<eos><pad>") == [97, 257, 256]
    assert tok.encode_ordinary("<pad>") == list(b"<pad>")
    assert tok.special_tokens == ["<pad>", "<eos>"]
    assert tok.id_to_token(256) == b"<pad>"


def test_empty_special_token_is_an_error() -> None:
    with pytest.raises(ConfigError):
        Tokenizer({i: bytes([i]) for i in range(256)}, [], [""])


def test_a_special_token_given_twice_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"^special token '<pad>' is given twice in special_tokens") as info:
        Tokenizer({i: bytes([i]) for i in range(256)}, [], ["<pad>", "<eos>", "<pad>"])
    assert "\n" not in str(info.value)


# -- streaming ---------------------------------------------------------------------------------------------


def test_encode_iterable_over_lines_equals_encode(shared_data: Path, gpt2: Tokenizer,
                                                  wikitext_text: str) -> None:
    stories = (shared_data / "tinystories_sample.txt").read_text(encoding="utf-8")
    for text in (stories, wikitext_text[:300_000]):
        with_specials = text.replace("\n\n", f"\n{EOT}\n", 3)
        lines = with_specials.splitlines(keepends=True)
        assert list(gpt2.encode_iterable(lines)) == gpt2.encode(with_specials)


def test_encode_iterable_of_bytes_says_it_takes_str(tmp_path: Path) -> None:
    tok = _stream_tokenizer()
    (tmp_path / "in.txt").write_text("some text\n" * 10, encoding="utf-8")
    with open(tmp_path / "in.txt", "rb") as binary, pytest.raises(
        InputError, match=r"^encode_iterable takes str, not bytes \(open the file in text mode\)$"
    ):
        list(tok.encode_iterable(binary))
    with pytest.raises(InputError, match="^encode_iterable takes str, not int$"):
        list(tok.encode_iterable(["text", 7]))
    # Refused at the call, not when the ids are first asked for.
    with pytest.raises(InputError, match=r"^encode_iterable takes an iterable of str .*, not NoneType$"):
        tok.encode_iterable(None)  # type: ignore[arg-type]


_stream_parts = ["a", "b", " ", "  ", "\n", "\n\n", "<|", "|>", "<|s|>", "<|s|><|s|>", "\nX", "1", "\u00e9",
                 "'s"]
_stream_text = st.lists(st.sampled_from(_stream_parts), max_size=40).map("".join)


@SETTINGS
@given(text=_stream_text, cuts=st.lists(st.integers(0, 200), max_size=10))
def test_encode_iterable_is_exact_wherever_the_stream_is_cut(text: str, cuts: list[int]) -> None:
    """With a flush after every chunk, cuts land next to specials, inside them and at line ends."""
    tok = _stream_tokenizer()
    chunks = [text[a:b] for a, b in itertools.pairwise([0, *sorted(cuts), len(text)])]
    original = tokenizer_module.STREAM_FLUSH_CHARS
    tokenizer_module.STREAM_FLUSH_CHARS = 1
    try:
        assert list(tok.encode_iterable(chunks)) == tok.encode(text)
    finally:
        tokenizer_module.STREAM_FLUSH_CHARS = original


@SETTINGS
@given(
    text=_stream_text,
    cuts=st.lists(st.integers(0, 200), max_size=10),
    at=st.integers(0, 200),
    flush=st.sampled_from([1, 7, 1 << 16]),
)
def test_encode_iterable_names_the_text_a_lone_surrogate_is_in(
    text: str, cuts: list[int], at: int, flush: int
) -> None:
    """Whichever stretch of the buffer it is encoded in, as a JSON-lines record's is named by its line."""
    tok = _stream_tokenizer()
    at = min(at, len(text))
    text = text[:at] + "\ud800" + text[at:]
    bounds = [0, *sorted(cuts), len(text)]
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    number = next(i for i, chunk in enumerate(chunks) if "\ud800" in chunk)
    where = chunks[number].index("\ud800")
    original = tokenizer_module.STREAM_FLUSH_CHARS
    tokenizer_module.STREAM_FLUSH_CHARS = flush
    try:
        message = rf"^encode_iterable: text {number}: unpaired surrogate '\\ud800' at character {where} \(not"
        with pytest.raises(InputError, match=message):
            list(tok.encode_iterable(chunks))
    finally:
        tokenizer_module.STREAM_FLUSH_CHARS = original


def test_a_lone_surrogate_is_named_alike_in_a_stream_and_in_json_lines(tmp_path: Path) -> None:
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], engine="python")
    texts = ["fine", "ab\ud800cd", "more"]
    records = tmp_path / "r.jsonl"
    records.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    same = r"unpaired surrogate '\\ud800' at character 2 \(not UTF-8\)"
    with pytest.raises(InputError, match=f"r.jsonl: line 2: {same}"):
        evaluate(tok, records)  # how superbpe-evaluate and superbpe-encode read records
    with pytest.raises(InputError, match=f"^encode_iterable: text 1: {same}$"):
        list(tok.encode_iterable(texts))


_stream_tokenizers: list[Tokenizer] = []


def _stream_tokenizer() -> Tokenizer:
    """Specials that overlap, nest and contain a newline; merges that join across spaces and newlines."""
    if not _stream_tokenizers:
        merges = [(b"a", b"b"), (b" ", b"a"), (b"\n", b"X"), (b"<", b"|"), (b"\n", b"\n"), (b" ", b" ")]
        vocab = {i: bytes([i]) for i in range(256)}
        for left, right in merges:
            vocab[len(vocab)] = left + right
        specials = ["<|s|>", "<|s|><|s|>", "s|>\nX"]
        _stream_tokenizers.append(Tokenizer(vocab, merges, specials, engine="python"))
    return _stream_tokenizers[0]


def test_encode_iterable_memory_stays_bounded(gpt2: Tokenizer) -> None:
    """Over ~1.5 MB of streamed lines, text read but not yet turned into ids never exceeds a small bound."""
    lines = ["The quick brown fox jumps over the lazy dog.\n", f"{EOT}\n", "\u00dcn\u00efc\u00f6d\u00e9 1\n"]
    consumed = [0]

    def many_lines() -> Iterator[str]:
        for index in range(60_000):
            line = lines[index % 3]
            consumed[0] += len(line.encode("utf-8"))
            yield line

    produced = 0
    backlog = 0
    sizes = {token_id: len(gpt2.id_to_token(token_id)) for token_id in set(gpt2.encode("".join(lines)))}
    ids = gpt2.encode_iterable(many_lines())
    while batch := list(itertools.islice(ids, 2048)):  # batches keep the bookkeeping cheap
        backlog = max(backlog, consumed[0] - produced)
        produced += sum(map(sizes.__getitem__, batch))
    assert consumed[0] > 1_400_000
    assert produced == consumed[0]
    assert backlog < 4 * tokenizer_module.STREAM_FLUSH_CHARS


_cut_merges = [(b" ", b"\n"), (b"\n", b" "), (b" ", b" "), (b"\n", b"\n"), (b"a", b"b"), (b"b", b" "),
               (b" ", b"a"), (b"1", b"1"), (b"1", b"a"), (b".", b"\n"), (b"\n", b"/"), (b"'", b"s"),
               (b"a", b"'"), (b" ", b"1"), (b"\t", b" ")]
_cut_parts = ["a", "b", "ab", " ", "  ", "\n", " \n", "\n ", "1", "11", "'s", ".", "/", "\t", "\u00e9",
              "\u3000"]
_cut_tokenizers: dict[tuple[str, bool, str], Tokenizer] = {}


def _cut_tokenizer(name: str, line_units: bool, engine: str) -> Tokenizer:
    """Merges that join across the places a wrong cut would separate (spaces, line ends, digits)."""
    key = (name, line_units, engine)
    if key not in _cut_tokenizers:
        vocab = {i: bytes([i]) for i in range(256)}
        for left, right in _cut_merges:
            vocab[len(vocab)] = left + right
        pre = get_pretokenizer(name, line_units=line_units)
        _cut_tokenizers[key] = Tokenizer(vocab, _cut_merges, [EOT], pre, engine)
    return _cut_tokenizers[key]


_engines = ["python", "native"] if native_engine.available() else ["python"]


@pytest.mark.parametrize("engine", _engines)
@pytest.mark.parametrize("line_units", [False, True])
@pytest.mark.parametrize("name", sorted(PATTERNS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(st.sampled_from([*_cut_parts, EOT]), max_size=50), cuts=st.lists(st.integers(0, 120)))
def test_encode_iterable_is_exact_for_every_pattern(
    name: str, line_units: bool, engine: str, parts: list[str], cuts: list[int]
) -> None:
    """Random text in random chunks, a cut tried after every chunk: the ids of ``encode`` of the whole."""
    tok = _cut_tokenizer(name, line_units, engine)
    text = "".join(parts)
    chunks = [text[a:b] for a, b in itertools.pairwise([0, *sorted(cuts), len(text)])]
    original = tokenizer_module.STREAM_FLUSH_CHARS
    tokenizer_module.STREAM_FLUSH_CHARS = 1
    try:
        assert list(tok.encode_iterable(chunks)) == tok.encode(text)
    finally:
        tokenizer_module.STREAM_FLUSH_CHARS = original


@pytest.mark.skipif(not native_engine.available(), reason="needs the native engine")
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_line_units_encode_lines_after_the_first_in_place(name: str) -> None:
    """Lines of plain ASCII long enough for the scanners' 64-byte blocks, after the first line: the
    native encoder must key their pieces where they lie in the text, not where they lie in their line."""
    line = "ab 11 b'sa. /\tab  a\n"
    text = "x\n" + line * 5 + "ab " * 40 + "\n" + ("a b" * 30).rstrip() + "\n\n" + "1a " * 30
    native = _cut_tokenizer(name, True, "native")
    ids = native.encode(text)
    assert native.decode(ids) == text
    assert ids == _cut_tokenizer(name, True, "python").encode(text)


def test_streaming_lines_ending_in_a_space_keeps_memory_small(
    gpt2_files: Gpt2Files, wikitext_text: str
) -> None:
    """WikiText's lines end in " \n" and the next begins with a space, where no line-end cut is safe: 50 MB of
    them stream through with a small, flat peak of Python memory, and their ids are exact."""
    vocab, merges = gpt2_files
    tok = Tokenizer(vocab, merges, [EOT], engine="native" if native_engine.available() else "python")
    lines = [line if line.endswith(" \n") else line.rstrip("\n") + " \n" for line in
             wikitext_text[:300_000].splitlines(keepends=True)]
    assert list(tok.encode_iterable(lines)) == tok.encode("".join(lines))
    size = 50_000_000 if tok.engine == "native" else 5_000_000
    streamed = [0]

    def many_lines() -> Iterator[str]:
        while streamed[0] < size:
            for line in lines:
                streamed[0] += len(line)
                yield line

    tracemalloc.start()
    try:
        collections.deque(tok.encode_iterable(many_lines()), maxlen=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert streamed[0] >= size
    assert peak < 8_000_000  # the buffer and a batch of ids; without cuts it held the whole stream


def test_custom_pattern_streams_exactly_and_bounded(wikitext_text: str, gpt2_files: Gpt2Files) -> None:
    """A custom pattern has no proven cut rule; it is cut within its assumed reach and stays exact."""
    vocab, merges = gpt2_files
    tok = Tokenizer(vocab, merges, [EOT], f"custom:{PATTERNS['gpt2']}", engine="python")
    text = wikitext_text[:400_000].replace(" \n \n", f" \n{EOT}\n", 5)
    lines = text.splitlines(keepends=True)
    read = [0]

    def counted() -> Iterator[str]:
        for line in lines:
            read[0] += len(line)
            yield line

    ids: list[int] = []
    backlog = done = 0
    for batch in tok._encode_batches(counted()):
        backlog = max(backlog, read[0] - done)  # read, but not yet given out as ids
        ids += batch
        done += len(tok.decode(batch))  # a batch ends where the text was cut: whole characters
    assert ids == tok.encode(text)
    assert backlog < 2 * tokenizer_module.STREAM_FLUSH_CHARS + 3 * pretokenize_module.CUSTOM_REACH


def test_uncuttable_stream_is_rescanned_rarely(gpt2: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """One 2 MB word (no cut anywhere): the buffer is re-examined only when it doubles, so streaming stays
    linear."""
    calls = []
    original = Tokenizer._stream_cut
    monkeypatch.setattr(Tokenizer, "_stream_cut", lambda self, buffer: calls.append(len(buffer)) or original(
        self, buffer))
    chunks = ["oneWordThatNeverEnds" for _ in range(100_000)]
    assert list(gpt2.encode_iterable(chunks)) == gpt2.encode("".join(chunks))
    assert 1 <= len(calls) <= 7


def test_encode_file_matches_encode(tmp_path: Path, gpt2: Tokenizer, wikitext_text: str) -> None:
    text = wikitext_text[:100_000].replace("\n", "\r\n", 50) + EOT + "tail"
    plain = tmp_path / "text.txt"
    plain.write_bytes(text.encode("utf-8"))
    packed = tmp_path / "text.txt.gz"
    packed.write_bytes(gzip.compress(text.encode("utf-8")))
    expected = gpt2.encode(text)
    ids = gpt2.encode_file(plain)
    assert ids.dtype == np.uint16
    assert ids.tolist() == expected
    wide = gpt2.encode_file(packed, dtype=np.uint32)
    assert wide.dtype == np.uint32
    assert wide.tolist() == expected


@pytest.mark.parametrize("pretokenizer", ["gpt2", "superbpe"])
def test_encode_file_in_many_chunks_matches_encode(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    wikitext_text: str,
    multilingual_text: str,
    pretokenizer: str,
) -> None:
    """Read in chunks far smaller than the file (cut where no piece or special token crosses, as the
    encoding jobs cut), a file gives the ids of its whole text on both engines, with the patterns that cut
    at lines and the one that does not; a bad byte deep inside is named with its offset."""
    monkeypatch.setattr(tokenizer_module, "FILE_READ_BYTES", 3000)
    specials = [EOT, "<|s|>"]
    corpus = iter([wikitext_text[:150_000]])
    vocab, merges = superbpe.train_bpe(corpus, 700, specials, pretokenizer=pretokenizer)
    tail = multilingual_text[:20_000] + "<|s|>  \n\n" + wikitext_text[-20_000:]
    text = (wikitext_text[:60_000] + EOT + tail) * 2
    path = tmp_path / "t.txt"
    path.write_bytes(text.encode("utf-8"))
    engines = ["python", "native"] if native_engine.available() else ["python"]
    for engine in engines:
        tok = Tokenizer(vocab, merges, specials, pretokenizer, engine)
        assert tok.encode_file(path).tolist() == tok.encode(text), engine
    data = text.encode("utf-8")
    path.write_bytes(data[:50_000] + b"\xff" + data[50_000:])
    with pytest.raises(InputError, match=r"t\.txt: invalid UTF-8 at byte 50000; "):
        tok.encode_file(path)


def test_encode_file_keeps_a_special_token_a_read_ends_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpt2: Tokenizer
) -> None:
    """A read that ends inside a special token holding a shorter one (``<a><b>`` of ``<a><b>x``) is not
    cut before the shorter: the bytes after the read complete the longer."""
    monkeypatch.setattr(tokenizer_module, "FILE_READ_BYTES", 8)
    tok = Tokenizer(gpt2.vocab, gpt2.merges, [EOT, "<b>", "<a><b>x"], "gpt2", gpt2.engine)
    text = "y" * 10 + "<a><b>x" + "z" * 20  # the second read ends after "<b>"
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    assert tok.token_to_id("<a><b>x") in tok.encode(text)
    assert tok.encode_file(path).tolist() == tok.encode(text)


def test_encode_file_reads_invalid_utf8_with_errors_replace(tmp_path: Path, gpt2: Tokenizer) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine\nthen \xff here\n")
    with pytest.raises(InputError, match="bad.txt: invalid UTF-8 at byte 10"):
        gpt2.encode_file(path)
    replaced = gpt2.encode_file(path, errors="replace")
    assert replaced.tolist() == gpt2.encode("fine\nthen \ufffd here\n")
    with pytest.raises(ConfigError, match="errors must be 'strict' or 'replace'"):
        gpt2.encode_file(path, errors="ignore")


def test_encode_file_uses_uint32_for_large_ids(tmp_path: Path) -> None:
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[70_000] = b"ab"
    tok = Tokenizer(vocab, [(b"a", b"b")], engine="python")
    path = tmp_path / "t.txt"
    path.write_text("abc ab", encoding="utf-8")
    ids = tok.encode_file(path)
    assert ids.dtype == np.uint32
    assert ids.tolist() == [70_000, 99, 32, 70_000]
    with pytest.raises(ConfigError):
        tok.encode_file(path, dtype=np.uint16)


def test_encode_file_errors(tmp_path: Path, gpt2: Tokenizer) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\xff\xfe broken")
    with pytest.raises(InputError, match="bad.txt"):
        gpt2.encode_file(bad)
    with pytest.raises(InputError, match="missing.txt"):
        gpt2.encode_file(tmp_path / "missing.txt")
    records = tmp_path / "docs.jsonl"
    records.write_text('{"text": "hello"}\n')
    with pytest.raises(InputError, match="docs.jsonl: encode_file reads one text; .* encode_batch"):
        gpt2.encode_file(records)  # its JSON would have been encoded as text


# -- decoding and lookups --------------------------------------------------------------------------------


def test_decode_replaces_invalid_utf8(gpt2: Tokenizer) -> None:
    byte_ff = gpt2.token_to_id(b"\xff")
    assert gpt2.decode([byte_ff]) == "\ufffd"
    euro = [gpt2.token_to_id(bytes([byte])) for byte in "\u20ac".encode()]
    assert gpt2.decode(euro) == "\u20ac"
    assert gpt2.decode(euro[:2]) == "\ufffd"
    assert gpt2.decode(euro[1:] + euro) == "\ufffd\ufffd\u20ac"
    assert gpt2.decode_bytes(iter(euro[:2])) == "\u20ac".encode()[:2]


@pytest.mark.parametrize("bad_id", [50257, -1, 10**9, "3", None])
def test_decode_unknown_id_is_an_error(gpt2: Tokenizer, bad_id: object) -> None:
    with pytest.raises(InputError, match="unknown token id"):
        gpt2.decode([5, bad_id])  # type: ignore[list-item]
    with pytest.raises(SuperBPEError):
        gpt2.id_to_token(bad_id)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad_id", [65.0, True, np.float64(65.0), np.bool_(True)], ids=["float", "bool", "np.float64", "np.bool_"]
)
def test_decode_refuses_ids_that_are_not_integers(bad_id: object) -> None:
    """65.0 and True hash as 65 and 1, so a lookup alone would take them."""
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], engine="python")
    refused = r"^unknown token id .*: token ids are integers, not (float|float64|bool)$"
    for ids in ([66, bad_id], (bad_id,), iter([bad_id])):
        with pytest.raises(InputError, match=refused):
            tok.decode(ids)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=refused):
        tok.decode_bytes([bad_id])  # type: ignore[list-item]
    with pytest.raises(InputError, match=refused):
        tok.decode(np.array([bad_id]))  # type: ignore[arg-type]
    with pytest.raises(InputError, match=refused):
        tok.id_to_token(bad_id)  # type: ignore[arg-type]


def test_decode_takes_numpy_integers() -> None:
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], engine="python")
    assert tok.decode(np.array([65, 66], dtype=np.uint16)) == "AB"
    assert tok.decode([np.int64(65), 66]) == "AB"
    assert tok.id_to_token(np.int32(65)) == b"A"
    with pytest.raises(InputError, match=r"^decode takes one sequence of token ids, not a 2-D array"):
        tok.decode(np.array([[65, 66]]))
    for one_id in (np.array(65), np.asarray(65, dtype=np.uint16)):  # iterating a 0-D array is a TypeError
        with pytest.raises(InputError, match=r"^decode takes a sequence of token ids, not a 0-D array"):
            tok.decode_bytes(one_id)  # type: ignore[arg-type]
    for unordered in ({65, 66}, {65: 1}):  # a set's text would come out shuffled, a dict's keys be decoded
        with pytest.raises(InputError, match=r"^decode takes token ids in order \(a list\), not a "):
            tok.decode(unordered)  # type: ignore[arg-type]


def test_decode_of_text_says_it_takes_ids() -> None:
    with pytest.raises(InputError, match="^decode takes token ids, not a str"):
        _stream_tokenizer().decode("the")  # type: ignore[arg-type]


def test_lookups_and_properties(gpt2: Tokenizer) -> None:
    assert gpt2.vocab_size == 50257
    assert gpt2.token_to_id(EOT) == 50256
    assert gpt2.token_to_id(" the") == gpt2.encode(" the")[0]
    assert gpt2.id_to_token(gpt2.token_to_id(b" the")) == b" the"
    assert gpt2.pretokenizer.name == "gpt2"
    assert gpt2.engine == "python"
    assert len(gpt2.merges) == 50000
    with pytest.raises(KeyError, match="'not a single token at all' is not a token of this tokenizer"):
        gpt2.token_to_id("not a single token at all")
    with pytest.raises(KeyError, match="is not a token of this tokenizer"):
        gpt2.token_to_id("\ud800")
    # bytes(3) would be three zero bytes: an id given here is refused, not looked up as such a token.
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"\x00\x00", 257: b"\x00\x00\x00"}
    zeros = Tokenizer(vocab, [(b"\x00", b"\x00"), (b"\x00\x00", b"\x00")], engine="python")
    with pytest.raises(InputError, match=r"^token_to_id takes a token as str or bytes, not int \(id_to_"):
        zeros.token_to_id(3)
    with pytest.raises(InputError, match="not NoneType"):
        gpt2.token_to_id(None)  # type: ignore[arg-type]


def test_constructor_rejects_bad_vocab() -> None:
    base = {i: bytes([i]) for i in range(256)}
    from_array = Tokenizer({np.int64(i): token for i, token in base.items()}, [], engine="python")
    assert from_array.encode("ok") == [ord("o"), ord("k")] and set(map(type, from_array.vocab)) == {int}
    with pytest.raises(ConfigError, match="twice"):
        Tokenizer({**base, 256: b"a"}, [])
    lacking = Tokenizer({i: bytes([i]) for i in range(255)}, [])  # no byte 0xFF: fine until a text needs it
    assert lacking.encode("ok") == [ord("o"), ord("k")]
    with pytest.raises(ConfigError, match="not in the vocab"):
        Tokenizer(base, [(b"a", b"b")])
    no_a = {i: token for i, token in base.items() if token != b"a"} | {256: b"ab"}
    for engine in ("python", "native") if native_available() else ("python",):  # the one gave ids, one failed
        with pytest.raises(ConfigError, match=r"^merge #0 \(b'a', b'b'\) joins b'a', which is not in the"):
            Tokenizer(no_a, [(b"a", b"b")], engine=engine, whole_pieces=False)
    for engine in ("python", "native") if native_available() else ("python",):
        with pytest.raises(ConfigError, match=r"^whole_pieces must be True or False, not 'no'"):
            Tokenizer(base, [], whole_pieces="no", engine=engine)  # type: ignore[arg-type]


def test_an_id_past_32_bits_in_vocab_json_is_refused_on_load(tmp_path: Path) -> None:
    """The constructor refuses such ids; read from a file, one loaded and then broke every array of ids
    (encode_array raised OverflowError)."""
    vocab = {bytes_to_token_str(bytes([i])): i for i in range(256)} | {"ab": 1 << 40}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    for engine in ("python", "native") if native_available() else ("python",):
        with pytest.raises(InputError, match=r"^token b'ab' has id 1099511627776: ids must be below 2\*\*32"):
            Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt", engine=engine)


def test_unpaired_surrogate_is_an_input_error(gpt2: Tokenizer) -> None:
    with pytest.raises(InputError, match="surrogate"):
        gpt2.encode("ok \ud800 no")


# -- files and directories ----------------------------------------------------------------------------------


def test_from_files_matches_constructor(shared_data: Path, gpt2: Tokenizer) -> None:
    tok = Tokenizer.from_files(shared_data / "gpt2_vocab.json", shared_data / "gpt2_merges.txt", [EOT],
                               engine="python")
    text = "Files and\n constructor agree, 100%!"
    assert tok.encode(text) == gpt2.encode(text)


def test_save_and_load_round_trip(tmp_path: Path, gpt2: Tokenizer, wikitext_text: str) -> None:
    gpt2.save(tmp_path / "tok", manifest_extra={"note": "round trip"})
    names = sorted(p.name for p in (tmp_path / "tok").iterdir())
    assert names == ["merges.txt", "special_tokens_map.json", "superbpe.json", "tokenizer.json",
                     "tokenizer_config.json", "vocab.json"]
    manifest = json.loads((tmp_path / "tok" / "superbpe.json").read_text(encoding="utf-8"))
    assert manifest["extra"] == {"note": "round trip"}
    assert manifest["vocab_size"] == 50257
    loaded = Tokenizer.load(tmp_path / "tok", engine="python")
    assert loaded.vocab == gpt2.vocab
    assert loaded.merges == gpt2.merges
    assert loaded.special_tokens == [EOT]
    sample = wikitext_text[:20_000] + EOT
    assert loaded.encode(sample) == gpt2.encode(sample)


def test_load_falls_back_to_tokenizer_json_then_gpt2_files(tmp_path: Path) -> None:
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b" ab"}
    merges = [(b"a", b"b"), (b" ", b"ab")]
    tok = Tokenizer(vocab, merges, ["<s>"], pretokenizer="superbpe", engine="python")
    tok.save(tmp_path)
    (tmp_path / "superbpe.json").unlink()
    from_hf = Tokenizer.load(tmp_path, engine="python")
    assert from_hf.pretokenizer == tok.pretokenizer
    assert from_hf.special_tokens == ["<s>"]
    assert from_hf.encode("ab ab<s>") == tok.encode("ab ab<s>")
    (tmp_path / "tokenizer.json").unlink()
    plain = Tokenizer.load(tmp_path, engine="python")
    assert plain.pretokenizer.name == "gpt2"
    assert plain.vocab == tok.vocab
    assert len(plain) == plain.vocab_size == 259


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        Tokenizer.load(tmp_path / "nowhere")
    with pytest.raises(InputError, match="none of"):
        Tokenizer.load(tmp_path)
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], engine="python")
    tok.save(tmp_path)
    with pytest.raises(InputError, match=r"vocab.json is a file: load takes the tokenizer's directory"):
        Tokenizer.load(tmp_path / "vocab.json")
    manifest = tmp_path / "superbpe.json"
    original = manifest.read_text(encoding="utf-8")
    manifest.write_text(original.replace('"vocab_size": 256', '"vocab_size": 300'), encoding="utf-8")
    with pytest.raises(InputError, match="vocab_size 300"):
        Tokenizer.load(tmp_path)
    manifest.write_text("{not json", encoding="utf-8")
    with pytest.raises(InputError, match="superbpe.json"):
        Tokenizer.load(tmp_path)



@pytest.mark.parametrize("kept", [0, 2])
def test_a_merges_file_cut_short_is_refused_on_load(tmp_path: Path, kept: int) -> None:
    """The vocab alone would still match the manifest's vocab_size: the merge count names the fault."""
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b" ab", 258: b"cd"}
    Tokenizer(vocab, [(b"a", b"b"), (b" ", b"ab"), (b"c", b"d")], engine="python").save(tmp_path)
    merges = tmp_path / "merges.txt"
    merges.write_text("".join(merges.read_text(encoding="utf-8").splitlines(keepends=True)[: 1 + kept]),
                      encoding="utf-8")  # fmt: skip
    with pytest.raises(InputError, match=rf"merges.txt: {kept} merges, but superbpe.json says 3"):
        Tokenizer.load(tmp_path)


def test_loading_an_unfinished_run_or_a_sweep_directory_says_what_to_name(tmp_path: Path) -> None:
    """A run killed before its tokenizer was written, or a sweep's directory (its runs are below it),
    holds no tokenizer files: the error says how to finish the run, or which directories hold one."""
    unfinished = tmp_path / "run"
    unfinished.mkdir()
    (unfinished / "checkpoint.json").write_text("{}", encoding="utf-8")
    with pytest.raises(InputError, match=r"has not finished: superbpe-train resume=.*run finishes it"):
        Tokenizer.load(unfinished)
    sweep = tmp_path / "sweep"
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], engine="python")
    for job in ("0", "1", "10", "2"):
        tok.save(sweep / job)
    with pytest.raises(InputError, match=r"subdirectories 0, 1, 2, \.\.\. hold tokenizers.*sweep/0\)"):
        Tokenizer.load(sweep)
    alone = tmp_path / "alone"
    tok.save(alone / "0")
    with pytest.raises(InputError, match=r"subdirectory 0 holds a tokenizer: .*alone/0\)"):
        Tokenizer.load(alone)


@pytest.mark.parametrize("line_units", [False, True])
def test_streaming_never_cuts_a_stage2_piece_that_spans_lines(line_units: bool) -> None:
    """superbpe-paper without line units keeps "ab\\ncd" as one piece: streaming must not split it."""
    merges = [(b"b", b"\n"), (b"b\n", b"c")]
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"b\n", 257: b"b\nc"}
    tok = Tokenizer(vocab, merges, pretokenizer=get_pretokenizer("superbpe-paper", line_units=line_units))
    lines = ["ab\n", "cd 12\n"] * 50_000
    assert list(tok.encode_iterable(lines)) == tok.encode("".join(lines))
    assert (257 in tok.encode("ab\ncd")) is not line_units


@pytest.mark.parametrize("count", [1, tokenizer_module.FEW_SPECIALS + 3])
def test_encode_finds_specials_with_few_or_many(gpt2_files: Gpt2Files, count: int) -> None:
    """encode() looks for a few special tokens one by one and for many with one regex search; either
    way a text holding one gets its id, and a text holding none the ordinary ids."""
    vocab, merges = gpt2_files
    specials = [EOT] + [f"<|extra{i}|>" for i in range(count - 1)]
    tok = Tokenizer(vocab, merges, specials)
    last = specials[-1]
    text = f"Hello {last} world"
    assert tok.encode(text) == tok.encode("Hello ") + [tok.token_to_id(last)] + tok.encode(" world")
    assert tok.encode("no special here") == tok.encode_ordinary("no special here")


def test_encode_takes_str_subclasses_and_refuses_bytes(gpt2: Tokenizer) -> None:
    class Text(str):
        pass

    assert gpt2.encode(Text("a b")) == gpt2.encode("a b")
    assert gpt2.encode_ordinary(Text("a b")) == gpt2.encode_ordinary("a b")
    for method in (gpt2.encode, gpt2.encode_ordinary):
        with pytest.raises(InputError, match="decode bytes to str first"):
            method(b"a b")  # type: ignore[arg-type]


@pytest.mark.parametrize("engine", ["python", *(["native"] if native_available() else [])])
def test_a_tokenizer_pickles_and_copies_as_itself(engine: str, sample_texts: Path) -> None:
    """The native encoder cannot be pickled: pickle and deepcopy failed, and so did ``datasets.map``'s
    hashing of a function using the tokenizer and spawned workers receiving it."""
    import copy  # reason: only this test copies
    import pickle  # reason: only this test pickles

    specials = ["<|endoftext|>", "<|pad|>"]
    vocab, merges = superbpe.train_superbpe(sample_texts / "corpus.en", 600, 300, specials)
    tok = Tokenizer(vocab, merges, specials, pretokenizer="superbpe", engine=engine)
    tok._roles = {"bos_token": "<|pad|>", "eos_token": "<|endoftext|>"}
    text = "Hello, world.<|endoftext|> And then<|pad|> some more of it."
    for other in (pickle.loads(pickle.dumps(tok)), copy.deepcopy(tok), copy.copy(tok)):
        assert other.encode(text) == tok.encode(text)
        assert (other.vocab, other.merges) == (tok.vocab, tok.merges) and other.special_tokens == specials
        assert (other.pretokenizer, other.engine, other.whole_pieces) == (tok.pretokenizer, engine, True)
        assert other.roles == tok.roles and repr(other) == repr(tok)


def test_a_tokenizer_pickled_without_the_settings_kept_since_still_loads(sample_texts: Path) -> None:
    """A pickle holds the state ``__reduce__`` gave when it was made: one made before the transformers
    settings and plain added tokens were kept has fewer fields, and unpickling it raised a TypeError."""
    import pickle  # reason: only this test pickles

    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 300, ["<|endoftext|>"])
    tok = Tokenizer(vocab, merges, ["<|endoftext|>"])
    rebuild, state = tok.__reduce__()
    older = pickle.loads(pickle.dumps(_Reduced(rebuild, state[:9])))
    assert older.encode("Hello<|endoftext|>") == tok.encode("Hello<|endoftext|>")
    assert dict(older.transformers_settings) == {} and older.plain_added_tokens == []


class _Reduced:
    """Pickles as ``rebuild(*state)``: a stand-in for a tokenizer pickled with a shorter state."""

    def __init__(self, rebuild: Any, state: tuple[Any, ...]) -> None:
        self.rebuild, self.state = rebuild, state

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.rebuild, self.state


def test_a_merges_file_cut_short_is_said_when_its_unmade_tokens_become_specials(
    tmp_path: Path, sample_texts: Path
) -> None:
    """Tokens no merge makes are taken as special tokens: a merges.txt cut short made thousands of them,
    which then cut ordinary text out as specials, without a word."""
    import warnings  # reason: only this test records warnings

    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 900, ["<|endoftext|>"])
    Tokenizer(vocab, merges, ["<|endoftext|>"]).save(tmp_path / "whole")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Tokenizer.from_files(tmp_path / "whole" / "vocab.json", tmp_path / "whole" / "merges.txt")
    lines = (tmp_path / "whole" / "merges.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "merges.txt").write_text("".join(lines[:100]), encoding="utf-8")
    with pytest.warns(UserWarning, match=r"tokens that no merge of .*merges.txt makes are taken as special"):
        Tokenizer.from_files(tmp_path / "whole" / "vocab.json", tmp_path / "merges.txt")
