"""One engine interface, two engines behind it.

The ``python`` engine is the readable reference; the ``native`` engine (Rust, ``superbpe._native``)
is the fast one. Both must give byte-identical pieces, counts, merges and ids, so callers choose
by speed only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from superbpe.counting import PieceCounts, ProgressFn, count_pieces
from superbpe.errors import ConfigError
from superbpe.pretokenize import Pretokenizer
from superbpe.sources import DEFAULT_CHUNK_BYTES, InputSpec
from superbpe.trainer import MergeRules, TrainResult, train_merges

Merge = tuple[bytes, bytes]
MergeCallback = Callable[[Sequence[Merge]], "bool | None"]
ENGINE_NAMES = ("python", "native", "auto")


@runtime_checkable
class EncoderCore(Protocol):
    """Turns text with no special tokens in it into ids."""

    def encode_ordinary(self, text: str) -> list[int]: ...


class Engine(Protocol):
    """Counting, training and encoding: the three places where speed matters."""

    name: str

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
    ) -> PieceCounts: ...

    def train(
        self,
        counts: PieceCounts,
        num_merges: int,
        *,
        rules: MergeRules = MergeRules(),
        replay: Sequence[Merge] = (),
        callback: MergeCallback | None = None,
        callback_every: int = 1000,
    ) -> TrainResult: ...

    def encoder(
        self,
        vocab: Mapping[bytes, int],
        merges: Sequence[Merge],
        pretokenizer: Pretokenizer,
        *,
        whole_pieces: bool = True,
    ) -> EncoderCore: ...


class PythonEngine:
    """The pure-Python reference engine: `regex` pre-tokenization, process-parallel counting."""

    name = "python"

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
    ) -> PieceCounts:
        return count_pieces(
            inputs,
            pretokenizer,
            special_tokens,
            workers=workers,
            chunk_bytes=chunk_bytes,
            errors=errors,
            text_field=text_field,
            progress=progress,
        )

    def train(
        self,
        counts: PieceCounts,
        num_merges: int,
        *,
        rules: MergeRules = MergeRules(),
        replay: Sequence[Merge] = (),
        callback: MergeCallback | None = None,
        callback_every: int = 1000,
    ) -> TrainResult:
        return train_merges(
            counts, num_merges, rules=rules, replay=replay, callback=callback, callback_every=callback_every
        )

    def encoder(
        self,
        vocab: Mapping[bytes, int],
        merges: Sequence[Merge],
        pretokenizer: Pretokenizer,
        *,
        whole_pieces: bool = True,
    ) -> EncoderCore:
        from superbpe.encoder import PythonEncoder

        return PythonEncoder(vocab, merges, pretokenizer, whole_pieces=whole_pieces)


def native_available() -> bool:
    """True when the Rust extension was built and imports."""
    try:
        from superbpe import native_engine
    except ImportError:
        return False
    return native_engine.available()


def get_engine(name: str | Engine = "auto") -> Engine:
    """``python``, ``native`` (error when not built) or ``auto`` (native when available)."""
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
    from superbpe.native_engine import NativeEngine

    return NativeEngine()
