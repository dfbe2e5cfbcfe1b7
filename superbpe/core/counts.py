"""Piece counts: how often each pre-tokenized piece occurs in a corpus.

Counting is the only pass over the raw corpus, so counts are a first-class, saveable object:
count once and train many times, or count shards on many machines and add the results.
Memory grows with the number of distinct pieces, never with corpus size.
"""

from __future__ import annotations

import json
import numbers
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from superbpe.core.errors import ConfigError, InputError, SuperBPEError
from superbpe.core.pretokenize import Pretokenizer, SpecialSplitter, get_pretokenizer, special_token_list
from superbpe.core.sources import (
    SAVED_COUNTS_START,
    SAVED_COUNTS_START_UNCHECKED,
    InputSpec,
    check_not_empty,
    resolve_inputs,
)
from superbpe.core.util import atomic_write, directory_problem, usable_cpus, user_path, whole_number

COUNTS_MAGIC = SAVED_COUNTS_START
#: Format 1: the same layout without the checksum that ends a file of the current format.
COUNTS_MAGIC_UNCHECKED = SAVED_COUNTS_START_UNCHECKED
#: The end of a ``.counts`` file: CRC-32 (``zlib.crc32``) of every byte before it.
_CHECKSUM = struct.Struct("<I")
#: Entries are written in blocks of about this many bytes, each added to the checksum at once.
_BLOCK_BYTES = 1 << 20
ProgressFn = Callable[[int], None]
#: Below this many bytes a corpus is counted in this process (workers would cost more than they save).
PARALLEL_MIN_BYTES = 8 << 20


def counts_file_to_write(path: str | os.PathLike[str]) -> Path:
    """``path`` as a file that piece counts can be saved to, else one line saying why not: an error from
    the write named the temp file beside it, or the working directory for an empty path."""
    target = user_path(path)
    if not str(path) or target.is_dir():
        raise InputError(f"cannot save piece counts to {str(path)!r}: it is a directory; give a file path")
    if (problem := directory_problem(target.parent)) is not None:
        raise InputError(f"cannot save piece counts to {target}: cannot write in {target.parent}: {problem}")
    return target


class PieceCounts(Mapping[bytes, int]):
    """A mapping from piece bytes to count, tagged with how the pieces were made.

    The tag (``meta``: pre-tokenizer spec and special tokens) makes adding counts made with
    different patterns an error instead of a silently wrong tokenizer.
    """

    def __init__(
        self, counts: Mapping[bytes, int] | None = None, meta: Mapping[str, Any] | None = None
    ) -> None:
        self.counts: dict[bytes, int] = dict(counts or {})
        self.meta: dict[str, Any] = dict(meta or {})

    def __getitem__(self, piece: bytes) -> int:
        return self.counts[piece]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.counts)

    def __len__(self) -> int:
        return len(self.counts)

    def total(self) -> int:
        """Number of piece occurrences in the corpus."""
        return sum(self.counts.values())

    def bytes_seen(self) -> bytes:
        """The distinct byte values of the pieces that occur, ascending."""
        seen: set[int] = set()
        for piece, count in self.items():
            if count > 0 and len(seen) < 256:
                seen.update(piece)
        return bytes(sorted(seen))

    def to_dict(self) -> dict[bytes, int]:
        return dict(self.counts)

    def update(self, other: PieceCounts) -> None:
        """Add ``other`` in place; both must come from the same pre-tokenization."""
        self.check_addable(other)
        mine = self.counts
        for piece, count in other.counts.items():
            mine[piece] = mine.get(piece, 0) + count

    def check_addable(self, other: PieceCounts) -> None:
        """Refuse counts made with another pre-tokenization; take ``other``'s tag when this has none.

        The special tokens are compared as a set: the text is cut at them alike in any order, so shards
        counted with them listed otherwise add up."""
        if not isinstance(other, PieceCounts):
            raise SuperBPEError(
                f"piece counts add only to piece counts (from superbpe.count or PieceCounts.load), not "
                f"{type(other).__name__}"
            )
        if self.meta and other.meta and _made_alike(self.meta) != _made_alike(other.meta):
            made = f"{_made(self.meta)} and {_made(other.meta)}"
            raise SuperBPEError(f"cannot add piece counts made differently: {made}")
        self.meta = self.meta or dict(other.meta)

    def __add__(self, other: PieceCounts) -> PieceCounts:
        result = PieceCounts(self.counts, self.meta)
        result.update(other)
        return result

    def __radd__(self, other: object) -> PieceCounts:
        """``0 + counts``, so that ``sum(shards)`` adds a list of counts (``sum`` starts from 0)."""
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return PieceCounts(self.counts, self.meta)
        raise SuperBPEError(f"piece counts add only to piece counts, not {type(other).__name__}")

    def key_bytes(self) -> int:
        """The bytes of all pieces."""
        return sum(map(len, self.counts))

    def __repr__(self) -> str:
        pre = (self.meta.get("pretokenizer") or {}).get("name", "unknown")
        return f"{type(self).__name__}({len(self)} distinct of {self.total()} pieces, pretokenizer {pre})"

    def meta_bytes(self) -> bytes:
        """The meta as the ``.counts`` file holds it."""
        return json.dumps(self.meta, sort_keys=True).encode("utf-8")

    def file_size(self) -> int:
        """Bytes of the ``.counts`` file :meth:`save` writes, without making it."""
        header = len(COUNTS_MAGIC) + 4 + len(self.meta_bytes()) + 8
        return header + 12 * len(self) + self.key_bytes() + _CHECKSUM.size

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ``.counts`` binary format (see docs/DESIGN.md) atomically."""
        with atomic_write(counts_file_to_write(path)) as out:
            out.writelines(self._serialized())

    def to_bytes(self) -> bytes:
        """The ``.counts`` format in memory (what a shard task sends back)."""
        return b"".join(self._serialized())

    def _serialized(self) -> Iterator[bytes]:
        """The file in blocks, its checksum closing the last: summed block by block, not entry by
        entry (a call per entry cost more than making the entry)."""
        meta = self.meta_bytes()
        block = [COUNTS_MAGIC + struct.pack("<I", len(meta)) + meta + struct.pack("<Q", len(self.counts))]
        pack = struct.Struct("<I").pack
        pack_count = struct.Struct("<Q").pack
        checksum = size = 0
        for piece in sorted(self.counts):
            entry = pack(len(piece)) + piece + pack_count(self.counts[piece])
            block.append(entry)
            size += len(entry)
            if size >= _BLOCK_BYTES:
                data = b"".join(block)
                checksum = zlib.crc32(data, checksum)
                yield data
                block, size = [], 0
        data = b"".join(block)
        yield data + _CHECKSUM.pack(zlib.crc32(data, checksum))

    @classmethod
    def from_bytes(cls, data: bytes) -> PieceCounts:
        """Inverse of :meth:`to_bytes`."""
        try:
            return cls._parse(data, require_checksum=False)
        except (struct.error, ValueError, IndexError) as exc:
            raise InputError(f"not a valid piece-counts table ({exc})") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, require_checksum: bool = False) -> PieceCounts:
        """Read a ``.counts`` file written by either engine. Its checksum is checked before anything in
        it is believed; a file of format 1, which has none, is refused with ``require_checksum`` (what a
        cache wants: counts it cannot check could change a run's merges unseen)."""
        try:
            data = user_path(path).read_bytes()
        except OSError as exc:
            raise InputError(f"{path}: cannot read piece counts ({exc.strerror})") from None
        try:
            return cls._parse(data, require_checksum=require_checksum)
        except struct.error:
            raise InputError(f"{path}: a piece-counts file cut short (copy it whole)") from None
        except (ValueError, IndexError) as exc:
            raise InputError(f"{path}: not a valid piece-counts file ({exc})") from None

    @classmethod
    def _parse(cls, data: bytes, *, require_checksum: bool) -> PieceCounts:
        end = _checked_end(data, require_checksum=require_checksum)
        pos = len(COUNTS_MAGIC)
        (meta_len,) = struct.unpack_from("<I", data, pos)
        meta = json.loads(data[pos + 4 : pos + 4 + meta_len])
        pos += 4 + meta_len
        (entries,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        counts: dict[bytes, int] = {}
        unpack_len = struct.Struct("<I").unpack_from
        unpack_count = struct.Struct("<Q").unpack_from
        for _ in range(entries):
            (size,) = unpack_len(data, pos)
            piece = data[pos + 4 : pos + 4 + size]
            (counts[piece],) = unpack_count(data, pos + 4 + size)
            pos += 12 + size
        if pos != end:
            raise ValueError("trailing bytes")
        return cls(counts, meta)


def bad_piece_count(piece: object, freq: object) -> SuperBPEError | None:
    """Why ``piece: freq`` is no entry of piece counts (bytes to a whole count >= 0), or None. Counts a
    user makes (``PieceCounts({...})``) are checked by the trainers with it: a str piece or a float count
    failed deep inside either engine, and differently in each."""
    if not isinstance(piece, bytes):
        hint = " (encode text to UTF-8 bytes)" if isinstance(piece, str) else ""
        return SuperBPEError(f"piece counts map bytes to counts, not {type(piece).__name__}: {piece!r}{hint}")
    if isinstance(freq, bool) or not isinstance(freq, numbers.Integral):
        return SuperBPEError(f"piece {piece!r} has a count that is not an integer: {freq!r}")
    if freq < 0:
        return SuperBPEError(f"piece {piece!r} has a negative count {freq}")
    return None


def counts_file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the ``.counts`` file at ``path`` cannot be trusted (damaged, cut short, format 1 without a
    checksum, not such a file), or None when its checksum matches. Reads it a block at a time and
    builds no table, so checking a cache of large files costs their reading only."""
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            start = file.read(len(COUNTS_MAGIC))
            if start != COUNTS_MAGIC:
                _checked_end(start, require_checksum=True)  # says which format or that it is none
                return "its checksum does not match: damaged or cut short since it was written"
            checksum, left = zlib.crc32(start), size - len(start) - _CHECKSUM.size
            while left > 0 and (block := file.read(min(left, 16 << 20))):
                checksum, left = zlib.crc32(block, checksum), left - len(block)
            written = file.read(_CHECKSUM.size)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    except ValueError as exc:
        return str(exc)
    if left != 0 or len(written) != _CHECKSUM.size or _CHECKSUM.unpack(written)[0] != checksum:
        return "its checksum does not match: damaged or cut short since it was written"
    return None


def counts_file_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], int] | None:
    """The tag (pre-tokenizer, special tokens) and the number of distinct pieces a ``.counts`` file
    says it holds, read from its header alone (its checksum is not checked: :func:`counts_file_problem`
    does); None when the file is not one. Says what a cached count is without reading it all."""
    try:
        with open(path, "rb") as file:
            if file.read(len(COUNTS_MAGIC)) not in (COUNTS_MAGIC, COUNTS_MAGIC_UNCHECKED):
                return None
            (meta_len,) = struct.unpack("<I", file.read(4))
            meta = json.loads(file.read(meta_len))
            (entries,) = struct.unpack("<Q", file.read(8))
    except (OSError, struct.error, ValueError):
        return None
    return (meta, entries) if isinstance(meta, dict) else None


def _checked_end(data: bytes, *, require_checksum: bool) -> int:
    """Where the entries of ``.counts`` bytes end, once their checksum is found to match (format 1 has
    none: read only without ``require_checksum``); ``ValueError`` saying why not."""
    if data.startswith(COUNTS_MAGIC):
        end = len(data) - _CHECKSUM.size
        written = _CHECKSUM.unpack_from(data, end)[0] if end >= len(COUNTS_MAGIC) else None
        if written is None or zlib.crc32(memoryview(data)[:end]) != written:
            raise ValueError("its checksum does not match: damaged or cut short since it was written")
        return end
    if data.startswith(COUNTS_MAGIC_UNCHECKED):
        if require_checksum:
            raise ValueError("format 1, which has no checksum to check it by")
        return len(data)
    if data[:4] == COUNTS_MAGIC[:4] and data[5:6] == b"\n" and data[4:5] > COUNTS_MAGIC[4:5]:
        raise ValueError(f"format {data[4]} of a later superbpe, not read by this one")
    raise ValueError("bad magic")


def _made_alike(meta: Mapping[str, Any]) -> dict[str, Any]:
    """``meta`` as far as it decides the pieces: its special tokens' order does not."""
    specials = meta.get("special_tokens")
    return {**meta, "special_tokens": sorted(specials) if isinstance(specials, list) else specials}


def _made(meta: Mapping[str, Any]) -> str:
    """How counts were made, in a few words (the whole tag holds a regex)."""
    spec = meta.get("pretokenizer") or {}
    units = ", line units" if spec.get("line_units") else ""
    return f"pretokenizer {spec.get('name')}{units} with special tokens {meta.get('special_tokens')}"


def counts_meta(pretokenizer: Pretokenizer, special_tokens: Iterable[str]) -> dict[str, Any]:
    """The tag that says how pieces were made: equal tags mean addable counts."""
    return {"pretokenizer": pretokenizer.spec(), "special_tokens": list(dict.fromkeys(special_tokens))}


def prepare_count(
    inputs: InputSpec, pretokenizer: str | Pretokenizer, special_tokens: Iterable[str], errors: str
) -> tuple[Pretokenizer, list[str], list[Path]]:
    """The checks every engine runs before reading a byte: options first, then the inputs."""
    pre = get_pretokenizer(pretokenizer)
    specials = special_token_list(special_tokens)
    SpecialSplitter(specials)
    check_errors_mode(errors)
    paths = resolve_inputs(inputs)
    check_not_empty(paths)
    return pre, specials, paths


def prepare_stream(
    pretokenizers: Sequence[Pretokenizer], special_tokens: Iterable[str], errors: str
) -> list[str]:
    """The checks a stream count runs before reading a document (both engines)."""
    if not pretokenizers:
        raise SuperBPEError("count_documents needs at least one pre-tokenizer")
    specials = special_token_list(special_tokens)
    SpecialSplitter(specials)
    check_errors_mode(errors)
    return specials


def check_errors_mode(errors: str) -> None:
    """A bad ``errors`` is a setting's mistake, told as every other bad option is (``ConfigError``)."""
    if errors not in ("strict", "replace"):
        raise ConfigError(f"errors must be 'strict' or 'replace', not {errors!r}")


def resolve_workers(workers: int | None, corpus_bytes: int) -> int:
    """An explicit count wins; otherwise one per usable core but one, and none for small inputs.

    The parent process reads and hands out chunks, so it needs a core of its own: on a
    two-core machine counting in-process is faster than one worker plus the feeder.
    """
    if workers is not None:
        return whole_number(workers, "workers")
    if corpus_bytes < PARALLEL_MIN_BYTES:
        return 1
    cores = usable_cpus()
    return max(1, cores - 1)
