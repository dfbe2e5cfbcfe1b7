"""The python engine's counter: the corpus read in chunks and split with `regex`, in worker processes
for large inputs.

Chunks are cut only where pieces cannot cross, and per-worker counts are summed, so the result never
depends on the number of workers or the chunk size.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import queue
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from superbpe.core.counts import (
    PARALLEL_MIN_BYTES,
    PieceCounts,
    ProgressFn,
    counts_meta,
    prepare_count,
    prepare_stream,
    resolve_workers,
)
from superbpe.core.errors import InputError, SuperBPEError
from superbpe.core.memory import CountCeiling
from superbpe.core.pretokenize import Pretokenizer, SpecialSplitter, get_pretokenizer
from superbpe.core.sources import (
    DEFAULT_CHUNK_BYTES,
    Chunk,
    DocumentStream,
    InputSpec,
    check_unchanged,
    chunk_documents,
    document_blocks,
    input_files_state,
    is_document_stream,
    iter_chunks,
)
from superbpe.core.util import as_worker_process, end_when_orphaned


def count_pieces(
    inputs: InputSpec,
    pretokenizer: str | Pretokenizer = "gpt2",
    special_tokens: Iterable[str] = (),
    *,
    workers: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    errors: str = "strict",
    text_field: str = "text",
    progress: ProgressFn | None = None,
    borrow_files: bool = False,
    ceiling: CountCeiling | None = None,
) -> PieceCounts:
    """Pre-tokenize and count a corpus with the python engine.

    The result never depends on ``workers`` or ``chunk_bytes``: chunks are cut only where
    pieces cannot cross, and per-worker counts are summed. ``borrow_files`` changes nothing here:
    Python's counts always hold their own keys. ``ceiling`` is checked in this process as chunks are
    counted (:meth:`CountCeiling.watching`; worker processes hold their own tables until the end).
    """
    if is_document_stream(inputs):
        pre = get_pretokenizer(pretokenizer)
        return count_documents(
            inputs, [pre], special_tokens, workers=workers, chunk_bytes=chunk_bytes, errors=errors,
            text_field=text_field, ceiling=ceiling,
        )[0]  # fmt: skip
    pre, specials, paths = prepare_count(inputs, pretokenizer, special_tokens, errors)
    chunks = (
        chunk
        for path in paths
        for chunk in iter_chunks(path, specials, chunk_bytes, line_cuts=pre.safe_cuts_hold)
    )
    job = CountJob((pre,), tuple(specials), errors, text_field)
    n_workers = resolve_workers(workers, sum(p.stat().st_size for p in paths))
    watched = CountCeiling.watching(ceiling, progress)
    before = input_files_state(paths)
    if n_workers <= 1:
        counters = job.count_serial(chunks, watched)
    else:
        counters = _count_parallel(job, chunks, n_workers, watched)
    check_unchanged(paths, before, "counted")
    return _piece_counts(counters[0], pre, specials)


def _piece_counts(counter: Mapping[str, int], pre: Pretokenizer, specials: Iterable[str]) -> PieceCounts:
    return PieceCounts({piece.encode("utf-8"): n for piece, n in counter.items()}, counts_meta(pre, specials))


def count_documents(
    documents: DocumentStream,
    pretokenizers: Sequence[Pretokenizer],
    special_tokens: Iterable[str] = (),
    *,
    workers: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    errors: str = "strict",
    text_field: str = "text",
    ceiling: CountCeiling | None = None,
) -> list[PieceCounts]:
    """Count a stream of documents with each of ``pretokenizers`` in one pass (the python engine).

    A stream can be read only once, so every pattern a schedule needs is counted from the same read.
    Documents go to the workers in blocks of about ``chunk_bytes`` characters, at most two blocks per
    worker in flight, so memory is bounded by the block size and the tables, never by the stream.
    Without ``workers``, a stream that ends within the first few megabytes is counted in this process
    (starting workers would cost more than it saves), a longer one in parallel.
    """
    specials = prepare_stream(pretokenizers, special_tokens, errors)
    blocks = document_blocks(documents, max(1, chunk_bytes), errors, text_field)
    head, rest, size = _stream_head(blocks, PARALLEL_MIN_BYTES if workers is None else 0)
    chunks = (document_chunk(number, block) for number, block in enumerate(itertools.chain(head, rest)))
    job = CountJob(tuple(pretokenizers), tuple(specials), errors, text_field)
    n_workers = resolve_workers(workers, size)
    if n_workers <= 1:
        counters = job.count_serial(chunks, CountCeiling.watching(ceiling, None))
    else:
        counters = _count_parallel(job, chunks, n_workers, CountCeiling.watching(ceiling, None))
    return [_piece_counts(c, pre, specials) for c, pre in zip(counters, pretokenizers, strict=True)]


def _stream_head(
    blocks: Iterator[list[str]], enough: int
) -> tuple[list[list[str]], Iterator[list[str]], int]:
    """The first blocks, up to ``enough`` characters, and the rest; the size is a lower bound (or, when the
    stream ended, exact): what decides whether counting in parallel pays."""
    head: list[list[str]] = []
    size = 0
    for block in blocks:
        head.append(block)
        size += sum(map(len, block))
        if size >= enough:
            return head, blocks, max(size, PARALLEL_MIN_BYTES)
    return head, iter(()), size


def document_chunk(number: int, block: list[str]) -> Chunk:
    """A block of a document stream as a chunk (counted like the records of a JSON-lines file)."""
    return Chunk("<documents>", number, b"", True, documents=tuple(block))


class CountJob:
    """What a worker needs to count a chunk with each pre-tokenizer; small and picklable."""

    def __init__(
        self, pres: tuple[Pretokenizer, ...], specials: tuple[str, ...], errors: str, text_field: str
    ) -> None:
        self.pres = pres
        self.specials = specials
        self.errors = errors
        self.text_field = text_field

    def counters(self) -> list[Counter[str]]:
        return [Counter() for _ in self.pres]

    def count_chunk(self, counters: list[Counter[str]], chunk: Chunk, splitter: SpecialSplitter) -> None:
        for document in chunk_documents(chunk, self.errors, self.text_field):
            for segment in splitter.ordinary_segments(document):
                for pre, counter in zip(self.pres, counters, strict=True):
                    counter.update(pre.split(segment))

    def count_serial(self, chunks: Iterable[Chunk], progress: ProgressFn | None) -> list[Counter[str]]:
        counters = self.counters()
        splitter = SpecialSplitter(self.specials)
        for chunk in chunks:
            self.count_chunk(counters, chunk, splitter)
            if progress:
                progress(chunk.read_bytes)
        return counters


def _worker(job: CountJob, tasks: Any, results: Any, parent: int) -> None:
    """Count chunks until told to stop, then send this worker's whole map back once."""
    as_worker_process(ignore_interrupt=True)  # Ctrl-C is the parent's to handle (it stops us)
    counters = job.counters()
    splitter = SpecialSplitter(job.specials)
    failed = False
    end_when_orphaned(parent)  # killed outright, the parent cannot stop us
    while (chunk := tasks.get()) is not None:
        if failed:
            continue
        try:
            job.count_chunk(counters, chunk, splitter)
            results.put(("progress", chunk.read_bytes))
        except SuperBPEError as exc:
            failed = True
            results.put(("error", str(exc)))
        except Exception as exc:  # a bug must still end the run with a message
            failed = True
            results.put(("error", f"counting failed in a worker: {exc!r}"))
    results.put(("done", None if failed else [dict(counter) for counter in counters]))


def _count_parallel(
    job: CountJob, chunks: Iterable[Chunk], n_workers: int, progress: ProgressFn | None
) -> list[Counter[str]]:
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    tasks = ctx.Queue(maxsize=2 * n_workers)
    results = ctx.Queue()
    args = (job, tasks, results, os.getpid())
    procs = [ctx.Process(target=_worker, args=args, daemon=True) for _ in range(n_workers)]
    for proc in procs:
        proc.start()
    state = _ParallelState(results, progress)
    try:
        for chunk in chunks:
            while not state.failed:
                try:
                    tasks.put(chunk, timeout=0.1)
                    break
                except queue.Full:
                    state.drain()
            state.drain()
            if state.failed:
                break
        for _ in procs:
            tasks.put(None)
        return state.collect(len(procs), len(job.pres))
    except BaseException:  # an error or Ctrl-C: nothing the workers still count is wanted
        for proc in procs:
            proc.kill()
        raise
    finally:
        # Leaving early (an error, Ctrl-C) can leave chunks buffered for workers that are gone; the
        # queue's feeder thread would then block interpreter exit forever trying to flush them.
        tasks.cancel_join_thread()
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()


class _ParallelState:
    """Gathers progress, errors and per-worker maps from the result queue."""

    def __init__(self, results: Any, progress: ProgressFn | None) -> None:
        self.results = results
        self.progress = progress
        self.error: str | None = None
        self.maps: list[list[dict[str, int]]] = []  # per worker: one map per pre-tokenizer

    @property
    def failed(self) -> bool:
        return self.error is not None

    def handle(self, kind: str, value: Any) -> None:
        if kind == "progress" and self.progress:
            self.progress(value)
        elif kind == "error" and self.error is None:
            self.error = value
        elif kind == "done" and value is not None:
            self.maps.append(value)

    def drain(self) -> None:
        while True:
            try:
                self.handle(*self.results.get_nowait())
            except queue.Empty:
                return

    def collect(self, n_workers: int, n_patterns: int) -> list[Counter[str]]:
        done = 0
        while done < n_workers:
            kind, value = self.results.get()
            done += kind == "done"
            self.handle(kind, value)
        if self.error is not None:
            raise InputError(self.error)
        return [_sum_maps([maps[index] for maps in self.maps]) for index in range(n_patterns)]


def _sum_maps(maps: list[dict[str, int]]) -> Counter[str]:
    """The workers' maps added up, starting from the largest (the fewest insertions)."""
    maps.sort(key=len, reverse=True)
    counter: Counter[str] = Counter(maps[0] if maps else {})
    for extra in maps[1:]:
        counter.update(extra)
    return counter
