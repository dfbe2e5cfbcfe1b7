"""Encode a corpus into token files for language-model training (:mod:`superbpe.formats.token_files`):
one flat file, or one file per shard on an executor.

Documents: one per ``.jsonl`` line; in text files, documents are separated by the separator special
token where it appears, and every file ends a document (a separator opening a file ends none). The
separator id is written after every document. Files are cut into chunks only before a special token
or at a safe cut, so the ids of a chunked document equal ``Tokenizer.encode`` of the whole document;
chunks go to worker threads (the native engine) or processes (the python engine) with a bounded number
in flight, and results are written in order, so memory stays bounded and the file is the same for any
number of workers.

Sharded: each task encodes one shard into its own token file (written under a temporary name and
renamed when complete, so a retried task just rewrites it); the driver writes ``index.json`` last. The
shard files concatenated in index order are exactly the single flat file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from superbpe.api.tokenizer import Tokenizer, encode_text_chunk, naming_chunk
from superbpe.core.compat import CompatConfig
from superbpe.core.counts import check_errors_mode
from superbpe.core.errors import ConfigError, InputError, SuperBPEError
from superbpe.core.pretokenize import specials_shown
from superbpe.core.progress import task
from superbpe.core.sources import (
    Chunk,
    InputSpec,
    check_unchanged,
    chunk_documents,
    corpus_size,
    input_files_state,
    is_jsonl,
    is_table,
    iter_chunks,
    resolve_inputs,
)
from superbpe.core.util import (
    as_pool_worker,
    atomic_write,
    atomic_write_text,
    default_threads,
    directory_problem,
    handled_stop_signals,
    made_dirs_removed_on_failure,
    missing_dirs,
    remove_empty_dirs,
    remove_stale_temps,
    resolve_threads,
    stop_signals_held,
    user_path,
)
from superbpe.formats.token_files import (
    INDEX_NAME,
    EncodeResult,
    ShardedEncodeResult,
    ShardEntry,
    check_not_token_files,
    is_token_file_sidecar,
    shard_file_name,
    sidecar_path,
    token_dtype,
    tokenizer_hash,
    write_ids,
)
from superbpe.jobs.executors import (
    ExecutorSpec,
    check_executor,
    get_executor,
    in_order,
    spec_from,
    threads_in_order,
)
from superbpe.jobs.shards import Shard, plan_shards, shard_chunks, shard_size, with_true_line_numbers
from superbpe.jobs.tokenizer_cache import load_tokenizer

_PARALLEL_MIN_BYTES = 4 << 20
log = logging.getLogger("superbpe")
_worker_state: dict[str, Any] = {}


class ChunkEncoder:
    """Turns one chunk into ids: what runs on each thread (or worker process, or in-process)."""

    def __init__(
        self, tokenizer: Tokenizer, separator_id: int | None, text_field: str, errors: str, dtype: np.dtype
    ) -> None:
        self.tokenizer = tokenizer
        self.separator_id = separator_id
        self.text_field = text_field
        self.errors = errors
        self.dtype = dtype

    def encode(self, chunk: Chunk) -> tuple[np.ndarray, int]:
        """Ids of the chunk (the token file's dtype) and the number of documents it ends.

        One thread per chunk: the chunks are what runs in parallel, so a batch's own threads would only
        compete with them. The ids never become Python ints (``encode_utf8`` of a text chunk's bytes,
        ``encode_batch_flat`` of a JSON-lines or table chunk's documents).
        """
        if chunk.is_text:  # one text; its separators are special tokens in it
            ids = encode_text_chunk(self.tokenizer, chunk, self.dtype, self.errors)
            ended = 0 if self.separator_id is None else int(np.count_nonzero(ids == self.separator_id))
            if ended and chunk.offset == 0 and ids[0] == self.separator_id:
                # A separator that opens a file ends no document, as one that closes it opens none
                # (superbpe-evaluate counts neither); its id stays in the file, as encode gives it.
                ended -= 1
            return ids, ended
        documents = list(chunk_documents(chunk, self.errors, self.text_field))
        with naming_chunk(chunk):
            ids, offsets = self.tokenizer.encode_batch_flat(documents, threads=1, dtype=self.dtype)
        if self.separator_id is not None:  # after every record
            ids = np.insert(ids, offsets[1:], np.asarray(self.separator_id, dtype=self.dtype))
        return ids, len(documents)


def separators_inside_records(chunk: Chunk, ids: np.ndarray, ended: int, separator_id: int | None) -> int:
    """How many separator ids a chunk of records holds beyond the one after each record: a record whose
    text holds the separator token is encoded with it, as ``Tokenizer.encode`` does."""
    if separator_id is None or chunk.is_text:
        return 0
    return int(np.count_nonzero(ids == separator_id)) - ended


def warn_of_separators_inside_records(
    path: str, inside: int, separator_id: int | None, tokenizer: Tokenizer
) -> None:
    """Say that a reader splitting the token file at the separator sees more documents than the records
    (the sidecar counts records): not silently."""
    if inside and separator_id is not None:
        log.warning(
            "%s: the texts of its records hold the separator %r %d time(s), written as its id there too: "
            "splitting the token file at it gives that many more documents than the sidecar's records",
            path,
            tokenizer.id_to_token(separator_id).decode("utf-8", "replace"),
            inside,
        )


def _init_worker(
    directory: str,
    engine: str,
    compat: str | CompatConfig | None,
    separator_id: int | None,
    text_field: str,
    errors: str,
    dtype_name: str,
    pool_pid: int,
    handled: tuple[int, ...],
) -> None:
    as_pool_worker(pool_pid, handled)
    tokenizer = Tokenizer.load(directory, engine=engine, compat=compat)
    _worker_state["encoder"] = ChunkEncoder(tokenizer, separator_id, text_field, errors, np.dtype(dtype_name))


def _encode_in_worker(chunk: Chunk) -> tuple[np.ndarray, int]:
    return _worker_state["encoder"].encode(chunk)


def encode_corpus(
    tokenizer_dir: str | os.PathLike[str],
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    separator: str | None = "<|endoftext|>",
    workers: int | None = None,
    chunk_bytes: int = 1 << 20,
    text_field: str = "text",
    errors: str = "strict",
    engine: str = "auto",
    progress: bool | None = None,
    executor: ExecutorSpec | str | None = None,
    compat: str | CompatConfig | None = None,
    dtype: str | None = None,
) -> EncodeResult | ShardedEncodeResult:
    """Write the flat token file and its sidecar; both appear only when complete. A stop (Ctrl-C, SIGTERM)
    that comes as they go into place waits until both are there and raises :class:`StoppedOnceWritten`.

    ``compat`` is passed to :meth:`Tokenizer.load` (``"official"``: bare official files encode as theirs).
    ``dtype`` (``"uint16"`` or ``"uint32"``) fixes the ids' type; None takes the smallest that holds them.

    With an ``executor`` other than local, or when ``output`` is a directory (existing, or named with a
    trailing ``/``), write one token file per shard plus ``index.json`` instead
    (:func:`encode_sharded`); the shards concatenated equal the flat file.
    """
    spec = check_executor(executor)
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ConfigError(f"chunk_bytes must be a whole number of bytes >= 1, not {chunk_bytes!r}")
    # Before any input is read: records are decoded by Python's codecs, which take any handler ('ignore'
    # would drop bytes silently), where text files are checked by the encoder.
    check_errors_mode(errors)
    if writes_shards(output, spec):
        return encode_sharded(
            tokenizer_dir, inputs, output, separator=separator, executor=spec, workers=workers,
            chunk_bytes=chunk_bytes, text_field=text_field, errors=errors, engine=engine, progress=progress,
            compat=compat, dtype=dtype,
        )  # fmt: skip
    directory = user_path(tokenizer_dir)  # as the inputs are: a quoted ~ is the home directory
    tokenizer = Tokenizer.load(directory, engine=engine, compat=compat)
    separator_id = separator_id_of(tokenizer, separator)
    paths = resolve_inputs(inputs)
    check_not_token_files(paths)
    out = user_path(output)
    if (problem := directory_problem(out.parent)) is not None:
        raise ConfigError(f"output {out}: cannot write in {out.parent}: {problem}")
    check_nothing_is_overwritten((out, sidecar_path(out)), paths, directory)
    check_only_token_files_are_replaced(out)
    ids_dtype = token_dtype(tokenizer.vocab, dtype)
    encoder = ChunkEncoder(tokenizer, separator_id, text_field, errors, ids_dtype)
    n_workers = _workers(workers, paths)
    tokens = documents = 0
    before = input_files_state(paths)
    result: EncodeResult | None = None
    for stale in remove_stale_temps(out.parent, out.name):  # a killed encoding's, as large as it got
        log.info("removed %s, left by an encoding killed while writing", stale.name)
    try:
        with contextlib.ExitStack() as placing, made_dirs_removed_on_failure(out.parent):
            with (
                atomic_write(out) as handle,
                task("encoding", corpus_size(paths), "B", enabled=progress) as update,
            ):
                for path in paths:
                    line_cuts = tokenizer.pretokenizer.safe_cuts_hold
                    chunks = iter_chunks(
                        path, tokenizer.special_tokens, chunk_bytes, line_cuts=line_cuts,
                        pretokenizer=tokenizer.pretokenizer,
                    )  # fmt: skip
                    args = (str(directory), engine, compat, separator_id, text_field, errors, ids_dtype.name)
                    open_document = False
                    inside = 0
                    for chunk, (ids, ended) in _encoded(chunks, encoder, n_workers, args):
                        if len(ids):
                            open_document = int(ids[-1]) != separator_id
                        tokens += write_ids(handle, ids, ids_dtype)
                        documents += ended
                        inside += separators_inside_records(chunk, ids, ended, separator_id)
                        update(chunk.read_bytes)
                    warn_of_separators_inside_records(str(path), inside, separator_id, tokenizer)
                    one_per_record = is_jsonl(path) or is_table(path)
                    if not one_per_record and open_document:  # a text file ends its last document
                        documents += 1
                        if separator_id is not None:
                            tokens += write_ids(handle, [separator_id], ids_dtype)
                # Inside the write: a file cut or appended to meanwhile leaves no token file behind.
                check_unchanged(paths, before, "encoded")
                complete = EncodeResult(
                    str(out),
                    ids_dtype.name,
                    tokens,
                    documents,
                    separator,
                    separator_id,
                    tokenizer.vocab_size,
                    str(directory.resolve()),  # the sidecar is read from elsewhere: no path relative to here
                    tokenizer_hash(directory),
                    [str(p.resolve()) for p in paths],
                )
                # From the token file's rename to its sidecar's: a stop (Ctrl-C, SIGTERM) in between left the
                # file without its sidecar, or beside the sidecar of the file it replaced.
                placing.enter_context(stop_signals_held())
            sidecar = json.dumps(asdict(complete), indent=2, ensure_ascii=False) + "\n"
            atomic_write_text(sidecar_path(out), sidecar)
            result = complete
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        if result is not None:  # held until the output was in place
            raise StoppedOnceWritten(result) from None
        raise
    return result


def writes_shards(output: str | os.PathLike[str], executor: ExecutorSpec | str | None) -> bool:
    """Whether :func:`encode_corpus` writes ``output`` as a directory of shards plus ``index.json`` (an
    executor other than local, or an existing directory, or a path ending in ``/``): a command says of what
    it left then the shards, not the token file. Asked before the encoding, which removes a directory it
    made when stopped."""
    spec = spec_from(executor)
    return spec.name != "local" or user_path(output).is_dir() or str(output).endswith(("/", os.sep))


class StoppedOnceWritten(KeyboardInterrupt):
    """A stop (Ctrl-C, SIGTERM) that came while the finished token file and its sidecar went into place:
    held until both were there, so the output is complete (``result``) although the command was stopped."""

    def __init__(self, result: EncodeResult) -> None:
        super().__init__()
        self.result = result


def check_nothing_is_overwritten(targets: Sequence[Path], paths: Sequence[Path], tokenizer_dir: Path) -> None:
    """A command's outputs (a token file and its sidecar, an evaluation report) replace what is at their
    paths when complete: refuse an input (the corpus would be lost to what was made of it) or a file of
    the tokenizer directory (the tokenizer would no longer load), before any work."""
    for target in targets:
        if not target.exists():
            continue
        if any(os.path.samefile(target, path) for path in paths):
            raise ConfigError(f"output {target} is one of the inputs; write it elsewhere")
        if os.path.samefile(target.parent, tokenizer_dir):
            raise ConfigError(f"output {target} is a file of the tokenizer directory; write it elsewhere")


#: Names that promise another format than a token file's raw ids.
NOT_TOKEN_FILE_SUFFIXES = {".npy": "NumPy's .npy format", ".npz": "NumPy's .npz format", ".json": "JSON"}


def check_only_token_files_are_replaced(out: Path) -> None:
    """A flat token file replaces only a token file an encoding wrote before (its sidecar says so), with
    that sidecar: any other file at either path (notes, a ``config.json`` beside ``output=config``) would
    be lost to it, so it is refused before any work. A name ending ``.npy``, ``.npz`` or ``.json`` is
    refused too: ``numpy.load`` of raw ids fails with a misleading message."""
    if out.suffix in NOT_TOKEN_FILE_SUFFIXES:
        raise ConfigError(
            f"output {out}: a token file holds raw ids (read it with superbpe.open_tokens or numpy.memmap), "
            f"not {NOT_TOKEN_FILE_SUFFIXES[out.suffix]}; name it .bin (its sidecar goes beside it, .bin.json)"
        )
    sidecar = sidecar_path(out)
    if is_token_file_sidecar(sidecar):
        return
    for target in (out, sidecar):
        if target.exists():
            raise ConfigError(
                f"output {target} exists and is not a token file an encoding wrote; remove it or write "
                "elsewhere"
            )


def separator_id_of(tokenizer: Tokenizer, separator: str | None) -> int | None:
    """The id written after every document; the separator must be one of the tokenizer's specials, so a
    typo fails before any output rather than writing text ids where a boundary was meant."""
    if separator is None:
        return None
    if separator not in tokenizer.special_tokens:
        known = specials_shown(tokenizer.special_tokens) or "none"
        raise ConfigError(
            f"separator {separator!r} is not a special token of the tokenizer (it has: {known}); "
            "separator=null writes none"
        )
    return tokenizer.token_to_id(separator)


def _workers(workers: int | None, paths: Sequence[Path]) -> int:
    """An explicit count (checked), else one for a small corpus, else :func:`default_threads`."""
    if workers is not None:
        return resolve_threads(workers, "workers")
    if corpus_size(paths) < _PARALLEL_MIN_BYTES:
        return 1
    return default_threads()


def _encoded(
    chunks: Iterator[Chunk], encoder: ChunkEncoder, n_workers: int, args: tuple[Any, ...]
) -> Iterator[tuple[Chunk, tuple[np.ndarray, int]]]:
    """(chunk, ids) in input order; with workers, at most 2 x workers chunks are in flight.

    The native engine encodes with the GIL released, so its workers are threads of this process sharing
    the loaded tokenizer. The python engine's encoder is Python code, which threads cannot run at once;
    its workers are processes, each loading the tokenizer itself.
    """
    if n_workers <= 1:
        for chunk in chunks:
            yield chunk, encoder.encode(chunk)
        return
    if encoder.tokenizer.engine == "native":
        yield from threads_in_order(encoder.encode, chunks, n_workers, "superbpe-encode")
        return
    initargs = (*args, os.getpid(), handled_stop_signals())
    pool = ProcessPoolExecutor(n_workers, initializer=_init_worker, initargs=initargs)

    def submit(chunk: Chunk) -> Future[tuple[np.ndarray, int]]:
        with stop_signals_held():  # the first submit starts the workers
            return pool.submit(_encode_in_worker, chunk)

    try:
        yield from in_order(submit, chunks, 2 * n_workers)
    finally:
        # Stopped (Ctrl-C, SIGTERM: the workers leave them to this process, as_pool_worker): what has not
        # started is dropped, and each worker ends once it has sent the chunks it was given, so that no
        # pipe of the pool is left with half a message.
        pool.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------------------ one file per shard


def encode_sharded(
    tokenizer_dir: str | os.PathLike[str],
    inputs: InputSpec,
    output_dir: str | os.PathLike[str],
    *,
    separator: str | None = "<|endoftext|>",
    executor: ExecutorSpec | str | None = None,
    workers: int | None = None,
    chunk_bytes: int = 1 << 20,
    text_field: str = "text",
    errors: str = "strict",
    engine: str = "auto",
    progress: bool | None = None,
    compat: str | CompatConfig | None = None,
    dtype: str | None = None,
) -> ShardedEncodeResult:
    """Encode ``inputs`` into one token file per shard under ``output_dir`` plus ``index.json``.

    ``output_dir`` must be new or empty. On any error the files written so far are removed and the
    error is raised; ``index.json`` is written only after every shard is complete.
    """
    check_errors_mode(errors)
    spec = spec_from(executor)
    directory = user_path(tokenizer_dir)
    tokenizer = Tokenizer.load(directory, engine=engine, compat=compat)
    separator_id = separator_id_of(tokenizer, separator)
    paths = resolve_inputs(inputs)
    check_not_token_files(paths)
    ids_dtype = token_dtype(tokenizer.vocab, dtype)
    fingerprint = tokenizer_hash(directory)
    runner = get_executor(spec, workers)
    before = input_files_state(paths)
    try:
        size = shard_size(spec.shard_bytes, runner.parallelism, paths)
        line_cuts = tokenizer.pretokenizer.safe_cuts_hold
        shards = plan_shards(
            paths, tokenizer.special_tokens, size, line_cuts=line_cuts, pretokenizer=tokenizer.pretokenizer
        )
        out, made = _prepare_output_dir(user_path(output_dir))
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
        tasks = [(shard, number, *common, ids_dtype.name) for number, shard in enumerate(shards)]
        entries: list[ShardEntry | None] = [None] * len(shards)
        inside_by_file: dict[str, int] = {}  # separators inside records (see separators_inside_records)
        try:
            with (
                task("encoding", sum(s.size() for s in shards), "B", enabled=progress) as update,
                contextlib.closing(runner.run(encode_shard, tasks)) as results,  # ended before the removal
            ):
                for number, (entry, inside) in results:
                    entries[number] = entry
                    inside_by_file[entry.source] = inside_by_file.get(entry.source, 0) + inside
                    update(shards[number].size())
            # Shards are planned from the sizes the files had: one cut meanwhile reads short.
            check_unchanged(paths, before, "encoded")
            for path, inside in inside_by_file.items():
                warn_of_separators_inside_records(path, inside, separator_id, tokenizer)
            _remove_attempts(out)
            result = _index(
                out,
                entries,
                shards,
                ids_dtype.name,
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
            _remove_output(out, made)
            raise
    finally:
        runner.close()
    return result


def _prepare_output_dir(out: Path) -> tuple[Path, list[Path]]:
    """The output directory, existing and empty, or made with the parents it lacked; with the directories
    made (innermost first, none for an existing one), for :func:`_remove_output`."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} is a file; a sharded encoding needs a new or empty directory")
    if out.is_dir():
        if any(out.iterdir()):
            held = _encoding_held(out)
            raise ConfigError(f"output directory {out} is not empty{held}; give a new or empty directory")
        return out, []
    made = missing_dirs(out)
    try:
        out.mkdir(parents=True)
    except OSError as exc:
        raise InputError(f"cannot create {out}: {exc.strerror or exc}") from None
    return out, made


#: The files a sharded encoding writes: its index, its shards, and a shard's attempt under a temporary name.
_SHARDED_FILE = re.compile(
    rf"{re.escape(INDEX_NAME)}|shard-\d{{6}}\.bin|\.shard-\d{{6}}\.bin\.[0-9a-f]{{32}}\.tmp"
)


def _encoding_held(out: Path) -> str:
    """What a non-empty output directory holds when it is a sharded encoding's, to say with the refusal: an
    encoding killed outright (SIGKILL, out of memory) leaves shard files without ``index.json``, or only
    the hidden temporary files of its attempts, which ``ls`` does not show."""
    names = sorted(item.name for item in out.iterdir())
    if not all(_SHARDED_FILE.fullmatch(name) for name in names):
        return ""
    if INDEX_NAME in names:
        return f" (it holds a sharded encoding, {INDEX_NAME} and its shards: remove them to encode it again)"
    return (
        f" (it holds {len(names)} file(s) of a sharded encoding stopped before its {INDEX_NAME}, such as "
        f"{names[0]}: remove them)"
    )


def _remove_attempts(out: Path) -> None:
    """Temporary files of task attempts that died (their retries wrote the shard again)."""
    for item in out.glob(".shard-*.tmp"):
        item.unlink(missing_ok=True)


def _remove_output(out: Path, made: Sequence[Path]) -> None:
    """Leave nothing of a failed encoding behind (the directory was new or empty when it began): the
    directories it made go, parents included while empty."""
    if made:
        shutil.rmtree(out, ignore_errors=True)
        remove_empty_dirs(made[1:])
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
        str(directory.resolve()),  # the sidecar is read from elsewhere: no path relative to here
        fingerprint,
        [str(p.resolve()) for p in paths],
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
) -> tuple[ShardEntry, int]:
    """One task: the shard's ids into ``out_dir/shard-NNNNNN.bin``, renamed into place only when complete;
    with the entry, how many separators the texts of its records hold (:func:`separators_inside_records`).

    ``continues_document`` needs the previous shard, so the driver fills it in.
    """
    tokenizer = load_tokenizer(tokenizer_dir, engine, fingerprint, compat)
    dtype = np.dtype(dtype_name).newbyteorder("<")
    encoder = ChunkEncoder(tokenizer, separator_id, text_field, errors, np.dtype(dtype_name))
    name = shard_file_name(number)
    final = Path(out_dir) / name
    temp = Path(out_dir) / f".{name}.{uuid.uuid4().hex}.tmp"
    line_cuts = tokenizer.pretokenizer.safe_cuts_hold
    specials = tokenizer.special_tokens

    def encode(first_line: int) -> tuple[int, int, bool, int]:
        tokens = documents = inside = 0
        last: int | None = None
        with open(temp, "wb") as handle:
            for chunk in shard_chunks(
                shard, specials, chunk_bytes, line_cuts=line_cuts, first_line=first_line,
                pretokenizer=tokenizer.pretokenizer,
            ):  # fmt: skip
                ids, ended = encoder.encode(chunk)
                if len(ids):
                    last = int(ids[-1])
                    handle.write(np.asarray(ids, dtype=dtype).tobytes())
                tokens += len(ids)
                documents += ended
                inside += separators_inside_records(chunk, ids, ended, separator_id)
            open_end = not shard.per_record and last is not None and last != separator_id
            if shard.last_of_file and open_end:  # a text file ends its last document
                documents += 1
                open_end = False
                if separator_id is not None:
                    handle.write(np.asarray([separator_id], dtype=dtype).tobytes())
                    tokens += 1
        return tokens, documents, open_end, inside

    try:
        tokens, documents, open_end, inside = with_true_line_numbers(shard, encode)
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return ShardEntry(name, tokens, documents, False, open_end, shard.path, shard.start, shard.end), inside
