"""Counting: inputs of every kind, invariance to workers and chunking, and clear errors."""

from __future__ import annotations

import gzip
import json
import logging
import os
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import superbpe.api.tokenizer as tokenizer_module
import superbpe.core.sources as sources_module
from superbpe.api.tokenizer import Tokenizer
from superbpe.core.counts import PieceCounts
from superbpe.core.errors import InputError, SuperBPEError
from superbpe.core.pretokenize import PATTERNS, Pretokenizer, SpecialSplitter, get_pretokenizer
from superbpe.core.sources import iter_chunks, resolve_inputs
from superbpe.engines import native as native_engine
from superbpe.engines.interface import get_engine, native_available
from superbpe.engines.python_count import count_pieces

EOT = "<|endoftext|>"


def direct_counts(text: str, pattern: str = "gpt2", specials: tuple[str, ...] = (EOT,)) -> dict[bytes, int]:
    pre = get_pretokenizer(pattern)
    for special in specials:
        text = text.replace(special, "\0SPLIT\0")
    counter: Counter[bytes] = Counter()
    for segment in text.split("\0SPLIT\0"):
        counter.update(piece.encode() for piece in pre.split(segment))
    return dict(counter)


def test_counts_match_a_direct_count(sample_texts: Path) -> None:
    text = (sample_texts / "corpus.en").read_text()
    counts = count_pieces(sample_texts / "corpus.en", "gpt2", [EOT])
    assert counts.to_dict() == direct_counts(text)
    assert counts.meta["special_tokens"] == [EOT]
    assert counts.meta["pretokenizer"]["name"] == "gpt2"


@pytest.mark.parametrize("pattern", ["gpt2", "superbpe", "superbpe-paper"])
@pytest.mark.parametrize(("workers", "chunk_bytes"), [(1, 97), (2, 1000), (3, 1 << 20)])
def test_same_counts_whatever_workers_or_chunk_size(
    tmp_path: Path, multilingual_text: str, pattern: str, workers: int, chunk_bytes: int
) -> None:
    corpus = tmp_path / "m.txt"
    corpus.write_text(multilingual_text[:150_000])
    expected = direct_counts(multilingual_text[:150_000], pattern)
    counts = count_pieces(corpus, pattern, [EOT], workers=workers, chunk_bytes=chunk_bytes)
    assert counts.to_dict() == expected


def test_chunks_cut_only_at_special_tokens_or_safe_cuts(sample_texts: Path) -> None:
    path = sample_texts / "corpus.en"
    chunks = list(iter_chunks(path, [EOT], 2000, line_cuts=True))
    assert b"".join(c.data for c in chunks) == path.read_bytes()
    assert len(chunks) > 10
    for chunk in chunks[1:]:
        assert chunk.data.startswith(EOT.encode()) or chunk.data[:1] not in b" \t\n\r"


_chunk_parts = st.sampled_from(["a", "b", " ", "  ", "\n", " \n", "\n ", "1", "12", "'s", ".", "/", "\t",
                                "\u00e9", "\u3000", EOT, "<| 1 |>"])


@pytest.mark.parametrize("line_units", [False, True])
@pytest.mark.parametrize("name", sorted(PATTERNS))
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(parts=st.lists(_chunk_parts, max_size=60), size=st.integers(1, 40), window=st.integers(4, 40))
@example(parts=["a", "<| 1 |>", "b"], size=3, window=8)  # a chunk would begin inside the special
@example(parts=["  ", EOT], size=1, window=4)  # a file shorter than the margin a special needs
@example(parts=["<| 1 |>", "a", "a", "a", "\u3000", "<| 1 |>"], size=1, window=4)
def test_chunks_with_the_pretokenizers_cuts_keep_every_piece(
    tmp_path: Path, name: str, line_units: bool, parts: list[str], size: int, window: int
) -> None:
    """A file cut with its pre-tokenizer's cuts (here after a few bytes without a safe cut): every chunk's
    stretches between special tokens split into the pieces of the whole file's stretches."""
    pre = get_pretokenizer(name, line_units=line_units)
    specials = [EOT, "<| 1 |>"]  # the rules would cut inside the second
    splitter = SpecialSplitter(specials)
    text = "".join(parts)
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    original = sources_module.LOCAL_CUT_WINDOW
    sources_module.LOCAL_CUT_WINDOW = window
    try:
        chunks = list(iter_chunks(path, specials, size, line_cuts=pre.safe_cuts_hold, pretokenizer=pre))
    finally:
        sources_module.LOCAL_CUT_WINDOW = original
    assert b"".join(c.data for c in chunks) == text.encode("utf-8")

    def pieces(texts: list[str]) -> list[str]:
        return [piece for t in texts for seg in splitter.ordinary_segments(t) for piece in pre.split(seg)]

    assert pieces([c.data.decode("utf-8") for c in chunks]) == pieces([text])


@pytest.mark.parametrize("size", [1, 2, 3, 5, 1 << 20])
@pytest.mark.parametrize(
    ("text", "specials"),
    [
        ("yy<a><b>x", ["<b>", "<a><b>x"]),  # the shorter special starts inside the longer
        ("z.\nab.\ncd.\n", ["b.\ncd"]),  # a safe line cut inside a special
    ],
)
def test_chunks_never_cut_inside_a_special_token_read_in_part(
    tmp_path: Path, text: str, specials: list[str], size: int
) -> None:
    """A cut is made only once every special token that could straddle it is wholly read: the bytes
    read so far may end inside one."""
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    splitter, pre = SpecialSplitter(specials), get_pretokenizer("gpt2")

    def parts(texts: list[str]) -> list[str]:  # special tokens and pieces, in order
        split = [part for t in texts for part in splitter.split(t)]
        return [piece for seg, special in split for piece in ([seg] if special else pre.split(seg))]

    chunks = list(iter_chunks(path, specials, size, line_cuts=True))
    assert parts([c.data.decode() for c in chunks]) == parts([text])
    counts = count_pieces(path, pre, specials, workers=1, chunk_bytes=size)
    pieces = Counter(p.encode() for seg in splitter.ordinary_segments(text) for p in pre.split(seg))
    assert counts.to_dict() == dict(pieces)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 1 << 20])
@pytest.mark.parametrize("engine", ["python", "native"])
def test_chunks_never_cut_inside_a_special_token_made_of_replaced_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, size: int
) -> None:
    """With errors="replace", a special token holding U+FFFD matches an invalid byte, which a search of the
    raw bytes does not see: a line cut after the newline must not split the token in two."""
    if engine == "native" and not native_available():
        pytest.skip("needs the native engine")
    specials = ["<\n\ufffd>", "\n\ufffd"]
    data = b"ab<\n\xff>cd\nx\n\xffz\n" * 2
    path = tmp_path / "t.txt"
    path.write_bytes(data)
    text = data.decode("utf-8", "replace")
    pre = get_pretokenizer("gpt2")
    segments = SpecialSplitter(specials).ordinary_segments(text)
    pieces = Counter(piece.encode() for segment in segments for piece in pre.split(segment))
    counter = get_engine(engine, [pre])
    counts = counter.count(path, pre, specials, workers=1, chunk_bytes=size, errors="replace")
    assert counts.to_dict() == dict(pieces)
    monkeypatch.setattr(tokenizer_module, "FILE_READ_BYTES", size)
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], specials, pre, engine)
    assert tok.encode_file(path, errors="replace").tolist() == tok.encode(text)


def test_wikitext_lines_come_in_chunks_of_the_size_asked(tmp_path: Path) -> None:
    """Lines ending in " \n" have no safe cut; the pre-tokenizer's own cuts still keep chunks small."""
    path = tmp_path / "w.txt"
    path.write_text(" = Title = \n \n The line , with words . \n \n" * 20_000)
    pre = get_pretokenizer("gpt2")
    assert len(list(iter_chunks(path, [EOT], 1 << 16, line_cuts=True))) == 1
    chunks = list(iter_chunks(path, [EOT], 1 << 16, line_cuts=True, pretokenizer=pre))
    assert len(chunks) > 10 and max(len(c.data) for c in chunks) < (1 << 16) + sources_module.LOCAL_CUT_WINDOW


def test_inputs_list_dir_glob_jsonl_and_gzip(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("hello world\n")
    with gzip.open(tmp_path / "d" / "b.txt.gz", "wt") as handle:
        handle.write("hello there")
    docs = [{"text": "hello jsonl"}, {"text": "world", "id": 2}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    (tmp_path / "d" / "ignored.bin").write_bytes(b"\xff")
    counts = count_pieces([tmp_path / "d", str(tmp_path / "*.jsonl")], "gpt2")
    assert counts.to_dict() == {b"hello": 3, b" world": 1, b"\n": 1, b" there": 1, b" jsonl": 1, b"world": 1}
    assert len(resolve_inputs(tmp_path / "d")) == 2


def test_a_file_named_twice_is_read_once_and_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """However it is spelt (relative, through ``..``, or by an overlapping directory), a file is one input,
    and the repeat is logged: a user who listed it twice to weight it must not believe it was."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("hello world\n")
    named = [tmp_path / "d" / "a.txt", f"{tmp_path}/d/../d/a.txt", tmp_path / "d"]
    with caplog.at_level(logging.WARNING, logger="superbpe"):
        assert resolve_inputs(named) == [tmp_path / "d" / "a.txt"]
    assert "inputs named more than once are read once: " in caplog.text and "d/../d/a.txt" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="superbpe"):
        resolve_inputs([tmp_path / "d"])
    assert not caplog.text


def test_jsonl_documents_are_independent_and_text_field_is_configurable(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps({"body": "a  "}) + "\n" + json.dumps({"body": "b"}) + "\n")
    counts = count_pieces(path, "gpt2", text_field="body", chunk_bytes=8)
    assert counts.to_dict() == {b"a": 1, b"  ": 1, b"b": 1}
    with pytest.raises(InputError, match=r"line 1: no string field 'text' \(its fields: 'body';"):
        count_pieces(path, "gpt2")
    numbered = tmp_path / "numbered.jsonl"
    numbered.write_text('{"text": "a"}\n{"text": 5}\n')
    with pytest.raises(InputError, match=r"numbered.jsonl: line 2: field 'text' holds int, not a string"):
        count_pieces(numbered, "gpt2")
    listed = tmp_path / "list.jsonl"
    listed.write_text('["a", "b"]\n')
    with pytest.raises(InputError, match=r"list.jsonl: line 1: a JSON list, not an object with"):
        count_pieces(listed, "gpt2")


def test_a_json_file_is_read_as_json_lines(tmp_path: Path) -> None:
    """HF datasets' ``to_json`` writes JSON lines named ``.json``: its records are the documents, as in a
    ``.jsonl`` file; a pretty-printed JSON file is refused, saying how ``.json`` is read."""
    records = "".join(json.dumps({"text": t}) + "\n" for t in ["hello json", "world"])
    (tmp_path / "d.json").write_text(records)
    (tmp_path / "d.jsonl").write_text(records)
    as_json = count_pieces(tmp_path / "d.json", "gpt2").to_dict()
    assert as_json == count_pieces(tmp_path / "d.jsonl", "gpt2").to_dict()
    assert as_json == {b"hello": 1, b" json": 1, b"world": 1}
    (tmp_path / "pretty.json").write_text('{\n  "text": "x"\n}\n')
    with pytest.raises(InputError, match=r"pretty.json: line 1: invalid JSON .* read as JSON lines"):
        count_pieces(tmp_path / "pretty.json", "gpt2")
    (tmp_path / "array.json").write_text('[{"text": "x"}, {"text": "y"}]\n')  # one line, one JSON array
    with pytest.raises(InputError, match=r"array.json: line 1: a JSON list, not an .* read as JSON lines"):
        count_pieces(tmp_path / "array.json", "gpt2")


def test_invalid_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"text": oops}\n')
    with pytest.raises(InputError, match=r"bad.jsonl: line 2: invalid JSON"):
        count_pieces(path, "gpt2")


@pytest.mark.parametrize("workers", [1, 2])
def test_invalid_utf8_names_file_and_byte_offset(tmp_path: Path, workers: int) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine text\nmore text\n" * 50 + b"bad \xff byte\n")
    with pytest.raises(InputError, match=r"bad.txt: invalid UTF-8 at byte 1004; data.errors=replace"):
        count_pieces(path, "gpt2", workers=workers, chunk_bytes=64)
    replaced = count_pieces(path, "gpt2", errors="replace")
    assert replaced[" \ufffd".encode()] == 1


@pytest.mark.skipif(not native_engine.available(), reason="superbpe._native is not built")
def test_a_file_found_valid_is_checked_again_once_rewritten(tmp_path: Path) -> None:
    """A file counted whole is not checked for UTF-8 again while unchanged (a SuperBPE run counts it once
    per stage): rewritten in place, the same size, with an invalid byte, it is refused all the same."""
    path = tmp_path / "corpus.txt"
    line = b"a line of text that is long enough\n"
    good = line * (400_000 // len(line))  # mapped, not read whole as a small file is
    path.write_bytes(good)
    engine = native_engine.NativeEngine()
    first = engine.count(path, get_pretokenizer("superbpe-stage1"), [EOT])
    assert engine.count(path, get_pretokenizer("superbpe"), [EOT]).total() == len(good) // len(line)
    bad = bytearray(good)
    bad[300_001] = 0xFF
    time.sleep(0.02)  # past the clock tick of file times on kernels without fine-grained ones
    path.write_bytes(bytes(bad))
    with pytest.raises(InputError, match=r"corpus.txt: invalid UTF-8 at byte 300001"):
        engine.count(path, get_pretokenizer("superbpe"), [EOT])
    assert first.total() > 0


def test_missing_and_empty_inputs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope.txt: no such file or directory"):
        count_pieces(tmp_path / "nope.txt")
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe.txt")
        with pytest.raises(InputError, match=r"pipe.txt: not a regular file \(a pipe or device"):
            resolve_inputs(tmp_path / "pipe.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(InputError, match=r"empty.txt: corpus is empty"):
        count_pieces(empty)
    with pytest.raises(InputError, match="glob matches no files"):
        count_pieces(str(tmp_path / "*.nothing"))
    with pytest.raises(SuperBPEError, match="errors must be"):
        count_pieces(empty, errors="ignore")


def test_save_load_and_sum(tmp_path: Path, sample_texts: Path) -> None:
    a = count_pieces(sample_texts / "tinystories_sample.txt", "gpt2", [EOT])
    b = count_pieces(sample_texts / "german.txt", "gpt2", [EOT])
    a.save(tmp_path / "a.counts")
    loaded = PieceCounts.load(tmp_path / "a.counts")
    assert loaded.to_dict() == a.to_dict() and loaded.meta == a.meta
    both = count_pieces([sample_texts / "tinystories_sample.txt", sample_texts / "german.txt"], "gpt2", [EOT])
    assert (loaded + b).to_dict() == both.to_dict()
    assert (loaded + b).total() == a.total() + b.total()
    other = count_pieces(sample_texts / "german.txt", "o200k", [EOT])
    made = r"differently: pretokenizer gpt2 with special tokens \['<\|endoftext\|>'\] and pretokenizer o200k"
    with pytest.raises(SuperBPEError, match=made):
        a + other
    with pytest.raises(SuperBPEError, match="^piece counts add only to piece counts .* not dict$"):
        a + {b"x": 1}  # type: ignore[operator]
    with pytest.raises(SuperBPEError, match="not dict$"):
        a.update({b"x": 1})  # type: ignore[arg-type]
    assert sum([loaded, b]).to_dict() == both.to_dict()  # type: ignore[attr-defined]
    # The text is cut at the special tokens alike in any order, so such shards add up.
    listed = [EOT, "<|pad|>"]
    named = [("german.txt", listed), ("tinystories_sample.txt", listed[::-1])]
    shards = [count_pieces(sample_texts / name, "gpt2", order) for name, order in named]
    assert (shards[0] + shards[1]).total() == shards[0].total() + shards[1].total()


def test_counts_saved_where_no_file_can_go_are_one_line_errors(
    tmp_path: Path, sample_texts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a file, onto a directory and to "": raw OS errors, one naming the temp file beside the path."""
    text = sample_texts / "tinystories_sample.txt"
    both = [count_pieces(text, "gpt2", [EOT])]
    if native_available():
        both.append(native_engine.NativeEngine().count(text, get_pretokenizer("gpt2"), [EOT]))
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    monkeypatch.chdir(tmp_path)
    for counts in both:
        with pytest.raises(InputError, match="cannot write in afile: it is a file"):
            counts.save("afile/x.counts")
        for directory in ("adir", ""):
            with pytest.raises(InputError, match=f"to '{directory}': it is a directory"):
                counts.save(directory)
    assert sorted(os.listdir(tmp_path)) == ["adir", "afile"] and not os.listdir(tmp_path / "adir")


def test_corrupt_counts_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "x.counts"
    path.write_bytes(b"not counts")
    with pytest.raises(InputError, match="not a valid piece-counts file"):
        PieceCounts.load(path)
    PieceCounts({b"ab": 3, b"c": 1}, {"pretokenizer": {"name": "gpt2"}}).save(path)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(InputError, match=r"x.counts: not a valid .* damaged or cut short"):
        PieceCounts.load(path)


@pytest.mark.parametrize("pattern", ["superbpe", "superbpe-paper", "custom:\\d+"])
@pytest.mark.parametrize("workers", [1, 2])
def test_patterns_whose_pieces_span_lines_are_cut_only_at_specials(
    tmp_path: Path, pattern: str, workers: int
) -> None:
    """Without line units a stage-2 gap ("ab\\ncd") may span a newline, so no safe cut may split it."""
    text = ("ab\ncd 12\nef gh\n" * 40 + EOT) * 30
    corpus = tmp_path / "lines.txt"
    corpus.write_text(text)
    pre = get_pretokenizer(pattern, line_units=False)
    assert not pre.safe_cuts_hold
    counts = count_pieces(corpus, pre, [EOT], workers=workers, chunk_bytes=50)
    assert counts.to_dict() == direct_counts_with(text, pre)
    assert any(b"\n" in piece[:-1] for piece in counts)  # pieces really do span lines here


def direct_counts_with(text: str, pre: Pretokenizer) -> dict[bytes, int]:
    counter: Counter[bytes] = Counter()
    for segment in text.split(EOT):
        counter.update(piece.encode() for piece in pre.split(segment))
    return dict(counter)


class _Sink:
    """A binary file that keeps what is written to it, write by write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.writes.append(bytes(data))
        return len(data)


class _FullDisk:
    def write(self, data: bytes) -> int:
        raise OSError(28, "No space left on device")


@pytest.mark.skipif(not native_engine.available(), reason="superbpe._native is not built")
def test_native_counts_save_the_same_file_a_chunk_at_a_time(tmp_path: Path, sample_texts: Path) -> None:
    """Native counts are written a chunk at a time (a stage 2's file is gigabytes): the same bytes as the
    Python format, whatever the chunk size, of the size ``file_size`` gives; a failed write is raised."""
    text = sample_texts / "tinystories_sample.txt"
    native = native_engine.NativeEngine().count(text, get_pretokenizer("gpt2"), [EOT])
    python = PieceCounts(native.to_dict(), native.meta)
    native.save(tmp_path / "n.counts")
    python.save(tmp_path / "p.counts")
    assert (tmp_path / "n.counts").read_bytes() == (tmp_path / "p.counts").read_bytes() == native.to_bytes()
    # The size a cache entry would have, known without writing it.
    assert native.file_size() == python.file_size() == (tmp_path / "n.counts").stat().st_size
    meta = json.dumps(native.meta, sort_keys=True).encode("utf-8")
    for chunk_bytes in [1, 100, 1 << 20]:
        sink = _Sink()
        native.native().write_to(sink, meta, chunk_bytes)
        assert b"".join(sink.writes) == native.to_bytes()
        assert chunk_bytes > 1 << 16 or len(sink.writes) > 10
    with pytest.raises(OSError, match="No space left"):
        native.native().write_to(_FullDisk(), meta)


def test_file_kinds_are_known_by_name_whatever_its_case(tmp_path: Path) -> None:
    """DOCS.JSONL was counted as text (its JSON syntax as pieces), and A.TXT in a directory left unread."""
    records = "".join(json.dumps({"text": t}) + "\n" for t in ["hello world", "more text here"])
    (tmp_path / "lower.jsonl").write_text(records)
    (tmp_path / "UPPER.JSONL").write_text(records)
    upper, lower = (count_pieces(tmp_path / name).to_dict() for name in ("UPPER.JSONL", "lower.jsonl"))
    assert upper == lower
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "A.TXT").write_text("text")
    assert resolve_inputs([tmp_path / "d"]) == [tmp_path / "d" / "A.TXT"]


def test_linked_directories_are_read_and_links_to_nothing_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory's linked subdirectories were skipped, and its links to nothing (unfetched git-annex
    files), without a word; a glob dropped the directories it matched."""
    (tmp_path / "d").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "d" / "a.txt").write_text("alpha\n")
    (tmp_path / "elsewhere" / "z.txt").write_text("only through the link\n")
    (tmp_path / "d" / "linked").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "d" / "loop").symlink_to(tmp_path / "d")  # read once, not forever
    (tmp_path / "d" / "unfetched.txt").symlink_to(tmp_path / "nowhere.txt")
    with caplog.at_level(logging.WARNING, logger="superbpe"):
        found = resolve_inputs([tmp_path / "d"])
    assert found == [tmp_path / "d" / "a.txt", tmp_path / "d" / "linked" / "z.txt"]
    assert "1 link(s) to nothing not read: unfetched.txt" in caplog.text
    (tmp_path / "g" / "sub").mkdir(parents=True)
    (tmp_path / "g" / "empty").mkdir()
    (tmp_path / "g" / "loose.txt").write_text("x\n")
    (tmp_path / "g" / "sub" / "s.txt").write_text("y\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="superbpe"):
        matched = resolve_inputs([str(tmp_path / "g" / "*")])
    assert matched == [tmp_path / "g" / "loose.txt", tmp_path / "g" / "sub" / "s.txt"]
    assert f"matches {tmp_path / 'g' / 'empty'}, which is not read" in caplog.text
    assert resolve_inputs([str(tmp_path / "g" / "s*")]) == [tmp_path / "g" / "sub" / "s.txt"]


@pytest.mark.parametrize(("kind", "compress"), [("xz", "lzma"), ("bzip2", "bz2")])
def test_files_compressed_other_than_with_gzip_are_refused(tmp_path: Path, kind: str, compress: str) -> None:
    """They were read as text: their invalid UTF-8 pointed to errors=replace, which trained on their bytes."""
    import importlib  # reason: the two compressors are this test's only

    data = importlib.import_module(compress).compress(b"some text to compress\n" * 10)
    (tmp_path / "d").mkdir()
    for path in (tmp_path / "named.txt.x", tmp_path / "d" / "in_a_directory.txt"):
        path.write_bytes(data)
        with pytest.raises(InputError, match=f"compressed with {kind}, which is not read"):
            resolve_inputs([path if path.parent == tmp_path else path.parent])


@pytest.mark.parametrize("engine", ["python", *(["native"] if native_available() else [])])
def test_a_file_that_grows_while_it_is_counted_is_refused(tmp_path: Path, engine: str) -> None:
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("hello world\n" * 100)
    second.write_text("more text\n" * 100)

    def append_once(done: int) -> None:  # another process appending to a.txt while the count runs
        if first.stat().st_size == 1200:
            with first.open("a") as stream:
                stream.write("appended\n")

    with pytest.raises(InputError, match=r"a\.txt: changed while it was counted \(1200 bytes then, 1209 now"):
        get_engine(engine).count([first, second], "gpt2", [EOT], workers=1, progress=append_once)


def test_a_pipe_named_like_a_corpus_file_in_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    os.mkfifo(tmp_path / "b.txt")  # skipped, the corpus would be less than the directory says
    with pytest.raises(InputError, match=r"b\.txt: not a regular file \(a pipe or device cannot be read"):
        resolve_inputs(tmp_path)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_python_count_workers_end_when_their_run_is_killed_outright():
    """Workers whose parent a SIGKILL ended waited for ever (they hold the chunk queue's writing end
    themselves), orphans holding their memory, and the run directory's lock with it."""
    from script_helpers import workers_left_when_killed  # reason: only this test watches processes

    script = (
        "import multiprocessing, time\n"
        "import superbpe.core.util\nimport superbpe.engines.python_count as python_count\n"
        "superbpe.core.util.PARENT_CHECK_SECONDS = 0.05\n"
        "def docs():\n"
        "    yield from ['a few words of text'] * 2000\n"  # more blocks than the queue holds: workers run
        "    print(*[p.pid for p in multiprocessing.active_children()], flush=True)\n"
        "    time.sleep(60)\n"
        "    yield 'never'\n"
        "python_count.count_pieces(docs(), workers=2, chunk_bytes=1000)\n"
    )
    workers, left = workers_left_when_killed(script)
    assert len(workers) == 2
    assert not left
