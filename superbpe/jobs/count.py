"""Counting and encoding as shard tasks on an executor (local processes or a Ray cluster).

Counting: each task counts one shard with the configured engine and pattern and returns its table in
the ``.counts`` byte format; the driver adds each table into one running total as soon as it arrives
(streaming add), so it holds the total plus at most a window of shard tables, never all of them.
Addition is exact and order-free, so the total equals a local count byte for byte.

Encoding: each task encodes one shard into its own token file (written under a temporary name and
renamed when complete, so a retried task just rewrites it). The driver writes ``index.json`` last:
a directory without it is not a finished encoding. The shard files concatenated in index order are
exactly the single-file output of :func:`superbpe.token_files.encode_corpus`.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from superbpe.config import CompatConfig
from superbpe.counting import PieceCounts, ProgressFn, _CountJob, counts_meta, prepare_count
from superbpe.engine import Engine, get_engine
from superbpe.errors import ConfigError, InputError, SuperBPEError
from superbpe.evaluate import EVAL_CHUNK_BYTES, EvalResult, _Tally, add_chunks
from superbpe.executor import Executor, ExecutorSpec, get_executor, spec_from
from superbpe.pretokenize import Pretokenizer
from superbpe.shards import (
    Shard,
    check_sampleable,
    first_line_of,
    plan_shards,
    sample_evenly,
    shard_chunks,
    with_true_line_numbers,
)
from superbpe.sources import DEFAULT_CHUNK_BYTES, Chunk, InputSpec, chunk_documents, resolve_inputs
from superbpe.token_files import (
    EncodeResult,
    _ChunkEncoder,
    _separator_id,
    choose_dtype,
    tokenizer_hash,
)
from superbpe.tokenizer import Tokenizer
from superbpe.util import atomic_write_text

INDEX_NAME = "index.json"
INDEX_FORMAT = "superbpe-token-shards"
_MIN_SHARD_BYTES = 1 << 20
#: Blocks of a sampled count: small, so that a fraction of them spreads over the whole corpus.
SAMPLE_BLOCK_BYTES = 1 << 20
#: Units a sampled block is split into for the counting threads (a block is one read).
_SAMPLE_UNIT_BYTES = 1 << 18


# ----------------------------------------------------------------------------------------- counting


def count_corpus(
    engine: Engine,
    executor: Any,
    inputs: InputSpec,
    pretokenizer: Pretokenizer,
    special_tokens: Iterable[str],
    *,
    sample: float | None = None,
    workers: int | None = None,
    errors: str = "strict",
    text_field: str = "text",
    progress: ProgressFn | None = None,
) -> PieceCounts:
    """``engine.count`` with executor ``local`` (unchanged), shard tasks with any other executor; with
    ``sample`` (a fraction below 1), the approximate count of :func:`count_sample`."""
    spec = spec_from(executor)
    if sample is not None and sample < 1:
        return count_sample(
            inputs, pretokenizer, special_tokens, sample, executor=spec, engine=engine.name, errors=errors,
            text_field=text_field, workers=workers, progress=progress,
        )  # fmt: skip
    if spec.name == "local":
        return engine.count(
            inputs, pretokenizer, special_tokens, workers=workers, errors=errors, text_field=text_field,
            progress=progress,
        )  # fmt: skip
    return count_on_executor(
        inputs, pretokenizer, special_tokens, executor=spec, engine=engine.name, errors=errors,
        text_field=text_field, workers=workers, progress=progress,
    )  # fmt: skip


def count_on_executor(
    inputs: InputSpec,
    pretokenizer: str | Pretokenizer,
    special_tokens: Iterable[str],
    *,
    executor: Any = None,
    engine: str = "auto",
    errors: str = "strict",
    text_field: str = "text",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    workers: int | None = None,
    progress: ProgressFn | None = None,
) -> PieceCounts:
    """Piece counts of a corpus, counted shard by shard on ``executor`` (a config, spec or name).

    Identical to ``get_engine(engine).count(...)`` on the same inputs.
    """
    spec = spec_from(executor)
    pre, specials, paths = prepare_count(inputs, pretokenizer, special_tokens, errors)
    engine_name = get_engine(engine, [pre]).name  # the choice a local count makes (engine.get_engine)
    meta = counts_meta(pre, specials)
    threads = spec.num_cpus_per_task
    task = (pre, tuple(specials), engine_name, errors, text_field, chunk_bytes, chunk_bytes, threads)
    runner = get_executor(spec, workers)
    try:
        size = shard_size(spec, runner, paths)
        shards = plan_shards(paths, specials, size, line_cuts=pre.safe_cuts_hold)
        total = _CountSum(engine_name, meta)
        for number, table in runner.run(count_task, [((shard,), *task) for shard in shards]):
            total.add(table)
            if progress:
                progress(shards[number].size())
        return total.result()
    finally:
        runner.close()


def count_sample(
    inputs: InputSpec,
    pretokenizer: str | Pretokenizer,
    special_tokens: Iterable[str],
    fraction: float,
    *,
    executor: Any = None,
    engine: str = "auto",
    errors: str = "strict",
    text_field: str = "text",
    workers: int | None = None,
    progress: ProgressFn | None = None,
) -> PieceCounts:
    """Approximation: the piece counts of an evenly spread ``fraction`` of the corpus.

    The corpus is cut into blocks of about :data:`SAMPLE_BLOCK_BYTES` where chunks may end (so every
    piece counted is one the whole count has, with no piece cut in two), and
    :func:`~superbpe.shards.sample_evenly` keeps ``fraction`` of them. Which blocks count depends on the
    files and the fraction only, never on the executor or the number of workers; a local count and one
    on any executor are identical.
    """
    spec = spec_from(executor)
    pre, specials, paths = prepare_count(inputs, pretokenizer, special_tokens, errors)
    check_sampleable(paths)
    engine_name = get_engine(engine, [pre]).name
    blocks = plan_shards(paths, specials, SAMPLE_BLOCK_BYTES, line_cuts=pre.safe_cuts_hold)
    kept = sample_evenly(blocks, fraction)
    if progress:
        progress(sum(block.size() for block in blocks) - sum(block.size() for block in kept))
    task = (pre, tuple(specials), engine_name, errors, text_field, SAMPLE_BLOCK_BYTES)
    if spec.name == "local":
        from superbpe.native_engine import thread_count

        return count_shards(kept, *task, _SAMPLE_UNIT_BYTES, thread_count(workers), progress=progress)
    runner = get_executor(spec, workers)
    try:
        groups = _grouped(kept, shard_size(spec, runner, paths))
        total = _CountSum(engine_name, counts_meta(pre, specials))
        arguments = [(group, *task, _SAMPLE_UNIT_BYTES, spec.num_cpus_per_task) for group in groups]
        for number, table in runner.run(count_task, arguments):
            total.add(table)
            if progress:
                progress(sum(block.size() for block in groups[number]))
        return total.result()
    finally:
        runner.close()


def _grouped(blocks: Sequence[Shard], group_bytes: int) -> list[tuple[Shard, ...]]:
    """Consecutive blocks in tasks of at least ``group_bytes`` (the last may be smaller)."""
    groups: list[tuple[Shard, ...]] = []
    current: list[Shard] = []
    size = 0
    for block in blocks:
        current.append(block)
        size += block.size()
        if size >= group_bytes:
            groups.append(tuple(current))
            current, size = [], 0
    if current:
        groups.append(tuple(current))
    return groups


def count_task(shards: tuple[Shard, ...], *task: Any) -> bytes:
    """One task: the piece counts of its shards (one, or a sampled count's blocks) in the ``.counts``
    format, which both engines write alike; ``task`` is :func:`count_shards`'s other arguments."""
    return count_shards(shards, *task).to_bytes()


def shard_size(spec: ExecutorSpec, runner: Executor, paths: Sequence[Path]) -> int:
    """``shard_bytes``, or smaller so that a small corpus still gives every task slot about four shards
    (a 100 MB file in 128 MB shards would be one task). Shards never change results, only balance."""
    total = sum(p.stat().st_size for p in paths)
    return max(1, min(spec.shard_bytes, max(_MIN_SHARD_BYTES, total // (4 * runner.parallelism))))


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
    meta = counts_meta(pre, specials)

    def chunks_of(shards: Sequence[Shard], first_line: Callable[[Shard], int]) -> Iterator[Chunk]:
        for shard in shards:
            yield from shard_chunks(
                shard, specials, chunk_bytes, line_cuts=pre.safe_cuts_hold, first_line=first_line(shard)
            )
            if progress:
                progress(shard.size())

    def count(first_line: Callable[[Shard], int]) -> PieceCounts:
        chunks = chunks_of(shards, first_line)
        if engine == "native":
            return _count_native(chunks, pre, specials, errors, text_field, unit_bytes, threads, meta)
        counter = _CountJob(pre, specials, errors, text_field).count_serial(chunks, None)
        return PieceCounts({piece.encode("utf-8"): n for piece, n in counter.items()}, meta)

    try:
        return count(lambda _: 1)
    except InputError:
        # Line numbers of JSON-lines shards that start inside their file are only right when counted
        # from the file's start; that read is paid on the error path alone.
        if not any(shard.jsonl and shard.start > 0 for shard in shards):
            raise
    return count(first_line_of)


def _count_native(
    chunks: Iterable[Chunk],
    pre: Pretokenizer,
    specials: tuple[str, ...],
    errors: str,
    text_field: str,
    unit_bytes: int,
    threads: int,
    meta: dict[str, Any],
) -> PieceCounts:
    from superbpe import native_engine

    lib = native_engine._require_native()
    counter = lib.Counter(
        pre.pattern, pre.line_units, [s.encode("utf-8") for s in specials], unit_bytes, threads
    )
    for chunk in chunks:
        if chunk.jsonl:
            counter.count_docs(list(chunk_documents(chunk, errors, text_field)))
            continue
        try:
            counter.count_bytes(chunk.data, errors == "replace")
        except lib.InvalidUtf8 as exc:
            raise InputError(f"{chunk.path}: invalid UTF-8 at byte {chunk.offset + exc.args[0]}") from None
    return native_engine.NativePieceCounts(counter.take(), meta)


class _CountSum:
    """The running total of shard tables (in Rust for the native engine)."""

    def __init__(self, engine: str, meta: dict[str, Any]) -> None:
        self.meta = meta
        self.native = engine == "native"
        self.table: Any = None
        self.counts = PieceCounts(meta=meta)

    def add(self, data: bytes) -> None:
        if self.native:
            from superbpe import native_engine

            _, table = native_engine._require_native().NativeCounts.parse(data)
            if self.table is None:
                self.table = table
            else:
                self.table.update(table)
            return
        self.counts.update(PieceCounts.from_bytes(data))

    def result(self) -> PieceCounts:
        if not self.native:
            return self.counts
        from superbpe import native_engine

        lib = native_engine._require_native()
        return native_engine.NativePieceCounts(
            self.table if self.table is not None else lib.NativeCounts(), self.meta
        )


# ----------------------------------------------------------------------------------------- encoding


@dataclass
class ShardEntry:
    """One token file of a sharded encoding, as listed in ``index.json``."""

    file: str
    tokens: int
    documents: int  # documents that end in this shard
    continues_document: bool  # its first token belongs to a document begun in the previous shard
    ends_inside_document: bool  # its last document goes on in the next shard
    source: str
    start: int
    end: int | None


@dataclass
class ShardedEncodeResult(EncodeResult):
    """What a single-file encode reports, plus the shard files in order (this is ``index.json``)."""

    shards: list[ShardEntry]
    format: str = INDEX_FORMAT
    format_version: int = 1


_TOKENIZERS: dict[tuple[str, str, str, str], Tokenizer] = {}


def _cached_tokenizer(
    directory: str, engine: str, fingerprint: str, compat: str | CompatConfig | None
) -> Tokenizer:
    """The tokenizer, loaded once per worker process (a worker runs many shards of one job)."""
    key = (directory, engine, fingerprint, repr(compat))
    if key not in _TOKENIZERS:
        _TOKENIZERS.clear()
        _TOKENIZERS[key] = Tokenizer.load(directory, engine=engine, compat=compat)
    return _TOKENIZERS[key]


def shard_file_name(number: int) -> str:
    return f"shard-{number:06d}.bin"


def encode_sharded(
    tokenizer_dir: str | os.PathLike[str],
    inputs: InputSpec,
    output_dir: str | os.PathLike[str],
    *,
    separator: str | None = "<|endoftext|>",
    executor: Any = None,
    workers: int | None = None,
    chunk_bytes: int = 1 << 20,
    text_field: str = "text",
    errors: str = "strict",
    engine: str = "auto",
    progress: bool | None = None,
    compat: str | CompatConfig | None = None,
) -> ShardedEncodeResult:
    """Encode ``inputs`` into one token file per shard under ``output_dir`` plus ``index.json``.

    ``output_dir`` must be new or empty. On any error the files written so far are removed and the
    error is raised; ``index.json`` is written only after every shard is complete.
    """
    from superbpe.progress import task

    spec = spec_from(executor)
    directory = Path(tokenizer_dir)
    tokenizer = Tokenizer.load(directory, engine=engine, compat=compat)
    separator_id = _separator_id(tokenizer, separator)
    paths = resolve_inputs(inputs)
    dtype = choose_dtype(tokenizer)
    fingerprint = tokenizer_hash(directory)
    runner = get_executor(spec, workers)
    try:
        size = shard_size(spec, runner, paths)
        line_cuts = tokenizer.pretokenizer.safe_cuts_hold
        shards = plan_shards(paths, tokenizer.special_tokens, size, line_cuts=line_cuts)
        out, created = _prepare_output_dir(Path(output_dir))
        common = (
            str(directory),
            engine,
            fingerprint,
            compat,
            separator_id,
            text_field,
            errors,
            chunk_bytes,
            str(out),
        )
        tasks = [(shard, number, *common, dtype.name) for number, shard in enumerate(shards)]
        entries: list[ShardEntry | None] = [None] * len(shards)
        try:
            with task("encoding", sum(s.size() for s in shards), "B", enabled=progress) as update:
                for number, entry in runner.run(encode_shard, tasks):
                    entries[number] = entry
                    update(shards[number].size())
            _remove_attempts(out)
            result = _index(
                out,
                entries,
                shards,
                dtype.name,
                separator,
                separator_id,
                tokenizer,
                directory,
                fingerprint,
                paths,
            )
            atomic_write_text(
                out / INDEX_NAME, json.dumps(asdict(result), indent=2, ensure_ascii=False) + "\n"
            )
        except BaseException:
            _remove_output(out, created)
            raise
    finally:
        runner.close()
    return result


def _prepare_output_dir(out: Path) -> tuple[Path, bool]:
    """The output directory, made if missing (True) or existing and empty (False)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} is a file; a sharded encoding needs a new or empty directory")
    if out.is_dir():
        if any(out.iterdir()):
            raise ConfigError(f"output directory {out} is not empty; give a new or empty directory")
        return out, False
    try:
        out.mkdir(parents=True)
    except OSError as exc:
        raise InputError(f"cannot create {out}: {exc.strerror or exc}") from None
    return out, True


def _remove_attempts(out: Path) -> None:
    """Temporary files of task attempts that died (their retries wrote the shard again)."""
    for item in out.glob(".shard-*.tmp"):
        item.unlink(missing_ok=True)


def _remove_output(out: Path, created: bool) -> None:
    """Leave nothing of a failed encoding behind (the directory was new or empty when it began)."""
    if created:
        shutil.rmtree(out, ignore_errors=True)
        return
    for item in out.iterdir():
        if item.is_file():
            item.unlink(missing_ok=True)


def _index(
    out: Path,
    entries: Sequence[ShardEntry | None],
    shards: Sequence[Shard],
    dtype: str,
    separator: str | None,
    separator_id: int | None,
    tokenizer: Tokenizer,
    directory: Path,
    fingerprint: str,
    paths: Sequence[Path],
) -> ShardedEncodeResult:
    done = [e for e in entries if e is not None]
    if len(done) != len(shards):
        raise SuperBPEError(f"{len(shards) - len(done)} shard(s) of {out} were not encoded")
    for previous, entry in zip(done, done[1:], strict=False):
        entry.continues_document = previous.ends_inside_document
    return ShardedEncodeResult(
        str(out),
        dtype,
        sum(e.tokens for e in done),
        sum(e.documents for e in done),
        separator,
        separator_id,
        tokenizer.vocab_size,
        str(directory),
        fingerprint,
        [str(p) for p in paths],
        done,
    )


def encode_shard(
    shard: Shard,
    number: int,
    tokenizer_dir: str,
    engine: str,
    fingerprint: str,
    compat: str | CompatConfig | None,
    separator_id: int | None,
    text_field: str,
    errors: str,
    chunk_bytes: int,
    out_dir: str,
    dtype_name: str,
) -> ShardEntry:
    """One task: the shard's ids into ``out_dir/shard-NNNNNN.bin``, renamed into place only when complete.

    ``continues_document`` needs the previous shard, so the driver fills it in.
    """
    tokenizer = _cached_tokenizer(tokenizer_dir, engine, fingerprint, compat)
    encoder = _ChunkEncoder(tokenizer, separator_id, text_field, errors)
    dtype = np.dtype(dtype_name).newbyteorder("<")
    name = shard_file_name(number)
    final = Path(out_dir) / name
    temp = Path(out_dir) / f".{name}.{uuid.uuid4().hex}.tmp"
    line_cuts = tokenizer.pretokenizer.safe_cuts_hold
    specials = tokenizer.special_tokens

    def encode(first_line: int) -> tuple[int, int, bool]:
        tokens = documents = 0
        last: int | None = None
        with open(temp, "wb") as handle:
            for chunk in shard_chunks(
                shard, specials, chunk_bytes, line_cuts=line_cuts, first_line=first_line
            ):
                ids, ended = encoder.encode(chunk)
                if ids:
                    last = ids[-1]
                    handle.write(np.asarray(ids, dtype=dtype).tobytes())
                tokens += len(ids)
                documents += ended
            open_end = not shard.jsonl and last is not None and last != separator_id
            if shard.last_of_file and open_end:  # a text file ends its last document
                documents += 1
                open_end = False
                if separator_id is not None:
                    handle.write(np.asarray([separator_id], dtype=dtype).tobytes())
                    tokens += 1
        return tokens, documents, open_end

    try:
        tokens, documents, open_end = with_true_line_numbers(shard, encode)
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return ShardEntry(name, tokens, documents, False, open_end, shard.path, shard.start, shard.end)


def read_index(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """``index.json`` of a sharded encoding (an error when the directory holds no finished encoding)."""
    path = Path(directory) / INDEX_NAME
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{directory}: no {INDEX_NAME} (not a finished sharded encoding)") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read ({exc})") from None
    if index.get("format") != INDEX_FORMAT:
        raise InputError(f"{path}: not a superbpe token-shard index")
    return index


def open_shards(directory: str | os.PathLike[str]) -> list[np.ndarray]:
    """The shard token files as read-only memory maps, in order (what a data loader reads)."""
    index = read_index(directory)
    dtype = np.dtype(index["dtype"]).newbyteorder("<")
    arrays: list[np.ndarray] = []
    for entry in index["shards"]:
        path = Path(directory) / entry["file"]
        arrays.append(np.memmap(path, dtype=dtype, mode="r") if entry["tokens"] else np.zeros(0, dtype))
    return arrays


# --------------------------------------------------------------------------------------- evaluation


def evaluate_sharded(
    directory: str | os.PathLike[str],
    inputs: InputSpec,
    *,
    separator: str | None = "<|endoftext|>",
    text_field: str = "text",
    errors: str = "strict",
    engine: str = "auto",
    executor: Any = None,
    workers: int | None = None,
    compat: str | CompatConfig | None = None,
) -> EvalResult:
    """:func:`superbpe.evaluate.evaluate` shard by shard on ``executor``; the same numbers.

    Bytes and tokens add up; a document that spans shards is counted once, by the shard where it ends
    (a shard reports whether its first document end closes a document begun before it).
    """
    spec = spec_from(executor)
    tokenizer_dir = Path(directory)
    tokenizer = Tokenizer.load(tokenizer_dir, engine=engine, compat=compat)
    paths = resolve_inputs(inputs)
    specials = [separator] if separator else []
    fingerprint = tokenizer_hash(tokenizer_dir)
    common = (str(tokenizer_dir), engine, fingerprint, compat, separator, text_field, errors)
    runner = get_executor(spec, workers)
    try:
        size = shard_size(spec, runner, paths)
        shards = plan_shards(paths, specials, size, line_cuts=tokenizer.pretokenizer.safe_cuts_hold)
        parts: list[tuple[int, int, int, bool, bool | None] | None] = [None] * len(shards)
        for number, part in runner.run(evaluate_shard, [(shard, *common) for shard in shards]):
            parts[number] = part
    finally:
        runner.close()
    total_bytes = total_tokens = documents = 0
    open_document = False
    for part in parts:
        assert part is not None
        size, tokens, ended, ends_unknown, open_at_end = part
        total_bytes += size
        total_tokens += tokens
        documents += ended + (ends_unknown and open_document)
        open_document = open_document if open_at_end is None else open_at_end
    return EvalResult([str(p) for p in paths], total_bytes, total_tokens, documents)


def evaluate_shard(
    shard: Shard,
    tokenizer_dir: str,
    engine: str,
    fingerprint: str,
    compat: str | CompatConfig | None,
    separator: str | None,
    text_field: str,
    errors: str,
) -> tuple[int, int, int, bool, bool | None]:
    """One task: (bytes, tokens, documents ended, whether its first end closes an earlier document,
    whether a document is open at its end, None if the shard held neither text nor an end)."""
    tokenizer = _cached_tokenizer(tokenizer_dir, engine, fingerprint, compat)
    line_cuts = tokenizer.pretokenizer.safe_cuts_hold
    specials = [separator] if separator else []

    def tally(first_line: int) -> _Tally:
        result = _Tally(tokenizer, open_document=None)
        chunks = shard_chunks(shard, specials, EVAL_CHUNK_BYTES, line_cuts=line_cuts, first_line=first_line)
        add_chunks(result, chunks, separator, errors, text_field)
        if shard.last_of_file:
            result.end_document()
        return result

    done = with_true_line_numbers(shard, tally)
    return done.bytes, done.tokens, done.documents, done.ends_unknown_document, done.open_document
