"""Batch encoding: ``encode_batch``, ``encode_ordinary_batch`` and ``encode_batch_flat`` equal per-text
encoding on both engines and every thread count; bad input fails in one line; threads are what was asked."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from fixture_texts import lines_with_specials
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superbpe import train_bpe
from superbpe.api.tokenizer import Tokenizer
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.util import THREADS_ENV, default_threads, resolve_threads, usable_cpus
from superbpe.engines import native as native_engine

EOT = "<|endoftext|>"
SPECIALS = [EOT, "<|s|>", "<|s|><|s|>"]  # overlapping specials: the longest at a position wins
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
needs_native = pytest.mark.skipif(not native_engine.available(), reason="superbpe._native is not built")


@pytest.fixture(scope="module")
def trained(wikitext_text: str) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """A small tokenizer learned from the WikiText fixture (merges across spaces come from ``superbpe``)."""
    return train_bpe(iter([wikitext_text[:200_000]]), 1200, SPECIALS, pretokenizer="superbpe-stage1")


def tokenizers(trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]]) -> list[Tokenizer]:
    vocab, merges = trained
    engines = ["python", "native"] if native_engine.available() else ["python"]
    return [Tokenizer(vocab, merges, SPECIALS, "superbpe-stage1", engine) for engine in engines]


@pytest.fixture(scope="module")
def documents(wikitext_text: str, multilingual_text: str) -> list[str]:
    """Short documents (WikiText lines, blank ones included), special tokens inside some, a few empty."""
    lines = lines_with_specials(wikitext_text[:400_000], multilingual_text[:100_000], SPECIALS, 37)
    return ["", *lines, "", "<|s|><|s|><|s|>", "x" * 5000]


@pytest.mark.parametrize("threads", [1, 2, 3, None])
def test_batches_equal_encoding_each_text(
    trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]], documents: list[str], threads: int | None
) -> None:
    for tok in tokenizers(trained):
        expected = [tok.encode(text) for text in documents]
        assert tok.encode_batch(documents, threads=threads) == expected, tok.engine
        ordinary = [tok.encode_ordinary(text) for text in documents]
        assert tok.encode_ordinary_batch(iter(documents), threads) == ordinary, tok.engine
        ids, offsets = tok.encode_batch_flat(documents, threads)
        assert ids.dtype == np.uint16 and offsets.dtype == np.int64
        assert offsets[0] == 0 and len(offsets) == len(documents) + 1
        assert [ids[a:b].tolist() for a, b in zip(offsets, offsets[1:], strict=False)] == expected
        flat, ends = tok.encode_batch_flat(documents, threads, ordinary=True, dtype=np.uint32)
        assert flat.dtype == np.uint32
        assert [flat[a:b].tolist() for a, b in zip(ends, ends[1:], strict=False)] == ordinary


def test_engines_agree_on_batches(
    trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]], documents: list[str]
) -> None:
    results = [tok.encode_batch(documents, 2) for tok in tokenizers(trained)]
    if len(results) < 2:
        pytest.skip("superbpe._native is not built")
    assert results[0] == results[1]


_parts = st.sampled_from(["a", " the", "\n", " \n", "<|s|>", "<|", EOT, "1", "\u00e9", "  ", "'s"])
_texts = st.lists(st.lists(_parts, max_size=12).map("".join), max_size=30)


@SETTINGS
@given(texts=_texts, threads=st.integers(1, 3))
def test_random_batches_equal_encoding_each_text(
    trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]], texts: list[str], threads: int
) -> None:
    for tok in tokenizers(trained):
        assert tok.encode_batch(texts, threads) == [tok.encode(t) for t in texts]
        assert tok.encode_ordinary_batch(texts, threads) == [tok.encode_ordinary(t) for t in texts]


def test_empty_batch(trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]]) -> None:
    for tok in tokenizers(trained):
        assert tok.encode_batch([]) == []
        ids, offsets = tok.encode_batch_flat([])
        assert ids.size == 0 and offsets.tolist() == [0]


# -- errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (["ok", 3], r"encode_batch: texts\[1\] is of type int, not str$"),
        (["ok", b"raw"], r"texts\[1\] is of type bytes, not str \(decode bytes to str first\)"),
        ("one text", r"encode_batch takes a list of str, not a str \(encode takes one text\)"),
        (42, r"encode_batch takes a list of str, not int$"),
        (["fine", "bad \ud800 text"], r"texts\[1\]: text has an unpaired surrogate '\\ud800' \(not UTF-8\)"),
    ],
)
def test_bad_batches_fail_in_one_line(
    trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]], texts: object, message: str
) -> None:
    for tok in tokenizers(trained):
        with pytest.raises(InputError, match=message) as caught:
            tok.encode_batch(texts)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize("threads", [0, -1, True, 1.5, "2"])
def test_bad_thread_counts_are_refused(
    trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]], threads: object
) -> None:
    for tok in tokenizers(trained):
        for call in (tok.encode_batch, tok.encode_ordinary_batch, tok.encode_batch_flat):
            with pytest.raises(ConfigError, match=r"^threads must be an integer >= 1, not "):
                call(["text"], threads)  # type: ignore[arg-type]


def test_a_thread_count_far_past_the_cpus_is_refused(
    trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]]
) -> None:
    for tok in tokenizers(trained):
        for call in (tok.encode_batch, tok.encode_ordinary_batch, tok.encode_batch_flat):
            expected = r"^threads=1000000 exceeds the limit of \d+ threads \(4 per CPU"
            with pytest.raises(ConfigError, match=expected):
                call(["text"], 10**6)


@pytest.mark.parametrize("ordinary", ["no", 1, None])
def test_flat_ordinary_must_be_a_bool(
    trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]], ordinary: object
) -> None:
    """A truthy non-bool such as "no" would quietly encode special tokens as plain text."""
    for tok in tokenizers(trained):
        with pytest.raises(ConfigError, match=r"^ordinary must be True or False, not ") as caught:
            tok.encode_batch_flat([EOT], ordinary=ordinary)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value)


def test_flat_dtype_must_hold_the_ids(trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]]) -> None:
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[70_000] = b"ab"
    wide = Tokenizer(vocab, [(b"a", b"b")], engine="python")
    assert wide.encode_batch_flat(["ab"])[0].dtype == np.uint32
    with pytest.raises(ConfigError, match="dtype uint16 cannot hold ids up to 70000"):
        wide.encode_batch_flat(["ab"], dtype=np.uint16)
    for tok in tokenizers(trained):
        with pytest.raises(ConfigError, match="dtype must be uint16 or uint32, not int8"):
            tok.encode_batch_flat(["ab"], dtype=np.int8)
        with pytest.raises(ConfigError, match="dtype must be uint16 or uint32, not no-such-type"):
            tok.encode_batch_flat(["ab"], dtype="no-such-type")


def test_a_text_needing_a_missing_byte_is_named() -> None:
    vocab = {i: bytes([i]) for i in range(256) if i != ord("z")}
    engines = ["python", "native"] if native_engine.available() else ["python"]
    for engine in engines:
        tok = Tokenizer(vocab, [], engine=engine)
        with pytest.raises(InputError, match=r"^texts\[2\]: text needs byte 0x7a, which has no token"):
            tok.encode_batch(["a", "b", "z", "zz"], threads=2)
        # Large enough to be cut into groups on several threads: the first failing text is named,
        # not the first group to fail.
        texts = ["a" * 20_000] * 60
        texts[25], texts[33] = "a z", "z"
        for threads in (1, 2, 3):
            for call in (tok.encode_batch, tok.encode_batch_flat):
                with pytest.raises(InputError, match=r"^texts\[25\]: text needs byte 0x7a"):
                    call(texts, threads)


# -- threads -------------------------------------------------------------------------------------------


def test_default_threads_honour_rayon_num_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert default_threads() == usable_cpus() == resolve_threads(None)
    monkeypatch.setenv(THREADS_ENV, "3")
    assert default_threads() == 3 == resolve_threads(None)
    assert resolve_threads(5) == 5
    monkeypatch.setenv(THREADS_ENV, "0")  # rayon's "choose for me"
    assert default_threads() == usable_cpus()
    for bad in ("many", "-2"):
        monkeypatch.setenv(THREADS_ENV, bad)
        expected = f"^{THREADS_ENV} must be a whole number of threads, not '{bad}'$"
        with pytest.raises(ConfigError, match=expected):
            default_threads()


_COUNT_THREADS = textwrap.dedent(
    """
    import json, os, sys
    from superbpe.api.tokenizer import Tokenizer
    from superbpe.engines.native import NativeEncoder
    from superbpe.core.pretokenize import get_pretokenizer
    threads = lambda: len(os.listdir("/proc/self/task"))
    vocab = {i: bytes([i]) for i in range(256)}
    counts = {"start": threads()}
    tok = Tokenizer(vocab, [], engine="native")  # its encoder's own pool: rayon's default size
    counts["encoder"] = threads()
    texts = ["some text " * 50] * 400
    counts["after"] = []
    for asked in json.loads(sys.argv[1]):
        tok.encode_batch(texts, threads=asked)
        counts["after"].append(threads())
    print(json.dumps(counts))
    """
)


def _threads_started(asked: list[int | None], env: dict[str, str]) -> dict[str, object]:
    """Threads of a fresh process after making a native tokenizer and encoding with each count asked."""
    run = subprocess.run(
        [sys.executable, "-c", _COUNT_THREADS, json.dumps(asked)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(run.stdout)


@needs_native
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_batches_run_on_the_threads_asked_for() -> None:
    """``threads=1`` starts no thread; ``threads=n`` uses the calling thread and a pool of n - 1 helpers (kept
    for the next call of that size); the default and the encoder's own pool follow ``RAYON_NUM_THREADS``."""
    env = {key: value for key, value in os.environ.items() if key != THREADS_ENV}
    counts = _threads_started([1, 3, 3, 1], {**env, THREADS_ENV: "2"})
    start, encoder = counts["start"], counts["encoder"]
    assert encoder == start + 2  # the encoder's own pool honours RAYON_NUM_THREADS
    assert counts["after"] == [encoder, encoder + 2, encoder + 2, encoder + 2]
    counts = _threads_started([None], {**env, THREADS_ENV: "4"})
    assert counts["encoder"] == counts["start"] + 4
    assert counts["after"] == [counts["encoder"] + 3]  # threads=None is RAYON_NUM_THREADS


def test_the_garbage_collector_is_left_as_it_was(
    trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]], documents: list[str]
) -> None:
    """The native engine pauses the collector while it makes lists; it must leave it as it found it."""
    for tok in tokenizers(trained):
        for threads in (1, 2):
            assert gc.isenabled()
            tok.encode_batch(documents, threads)
            assert gc.isenabled()
            gc.disable()
            try:
                tok.encode_batch(documents, threads)
                assert not gc.isenabled()
            finally:
                gc.enable()


def test_batches_from_several_python_threads_at_once(
    trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]], documents: list[str]
) -> None:
    """Calls on one tokenizer from several threads (each with helpers of its own size, or none) agree with
    a call made alone: the encoder and its kept pool are shared safely."""
    for tok in tokenizers(trained):
        expected = tok.encode_batch(documents, 1)
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(tok.encode_batch, documents, threads) for threads in (1, 2, 3, 2, 1, 3)]
            flat = [pool.submit(tok.encode_batch_flat, documents, threads) for threads in (2, 3)]
            assert all(future.result() == expected for future in futures)
            for future in flat:
                ids, offsets = future.result()
                assert [ids[a:b].tolist() for a, b in zip(offsets, offsets[1:], strict=False)] == expected


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_a_batch_like_the_last_writes_its_ids_where_the_last_ones_were(
    trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]], documents: list[str], threads: int
) -> None:
    """An array gives its buffer back whole when it goes (only the pages past its ids were given to the
    system), so the same batch again writes into that buffer instead of taking fresh memory. The texts
    are words that are tokens, several bytes an id, so the ids fill much less than the room a batch
    takes for them."""
    (tok,) = [t for t in tokenizers(trained) if t.engine == "native"]
    vocab, _ = trained
    words = sorted(w.decode() for w in vocab.values() if len(w) >= 5 and w[:1] == b" " and w[1:].isalpha())
    assert len(words) >= 10
    big = ["".join(words[:40]) * 10] * 1000
    assert len(tok.encode(big[0])) * 4 < len(big[0].encode())
    addresses = []
    for _ in range(3):
        ids, _ = tok.encode_batch_flat(big, threads, dtype=np.uint32)
        addresses.append(ids.__array_interface__["data"][0])
        del ids
        gc.collect()
    assert addresses[1] == addresses[2]


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_arrays_keep_their_ids_while_later_batches_reuse_buffers(
    trained: tuple[dict[int, bytes], list[tuple[bytes, bytes]]], documents: list[str], threads: int
) -> None:
    """Large id buffers go back for reuse when their array goes (``memory::spare``): an array still
    alive, or a view of it, keeps its ids however many batches follow, and a reused buffer holds only
    the new batch's ids, even after the array that held it was written to."""
    (tok,) = [t for t in tokenizers(trained) if t.engine == "native"]
    big = documents * 8  # megabytes of ids: buffers large enough to be kept
    want_ids, want_offsets = tok.encode_batch_flat(big, threads, dtype=np.uint32)
    want_ids, want_offsets = want_ids.copy(), want_offsets.copy()
    kept, _ = tok.encode_batch_flat(big, threads, dtype=np.uint32)
    view = kept[len(kept) // 2 :]
    del kept
    for dtype in [np.uint32, np.uint16, np.uint32]:
        ids, offsets = tok.encode_batch_flat(big, threads, dtype=dtype)
        assert np.array_equal(ids, want_ids) and np.array_equal(offsets, want_offsets)
        ids[:] = 7  # written by the caller, then given back
        del ids
        gc.collect()
    assert np.array_equal(view, want_ids[len(want_ids) // 2 :])
    whole = tok.encode_array("".join(big[:2000]), dtype=np.uint32)
    assert whole.tolist() == tok.encode("".join(big[:2000]))
