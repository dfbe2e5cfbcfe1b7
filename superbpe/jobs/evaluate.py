"""Compression of a tokenizer on held-out text: bytes per token and tokens per document.

Bytes per token (UTF-8 bytes of the text / number of tokens) is the SuperBPE paper's measure of
encoding efficiency; higher is better. Documents are separated by a special token (``<|endoftext|>``
by default) in text files and are one per line in ``.jsonl`` files; separators themselves count as
neither bytes nor tokens. Files are read in chunks cut at safe positions, so memory stays bounded
and the counts equal those of encoding each document whole; locally, worker threads encode several
chunks at once (the native engine releases the GIL) and their counts are added in order.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from superbpe.api.tokenizer import Tokenizer, encode_text_chunk, naming_chunk
from superbpe.core.compat import CompatConfig
from superbpe.core.counts import check_errors_mode
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.progress import task
from superbpe.core.sources import (
    Chunk,
    InputSpec,
    check_unchanged,
    chunk_documents,
    corpus_size,
    input_files_state,
    iter_chunks,
    resolve_inputs,
)
from superbpe.core.util import default_threads, directory_problem, resolve_threads, user_path
from superbpe.formats.token_files import check_not_token_files, tokenizer_hash
from superbpe.jobs.encode import check_nothing_is_overwritten
from superbpe.jobs.executors import (
    ExecutorSpec,
    check_executor,
    get_executor,
    spec_from,
    threads_in_order,
)
from superbpe.jobs.shards import Shard, plan_shards, shard_chunks, shard_size, with_true_line_numbers
from superbpe.jobs.tokenizer_cache import load_tokenizer

EVAL_CHUNK_BYTES = 1 << 20
#: Below this much input a local evaluation uses one thread by default (starting more costs more).
PARALLEL_MIN_BYTES = 4 << 20


@dataclass
class EvalResult:
    files: list[str]
    bytes: int
    tokens: int
    documents: int

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens if self.tokens else 0.0

    @property
    def tokens_per_document(self) -> float:
        return self.tokens / self.documents if self.documents else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "bytes_per_token": round(self.bytes_per_token, 4),
            "tokens_per_document": round(self.tokens_per_document, 2),
        }


class Tally:
    """Running totals for one evaluation; a document is counted when its separator or file end is seen."""

    def __init__(self, open_document: bool | None = False) -> None:
        self.bytes = self.tokens = self.documents = 0
        # None: a shard that starts where the previous one left off, unknown here; its first
        # document end is then counted by whoever knows (``ends_unknown_document``).
        self.open_document = open_document
        self.ends_unknown_document = False

    def add_text(self, size: int, tokens: int) -> None:
        """A stretch of text of ``size`` UTF-8 bytes and ``tokens`` tokens (an empty one opens nothing)."""
        if size:
            self.bytes += size
            self.tokens += tokens
            self.open_document = True

    def end_document(self) -> None:
        if self.open_document is None:
            self.ends_unknown_document = True
        elif self.open_document:
            self.documents += 1
        self.open_document = False

    def add_chunk(self, counts: ChunkCounts, jsonl: bool) -> None:
        """A chunk's counts (:func:`chunk_counts`), in order: a separator between stretches ends a
        document, and so does every record of JSON lines."""
        for stretches in counts:
            for index, (size, tokens) in enumerate(stretches):
                if index:
                    self.end_document()
                self.add_text(size, tokens)
            if jsonl:
                self.end_document()


#: Per document of a chunk, (UTF-8 bytes, tokens) of each stretch between separators.
ChunkCounts = list[list[tuple[int, int]]]


log = logging.getLogger("superbpe")

#: Where documents end unless said otherwise (the text between separators is what is measured).
SEPARATOR = "<|endoftext|>"


def chunk_counts(
    tokenizer: Tokenizer, chunk: Chunk, separator: str | None, errors: str, text_field: str
) -> ChunkCounts:
    """What one chunk adds to a tally; the part that runs on a worker thread.

    A text chunk is encoded from its bytes where that is exact (``_text_stretch_counts``), any other chunk's
    stretches as one batch; on one thread either way (chunks run in parallel), and only the lengths are kept.
    """
    if chunk.is_text and errors == "strict" and _cuts_as_special(tuple(tokenizer.special_tokens), separator):
        return [_text_stretch_counts(tokenizer, chunk, separator)]
    documents = [
        document.split(separator) if separator else [document]
        for document in chunk_documents(chunk, errors, text_field)
    ]
    stretches = [stretch for document in documents for stretch in document]
    with naming_chunk(chunk):
        _, offsets = tokenizer.encode_batch_flat(stretches, threads=1)
    tokens = np.diff(offsets).tolist()
    counts: ChunkCounts = []
    at = 0
    for document in documents:
        sizes = [len(stretch.encode("utf-8")) for stretch in document]
        counts.append(list(zip(sizes, tokens[at : at + len(document)], strict=True)))
        at += len(document)
    return counts


def _text_stretch_counts(tokenizer: Tokenizer, chunk: Chunk, separator: str | None) -> list[tuple[int, int]]:
    """(bytes, tokens) of each stretch of a text chunk between separators, from its bytes in one call that
    makes no str, so threads counting chunks side by side do not wait for each other. The chunk is encoded
    whole and its ids cut at the separator's id: the same stretches and ids as splitting the decoded text
    when the separator is a special token nothing else can overlap (see ``_cuts_as_special``)."""
    ids = encode_text_chunk(tokenizer, chunk)
    if not separator:
        return [(len(chunk.data), len(ids))]
    sizes = [len(stretch) for stretch in chunk.data.split(separator.encode("utf-8"))]
    ends = np.flatnonzero(ids == tokenizer.token_to_id(separator))
    tokens = np.diff(ends, prepend=-1, append=len(ids)) - 1
    return list(zip(sizes, tokens.tolist(), strict=True))


@functools.lru_cache(maxsize=64)
def _cuts_as_special(special_tokens: tuple[str, ...], separator: str | None) -> bool:
    """Whether encoding a text whole cuts it at each separator as splitting the text there would: no
    separator, or one that is a special token which no other special token contains, is contained in or
    overlaps (so every occurrence is matched as itself, and no match reaches across one)."""
    if not separator:
        return True
    if separator not in special_tokens:
        return False
    for other in special_tokens:
        if other == separator:
            continue
        if separator in other or other in separator:
            return False
        for k in range(1, min(len(other), len(separator))):
            if other.endswith(separator[:k]) or other.startswith(separator[-k:]):
                return False
    return True


def _chunk_specials(tokenizer: Tokenizer) -> list[str]:
    """The special tokens a file is cut around into chunks (and shards): all of the tokenizer's, not the
    separator alone. A line cut or a pre-tokenizer's cut inside another special token (``"\n<n>"`` after a
    line end, ``"<|reserved_0|>"`` after its digit) left its halves to be encoded as text, so the tokens
    counted depended on where the chunks ended, not only on the documents."""
    return list(tokenizer.special_tokens)


def _usable_separator(tokenizer: Tokenizer, separator: str | None) -> str | None:
    """``separator`` where it is a special token of ``tokenizer``, else None, said: text cut at another
    string (``foo``, even inside ``foobar``) left the cut text out of bytes and tokens unseen, and a
    tokenizer without ``<|endoftext|>`` (a bare official one) encodes that string as text."""
    if separator is None or separator in tokenizer.special_tokens:
        return separator
    log.warning(
        "separator %r is not a special token of the tokenizer: documents are not cut at it (each file or "
        "record is one), and it counts as text; separator=null says so without this warning", separator
    )
    return None


def evaluate(
    tokenizer: Tokenizer,
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    separator: str | None = SEPARATOR,
    text_field: str = "text",
    errors: str = "strict",
    workers: int | None = None,
    progress: bool | None = None,
) -> EvalResult:
    """Bytes per token and tokens per document of ``tokenizer`` on ``inputs``.

    ``workers`` threads encode chunks at once (the native engine; the python engine's encoder cannot run
    on two threads at once and uses one); by default one for a small corpus, else ``default_threads()``.
    The numbers never depend on it. ``progress``: a bar (True), log lines (False), or a bar only on a
    terminal (None), as for encoding: a held-out set of gigabytes takes minutes.
    """
    check_errors_mode(errors)
    separator = _usable_separator(tokenizer, separator)
    paths = resolve_inputs(inputs)
    check_not_token_files(paths)
    threads = _threads(tokenizer, workers, paths)
    tally = Tally()
    before = input_files_state(paths)
    specials = _chunk_specials(tokenizer)
    with task("evaluating", corpus_size(paths), "B", enabled=progress) as update:
        for path in paths:
            line_cuts = tokenizer.pretokenizer.safe_cuts_hold
            add_chunks(
                tally,
                tokenizer,
                iter_chunks(
                    path, specials, EVAL_CHUNK_BYTES, line_cuts=line_cuts, pretokenizer=tokenizer.pretokenizer
                ),
                separator,
                errors,
                text_field,
                threads,
                done=update,
            )
            tally.end_document()
    check_unchanged(paths, before, "evaluated")
    if not tally.bytes:  # bytes/token of nothing is no measurement
        what = str(paths[0]) if len(paths) == 1 else f"all {len(paths)} input files"
        raise InputError(f"{what}: no text to evaluate")
    return EvalResult([str(p) for p in paths], tally.bytes, tally.tokens, tally.documents)


def _threads(tokenizer: Tokenizer, workers: int | None, paths: Sequence[Path]) -> int:
    """Threads for a local evaluation: an explicit count (checked), else one for a small corpus or the
    python engine, else ``default_threads()``."""
    threads = None if workers is None else resolve_threads(workers, "workers")
    if tokenizer.engine != "native":
        return 1
    if threads is None:
        return 1 if corpus_size(paths) < PARALLEL_MIN_BYTES else default_threads()
    return threads


def add_chunks(
    tally: Tally,
    tokenizer: Tokenizer,
    chunks: Iterable[Chunk],
    separator: str | None,
    errors: str,
    text_field: str,
    threads: int = 1,
    done: Callable[[int], None] | None = None,
) -> None:
    """Add the chunks' counts to ``tally`` in order, encoding up to ``threads`` chunks at once; ``done`` is
    told the bytes of the file each chunk read (a progress bar's)."""
    def count(chunk: Chunk) -> ChunkCounts:
        return chunk_counts(tokenizer, chunk, separator, errors, text_field)

    if threads <= 1:
        in_order: Iterable[tuple[Chunk, ChunkCounts]] = ((chunk, count(chunk)) for chunk in chunks)
    else:
        in_order = threads_in_order(count, chunks, threads, "superbpe-evaluate")
    for chunk, counts in in_order:
        tally.add_chunk(counts, chunk.jsonl)
        if done is not None:
            done(chunk.read_bytes)


def evaluate_dir(
    directory: str | os.PathLike[str],
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    separator: str | None = SEPARATOR,
    text_field: str = "text",
    errors: str = "strict",
    engine: str = "auto",
    executor: ExecutorSpec | str | None = None,
    compat: str | CompatConfig | None = None,
    workers: int | None = None,
    progress: bool | None = None,
) -> EvalResult:
    """Load the tokenizer saved in ``directory`` (its manifest pattern included) and evaluate it.

    ``compat`` is passed to :meth:`Tokenizer.load` (``"official"``: bare official files encode as theirs).
    An ``executor`` other than local evaluates shard by shard (:func:`evaluate_sharded`); locally,
    ``workers`` threads encode at once (:func:`evaluate`). ``progress`` as in :func:`evaluate`.
    """
    spec = check_executor(executor)
    if spec.name != "local":
        return evaluate_sharded(
            directory, inputs, separator=separator, text_field=text_field, errors=errors, engine=engine,
            executor=spec, compat=compat, workers=workers, progress=progress,
        )  # fmt: skip
    tokenizer = Tokenizer.load(user_path(directory), engine=engine, compat=compat)
    return evaluate(
        tokenizer, inputs, separator=separator, text_field=text_field, errors=errors, workers=workers,
        progress=progress,
    )  # fmt: skip


def check_report_path(
    output: str | os.PathLike[str], inputs: InputSpec, directory: str | os.PathLike[str]
) -> None:
    """Where ``superbpe-evaluate`` is to write its report, checked before the evaluation: the report is
    written after all the work, and must not replace an input or a file of the tokenizer."""
    path = user_path(output)
    if path.is_dir():
        example = path / "eval.json"
        raise ConfigError(f"output {output} is a directory; name the report's file, e.g. {example}")
    problem = directory_problem(path.parent)
    if problem is not None:
        raise ConfigError(f"output {output}: cannot write in {path.parent}: {problem}")
    check_nothing_is_overwritten((path,), resolve_inputs(inputs), user_path(directory))
    if path.exists() and not _is_report(path):
        raise ConfigError(f"output {output} exists and is not a report superbpe-evaluate wrote; remove it or "
                          "write elsewhere")  # fmt: skip


def report(result: EvalResult, directory: str | os.PathLike[str], separator: str | None) -> dict[str, Any]:
    """``superbpe-evaluate``'s report: the numbers, with the tokenizer they measure (its directory and
    the digest of its files an encoding's sidecar also gives) and the separator that cut documents, so
    that reports of several tokenizers say which is which. Paths are absolute: a report is read from
    elsewhere than where the command ran."""
    path = user_path(directory).absolute()
    files = [str(Path(file).absolute()) for file in result.files]
    return {"tokenizer": str(path), "tokenizer_hash": tokenizer_hash(path), "separator": separator,
            **result.to_json(), "files": files}  # fmt: skip


#: The keys of a report: the numbers (all of them), and those naming what was measured (any of them).
_REPORT_KEYS = set(EvalResult([], 0, 0, 0).to_json())
_REPORT_SOURCE_KEYS = {"tokenizer", "tokenizer_hash", "separator"}


def _is_report(path: Path) -> bool:
    """Whether ``path`` holds a report as :func:`report` writes it (one a new report may replace)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and _REPORT_KEYS <= set(data) <= _REPORT_KEYS | _REPORT_SOURCE_KEYS


def evaluate_sharded(
    directory: str | os.PathLike[str],
    inputs: InputSpec,
    *,
    separator: str | None = SEPARATOR,
    text_field: str = "text",
    errors: str = "strict",
    engine: str = "auto",
    executor: Any = None,
    workers: int | None = None,
    compat: str | CompatConfig | None = None,
    progress: bool | None = None,
) -> EvalResult:
    """:func:`superbpe.jobs.evaluate.evaluate` shard by shard on ``executor``; the same numbers (``progress``
    counts the shards' bytes as they come back).

    Bytes and tokens add up; a document that spans shards is counted once, by the shard where it ends
    (a shard reports whether its first document end closes a document begun before it).
    """
    check_errors_mode(errors)
    spec = spec_from(executor)
    tokenizer_dir = user_path(directory)
    tokenizer = Tokenizer.load(tokenizer_dir, engine=engine, compat=compat)
    separator = _usable_separator(tokenizer, separator)
    paths = resolve_inputs(inputs)
    check_not_token_files(paths)
    specials = _chunk_specials(tokenizer)
    fingerprint = tokenizer_hash(tokenizer_dir)
    common = (str(tokenizer_dir), engine, fingerprint, compat, separator, text_field, errors)
    runner = get_executor(spec, workers)
    before = input_files_state(paths)
    try:
        size = shard_size(spec.shard_bytes, runner.parallelism, paths)
        pre = tokenizer.pretokenizer
        shards = plan_shards(paths, specials, size, line_cuts=pre.safe_cuts_hold, pretokenizer=pre)
        parts: list[tuple[int, int, int, bool, bool | None] | None] = [None] * len(shards)
        tasks = [(shard, *common) for shard in shards]
        with (
            task("evaluating", sum(s.size() for s in shards), "B", enabled=progress) as update,
            contextlib.closing(runner.run(evaluate_shard, tasks)) as results,
        ):
            for number, part in results:
                parts[number] = part
                update(shards[number].size())
    finally:
        runner.close()
    check_unchanged(paths, before, "evaluated")  # shards are planned from the sizes the files had
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
    tokenizer = load_tokenizer(tokenizer_dir, engine, fingerprint, compat)
    line_cuts = tokenizer.pretokenizer.safe_cuts_hold
    specials = _chunk_specials(tokenizer)

    def tally(first_line: int) -> Tally:
        result = Tally(open_document=None)
        chunks = shard_chunks(
            shard, specials, EVAL_CHUNK_BYTES, line_cuts=line_cuts, first_line=first_line,
            pretokenizer=tokenizer.pretokenizer,
        )  # fmt: skip
        add_chunks(result, tokenizer, chunks, separator, errors, text_field)
        if shard.last_of_file:
            result.end_document()
        return result

    done = with_true_line_numbers(shard, tally)
    return done.bytes, done.tokens, done.documents, done.ends_unknown_document, done.open_document
