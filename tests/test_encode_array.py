"""Per-document arrays: ``encode_array`` and ``encode_ordinary_array`` equal ``encode`` and
``encode_ordinary`` on both engines (special tokens, non-ASCII text, empty strings, random texts), in the
dtype asked for; bad input fails as ``encode`` does, a bad dtype as ``encode_batch_flat`` does.
``encode_utf8`` of bytes equals ``encode_array`` of the text they decode to, and fails where decoding does."""

from __future__ import annotations

import array
import ctypes
import mmap
import random
import string
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixture_texts import lines_with_specials
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superbpe import train_bpe
from superbpe.api import tokenizer as tokenizer_module
from superbpe.api.tokenizer import Tokenizer
from superbpe.core.errors import ConfigError, InputError, SuperBPEError
from superbpe.engines import native as native_engine

EOT = "<|endoftext|>"
SPECIALS = [EOT, "<|s|>", "<|s|><|s|>"]  # overlapping specials: the longest at a position wins
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ENGINES = ["python", "native"] if native_engine.available() else ["python"]


@pytest.fixture(scope="module")
def trained(wikitext_text: str) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    return train_bpe(iter([wikitext_text[:200_000]]), 1200, SPECIALS, pretokenizer="gpt2")


@pytest.fixture(scope="module")
def tokenizers(trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]]) -> list[Tokenizer]:
    vocab, merges = trained
    return [Tokenizer(vocab, merges, SPECIALS, "gpt2", engine) for engine in ENGINES]


@pytest.fixture(scope="module")
def documents(wikitext_text: str, multilingual_text: str) -> list[str]:
    """Lines of English and of many scripts, special tokens inside some, empty ones, one long piece."""
    lines = lines_with_specials(wikitext_text[:300_000], multilingual_text[:100_000], SPECIALS, 29)
    return ["", *lines, "<|s|><|s|><|s|>", EOT, "x" * 5000, " " * 33]


def check_equal(tok: Tokenizer, text: str) -> None:
    for dtype in (None, np.uint32):
        array = tok.encode_array(text, dtype)
        assert array.dtype == (np.uint16 if dtype is None else np.uint32)
        assert array.tolist() == tok.encode(text), (tok.engine, text[:80])
        ordinary = tok.encode_ordinary_array(text, dtype)
        assert ordinary.dtype == array.dtype
        assert ordinary.tolist() == tok.encode_ordinary(text), (tok.engine, text[:80])


def test_arrays_equal_lists(tokenizers: list[Tokenizer], documents: list[str]) -> None:
    for tok in tokenizers:
        for _ in range(2):  # cold piece caches, then warm
            for text in documents:
                check_equal(tok, text)


def test_engines_agree(tokenizers: list[Tokenizer], documents: list[str]) -> None:
    if len(tokenizers) < 2:
        pytest.skip("superbpe._native is not built")
    python, native = tokenizers
    for text in documents:
        assert np.array_equal(python.encode_array(text), native.encode_array(text)), text[:80]


_parts = st.sampled_from(
    ["a", " the", "\n", " \n", "<|s|>", "<|", EOT, "1", "\u00e9", "  ", "'s", "\u65e5\u672c", "\t"]
)


@SETTINGS
@given(text=st.lists(_parts, max_size=40).map("".join) | st.text(max_size=200))
def test_random_texts(tokenizers: list[Tokenizer], text: str) -> None:
    for tok in tokenizers:
        check_equal(tok, text)


def check_utf8(tok: Tokenizer, data: bytes) -> None:
    """``encode_utf8(data)`` against ``encode_array`` of what ``bytes.decode`` makes of it, both modes."""
    for dtype in (None, np.uint32):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as expected:
            with pytest.raises(UnicodeDecodeError) as raised:
                tok.encode_utf8(data, dtype)
            assert str(raised.value) == str(expected), data  # the range and the reason
        else:
            got = tok.encode_utf8(data, dtype)
            assert got.dtype == tok.encode_array(text, dtype).dtype
            assert got.tolist() == tok.encode(text), (tok.engine, data[:80])
        replaced = tok.encode_utf8(data, dtype, errors="replace")
        assert replaced.tolist() == tok.encode(data.decode("utf-8", "replace")), (tok.engine, data[:80])


def test_utf8_bytes_encode_as_their_text(tokenizers: list[Tokenizer], documents: list[str]) -> None:
    for tok in tokenizers:
        for text in documents:
            check_utf8(tok, text.encode("utf-8"))
        check_utf8(tok, bytearray(b"a bytearray " + EOT.encode()))
        # Long enough to be encoded with the GIL released, a bad byte deep inside.
        whole = "\n".join(documents).encode("utf-8")
        assert len(whole) > 100_000
        check_utf8(tok, whole)
        check_utf8(tok, whole[:70_000] + b"\xc3(" + whole[70_000:])


_flawed = st.tuples(
    st.lists(_parts, max_size=30).map("".join), st.binary(min_size=1, max_size=4), st.integers(0, 200)
)


@SETTINGS
@given(
    data=st.lists(_parts, max_size=40).map(lambda parts: "".join(parts).encode("utf-8"))
    | st.binary(max_size=200)
    | _flawed.map(lambda t: t[0].encode("utf-8")[: t[2]] + t[1] + t[0].encode("utf-8")[t[2] :])
)
def test_random_bytes_encode_as_their_text(tokenizers: list[Tokenizer], data: bytes) -> None:
    """Valid text, any bytes, and text with a few arbitrary bytes put in (truncated sequences,
    surrogates, overlong forms): the ids, the error's span and the replacements all as decoding has them."""
    for tok in tokenizers:
        check_utf8(tok, data)


def test_encode_utf8_refuses_what_it_cannot_take(tokenizers: list[Tokenizer]) -> None:
    for tok in tokenizers:
        with pytest.raises(InputError, match="^encode_utf8 takes bytes, not str$"):
            tok.encode_utf8("text")  # type: ignore[arg-type]
        with pytest.raises(SuperBPEError, match="^errors must be 'strict' or 'replace', not 'ignore'$"):
            tok.encode_utf8(b"text", errors="ignore")
        with pytest.raises(ConfigError, match="dtype must be uint16 or uint32, not int8"):
            tok.encode_utf8(b"text", np.int8)
    lacking = {i: bytes([i]) for i in range(256) if i != ord("a")}
    for engine in ENGINES:  # one text, so no "texts[0]: " (the python engine encodes it as a batch of one)
        with pytest.raises(InputError, match=r"^text needs byte 0x61, which has no token in the vocabulary$"):
            Tokenizer(lacking, [], engine=engine).encode_utf8(b"bca")


def _byte_buffers(data: bytes, directory: Path) -> dict[str, object]:
    """``data`` as each kind of bytes-like object a caller may hold, by name."""
    path = directory / "text.bin"
    path.write_bytes(data)
    with path.open("rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    return {
        "bytearray": bytearray(data),
        "memoryview": memoryview(data),
        "memoryview slice": memoryview(b"xx" + data)[2:],
        "uint8 array": np.frombuffer(data, np.uint8),
        "int8 array": np.frombuffer(data, np.int8),
        "array.array": array.array("B", data),
        "ctypes": (ctypes.c_ubyte * len(data)).from_buffer_copy(data),
        "mmap": mapped,
    }


def test_encode_utf8_takes_any_contiguous_byte_buffer(tokenizers: list[Tokenizer], tmp_path: Path) -> None:
    """Bytes read into a buffer (a memory-mapped file, a numpy array) encode as those bytes do, on both
    engines alike, and an mmap given is left free to close."""
    data = ("ab cd " + EOT + " \u00e9t\u00e9 <|s|><|s|> \u65e5\u672c\n").encode("utf-8") * 50
    expected = [tok.encode_utf8(data).tolist() for tok in tokenizers]
    assert all(ids == expected[0] for ids in expected)
    buffers = _byte_buffers(data, tmp_path)
    for tok in tokenizers:
        for kind, buffer in buffers.items():
            assert tok.encode_utf8(buffer).tolist() == expected[0], (tok.engine, kind)  # type: ignore[arg-type]
            replaced = tok.encode_utf8(buffer, np.uint32, errors="replace")  # type: ignore[arg-type]
            assert replaced.tolist() == expected[0], (tok.engine, kind)
    buffers["mmap"].close()  # type: ignore[attr-defined]


def test_encode_utf8_refuses_buffers_that_are_not_bytes(tokenizers: list[Tokenizer]) -> None:
    """Wider items or a strided view are not a text's bytes in order; an int would read as zero bytes."""
    not_bytes = "takes a buffer of bytes, not ndarray of format"
    refused = {
        "int32 array": (np.arange(4, dtype=np.int32), not_bytes + r" 'i' \(4-byte items\)"),
        "bool array": (np.zeros(4, bool), not_bytes + r" '\?' \(1-byte items\)"),
        "strided view": (memoryview(b"abcdef")[::2], r"takes a contiguous buffer, not a strided memoryview"),
        "int": (5, r"takes bytes, not int$"),
    }
    for tok in tokenizers:
        for kind, (data, message) in refused.items():
            with pytest.raises(InputError, match="^encode_utf8 " + message) as caught:
                tok.encode_utf8(data)  # type: ignore[arg-type]
            assert "\n" not in str(caught.value), (tok.engine, kind)


@pytest.mark.parametrize("count", [1, tokenizer_module.FEW_SPECIALS + 3])
def test_special_tokens_with_few_or_many(trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]],
                                         count: int) -> None:
    vocab, merges = trained
    specials = [EOT] + [f"<|extra{i}|>" for i in range(count - 1)]
    for engine in ENGINES:
        tok = Tokenizer(vocab, merges, specials, "gpt2", engine)
        text = f"Hello {specials[-1]} world{EOT}"
        assert tok.encode_array(text).tolist() == tok.encode(text)
        assert tok.token_to_id(specials[-1]) in tok.encode_array(text).tolist()
        assert tok.token_to_id(specials[-1]) not in tok.encode_ordinary_array(text).tolist()


def test_dtypes_must_hold_the_ids(tokenizers: list[Tokenizer], tmp_path: Path) -> None:
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[70_000] = b"ab"
    for engine in ENGINES:
        wide = Tokenizer(vocab, [(b"a", b"b")], engine=engine)
        assert wide.encode_array("abc").dtype == np.uint32
        assert wide.encode_array("abc").tolist() == [70_000, ord("c")]
        for method in (wide.encode_array, wide.encode_ordinary_array):
            with pytest.raises(ConfigError, match="dtype uint16 cannot hold ids up to 70000"):
                method("ab", np.uint16)
    for tok in tokenizers:
        for method in (tok.encode_array, tok.encode_ordinary_array):
            with pytest.raises(ConfigError, match="dtype must be uint16 or uint32, not int8"):
                method("ab", np.int8)
            with pytest.raises(ConfigError, match="dtype must be uint16 or uint32, not no-such-type"):
                method("ab", "no-such-type")
        assert tok.encode_array("ab", "uint32").dtype == np.uint32
    # A file's ids take the same dtypes (int64 and float were returned, or failed in numpy).
    text = tmp_path / "ab.txt"
    text.write_text("ab", encoding="utf-8")
    for tok in tokenizers:
        for dtype, said in ((np.int64, "int64"), (float, "float64"), ("no-such-type", "no-such-type")):
            with pytest.raises(ConfigError, match=f"dtype must be uint16 or uint32, not {said}"):
                tok.encode_file(text, dtype)
        assert tok.encode_file(text, "uint32").tolist() == tok.encode("ab")


def test_bad_texts_fail_as_encode_does(tokenizers: list[Tokenizer]) -> None:
    for tok in tokenizers:
        for method in (tok.encode_array, tok.encode_ordinary_array):
            with pytest.raises(InputError, match="decode bytes to str first"):
                method(b"a b")  # type: ignore[arg-type]
            with pytest.raises(InputError, match=r"unpaired surrogate '\\ud800'"):
                method("ok \ud800 no")
    lacking = {i: bytes([i]) for i in range(256) if i != ord("z")}
    for engine in ENGINES:
        tok = Tokenizer(lacking, [], engine=engine)
        for method in (tok.encode_array, tok.encode_ordinary_array):
            with pytest.raises(InputError, match="^text needs byte 0x7a, which has no token"):
                method("a z")


def test_plain_takes_only_plain_texts(trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]]) -> None:
    """The cores' one-call path answers None for anything ``encode`` must look at more closely: not a
    str, a watched special token in it, a lone surrogate, a byte the vocabulary lacks."""
    vocab, merges = trained
    lacking = {i: bytes([i]) for i in range(256) if i != ord("z")}
    for engine in ENGINES:
        tok = Tokenizer(vocab, merges, SPECIALS, "gpt2", engine)
        core = tok._core  # the contract of EncoderCore.plain is what is tested
        text = "plain text \u00e9\u65e5 1234"
        assert core.plain(text) == tok.encode_ordinary(text)
        assert core.plain_array(text, "uint32").tolist() == tok.encode_ordinary(text)
        for bad in (b"bytes", 3, None, f"a {EOT} b", "a <|s|> b", "ok \ud800 no"):
            assert core.plain(bad) is None, (engine, bad)
            assert core.plain_array(bad, "uint16") is None, (engine, bad)
        short = Tokenizer(lacking, [], engine=engine)
        assert short._core.plain("a z") is None
        assert short._core.plain("a b") == [ord("a"), ord(" "), ord("b")]


_INTERRUPTED_ENCODE = """
import signal, sys
from superbpe.api.tokenizer import Tokenizer

tok = Tokenizer.load(sys.argv[1], engine="native")
text = open(sys.argv[2], encoding="utf-8").read()

def stop(signum, frame):
    raise KeyboardInterrupt

signal.signal(signal.SIGALRM, stop)
signal.setitimer(signal.ITIMER_REAL, 0.02)  # comes while Rust encodes, before it makes the array
try:
    tok.encode_ordinary_array(text)
    signal.setitimer(signal.ITIMER_REAL, 0)
    print("not interrupted")
except KeyboardInterrupt:
    print("KeyboardInterrupt")
except BaseException as exc:
    print(type(exc).__name__, str(exc)[:200])
"""


def test_ctrl_c_in_a_first_encode_is_keyboard_interrupt(tokenizers: list[Tokenizer], tmp_path: Path) -> None:
    """The first array a process makes in Rust loads numpy's C API, which runs Python code: a Ctrl-C
    pending from the encode before it came out of that code as a Rust panic (a traceback)."""
    if len(tokenizers) < 2:
        pytest.skip("superbpe._native is not built")
    tokenizers[1].save(tmp_path / "tok")
    text = tmp_path / "text.txt"
    rng = random.Random(0)  # words of random letters: no piece cache makes the cold encode short
    words = ("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(600_000))
    text.write_text(" ".join(words), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_ENCODE, str(tmp_path / "tok"), str(text)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout.strip() == "KeyboardInterrupt", done.stdout + done.stderr[-2000:]
