"""The python engine: the readable reference, `regex` pre-tokenization and process-parallel counting."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from superbpe.core.counts import PieceCounts, counts_meta
from superbpe.core.memory import StageMemory
from superbpe.core.pretokenize import Pretokenizer
from superbpe.core.progress import BuildProgress
from superbpe.core.rules import MergeCallback, MergeRules, TrainResult
from superbpe.core.sources import DEFAULT_CHUNK_BYTES, Chunk
from superbpe.core.types import Merge
from superbpe.engines.python_count import CountJob, count_documents, count_pieces
from superbpe.engines.python_encoder import PythonEncoder
from superbpe.engines.python_trainer import train_merges


class PythonEngine:
    """The pure-Python reference engine: `regex` pre-tokenization, process-parallel counting."""

    name = "python"
    #: The python counter and trainer hold the GIL: a count beside training would only take turns.
    counts_beside_training = False

    #: The python counter already has the interface's signature (files in, ``PieceCounts`` out).
    count = staticmethod(count_pieces)

    def stop_counts(self) -> None:
        """Python counts run on the main thread (or in worker processes it waits for), which hear Ctrl-C."""

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
    ) -> TrainResult:
        """``build_progress`` and ``check_memory`` are not called and ``consume_counts`` is ignored: this
        engine is the reference for small corpora, not for scale (its memory is not estimated)."""
        return train_merges(
            counts, num_merges, rules=rules, replay=replay, callback=callback, callback_every=callback_every
        )

    #: The same for a stream of documents, counted with every pattern in one pass.
    count_documents = staticmethod(count_documents)

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
        """Counts of chunks read elsewhere (a shard's), in this process: ``unit_bytes`` and ``threads``
        are the native counter's and change nothing here."""
        job = CountJob((pretokenizer,), tuple(special_tokens), errors, text_field)
        (counter,) = job.count_serial(chunks, None)
        meta = counts_meta(pretokenizer, special_tokens)
        return PieceCounts({piece.encode("utf-8"): n for piece, n in counter.items()}, meta)

    def counts_from_bytes(self, data: bytes) -> PieceCounts:
        """A table in the ``.counts`` format (what a shard task sends back)."""
        return PieceCounts.from_bytes(data)

    def encoder(
        self,
        vocab: Mapping[bytes, int],
        merges: Sequence[Merge],
        pretokenizer: Pretokenizer,
        *,
        whole_pieces: bool = True,
        watched: Sequence[str] = (),
    ) -> PythonEncoder:
        return PythonEncoder(vocab, merges, pretokenizer, whole_pieces=whole_pieces, watched=watched)
