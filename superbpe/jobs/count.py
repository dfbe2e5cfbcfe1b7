"""Counting a corpus as shard tasks on an executor (local processes or a Ray cluster), and the sampled
count a stage's ``approx_sample`` asks for.

Each task counts one shard with the configured engine and pattern and returns its table in the
``.counts`` byte format; the driver adds each table into one running total as soon as it arrives
(streaming add), so it holds the total plus at most a window of shard tables, never all of them.
Addition is exact and order-free, so the total equals a local count byte for byte.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from superbpe.core.counts import PieceCounts, ProgressFn, counts_meta, prepare_count
from superbpe.core.errors import InputError
from superbpe.core.memory import CountCeiling
from superbpe.core.pretokenize import Pretokenizer
from superbpe.core.sources import (
    DEFAULT_CHUNK_BYTES,
    Chunk,
    InputSpec,
    check_unchanged,
    input_files_state,
    input_fingerprint,
)
from superbpe.core.util import human_size
from superbpe.engines.interface import Engine, get_engine
from superbpe.engines.native import thread_count
from superbpe.jobs.executors import ExecutorSpec, get_executor, spec_from
from superbpe.jobs.shards import (
    Shard,
    check_sampleable,
    first_line_of,
    group_shards,
    plan_shards,
    sample_evenly,
    shard_chunks,
    shard_size,
)

log = logging.getLogger("superbpe")

#: Blocks of a sampled count: small, so that a fraction of them spreads over the whole corpus.
SAMPLE_BLOCK_BYTES = 1 << 20
#: Units a sampled block is split into for the counting threads (a block is one read).
_SAMPLE_UNIT_BYTES = 1 << 18


def count_corpus(
    engine: Engine,
    executor: ExecutorSpec | str | None,
    inputs: InputSpec,
    pretokenizer: Pretokenizer,
    special_tokens: Iterable[str],
    *,
    sample: float | None = None,
    workers: int | None = None,
    errors: str = "strict",
    text_field: str = "text",
    progress: ProgressFn | None = None,
    borrow_files: bool = False,
    ceiling: CountCeiling | None = None,
) -> PieceCounts:
    """``engine.count`` with executor ``local`` (unchanged, ``borrow_files`` and ``ceiling`` passed on),
    shard tasks with any other executor; with ``sample`` (a fraction below 1), the approximate count of
    :func:`count_sample`. Those two check ``ceiling`` in this process as shards are added
    (:meth:`CountCeiling.watching`)."""
    spec = spec_from(executor)
    watched = CountCeiling.watching(ceiling, progress)
    if sample is not None and sample < 1:
        return count_sample(
            inputs, pretokenizer, special_tokens, sample, executor=spec, engine=engine.name, errors=errors,
            text_field=text_field, workers=workers, progress=watched,
        )  # fmt: skip
    if spec.name == "local":
        return engine.count(
            inputs, pretokenizer, special_tokens, workers=workers, errors=errors, text_field=text_field,
            progress=progress, borrow_files=borrow_files, ceiling=ceiling,
        )  # fmt: skip
    return count_on_executor(
        inputs, pretokenizer, special_tokens, executor=spec, engine=engine.name, errors=errors,
        text_field=text_field, workers=workers, progress=watched,
    )  # fmt: skip


def count_on_executor(
    inputs: InputSpec,
    pretokenizer: str | Pretokenizer,
    special_tokens: Iterable[str],
    *,
    executor: ExecutorSpec | str | None = None,
    engine: str = "auto",
    errors: str = "strict",
    text_field: str = "text",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    workers: int | None = None,
    progress: ProgressFn | None = None,
) -> PieceCounts:
    """Piece counts of a corpus, counted shard by shard on ``executor`` (a spec or a name).

    Identical to ``get_engine(engine).count(...)`` on the same inputs.
    """
    spec = spec_from(executor)
    pre, specials, paths = prepare_count(inputs, pretokenizer, special_tokens, errors)
    engine_name = get_engine(engine, [pre]).name  # the choice a local count makes
    meta = counts_meta(pre, specials)
    threads = spec.num_cpus_per_task
    task = (pre, tuple(specials), engine_name, errors, text_field, chunk_bytes, chunk_bytes, threads)
    runner = get_executor(spec, workers)
    before = input_files_state(paths)
    try:
        size = shard_size(spec.shard_bytes, runner.parallelism, paths)
        shards = plan_shards(paths, specials, size, line_cuts=pre.safe_cuts_hold, pretokenizer=pre)
        total = _CountSum(engine_name, meta)
        with contextlib.closing(runner.run(count_task, [((shard,), *task) for shard in shards])) as results:
            for number, table in results:
                total.add(table)
                if progress:
                    progress(shards[number].size())
        check_unchanged(paths, before, "counted")  # shards are planned from the sizes the files had
        return total.result()
    finally:
        runner.close()


def _sample_blocks(
    paths: Sequence[Path], pre: Pretokenizer, specials: Sequence[str], fraction: float
) -> tuple[list[Shard], list[Shard]]:
    """The corpus's blocks for a sample, and the ``fraction`` of them kept (see :func:`count_sample`)."""
    blocks, kept = _planned_sample(tuple(paths), pre, tuple(specials), fraction, input_fingerprint(paths))
    return list(blocks), list(kept)


@functools.lru_cache(maxsize=8)
def _planned_sample(
    paths: tuple[Path, ...], pre: Pretokenizer, specials: tuple[str, ...], fraction: float, identity: str
) -> tuple[tuple[Shard, ...], tuple[Shard, ...]]:
    """:func:`_sample_blocks`, planned once per corpus (``identity``: its files' sizes and times): finding
    the cuts reads a window of the corpus per block, and a run asks again for its metrics."""
    blocks = plan_shards(paths, specials, SAMPLE_BLOCK_BYTES, line_cuts=pre.safe_cuts_hold, pretokenizer=pre)
    return tuple(blocks), tuple(sample_evenly(blocks, fraction))


def sampled_share(
    paths: Sequence[Path], pre: Pretokenizer, specials: Sequence[str], fraction: float
) -> float:
    """The share of the corpus's bytes that :func:`count_sample` counts for ``fraction``: whole blocks are
    taken, so on a corpus of few blocks it lies far from ``fraction``."""
    blocks, kept = _sample_blocks(paths, pre, specials, fraction)
    return sum(block.size() for block in kept) / max(sum(block.size() for block in blocks), 1)


def count_sample(
    inputs: InputSpec,
    pretokenizer: str | Pretokenizer,
    special_tokens: Iterable[str],
    fraction: float,
    *,
    executor: ExecutorSpec | str | None = None,
    engine: str = "auto",
    errors: str = "strict",
    text_field: str = "text",
    workers: int | None = None,
    progress: ProgressFn | None = None,
) -> PieceCounts:
    """Approximation: the piece counts of an evenly spread ``fraction`` of the corpus.

    The corpus is cut into blocks of about :data:`SAMPLE_BLOCK_BYTES` where chunks may end (so every
    piece counted is one the whole count has, with no piece cut in two), and
    :func:`~superbpe.jobs.shards.sample_evenly` keeps ``fraction`` of them. Which blocks count depends on the
    files and the fraction only, never on the executor or the number of workers; a local count and one
    on any executor are identical.
    """
    spec = spec_from(executor)
    pre, specials, paths = prepare_count(inputs, pretokenizer, special_tokens, errors)
    check_sampleable(paths)
    engine_name = get_engine(engine, [pre]).name
    before = input_files_state(paths)
    blocks, kept = _sample_blocks(paths, pre, specials, fraction)
    # What was counted: a small corpus (few blocks) can put it far from ``fraction``.
    whole, taken = sum(block.size() for block in blocks), sum(block.size() for block in kept)
    share = taken / max(whole, 1)
    log.info(
        "sample: %d of %d blocks, %s of %s (%.3g%%)", len(kept), len(blocks), human_size(taken),
        human_size(whole), 100 * share,
    )  # fmt: skip
    if abs(share - fraction) > max(0.05, fraction / 5):  # two runs with other shares may count the same
        log.warning(
            "sample: %.3g%% of the corpus counted for a share of %.3g%%: it has only %d blocks of about %s, "
            "and a sample takes whole blocks", 100 * share, 100 * fraction, len(blocks),
            human_size(SAMPLE_BLOCK_BYTES),
        )  # fmt: skip
    if progress:
        progress(whole - taken)
    task = (pre, tuple(specials), engine_name, errors, text_field, SAMPLE_BLOCK_BYTES)
    if spec.name == "local":
        counts = count_shards(kept, *task, _SAMPLE_UNIT_BYTES, thread_count(workers), progress=progress)
        check_unchanged(paths, before, "counted")  # blocks are planned from the sizes the files had
        return counts
    runner = get_executor(spec, workers)
    try:
        groups = group_shards(kept, shard_size(spec.shard_bytes, runner.parallelism, paths))
        total = _CountSum(engine_name, counts_meta(pre, specials))
        arguments = [(group, *task, _SAMPLE_UNIT_BYTES, spec.num_cpus_per_task) for group in groups]
        for number, table in runner.run(count_task, arguments):
            total.add(table)
            if progress:
                progress(sum(block.size() for block in groups[number]))
        check_unchanged(paths, before, "counted")
        return total.result()
    finally:
        runner.close()


def count_task(shards: tuple[Shard, ...], *task: Any) -> bytes:
    """One task: the piece counts of its shards (one, or a sampled count's blocks) in the ``.counts``
    format, which both engines write alike; ``task`` is :func:`count_shards`'s other arguments."""
    return count_shards(shards, *task).to_bytes()


def count_shards(
    shards: Sequence[Shard],
    pre: Pretokenizer,
    specials: tuple[str, ...],
    engine: str,
    errors: str,
    text_field: str,
    chunk_bytes: int,
    unit_bytes: int,
    threads: int,
    *,
    progress: ProgressFn | None = None,
) -> PieceCounts:
    """The piece counts of ``shards`` together (one shard, or the blocks of a sampled count): read in
    chunks of ``chunk_bytes``, which the native counter splits into units of ``unit_bytes`` for its
    ``threads``."""

    def chunks_of(shards: Sequence[Shard], first_line: Callable[[Shard], int]) -> Iterator[Chunk]:
        for shard in shards:
            yield from shard_chunks(
                shard, specials, chunk_bytes, line_cuts=pre.safe_cuts_hold, first_line=first_line(shard)
            )
            if progress:
                progress(shard.size())

    def count(first_line: Callable[[Shard], int]) -> PieceCounts:
        return get_engine(engine).count_chunks(
            chunks_of(shards, first_line), pre, specials, errors=errors, text_field=text_field,
            unit_bytes=unit_bytes, threads=threads,
        )  # fmt: skip

    try:
        return count(lambda _: 1)
    except InputError:
        # Line numbers of JSON-lines shards that start inside their file are only right when counted
        # from the file's start; that read is paid on the error path alone.
        if not any(shard.jsonl and shard.start > 0 for shard in shards):
            raise
    return count(first_line_of)


class _CountSum:
    """The running total of shard tables, in the engine's own table (in Rust for the native engine)."""

    def __init__(self, engine: str, meta: dict[str, Any]) -> None:
        self.engine = get_engine(engine)
        self.meta = meta
        self.total: PieceCounts | None = None

    def add(self, data: bytes) -> None:
        part = self.engine.counts_from_bytes(data)
        if self.total is None:
            self.total = part
        else:
            self.total.update(part)

    def result(self) -> PieceCounts:
        if self.total is None:  # no shard: an empty table of the same engine and tag
            return self.engine.counts_from_bytes(PieceCounts(meta=self.meta).to_bytes())
        return self.total
