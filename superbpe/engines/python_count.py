"""The python engine's counter: the corpus read in chunks and split with `regex`, in worker processes
for large inputs.

Chunks are cut only where pieces cannot cross, and per-worker counts are summed, so the result never
depends on the number of workers or the chunk size.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import signal
from collections import Counter
from collections.abc import Iterable
from typing import Any

from superbpe.core.counts import PieceCounts, ProgressFn, counts_meta, prepare_count, resolve_workers
from superbpe.core.errors import InputError, SuperBPEError
from superbpe.core.pretokenize import Pretokenizer, SpecialSplitter
from superbpe.core.sources import DEFAULT_CHUNK_BYTES, Chunk, InputSpec, chunk_documents, iter_chunks


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
) -> PieceCounts:
    """Pre-tokenize and count a corpus with the python engine.

    The result never depends on ``workers`` or ``chunk_bytes``: chunks are cut only where
    pieces cannot cross, and per-worker counts are summed.
    """
    pre, specials, paths = prepare_count(inputs, pretokenizer, special_tokens, errors)
    chunks = (
        chunk
        for path in paths
        for chunk in iter_chunks(path, specials, chunk_bytes, line_cuts=pre.safe_cuts_hold)
    )
    job = CountJob(pre, tuple(specials), errors, text_field)
    n_workers = resolve_workers(workers, sum(p.stat().st_size for p in paths))
    if n_workers <= 1:
        counter = job.count_serial(chunks, progress)
    else:
        counter = _count_parallel(job, chunks, n_workers, progress)
    return PieceCounts({piece.encode("utf-8"): n for piece, n in counter.items()}, counts_meta(pre, specials))


class CountJob:
    """What a worker needs to count a chunk; small and picklable."""

    def __init__(self, pre: Pretokenizer, specials: tuple[str, ...], errors: str, text_field: str) -> None:
        self.pre = pre
        self.specials = specials
        self.errors = errors
        self.text_field = text_field

    def count_chunk(self, counter: Counter[str], chunk: Chunk, splitter: SpecialSplitter) -> None:
        split = self.pre.split
        for document in chunk_documents(chunk, self.errors, self.text_field):
            for segment in splitter.ordinary_segments(document):
                counter.update(split(segment))

    def count_serial(self, chunks: Iterable[Chunk], progress: ProgressFn | None) -> Counter[str]:
        counter: Counter[str] = Counter()
        splitter = SpecialSplitter(self.specials)
        for chunk in chunks:
            self.count_chunk(counter, chunk, splitter)
            if progress:
                progress(len(chunk.data))
        return counter


def _worker(job: CountJob, tasks: Any, results: Any) -> None:
    """Count chunks until told to stop, then send this worker's whole map back once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (it stops us)
    counter: Counter[str] = Counter()
    splitter = SpecialSplitter(job.specials)
    failed = False
    while (chunk := tasks.get()) is not None:
        if failed:
            continue
        try:
            job.count_chunk(counter, chunk, splitter)
            results.put(("progress", len(chunk.data)))
        except SuperBPEError as exc:
            failed = True
            results.put(("error", str(exc)))
        except Exception as exc:  # a bug must still end the run with a message
            failed = True
            results.put(("error", f"counting failed in a worker: {exc!r}"))
    results.put(("done", None if failed else dict(counter)))


def _count_parallel(
    job: CountJob, chunks: Iterable[Chunk], n_workers: int, progress: ProgressFn | None
) -> Counter[str]:
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    tasks = ctx.Queue(maxsize=2 * n_workers)
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(job, tasks, results), daemon=True) for _ in range(n_workers)]
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
        return state.collect(len(procs))
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
        self.maps: list[dict[str, int]] = []

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

    def collect(self, n_workers: int) -> Counter[str]:
        done = 0
        while done < n_workers:
            kind, value = self.results.get()
            done += kind == "done"
            self.handle(kind, value)
        if self.error is not None:
            raise InputError(self.error)
        self.maps.sort(key=len, reverse=True)
        counter: Counter[str] = Counter(self.maps[0] if self.maps else {})
        for extra in self.maps[1:]:
            counter.update(extra)
        return counter
