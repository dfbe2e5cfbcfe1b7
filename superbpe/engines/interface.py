"""One engine interface, two engines behind it.

The ``python`` engine is the readable reference; the ``native`` engine (Rust, ``superbpe._native``)
is the fast one. Both must give byte-identical pieces, counts, merges and ids, so callers choose
by speed only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from superbpe.core.counts import PieceCounts, ProgressFn
from superbpe.core.errors import ConfigError
from superbpe.core.memory import CountCeiling, StageMemory
from superbpe.core.pretokenize import Pretokenizer
from superbpe.core.progress import BuildProgress
from superbpe.core.rules import MergeCallback, MergeRules, TrainResult
from superbpe.core.sources import DEFAULT_CHUNK_BYTES, Chunk, DocumentStream, InputSpec
from superbpe.core.types import Merge
from superbpe.engines import native
from superbpe.engines.python import PythonEngine

ENGINE_NAMES = ("python", "native", "auto")
log = logging.getLogger("superbpe")


@runtime_checkable
class EncoderCore(Protocol):
    """Turns text into ids: one text with no special tokens, or a batch with the given special tokens.

    A batch's ``specials`` maps each special token to its id; they are cut out of every text (leftmost,
    longest there) as ``SpecialSplitter.encode`` does, and ``{}`` treats them as plain text. ``threads``
    (>= 1, resolved by the caller) is how many threads may encode at once; an engine that cannot release
    the GIL encodes on the calling thread. A failing text raises an ``InputError`` that names it as
    ``texts[i]``.
    """

    @property
    def levels(self) -> int:
        """2 when SuperBPE pieces are encoded on two levels (native, where exact), else 1."""
        ...

    def encode_ordinary(self, text: str) -> list[int]: ...

    def encode_ordinary_array(self, text: str, dtype: str) -> np.ndarray:
        """``encode_ordinary`` as a numpy array of ``dtype`` ("uint16" or "uint32", which the caller
        checked holds every id)."""
        ...

    def plain(self, text: object) -> list[int] | None:
        """``encode_ordinary(text)`` when ``text`` is a str holding none of the ``watched`` special tokens
        the encoder was made with; else None, and the caller takes its general path (which raises any
        error). The native engine answers in one call: per-document encoding with no Python around it."""
        ...

    def plain_array(self, text: object, dtype: str) -> np.ndarray | None:
        """``plain`` as a numpy array of ``dtype``."""
        ...

    def encode_texts(
        self, texts: list[str], specials: Mapping[str, int], threads: int
    ) -> list[list[int]]: ...

    def encode_texts_flat(
        self, texts: list[str], specials: Mapping[str, int], threads: int, dtype: str
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def encode_utf8(self, data: bytes, specials: Mapping[str, int], dtype: str, replace: bool) -> np.ndarray:
        """The ids of ``data.decode("utf-8", "replace" if replace else "strict")`` (special tokens in
        ``specials`` cut out first) as one array of ``dtype``; invalid UTF-8 without ``replace`` raises
        the ``UnicodeDecodeError`` that decoding raises."""
        ...


class Engine(Protocol):
    """Counting, training and encoding: the three places where speed matters."""

    name: str
    #: Whether a count may run on another thread while this engine trains (both release the GIL), as
    #: a SuperBPE run's count of its next stage does.
    counts_beside_training: bool

    def stop_counts(self) -> None:
        """Stop every count of this engine running in the process (each raises ``KeyboardInterrupt``);
        for counts on other threads, which do not hear Ctrl-C themselves."""
        ...

    def count(
        self,
        inputs: InputSpec,
        pretokenizer: Pretokenizer,
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
        """Piece counts of files. With ``borrow_files`` an engine may leave long pieces in the files they
        lie in (mapped) rather than copy them: for counts handed straight to a trainer, which must
        not outlive a change to the files. Past ``ceiling`` (checked as the count goes, in the process
        that holds the counts) the count stops with ``MemoryLimitError``."""
        ...

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
    ) -> Sequence[PieceCounts]: ...

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
    ) -> PieceCounts: ...

    def counts_from_bytes(self, data: bytes) -> PieceCounts: ...

    def train(
        self,
        counts: PieceCounts,
        num_merges: int,
        *,
        rules: MergeRules = MergeRules(),
        replay: Sequence[Merge] = (),
        callback: MergeCallback | None = None,
        callback_every: int = 1000,
        build_progress: BuildProgress | None = None,
        check_memory: Callable[[StageMemory], None] | None = None,
        consume_counts: bool = False,
    ) -> TrainResult: ...

    def encoder(
        self,
        vocab: Mapping[bytes, int],
        merges: Sequence[Merge],
        pretokenizer: Pretokenizer,
        *,
        whole_pieces: bool = True,
        watched: Sequence[str] = (),
    ) -> EncoderCore: ...


def native_available() -> bool:
    """True when the Rust extension was built and imports."""
    return native.available()


def get_engine(name: str | Engine = "auto", pretokenizers: Iterable[Pretokenizer] = ()) -> Engine:
    """``python``, ``native`` or ``auto``, for work that splits text with ``pretokenizers``.

    The choice is made once, here, for counting and encoding alike, and never changes behind the
    caller's back: ``native`` splits only with its exact scanners (the built-in patterns), so a
    pattern without one is an error for ``native``, and makes ``auto`` choose ``python`` (logged).
    ``auto`` is ``native`` when the extension is built and every pattern has an exact scanner.
    """
    if not isinstance(name, str):
        return name
    if name not in ENGINE_NAMES:
        raise ConfigError(f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")
    if name == "python" or (name == "auto" and not native_available()):
        return PythonEngine()
    if not native_available():
        raise ConfigError(
            "engine 'native' is not built; reinstall with `pip install -e .` and a Rust toolchain"
        )
    inexact = [pre.name for pre in pretokenizers if not native.splits_exactly(pre)]
    if inexact and name == "native":
        raise ConfigError(
            f"engine 'native' splits only the built-in patterns exactly, not {inexact[0]}; "
            "use engine=python (or engine=auto, which then picks it)"
        )
    if inexact:
        log.info("engine auto: python, since the native engine has no exact splitter for %s", inexact[0])
        return PythonEngine()
    return native.NativeEngine()
