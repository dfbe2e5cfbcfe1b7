"""The native engine: the Rust extension ``superbpe._native`` behind the ``Engine`` interface.

This adapter owns everything that must match the python engine *exactly* but is not speed-critical:
argument validation and its error messages, input resolution, JSON-lines parsing and gzip decoding (done
with the very same :mod:`superbpe.core.sources` helpers, so errors and documents are identical), and the
``.counts`` meta. Rust gets only validated data and does the per-byte work with the GIL released.

Counts made here stay in Rust (:class:`NativePieceCounts` keeps the Rust table, and builds a read-only
dict once when Python code reads entries), so ``count`` -> ``train`` never converts millions of pieces to
Python objects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from superbpe.core.counts import (
    PieceCounts,
    ProgressFn,
    bad_piece_count,
    counts_file_to_write,
    counts_meta,
    prepare_count,
    prepare_stream,
    resolve_workers,
)
from superbpe.core.errors import ConfigError, InputError, SuperBPEError
from superbpe.core.memory import CountCeiling, StageMemory, count_over_memory
from superbpe.core.pretokenize import Pretokenizer, get_pretokenizer
from superbpe.core.progress import BuildProgress
from superbpe.core.rules import (
    MergeRules,
    MergesSoFar,
    TrainResult,
    check_replay,
    check_train_args,
)
from superbpe.core.sources import (
    DEFAULT_CHUNK_BYTES,
    Chunk,
    DocumentStream,
    InputSpec,
    check_unchanged,
    chunk_documents,
    cut_while_read,
    document_blocks,
    input_files_state,
    invalid_utf8,
    is_document_stream,
    is_gzipped,
    is_jsonl,
    is_table,
    iter_chunks,
    open_binary,
)
from superbpe.core.types import Merge
from superbpe.core.util import atomic_write, usable_cpus, user_path
from superbpe.core.vocab import check_merge_parts

try:
    from superbpe import _native
except ImportError:  # not built: get_engine("auto") falls back to the python engine
    _native = None  # type: ignore[assignment]

_U64_MAX = (1 << 64) - 1
# A mapped file is counted a window of about this many bytes at a time; each window's pages are
# given back or, for counts that borrow the file, kept as a whole (the counts never depend on it).
MAP_WINDOW_BYTES = 256 << 20
#: Whether numpy's C API is loaded in this process (see ``_load_numpy_api``).
_numpy_api_loaded = False


def available() -> bool:
    """True when the Rust extension is built and importable."""
    return _native is not None


def _require_native() -> Any:
    if _native is None:
        raise ConfigError("engine 'native' is not built; reinstall with `pip install -e .` (needs Rust)")
    return _native


def stop_counts() -> None:
    """Stop every native count running in this process (each raises ``KeyboardInterrupt`` after the
    work unit it is on). A count on the main thread hears Ctrl-C itself; this is for those on other
    threads, such as a SuperBPE run's count of its next stage, which would otherwise be waited for."""
    if _native is not None:
        _native.stop_all_counts()


def _load_numpy_api(core: Any) -> None:
    """Make an encoder's first numpy array now, as it is built, rather than in its first encode.

    rust-numpy loads numpy's C API on the first array it makes, running Python code (numpy's version
    check). A Ctrl-C or SIGTERM that came while Rust encoded with the GIL released is raised inside that
    code, and rust-numpy turns the error into a panic (``PanicException``, a traceback) instead of
    ``KeyboardInterrupt``. Here the interruption stays one, and no later array runs Python code.
    """
    global _numpy_api_loaded
    if _numpy_api_loaded:
        return
    try:
        core.encode_ordinary_array("", "uint16")
    except BaseException as exc:  # PanicException is a BaseException, and not importable by name
        if type(exc).__name__ == "PanicException" and "KeyboardInterrupt" in str(exc):
            raise KeyboardInterrupt from None
        raise
    _numpy_api_loaded = True


def splits_exactly(pre: Pretokenizer) -> bool:
    """Whether the native engine splits with ``pre`` exactly like `regex` does.

    Only the built-in patterns have scanners, fuzz-tested against `regex`. A custom pattern could run
    on fancy-regex, whose syntax and Unicode tables differ from `regex` in corners; no probe text can
    show that it agrees on a whole corpus, so the engine does not use it (see ``get_engine``).
    """
    return bool(_require_native().has_scanner(pre.pattern))


def _require_exact(pre: Pretokenizer) -> None:
    if not splits_exactly(pre):
        raise ConfigError(f"engine 'native' splits only the built-in patterns exactly, not {pre.name}")


def thread_count(workers: int | None) -> int:
    """Threads for Rust: an explicit count wins (validated like the python engine), else every usable core."""
    if workers is not None:
        return resolve_workers(workers, 0)
    return usable_cpus()


class NativePieceCounts(PieceCounts):
    """:class:`PieceCounts` whose entries live in a Rust table, which stays the authority.

    ``len``, ``total``, ``save``, ``update`` with other native counts and training use the table
    directly. Reading entries from Python (``pc[piece]``, iteration) makes a dict once and keeps it
    beside the table, read-only, so reading never costs a rebuild of the table for the next ``train``.
    """

    def __init__(self, native: Any, meta: Mapping[str, Any]) -> None:  # noqa: D107 - see class docstring
        self._native: Any = native
        self._dict: dict[bytes, int] | None = None
        self.meta = dict(meta)

    @property  # type: ignore[override]
    def counts(self) -> Mapping[bytes, int]:
        if self._dict is None:
            with _keys_intact():
                self._dict = self._table().to_dict()
        return MappingProxyType(self._dict)

    def spend(self) -> None:
        """Forget the table: a trainer takes it over and frees it (``train(consume_counts=True)``)."""
        self._native = None
        self._dict = None

    def _table(self) -> Any:
        if self._native is None:
            raise SuperBPEError("these piece counts were handed to a trainer, which freed them")
        return self._native

    @counts.setter
    def counts(self, value: Mapping[bytes, int]) -> None:
        self._native = native_counts(value)
        self._dict = None

    def native(self) -> Any:
        """The Rust table."""
        return self._table()

    def __len__(self) -> int:
        return len(self._table())

    def bytes_seen(self) -> bytes:
        with _keys_intact():
            return bytes(self._native.bytes_seen())

    def total(self) -> int:
        return int(self._table().total())

    def key_bytes(self) -> int:
        """In Rust, without reading the long pieces (their arenas keep the totals)."""
        return int(self._table().key_bytes())

    def update(self, other: PieceCounts) -> None:
        """Add ``other`` in place, in Rust."""
        self.check_addable(other)
        self._table().update(native_counts(dict(other.counts) if other is self else other))
        self._dict = None

    def to_bytes(self) -> bytes:
        """Same bytes as :meth:`PieceCounts.to_bytes`, serialised in Rust."""
        with _keys_intact():
            return bytes(self._table().serialize(self.meta_bytes()))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Same bytes as :meth:`PieceCounts.save`, serialised in Rust and written a chunk at a time: a
        stage 2's counts of gigabytes of text make a file of gigabytes, which whole (and copied into a
        Python ``bytes``) stood beside the table twice over."""
        with _keys_intact(), atomic_write(counts_file_to_write(path)) as out:
            self._table().write_to(out, self.meta_bytes())

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as a plain :class:`PieceCounts` (the Rust table cannot cross processes)."""
        return (PieceCounts, (dict(self.counts), self.meta))


@contextmanager
def _keys_intact() -> Iterator[None]:
    """Counts whose long pieces are left in a mapped file (``borrow_files``) read them there until they
    are freed: a file cut short meanwhile reads as zeros past its cut, and the table refuses to hand
    them out (``FileChanged``), which is this one-line input error."""
    try:
        yield
    except _native.FileChanged as exc:
        raise cut_while_read(exc.args[0], "read") from None


def native_counts(counts: Mapping[bytes, int]) -> Any:
    """A Rust table from any ``bytes -> int`` mapping, after the python trainer's checks."""
    lib = _require_native()
    if isinstance(counts, NativePieceCounts):
        return counts.native()
    plain = counts.counts if isinstance(counts, PieceCounts) else dict(counts)
    for piece, freq in plain.items():
        if (type(piece) is not bytes or type(freq) is not int or freq < 0) and (
            problem := bad_piece_count(piece, freq)
        ) is not None:
            raise problem
        if freq > _U64_MAX:
            raise SuperBPEError(f"piece {piece!r} has a count above 2**64-1: {freq}")
    return lib.NativeCounts.from_dict(plain)


def load_counts(path: str | os.PathLike[str], *, require_checksum: bool = False) -> NativePieceCounts:
    """Read a ``.counts`` file straight into Rust (same format and checks as :meth:`PieceCounts.load`)."""
    try:
        data = user_path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read piece counts ({exc.strerror})") from None
    try:
        return parse_counts(data, require_checksum=require_checksum)
    except ValueError as exc:
        raise InputError(f"{path}: not a valid piece-counts file ({exc})") from None


def parse_counts(data: bytes, *, require_checksum: bool = False) -> NativePieceCounts:
    """The ``.counts`` format in memory, parsed in Rust once its checksum matches (``ValueError`` when
    it is not one; format 1, without a checksum, only when not ``require_checksum``)."""
    meta, table = _require_native().NativeCounts.parse(data, unchecked=not require_checksum)
    return NativePieceCounts(table, json.loads(meta))


class NativeEngine:
    """Counting, training and encoding in Rust; results identical to the python engine."""

    name = "native"
    counts_beside_training = True
    stop_counts = staticmethod(stop_counts)

    def count(
        self,
        inputs: InputSpec,
        pretokenizer: Pretokenizer | str,
        special_tokens: Iterable[str],
        *,
        workers: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        errors: str = "strict",
        text_field: str = "text",
        progress: ProgressFn | None = None,
        borrow_files: bool = False,
        ceiling: CountCeiling | None = None,
    ) -> PieceCounts:
        """With ``borrow_files``, a plain-text file's pieces of 64 bytes or more may stay where they lie
        in its map instead of being copied: window by window (``MAP_WINDOW_BYTES``), when most of the
        window before was such new pieces (a SuperBPE stage 2's distinct lines of web text). Those
        windows' pages stay mapped until the counts are freed, and the files must not change
        meanwhile; the counts are the same either way. ``ceiling`` is checked after each window."""
        if is_document_stream(inputs):
            pre = get_pretokenizer(pretokenizer)
            return self.count_documents(
                inputs, [pre], special_tokens, workers=workers, chunk_bytes=chunk_bytes, errors=errors,
                text_field=text_field, ceiling=ceiling,
            )[0]  # fmt: skip
        pre, specials, paths = prepare_count(inputs, pretokenizer, special_tokens, errors)
        threads = thread_count(workers)
        lib = _require_native()
        _require_exact(pre)
        ceiling = ceiling or CountCeiling()
        counter = lib.Counter(
            pre.pattern, pre.line_units, [s.encode("utf-8") for s in specials], max(1, chunk_bytes), threads,
            ceiling.limit, ceiling.reserve,
        )  # fmt: skip
        before = input_files_state(paths)
        try:
            for path in paths:
                _count_path(counter, path, specials, chunk_bytes, errors, text_field, progress, borrow_files)
        except lib.OverMemory as exc:
            raise count_over_memory(*exc.args) from None
        check_unchanged(paths, before, "counted")
        return NativePieceCounts(counter.take(), counts_meta(pre, specials))

    def count_chunks(
        self,
        chunks: Iterable[Chunk],
        pretokenizer: Pretokenizer,
        special_tokens: Sequence[str],
        *,
        errors: str = "strict",
        text_field: str = "text",
        unit_bytes: int = DEFAULT_CHUNK_BYTES,
        threads: int = 1,
    ) -> PieceCounts:
        """Counts of chunks read elsewhere (a shard's); the counter splits them into units of
        ``unit_bytes`` for its ``threads``."""
        lib = _require_native()
        _require_exact(pretokenizer)
        specials = list(special_tokens)
        counter = lib.Counter(
            pretokenizer.pattern, pretokenizer.line_units, [s.encode("utf-8") for s in specials], unit_bytes,
            threads,
        )  # fmt: skip
        _count_chunks(counter, chunks, errors, text_field, None)
        return NativePieceCounts(counter.take(), counts_meta(pretokenizer, specials))

    def counts_from_bytes(self, data: bytes) -> PieceCounts:
        """A table in the ``.counts`` format (what a shard task sends back), kept in Rust."""
        try:
            return parse_counts(data)
        except ValueError as exc:
            raise InputError(f"not a valid piece-counts table ({exc})") from None

    def count_documents(
        self,
        documents: DocumentStream,
        pretokenizers: Sequence[Pretokenizer],
        special_tokens: Iterable[str] = (),
        *,
        workers: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        errors: str = "strict",
        text_field: str = "text",
        ceiling: CountCeiling | None = None,
    ) -> list[NativePieceCounts]:
        """Count a stream of documents with each of ``pretokenizers`` in one pass (a stream is read once).

        Blocks of about ``chunk_bytes`` characters are counted in Rust on all threads while Python reads
        the next block from the stream (the count releases the GIL), so at most two blocks are held.
        ``ceiling`` is checked after each block.
        """
        specials = prepare_stream(pretokenizers, special_tokens, errors)
        lib = _require_native()
        for pre in pretokenizers:
            _require_exact(pre)
        threads = thread_count(workers)
        encoded = [s.encode("utf-8") for s in specials]
        unit = max(1, chunk_bytes)
        ceiling = ceiling or CountCeiling()
        counters = [
            lib.Counter(pre.pattern, pre.line_units, encoded, unit, threads, ceiling.limit, ceiling.reserve)
            for pre in pretokenizers
        ]

        def count(block: list[str]) -> None:
            for counter in counters:
                counter.count_docs(block)

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="superbpe-count-documents") as pool:
            pending: Future[None] | None = None
            try:
                for block in document_blocks(documents, max(1, chunk_bytes), errors, text_field):
                    if pending is not None:
                        pending.result()
                    pending = pool.submit(count, block)
                if pending is not None:
                    pending.result()
            except lib.OverMemory as exc:
                raise count_over_memory(*exc.args) from None
        return [
            NativePieceCounts(counter.take(), counts_meta(pre, specials))
            for counter, pre in zip(counters, pretokenizers, strict=True)
        ]

    def train(
        self,
        counts: Mapping[bytes, int],
        num_merges: int,
        *,
        rules: MergeRules = MergeRules(),
        replay: Sequence[Merge] = (),
        callback: Callable[[list[Merge]], bool | None] | None = None,
        callback_every: int = 1000,
        build_progress: BuildProgress | None = None,
        check_memory: Callable[[StageMemory], None] | None = None,
        consume_counts: bool = False,
    ) -> TrainResult:
        lib = _require_native()
        check_train_args(num_merges, replay, callback_every, callback=callback)
        table = native_counts(counts)
        replay = list(replay)
        check_replay(replay)
        if check_memory is not None:
            check_memory(StageMemory(*lib.train_memory(table, replay, rules, consume_counts)))
        if consume_counts and isinstance(counts, NativePieceCounts):
            counts.spend()
        with _keys_intact():
            merges, stopped = lib.train(
                table,
                num_merges,
                replay,
                rules,
                None if callback is None else (lambda merges: callback(MergesSoFar(merges))),
                callback_every,
                build_progress,
                consume_counts,
            )
        return TrainResult(merges=merges, stopped=stopped)

    def train_memory(
        self,
        counts: Mapping[bytes, int],
        replay: Sequence[Merge],
        rules: MergeRules = MergeRules(),  # noqa: B008 -- frozen, so a shared default is safe
        consume_counts: bool = False,
    ) -> StageMemory:
        """What building the trainer under ``rules`` will add to this process's memory at its peak
        (estimated; the official rules build differently, see ``native/src/memory/estimate.rs``). Counts
        handed to the trainer (``consume_counts``, as ``train`` takes it) are freed during the
        build, which lowers its peak."""
        lib = _require_native()
        replay = list(replay)
        check_replay(replay)
        return StageMemory(*lib.train_memory(native_counts(counts), replay, rules, consume_counts))

    def encoder(
        self,
        vocab: Mapping[bytes, int],
        merges: Sequence[Merge],
        pretokenizer: Pretokenizer,
        *,
        whole_pieces: bool = True,
        watched: Sequence[str] = (),
    ) -> NativeEncoder:
        return NativeEncoder(vocab, merges, pretokenizer, whole_pieces=whole_pieces, watched=watched)


def _count_path(
    counter: Any,
    path: Path,
    specials: list[str],
    chunk_bytes: int,
    errors: str,
    text_field: str,
    progress: ProgressFn | None,
    borrow: bool = False,
) -> None:
    """One input file: JSON lines via the shared Python reader, gzip decoded here, plain text mmapped
    (its long pieces left in the map with ``borrow``)."""
    if is_jsonl(path) or is_table(path):
        # JSON lines and tables are cut between documents; line_cuts only matters for plain text.
        _count_chunks(counter, iter_chunks(path, specials, chunk_bytes, line_cuts=False), errors, text_field,
                      progress)
        return
    replace = errors == "replace"
    try:
        if is_gzipped(path):
            with open_binary(path) as stream:
                try:
                    data = stream.read()
                except (OSError, EOFError) as exc:
                    raise InputError(f"{path}: cannot read ({exc})") from None
            counter.count_bytes(data, replace)
        else:
            counter.count_file(str(path), replace, MAP_WINDOW_BYTES, borrow)
    except _native.InvalidUtf8 as exc:
        raise invalid_utf8(path, exc.args[0]) from None
    except _native.FileChanged:
        raise cut_while_read(path, "counted") from None
    if progress:
        progress(path.stat().st_size)


def _count_chunks(
    counter: Any, chunks: Iterable[Chunk], errors: str, text_field: str, progress: ProgressFn | None
) -> None:
    """Feed chunks to a Rust counter: documents of JSON lines and tables, bytes of text (an error names
    the byte's offset in its file)."""
    for chunk in chunks:
        if chunk.jsonl:
            counter.count_docs(list(chunk_documents(chunk, errors, text_field)))
        else:
            try:
                counter.count_bytes(chunk.data, errors == "replace")
            except _native.InvalidUtf8 as exc:
                raise invalid_utf8(chunk.path, chunk.offset + exc.args[0]) from None
        if progress:
            progress(chunk.read_bytes)


class NativeEncoder:
    """Rust merge-rank encoder (the native ``EncoderCore``), plus batch encoding into numpy arrays.

    SuperBPE pieces are encoded on two levels where that is exact (docs/DESIGN.md "Encoding"):
    ``levels`` says which was chosen, ``transition`` where, ``levels_reason`` why not.
    ``two_level=False`` asks for one level; ``transition`` replaces the detected transition.
    """

    def __init__(
        self,
        vocab: Mapping[bytes, int],
        merges: Sequence[Merge],
        pretokenizer: Pretokenizer,
        *,
        workers: int | None = None,
        whole_pieces: bool = True,
        two_level: bool = True,
        transition: int | None = None,
        watched: Sequence[str] = (),
    ) -> None:
        lib = _require_native()
        if transition is not None and (type(transition) is not int or transition < 0):
            raise ConfigError(f"transition must be a merge count (an int >= 0), not {transition!r}")
        ids = vocab if type(vocab) is dict else dict(vocab)  # read once below; a 200K copy is not free
        _require_exact(pretokenizer)
        try:
            self._core = lib.Encoder(
                ids,
                merges if type(merges) is list else list(merges),
                pretokenizer.pattern,
                pretokenizer.line_units,
                0 if workers is None else resolve_workers(workers, 0),  # 0: rayon's own default
                whole_pieces,
                two_level,
                transition,
                [token.encode("utf-8") for token in watched],
            )
        except ValueError as exc:  # the core refuses a merge whose parts or result are not tokens: name it
            check_merge_parts(ids, merges)
            for rank, (left, right) in enumerate(merges):
                if left + right not in ids:
                    shown = f"merge #{rank} ({left!r}, {right!r})"
                    raise ConfigError(f"{shown} makes a token not in the vocab") from None
            raise ConfigError(str(exc)) from None
        _load_numpy_api(self._core)
        # `plain` and `plain_array` are the Rust methods themselves: they never raise for a bad text
        # (they answer None), so there is nothing to translate, and a per-document call is one call.
        self.plain = self._core.plain
        self.plain_array = self._core.plain_array
        # The specials `encode_utf8` was last given, and them as the core takes them.
        self._utf8_specials: tuple[Mapping[str, int] | None, list[tuple[bytes, int]]] = (None, [])

    @property
    def levels(self) -> int:
        """2 when pieces are encoded on two levels, 1 when on one."""
        return int(self._core.levels)

    @property
    def transition(self) -> int | None:
        """Merges below this rank run on the first level (None on one level)."""
        return self._core.transition  # type: ignore[no-any-return]

    @property
    def levels_reason(self) -> str:
        """Why the encoder runs on one level ("" on two)."""
        return str(self._core.levels_reason)

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids of ``text``; special tokens in it are treated as plain text."""
        try:
            return self._core.encode_ordinary(text)
        except UnicodeEncodeError as exc:
            raise _surrogate_error(text, exc) from None
        except ValueError as exc:
            raise _encode_error(exc) from None

    def encode_ordinary_array(self, text: str, dtype: str) -> np.ndarray:
        """``encode_ordinary`` as a numpy array of ``dtype`` (uint16 or uint32), made in Rust."""
        try:
            return self._core.encode_ordinary_array(text, dtype)  # type: ignore[no-any-return]
        except UnicodeEncodeError as exc:
            raise _surrogate_error(text, exc) from None
        except ValueError as exc:
            raise _encode_error(exc) from None

    def plain(self, text: object) -> list[int] | None:
        """``encode_ordinary(text)`` for a str holding none of the ``watched`` special tokens that
        encodes, else None (replaced by the Rust method in ``__init__``)."""
        return self._core.plain(text)  # type: ignore[no-any-return]

    def plain_array(self, text: object, dtype: str) -> np.ndarray | None:
        """``plain`` as a numpy array of ``dtype`` (replaced by the Rust method in ``__init__``)."""
        return self._core.plain_array(text, dtype)  # type: ignore[no-any-return]

    def encode_texts(self, texts: list[str], specials: Mapping[str, int], threads: int) -> list[list[int]]:
        """Ids of each text, special tokens cut out first, encoded in Rust on ``threads`` threads with the
        GIL released; the lists share the encoder's int objects (see ``NativeEncoder`` in Rust)."""
        pairs = [(token.encode("utf-8"), token_id) for token, token_id in specials.items()]
        try:
            return self._core.encode_texts(texts, pairs, threads)
        except UnicodeEncodeError:
            raise _batch_surrogate_error(texts) from None
        except ValueError as exc:
            raise _encode_error(exc) from None

    def encode_texts_flat(
        self, texts: list[str], specials: Mapping[str, int], threads: int, dtype: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """As ``encode_texts``, into one array of ids and ``len(texts) + 1`` int64 offsets, built in Rust
        without a Python int per id."""
        _check_dtype(dtype)
        pairs = [(token.encode("utf-8"), token_id) for token, token_id in specials.items()]
        try:
            return self._core.encode_texts_flat(texts, pairs, threads, dtype)  # type: ignore[no-any-return]
        except UnicodeEncodeError:
            raise _batch_surrogate_error(texts) from None
        except ValueError as exc:
            raise _encode_error(exc) from None

    def encode_utf8(self, data: bytes, specials: Mapping[str, int], dtype: str, replace: bool) -> np.ndarray:
        """As ``encode_texts_flat`` of the one text ``data`` decodes to, without making that str: the
        bytes are checked and encoded in Rust, with the GIL released (but for a short text)."""
        _check_dtype(dtype)
        if specials is not self._utf8_specials[0]:  # a tokenizer passes the same mapping every call
            self._utf8_specials = (specials, [(token.encode("utf-8"), i) for token, i in specials.items()])
        try:
            return self._core.encode_utf8(data, self._utf8_specials[1], dtype, replace)  # type: ignore[no-any-return]
        except UnicodeDecodeError:  # a ValueError too, but the caller's to place in its file
            raise
        except ValueError as exc:
            raise _encode_error(exc) from None

    def encode_batch(self, texts: Sequence[str], dtype: str = "uint32") -> tuple[np.ndarray, np.ndarray]:
        """Encode many texts on all cores: flat ids (``dtype`` uint16/uint32) and each text's end offset."""
        _check_dtype(dtype)
        try:
            return self._core.encode_batch(list(texts), dtype)  # type: ignore[no-any-return]
        except UnicodeEncodeError as exc:
            raise _surrogate_error(str(exc.object), exc) from None
        except ValueError as exc:
            raise _encode_error(exc) from None

    def encode_array(self, text: str, dtype: str = "uint32", chunk_bytes: int = 1 << 20) -> np.ndarray:
        """Ids of one large text as a numpy array, encoded in parallel between safe cuts."""
        _check_dtype(dtype)
        try:
            return self._core.encode_array(text, dtype, chunk_bytes)  # type: ignore[no-any-return]
        except UnicodeEncodeError as exc:
            raise _surrogate_error(text, exc) from None
        except ValueError as exc:
            raise _encode_error(exc) from None


def _check_dtype(dtype: str) -> None:
    if dtype not in ("uint16", "uint32"):
        raise ConfigError(f"dtype must be 'uint16' or 'uint32', not {dtype!r}")


def _encode_error(exc: ValueError) -> InputError:
    """A text the encoder cannot encode (it needs a byte the vocabulary lacks), as an input error."""
    return InputError(str(exc))


def _batch_surrogate_error(texts: Sequence[str]) -> InputError:
    """The python engine's message for the first text of a batch that is not valid Unicode."""
    for index, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return InputError(f"texts[{index}]: {_surrogate_error(text, exc)}")
    return InputError("a text of the batch is not valid Unicode")


def _surrogate_error(text: str, exc: UnicodeEncodeError) -> InputError:
    """The python encoder's message for text that is not valid Unicode."""
    bad = exc.object[exc.start] if isinstance(exc.object, str) else text[exc.start]
    return InputError(f"text has an unpaired surrogate {bad!r} (not UTF-8)")
