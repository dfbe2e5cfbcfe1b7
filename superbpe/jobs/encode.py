"""Encode a corpus into one flat token file for language-model training.

The output is raw little-endian ``uint16`` ids when every id of the tokenizer fits, else ``uint32``,
so it loads with ``np.memmap(path, dtype=...)``. A JSON sidecar (``<output>.json``) records dtype,
token and document counts and a hash of the tokenizer files, so a training job can check it reads
what it thinks it reads.

Documents: one per ``.jsonl`` line; in text files, documents are separated by the separator special
token where it appears, and every file ends a document. The separator id is written after every
document. Files are cut into chunks only before a special token or at a safe cut, so the ids of a
chunked document equal ``Tokenizer.encode`` of the whole document; chunks go to worker processes
with a bounded number in flight, and results are written in order, so memory stays bounded.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from superbpe.config import CompatConfig
from superbpe.errors import ConfigError, InputError
from superbpe.progress import task
from superbpe.sources import TABLE_SUFFIXES, Chunk, chunk_documents, corpus_size, iter_chunks, resolve_inputs
from superbpe.tokenizer import Tokenizer
from superbpe.util import atomic_write, atomic_write_text, usable_cpus

if TYPE_CHECKING:
    from superbpe.sharded import ShardedEncodeResult

_PARALLEL_MIN_BYTES = 4 << 20
_worker_state: dict[str, Any] = {}


@dataclass
class EncodeResult:
    output: str
    dtype: str
    tokens: int
    documents: int
    separator: str | None
    separator_id: int | None
    vocab_size: int
    tokenizer: str
    tokenizer_hash: str
    inputs: list[str]


def tokenizer_hash(directory: Path) -> str:
    """sha256 over the tokenizer's files (names and contents), to tie a token file to its tokenizer."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.iterdir() if p.name in _TOKENIZER_FILES):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


_TOKENIZER_FILES = frozenset({"vocab.json", "merges.txt", "tokenizer.json", "superbpe.json"})


def choose_dtype(tokenizer: Tokenizer) -> np.dtype:
    """uint16 when every id fits in 16 bits, else uint32."""
    return np.dtype(np.uint16) if max(tokenizer.vocab) < 1 << 16 else np.dtype(np.uint32)


class _ChunkEncoder:
    """Turns one chunk into ids: what runs in each worker (or in-process for small inputs)."""

    def __init__(self, tokenizer: Tokenizer, separator_id: int | None, text_field: str, errors: str) -> None:
        self.tokenizer = tokenizer
        self.separator_id = separator_id
        self.text_field = text_field
        self.errors = errors

    def encode(self, chunk: Chunk) -> tuple[list[int], int]:
        """Ids of the chunk and the number of documents it ends."""
        ids: list[int] = []
        ended = 0
        for document in chunk_documents(chunk, self.errors, self.text_field):
            ids.extend(self.tokenizer.encode(document))
            if chunk.jsonl:
                ended += 1
                if self.separator_id is not None:
                    ids.append(self.separator_id)
        if not chunk.jsonl and self.separator_id is not None:
            ended = ids.count(self.separator_id)
        return ids, ended


def _init_worker(
    directory: str,
    engine: str,
    compat: str | CompatConfig | None,
    separator_id: int | None,
    text_field: str,
    errors: str,
) -> None:
    tokenizer = Tokenizer.load(directory, engine=engine, compat=compat)
    _worker_state["encoder"] = _ChunkEncoder(tokenizer, separator_id, text_field, errors)


def _encode_in_worker(chunk: Chunk) -> tuple[list[int], int]:
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
    executor: Any = None,
    compat: str | CompatConfig | None = None,
) -> EncodeResult | ShardedEncodeResult:
    """Write the flat token file and its sidecar; both appear only when complete.

    ``compat`` is passed to :meth:`Tokenizer.load` (``"official"``: bare official files encode as theirs).

    With an ``executor`` other than local, or when ``output`` is a directory (existing, or named with a
    trailing ``/``), write one token file per shard plus ``index.json`` instead
    (:func:`superbpe.sharded.encode_sharded`); the shards concatenated equal the flat file.
    """
    from superbpe.executor import check_executor

    spec = check_executor(executor)
    if spec.name != "local" or Path(output).is_dir() or str(output).endswith(("/", os.sep)):
        from superbpe.sharded import encode_sharded

        return encode_sharded(
            tokenizer_dir, inputs, output, separator=separator, executor=spec, workers=workers,
            chunk_bytes=chunk_bytes, text_field=text_field, errors=errors, engine=engine, progress=progress,
            compat=compat,
        )  # fmt: skip
    directory = Path(tokenizer_dir)
    tokenizer = Tokenizer.load(directory, engine=engine, compat=compat)
    separator_id = _separator_id(tokenizer, separator)
    paths = resolve_inputs(inputs)
    out = Path(output)
    dtype = choose_dtype(tokenizer)
    encoder = _ChunkEncoder(tokenizer, separator_id, text_field, errors)
    n_workers = _workers(workers, paths)
    tokens = documents = 0
    try:
        with (
            atomic_write(out) as handle,
            task("encoding", corpus_size(paths), "B", enabled=progress) as update,
        ):
            for path in paths:
                line_cuts = tokenizer.pretokenizer.safe_cuts_hold
                chunks = iter_chunks(path, tokenizer.special_tokens, chunk_bytes, line_cuts=line_cuts)
                args = (str(directory), engine, compat, separator_id, text_field, errors)
                open_document = False
                for chunk, (ids, ended) in _encoded(chunks, encoder, n_workers, args):
                    if ids:
                        open_document = ids[-1] != separator_id
                    tokens += _write(handle, ids, dtype)
                    documents += ended
                    update(len(chunk.data))
                if not path_is_jsonl(path) and open_document:  # a text file ends its last document
                    documents += 1
                    if separator_id is not None:
                        tokens += _write(handle, [separator_id], dtype)
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror or exc}") from None
    result = EncodeResult(
        str(out),
        dtype.name,
        tokens,
        documents,
        separator,
        separator_id,
        tokenizer.vocab_size,
        str(directory),
        tokenizer_hash(directory),
        [str(p) for p in paths],
    )
    atomic_write_text(sidecar_path(out), json.dumps(asdict(result), indent=2, ensure_ascii=False) + "\n")
    return result


def sidecar_path(output: Path) -> Path:
    return output.with_name(output.name + ".json")


def path_is_jsonl(path: Path) -> bool:
    """One document per record: JSON lines and tables (so no open document is left at the file's end)."""
    return path.name.endswith((".jsonl", ".jsonl.gz", *TABLE_SUFFIXES))


def _separator_id(tokenizer: Tokenizer, separator: str | None) -> int | None:
    if separator is None:
        return None
    if separator not in tokenizer.special_tokens:
        known = ", ".join(tokenizer.special_tokens) or "none"
        raise ConfigError(
            f"separator {separator!r} is not a special token of the tokenizer (it has: {known}); "
            "separator=null writes none"
        )
    return tokenizer.token_to_id(separator)


def _workers(workers: int | None, paths: Sequence[Path]) -> int:
    if workers is not None:
        if workers < 1:
            raise ConfigError(f"workers must be >= 1, not {workers}")
        return workers
    if corpus_size(paths) < _PARALLEL_MIN_BYTES:
        return 1
    cores = usable_cpus()
    return max(1, cores)


def _encoded(
    chunks: Iterator[Chunk], encoder: _ChunkEncoder, n_workers: int, args: tuple[Any, ...]
) -> Iterator[tuple[Chunk, tuple[list[int], int]]]:
    """(chunk, ids) in input order; with workers, at most 2 x workers chunks are in flight."""
    if n_workers <= 1:
        for chunk in chunks:
            yield chunk, encoder.encode(chunk)
        return
    with ProcessPoolExecutor(n_workers, initializer=_init_worker, initargs=args) as pool:
        pending: deque[tuple[Chunk, Future[tuple[list[int], int]]]] = deque()
        for chunk in chunks:
            pending.append((chunk, pool.submit(_encode_in_worker, chunk)))
            if len(pending) >= 2 * n_workers:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()


def _write(handle: Any, ids: list[int], dtype: np.dtype) -> int:
    if ids:
        handle.write(np.asarray(ids, dtype=dtype.newbyteorder("<")).tobytes())
    return len(ids)
