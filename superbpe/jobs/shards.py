"""Shards: a corpus cut into byte ranges of files, each one task of a distributed job.

A shard ends where a chunk may end (:class:`superbpe.core.sources.ChunkCutter`: before a special token or
at a safe line break; between lines in JSON lines), so counting or encoding shards separately gives
exactly what one pass over the whole corpus gives. The driver finds each cut by reading a small
window around the target offset, never the whole file; gzip files cannot be entered in the middle
and are one shard each, and so are tables (Parquet, Arrow), whose bytes are not their text.

A shard carries no data, only (file, start, end), so it is cheap to send to a remote worker; every
worker must see the input files at the same path (a shared filesystem).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, BinaryIO

from superbpe.core.errors import InputError
from superbpe.core.pretokenize import Pretokenizer
from superbpe.core.sources import (
    DEFAULT_CHUNK_BYTES,
    Chunk,
    ChunkCutter,
    cut_stream,
    is_gzipped,
    is_jsonl,
    is_table,
    iter_chunks,
    open_binary,
)

_WINDOW = 1 << 16
#: The smallest shard :func:`shard_size` makes of a small corpus.
_MIN_SHARD_BYTES = 1 << 20


@dataclass(frozen=True)
class Shard:
    """Bytes ``[start, end)`` of ``path`` (``end`` None: to the end, for gzip files)."""

    path: str
    start: int
    end: int | None
    last_of_file: bool

    @property
    def jsonl(self) -> bool:
        return is_jsonl(Path(self.path))

    @property
    def per_record(self) -> bool:
        """One document per record (JSON lines, or a table's rows): each record's end is its document's, so
        the shard's last ids never leave a text file's last document open."""
        return self.jsonl or is_table(Path(self.path))

    def size(self) -> int:
        """Bytes in the shard (on disk: compressed for gzip)."""
        return (self.end if self.end is not None else Path(self.path).stat().st_size) - self.start


def plan_shards(
    paths: Sequence[Path],
    special_tokens: Sequence[str],
    shard_bytes: int,
    *,
    line_cuts: bool,
    pretokenizer: Pretokenizer | None = None,
) -> list[Shard]:
    """Every input cut into shards of at least ``shard_bytes`` (the last of a file may be smaller).

    ``line_cuts`` comes from the pre-tokenizer (``Pretokenizer.safe_cuts_hold``), as for chunks; with the
    ``pretokenizer``, its local rules cut text without safe line cuts too (lines ending in whitespace, as
    WikiText's do), which was otherwise one shard per file.
    """
    shards: list[Shard] = []
    for path in paths:
        size = path.stat().st_size
        if size == 0:
            continue
        if is_gzipped(path) or is_table(path):  # read whole: a table's bytes are not its text
            shards.append(Shard(str(path), 0, None, True))
            continue
        cutter = None if is_jsonl(path) else ChunkCutter(special_tokens, line_cuts, pretokenizer)
        back = 8 + max((len(s.encode("utf-8")) for s in special_tokens), default=0)
        with open(path, "rb") as stream:
            start = 0
            while start < size:
                end = _find_cut(stream, start + shard_bytes, size, cutter, back)
                shards.append(Shard(str(path), start, end, end == size))
                start = end
    return shards


def sample_evenly(blocks: Sequence[Shard], fraction: float) -> list[Shard]:
    """``fraction`` of ``blocks``, spread evenly from first to last: block i is kept when the running
    target ``ceil((i + 1) * fraction)`` steps up, so the first block is always kept and every stretch
    of the corpus gives its share (0.25 keeps blocks 0, 4, 8, ...). Exact fractions, so no rounding
    error moves a step; the choice depends on the blocks and the fraction alone."""
    # The nearest fraction of small denominator spells 0.1 as 1/10, but a fraction below 2**-21 has
    # none above zero; its exact binary value still keeps the first block.
    share = Fraction(fraction).limit_denominator(1 << 20) or Fraction(fraction)
    if not 0 < share <= 1:
        raise ValueError(f"sample fraction {fraction!r} is not in (0, 1]")
    return [block for i, block in enumerate(blocks) if math.ceil((i + 1) * share) > math.ceil(i * share)]


def check_sampleable(paths: Sequence[Path]) -> None:
    """Sampling cuts files into byte ranges: gzip files and tables cannot be entered in the middle."""
    for path in paths:
        if is_table(path) or (path.stat().st_size and is_gzipped(path)):
            raise InputError(
                f"{path}: a sampled count (approx_sample) cuts files into byte ranges, which this file "
                "cannot be; give it as plain text or JSON lines, or count the whole corpus"
            )


def _find_cut(stream: BinaryIO, target: int, size: int, cutter: ChunkCutter | None, back: int) -> int:
    """The first chunk boundary at or after ``target`` (``size`` when there is none).

    Reads windows with ``back`` bytes of context before the search start (what the cutter looks
    back at); a cut within ``back`` bytes of a window's end may depend on bytes past it, so the
    search moves on to a window that starts there.
    """
    pos = target
    while pos < size:
        lo = max(0, pos - back)
        stream.seek(lo)
        buf = stream.read(pos - lo + _WINDOW)
        if cutter is None:
            found = buf.find(b"\n", max(pos - lo - 1, 0))
            cut = -1 if found == -1 else found + 1
        else:
            cut = cutter.find(buf, pos - lo)
        at_eof = lo + len(buf) >= size
        if cut != -1 and (at_eof or cut < len(buf) - back):
            return lo + cut
        if at_eof:
            break
        pos = max(pos + 1, lo + len(buf) - back)
    return size


class _Limited(io.RawIOBase):
    """At most ``remaining`` bytes of an open file."""

    def __init__(self, stream: BinaryIO, remaining: int) -> None:
        self.stream = stream
        self.remaining = remaining

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size < 0 or size > self.remaining:
            size = self.remaining
        data = self.stream.read(size)
        self.remaining -= len(data)
        return data


def shard_chunks(
    shard: Shard,
    special_tokens: Sequence[str],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    *,
    line_cuts: bool,
    first_line: int = 1,
    pretokenizer: Pretokenizer | None = None,
) -> Iterator[Chunk]:
    """The shard's chunks, with offsets in the file (so error messages name the true byte offset).

    JSON-lines line numbers start at ``first_line``; callers pass :func:`first_line_of` when they need
    exact numbers (only for an error message: it reads the file up to the shard). A ``pretokenizer`` adds
    its own cuts where a long stretch has no safe one (``ChunkCutter``).
    """
    if is_table(Path(shard.path)):  # a whole file (`plan_shards`), read by its parts
        yield from iter_chunks(Path(shard.path), special_tokens, chunk_bytes, line_cuts=line_cuts)
        return
    jsonl = shard.jsonl
    cutter = None if jsonl else ChunkCutter(special_tokens, line_cuts, pretokenizer)
    with open_binary(Path(shard.path)) as stream:
        source: BinaryIO = stream
        if shard.end is not None:
            stream.seek(shard.start)
            source = _Limited(stream, shard.end - shard.start)  # type: ignore[assignment]
        yield from cut_stream(
            source, shard.path, jsonl, cutter, max(1, chunk_bytes), shard.start, first_line
        )


def first_line_of(shard: Shard) -> int:
    """The line number of the shard's first byte (reads the file up to it)."""
    lines = 1
    with open(shard.path, "rb") as stream:
        remaining = shard.start
        while remaining > 0:
            block = stream.read(min(remaining, 1 << 24))
            if not block:
                break
            lines += block.count(b"\n")
            remaining -= len(block)
    return lines


def with_true_line_numbers(shard: Shard, run: Callable[[int], Any]) -> Any:
    """``run(1)``; when it fails on a JSON-lines shard that starts inside its file, run again from the
    shard's true first line so the error names the right line (the file is read up to the shard only then)."""
    try:
        return run(1)
    except InputError:
        if not shard.jsonl or shard.start == 0:
            raise
    return run(first_line_of(shard))


def shard_size(shard_bytes: int, parallelism: int, paths: Sequence[Path]) -> int:
    """``shard_bytes``, or smaller so that a small corpus still gives every task slot about four shards
    (a 100 MB file in 128 MB shards would be one task). Shards never change results, only balance."""
    total = sum(p.stat().st_size for p in paths)
    return max(1, min(shard_bytes, max(_MIN_SHARD_BYTES, total // (4 * parallelism))))


def group_shards(blocks: Sequence[Shard], group_bytes: int) -> list[tuple[Shard, ...]]:
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
