"""The native engine: the Rust extension ``superbpe._native`` behind the ``Engine`` interface.

This adapter owns everything that must match the python engine *exactly* but is not speed-critical:
argument validation and its error messages, input resolution, JSON-lines parsing and gzip decoding (done
with the very same :mod:`superbpe.sources` helpers, so errors and documents are identical), and the
``.counts`` meta. Rust gets only validated data and does the per-byte work with the GIL released.

Counts made here stay in Rust (:class:`NativePieceCounts` materialises the Python dict only when someone
reads it), so ``count`` -> ``train`` never converts millions of pieces to Python objects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from superbpe.counting import (
    PieceCounts,
    ProgressFn,
    count_pieces,
    counts_meta,
    prepare_count,
    resolve_workers,
)
from superbpe.errors import ConfigError, InputError, SuperBPEError
from superbpe.pretokenize import Pretokenizer
from superbpe.sources import (
    DEFAULT_CHUNK_BYTES,
    InputSpec,
    chunk_documents,
    is_jsonl,
    is_table,
    iter_chunks,
    open_binary,
)
from superbpe.trainer import MergeRules, MergesSoFar, TrainResult, check_replay, check_train_args
from superbpe.util import atomic_write

try:
    from superbpe import _native
except ImportError:  # not built: get_engine("auto") falls back to the python engine
    _native = None  # type: ignore[assignment]

Merge = tuple[bytes, bytes]
_U64_MAX = (1 << 64) - 1
_GZIP_MAGIC = b"\x1f\x8b"


def available() -> bool:
    """True when the Rust extension is built and importable."""
    return _native is not None


def _require_native() -> Any:
    if _native is None:
        raise ConfigError("engine 'native' is not built; reinstall with `pip install -e .` (needs Rust)")
    return _native


# Text that exercises most regex features a custom pattern may use: cases, scripts, digits,
# whitespace kinds, punctuation runs, contractions, emoji.
_PROBE = (
    "Hello, World! It's DON'T we'll 2024-01-02 3.14159 1,234,567 naïve café Ωμέγα Привет мир 中文字 한국어 "
    "العربية १२३ ½ Ⅻ e\u0301 \t tab  two  \n\n\r\nline\u3000ideo\u00a0nbsp x...y --z // #tag @user 😀👍🏽 "
    "snake_case CamelCase ALLCAPS a1b2 \x00\x1f The quick brown fox jumps over the lazy dog. end"
)
_SAMPLE_BYTES = 1 << 16


def splits_like_regex(pre: Pretokenizer, sample: str = "") -> bool:
    """Whether the native splitter gives the python pieces for ``pre``.

    Built-in patterns have exact scanners (fuzz-tested). A custom pattern runs on fancy-regex,
    whose syntax and Unicode tables differ from `regex` in corners (e.g. it reads `{e<=1}` as
    literal text), so it is used only when it compiles *and* splits a probe text plus ``sample``
    (the start of the corpus) exactly like `regex`; otherwise the caller falls back to Python.
    """
    lib = _require_native()
    if lib.has_scanner(pre.pattern):
        return True
    if not lib.supports_pattern(pre.pattern):
        return False
    probe = _PROBE + sample
    try:
        return bool(lib.pretokenize(pre.pattern, pre.line_units, probe) == pre.split(probe))
    except ValueError:
        return False


def _corpus_sample(paths: Sequence[Path]) -> str:
    """The first bytes of the first input as text (for checking a custom pattern)."""
    try:
        with open_binary(paths[0]) as stream:
            return stream.read(_SAMPLE_BYTES).decode("utf-8", "ignore")
    except (OSError, EOFError, InputError):
        return ""


def _thread_count(workers: int | None) -> int:
    """Threads for Rust: an explicit count wins (validated like the python engine), else every usable core."""
    if workers is not None:
        return resolve_workers(workers, 0)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class NativePieceCounts(PieceCounts):
    """:class:`PieceCounts` whose entries live in Rust until Python code reads them.

    ``len``, ``total``, ``save`` and training use the Rust table directly; any dict access materialises
    ``counts`` once, after which the dict is authoritative (so in-place ``update`` keeps working).
    """

    def __init__(self, native: Any, meta: Mapping[str, Any]) -> None:  # noqa: D107 - see class docstring
        self._native: Any = native
        self._dict: dict[bytes, int] | None = None
        self.meta = dict(meta)

    @property  # type: ignore[override]
    def counts(self) -> dict[bytes, int]:
        if self._dict is None:
            self._dict = self._native.to_dict()
            self._native = None
        return self._dict

    @counts.setter
    def counts(self, value: dict[bytes, int]) -> None:
        self._dict = value
        self._native = None

    def native(self) -> Any:
        """The Rust table (converted from the dict if it was materialised)."""
        if self._native is not None:
            return self._native
        return native_counts(self.counts)

    def __len__(self) -> int:
        return len(self._native) if self._native is not None else len(self.counts)

    def bytes_seen(self) -> bytes:
        return bytes(self._native.bytes_seen()) if self._native is not None else super().bytes_seen()

    def total(self) -> int:
        return int(self._native.total()) if self._native is not None else super().total()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Same bytes as :meth:`PieceCounts.save`, serialised in Rust."""
        if self._native is None:
            super().save(path)
            return
        meta = json.dumps(self.meta, sort_keys=True).encode("utf-8")
        data = self._native.serialize(meta)
        with atomic_write(Path(path)) as out:
            out.write(data)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as a plain :class:`PieceCounts` (the Rust table cannot cross processes)."""
        return (PieceCounts, (self.counts, self.meta))


def native_counts(counts: Mapping[bytes, int]) -> Any:
    """A Rust table from any ``bytes -> int`` mapping, after the python trainer's checks."""
    lib = _require_native()
    if isinstance(counts, NativePieceCounts):
        return counts.native()
    plain = counts.counts if isinstance(counts, PieceCounts) else dict(counts)
    for piece, freq in plain.items():
        if freq < 0:
            raise SuperBPEError(f"piece {piece!r} has a negative count {freq}")
        if freq > _U64_MAX:
            raise SuperBPEError(f"piece {piece!r} has a count above 2**64-1: {freq}")
    return lib.NativeCounts.from_dict(plain)


def load_counts(path: str | os.PathLike[str]) -> NativePieceCounts:
    """Read a ``.counts`` file straight into Rust (same format as :meth:`PieceCounts.load`)."""
    lib = _require_native()
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read piece counts ({exc.strerror})") from None
    try:
        meta, table = lib.NativeCounts.parse(data)
        return NativePieceCounts(table, json.loads(meta))
    except ValueError as exc:
        raise InputError(f"{path}: not a valid piece-counts file ({exc})") from None


class NativeEngine:
    """Counting, training and encoding in Rust; results identical to the python engine."""

    name = "native"

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
    ) -> PieceCounts:
        pre, specials, paths = prepare_count(inputs, pretokenizer, special_tokens, errors)
        threads = _thread_count(workers)
        lib = _require_native()
        if not splits_like_regex(pre, "" if lib.has_scanner(pre.pattern) else _corpus_sample(paths)):
            # A pattern only Python's `regex` handles right: exact results beat speed.
            return count_pieces(
                paths, pre, specials, workers=workers, chunk_bytes=chunk_bytes, errors=errors,
                text_field=text_field, progress=progress,
            )  # fmt: skip
        counter = lib.Counter(
            pre.pattern, pre.line_units, [s.encode("utf-8") for s in specials], max(1, chunk_bytes), threads
        )
        for path in paths:
            _count_path(counter, path, specials, chunk_bytes, errors, text_field, progress)
        return NativePieceCounts(counter.take(), counts_meta(pre, specials))

    def train(
        self,
        counts: Mapping[bytes, int],
        num_merges: int,
        *,
        rules: MergeRules = MergeRules(),
        replay: Sequence[Merge] = (),
        callback: Callable[[list[Merge]], bool | None] | None = None,
        callback_every: int = 1000,
    ) -> TrainResult:
        lib = _require_native()
        check_train_args(num_merges, replay, callback_every)
        table = native_counts(counts)
        replay = list(replay)
        check_replay(replay)
        merges, stopped = lib.train(
            table,
            num_merges,
            replay,
            rules,
            None if callback is None else (lambda merges: callback(MergesSoFar(merges))),
            callback_every,
        )
        return TrainResult(merges=merges, stopped=stopped)

    def encoder(
        self,
        vocab: Mapping[bytes, int],
        merges: Sequence[Merge],
        pretokenizer: Pretokenizer,
        *,
        whole_pieces: bool = True,
    ) -> NativeEncoder:
        return NativeEncoder(vocab, merges, pretokenizer, whole_pieces=whole_pieces)


def _count_path(
    counter: Any,
    path: Path,
    specials: list[str],
    chunk_bytes: int,
    errors: str,
    text_field: str,
    progress: ProgressFn | None,
) -> None:
    """One input file: JSON lines via the shared Python reader, gzip decoded here, plain text mmapped."""
    replace = errors == "replace"
    if is_jsonl(path) or is_table(path):
        # JSON lines and tables are cut between documents; line_cuts only matters for plain text.
        for chunk in iter_chunks(path, specials, chunk_bytes, line_cuts=False):
            counter.count_docs(list(chunk_documents(chunk, errors, text_field)))
            if progress:
                progress(len(chunk.data))
        return
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == _GZIP_MAGIC
    try:
        if gzipped:
            with open_binary(path) as stream:
                try:
                    data = stream.read()
                except (OSError, EOFError) as exc:
                    raise InputError(f"{path}: cannot read ({exc})") from None
            counter.count_bytes(data, replace)
        else:
            counter.count_file(str(path), replace)
    except _native.InvalidUtf8 as exc:
        raise InputError(f"{path}: invalid UTF-8 at byte {exc.args[0]}") from None
    if progress:
        progress(path.stat().st_size)


class NativeEncoder:
    """Rust merge-rank encoder (the native ``EncoderCore``), plus batch encoding into numpy arrays."""

    def __init__(
        self,
        vocab: Mapping[bytes, int],
        merges: Sequence[Merge],
        pretokenizer: Pretokenizer,
        *,
        workers: int | None = None,
        whole_pieces: bool = True,
    ) -> None:
        lib = _require_native()
        ids = dict(vocab)
        for rank, (left, right) in enumerate(merges):
            if left + right not in ids:
                raise ConfigError(f"merge #{rank} ({left!r}, {right!r}) makes a token not in the vocab")
        self._fallback = None
        if not splits_like_regex(pretokenizer):
            from superbpe.encoder import PythonEncoder

            self._fallback = PythonEncoder(ids, merges, pretokenizer, whole_pieces=whole_pieces)
            return
        self._core = lib.Encoder(
            ids,
            list(merges),
            pretokenizer.pattern,
            pretokenizer.line_units,
            _thread_count(workers),
            whole_pieces,
        )

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids of ``text``; special tokens in it are treated as plain text."""
        if self._fallback is not None:
            return self._fallback.encode_ordinary(text)
        try:
            return self._core.encode_ordinary(text)
        except UnicodeEncodeError as exc:
            raise _surrogate_error(text, exc) from None
        except ValueError as exc:
            raise _encode_error(exc) from None

    def encode_batch(self, texts: Sequence[str], dtype: str = "uint32") -> tuple[np.ndarray, np.ndarray]:
        """Encode many texts on all cores: flat ids (``dtype`` uint16/uint32) and each text's end offset."""
        _check_dtype(dtype)
        if self._fallback is not None:
            lists = [self._fallback.encode_ordinary(t) for t in texts]
            ends = np.cumsum([len(ids) for ids in lists], dtype=np.uint64)
            flat = [i for ids in lists for i in ids]
            return _as_dtype(flat, dtype), ends
        try:
            ids, ends = self._core.encode_batch(list(texts), dtype)
        except UnicodeEncodeError as exc:
            raise _surrogate_error(str(exc.object), exc) from None
        except ValueError as exc:
            raise _encode_error(exc) from None
        return np.frombuffer(ids, dtype=np.dtype(dtype).newbyteorder("<")), np.frombuffer(ends, dtype="<u8")

    def encode_array(self, text: str, dtype: str = "uint32", chunk_bytes: int = 1 << 20) -> np.ndarray:
        """Ids of one large text as a numpy array, encoded in parallel between safe cuts."""
        _check_dtype(dtype)
        if self._fallback is not None:
            return _as_dtype(self._fallback.encode_ordinary(text), dtype)
        try:
            ids = self._core.encode_array(text, dtype, chunk_bytes)
        except UnicodeEncodeError as exc:
            raise _surrogate_error(text, exc) from None
        except ValueError as exc:
            raise _encode_error(exc) from None
        return np.frombuffer(ids, dtype=np.dtype(dtype).newbyteorder("<"))


def _check_dtype(dtype: str) -> None:
    if dtype not in ("uint16", "uint32"):
        raise ConfigError(f"dtype must be 'uint16' or 'uint32', not {dtype!r}")


def _as_dtype(ids: list[int], dtype: str) -> np.ndarray:
    if dtype == "uint16" and ids and max(ids) > 0xFFFF:
        raise ConfigError(f"id {max(ids)} does not fit in uint16")
    return np.asarray(ids, dtype=dtype)


def _encode_error(exc: ValueError) -> InputError:
    """A text the encoder cannot encode (it needs a byte the vocabulary lacks), as an input error."""
    return InputError(str(exc))


def _surrogate_error(text: str, exc: UnicodeEncodeError) -> InputError:
    """The python encoder's message for text that is not valid Unicode."""
    bad = exc.object[exc.start] if isinstance(exc.object, str) else text[exc.start]
    return InputError(f"text has an unpaired surrogate {bad!r} (not UTF-8)")
