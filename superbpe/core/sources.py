"""Corpus inputs: which files, how to read them, and where they may be cut into chunks.

Counting runs on chunks so that memory is bounded by the chunk size and chunks can go to worker
processes. A chunk boundary must never change the pieces, so chunks are only cut right before a
special token (text is split there anyway) or at a *safe cut* (after a newline that is followed by
a non-space character; see :mod:`superbpe.core.pretokenize`).

Tables (``.parquet`` files, and the ``.arrow`` files of an HF ``datasets`` directory saved with
``save_to_disk``) hold one document per row in the ``text_field`` column, like JSON lines. Their
chunks are row groups / record batches that name their part instead of carrying bytes, and the
documents are read where the chunk is counted (a worker reads its own part). Reading them needs
``pyarrow`` (the ``parquet`` extra).
"""

from __future__ import annotations

import codecs
import contextlib
import glob
import gzip
import hashlib
import io
import itertools
import json
import logging
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import regex

from superbpe.core.errors import InputError
from superbpe.core.pretokenize import Pretokenizer
from superbpe.core.util import caller_stacklevel, import_optional

log = logging.getLogger("superbpe")

TEXT_SUFFIXES = (".txt", ".jsonl", ".txt.gz", ".jsonl.gz", ".parquet")
#: Read as JSON lines too when named as inputs: HF datasets' ``to_json`` writes JSON lines under this name.
JSON_SUFFIXES = (".json", ".json.gz")
TABLE_SUFFIXES = (".parquet", ".arrow")
DEFAULT_CHUNK_BYTES = 4 << 20
_ASCII_SPACE = frozenset(b"\t\n\x0b\x0c\r ")
#: A chunk cutter with a pre-tokenizer uses its cuts after this many bytes without a safe cut.
LOCAL_CUT_WINDOW = 1 << 16
_NON_SPACE = regex.compile(r"\S")

InputSpec = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
#: A corpus given as documents: any iterable of strings (or of mappings holding the text under
#: ``text_field``, as rows of a ``datasets`` stream are) that is not a list or tuple of paths.
DocumentStream = Iterable[str] | Iterable[Mapping[str, Any]]


def is_document_stream(inputs: Any) -> bool:
    """Whether ``inputs`` are documents rather than paths: any iterable but a string, a path, or a list or
    tuple (of paths, as always). Generators, iterators, ``map`` objects and ``datasets`` streams qualify."""
    if isinstance(inputs, (str, bytes, os.PathLike, list, tuple)):
        return False
    return isinstance(inputs, Iterable) and not isinstance(inputs, Mapping)


def document_blocks(
    documents: DocumentStream, block_chars: int, errors: str = "strict", text_field: str = "text"
) -> Iterator[list[str]]:
    """The stream's documents in lists of about ``block_chars`` characters, read lazily (the stream is
    never held whole). Each is checked: a string, or a mapping with a string under ``text_field``; a
    lone surrogate (not UTF-8) is an error, or with ``errors="replace"`` three U+FFFD, one per byte of its
    ``surrogatepass`` form (as a file holding those bytes reads)."""
    block: list[str] = []
    size = 0
    empty = True
    for number, item in enumerate(documents):
        empty = False
        text = _document_text(item, number, text_field)
        if number == 0:
            _warn_if_a_path(text)
        if not text.isascii():
            text = _checked_unicode(text, f"document {number}", errors)
        block.append(text)
        size += len(text)
        if size >= block_chars:
            yield block
            block, size = [], 0
    if empty:
        raise InputError("the document stream is empty: no documents to count")
    if block:
        yield block


def _warn_if_a_path(text: str) -> None:
    """A stream whose first document names a file was most likely meant as paths (a generator of paths
    is a stream of texts; paths go in a list or tuple)."""
    try:
        names_a_file = len(text) < 4096 and "\n" not in text and Path(text).expanduser().is_file()
    except (OSError, ValueError, RuntimeError):
        # Not a possible path: a NUL byte, a name too long, or a leading "~" that names no user's home
        # ("~~~ code", "~ 5 km"), for which expanduser raises RuntimeError.
        names_a_file = False
    if names_a_file:
        warnings.warn(
            f"the first document {text!r} is the name of a file, but an iterator is read as texts: pass "
            "paths as a list or tuple",
            UserWarning,
            stacklevel=caller_stacklevel(),
        )


def _document_text(item: Any, number: int, text_field: str) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, os.PathLike):
        raise InputError(
            f"document {number} is a path ({item}); an iterator is read as texts: pass paths as a list, "
            "e.g. list(Path('corpus').glob('*.txt'))"
        )
    if isinstance(item, Mapping):
        text = item.get(text_field)
        if isinstance(text, str):
            return text
        raise InputError(f"document {number}: {_no_text_field(item, text_field)}")
    raise InputError(
        f"document {number} is a {type(item).__name__}, not a string (give texts, or rows with a "
        f"{text_field!r} field)"
    )


#: What ``errors="replace"`` makes of a lone surrogate, for its error's hint.
SURROGATE_REPLACED = "it as three U+FFFD (one per byte of its UTF-8 form)"


def _checked_unicode(text: str, where: str, errors: str) -> str:
    """``text`` if it is valid Unicode; a lone surrogate is an error, or U+FFFD per byte under "replace".
    Python texts and JSON strings (``"\\ud800"``, a cut-off emoji in scraped text) can hold one."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        if errors == "replace":
            return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        raise InputError(
            f"{where}: unpaired surrogate {text[exc.start]!r} at character {exc.start} (not UTF-8); "
            + REPLACE_HINT.replace("such bytes as U+FFFD", SURROGATE_REPLACED)
        ) from None
    return text


def resolve_inputs(inputs: InputSpec) -> list[Path]:
    """Expand files, directories (recursively, sorted) and globs into a list of existing files."""
    if isinstance(inputs, bytes):
        named = os.fsdecode(inputs)
        raise InputError(f"inputs are a path (str or Path) or a list of them, not bytes: {named!r}")
    if isinstance(inputs, Mapping):
        first = next(iter(inputs.items()), None)
        if first is not None and not isinstance(first[1], str):  # a datasets DatasetDict: splits by name
            names = ", ".join(map(repr, list(inputs)[:3])) + (", ..." if len(inputs) > 3 else "")
            raise InputError(
                f"inputs are paths or documents, not a mapping of splits ({names}): give one, "
                f"inputs[{first[0]!r}]"
            )
        raise InputError("inputs are paths or documents, not a mapping: a row of text goes in a list, [row]")
    if not isinstance(inputs, (str, os.PathLike, Iterable)):
        raise InputError(f"inputs are a path or a list of paths, not {type(inputs).__name__}")
    items = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    if not items:
        raise InputError("no input paths given")
    for number, item in enumerate(items):
        if not isinstance(item, (str, os.PathLike)):
            raise InputError(f"inputs[{number}] is of type {type(item).__name__}, not a path (str or Path)")
        if not str(item).strip():  # "" is the working directory to Path: a $CORPUS never set read it all
            raise InputError(f"inputs[{number}] is an empty path")
    files: list[Path] = []
    read_as = "a str is read as a path" if isinstance(inputs, str) else "a list is read as paths"
    for item in items:
        files.extend(_expand(str(item), read_as))
    unique: dict[Path, Path] = {}  # a file by its real path, however it was named
    repeated = [str(f) for f in files if unique.setdefault(f.resolve(), f) is not f]
    if not unique:
        raise InputError(f"no corpus files found in {', '.join(map(str, items))}")
    if repeated:  # a file listed twice to weight it, or globs and directories that overlap
        shown = ", ".join(dict.fromkeys(repeated[:3])) + (", ..." if len(repeated) > 3 else "")
        log.warning("inputs named more than once are read once: %s", shown)
    return list(unique.values())


#: The first bytes of a file ``PieceCounts.save`` writes (``core/counts.py`` checks them on load).
SAVED_COUNTS_START = b"SBPC\x02\n"
#: The first bytes of a file of the format before, which had no checksum.
SAVED_COUNTS_START_UNCHECKED = b"SBPC\x01\n"


def _expand(item: str, read_as: str = "a list is read as paths") -> list[Path]:
    """The files ``item`` names; ``read_as`` says, for an item that looks like text, how it was taken."""
    try:
        path = Path(item).expanduser()
    except RuntimeError:  # "~name" of no user, or text given as a path ("~~~ code"): said as not found below
        path = Path(item)
    if path.is_file():
        _refuse_what_is_not_text(path)
        return [path]
    dataset = _saved_dataset_files(path) if path.is_dir() else None
    if dataset is not None:
        return dataset
    if path.is_dir():
        files = _files_under(path)
        hidden = [p for p in files if _hidden(p, path) and named_as(p, TEXT_SUFFIXES)]
        if hidden:  # .ipynb_checkpoints/ holds copies of the notebooks' texts: read, they counted twice
            shown = ", ".join(str(p.relative_to(path)) for p in hidden[:3]) + (", ..." * (len(hidden) > 3))
            log.warning("%s: %d hidden file(s) not read (name them as inputs to read them): %s",
                        path, len(hidden), shown)  # fmt: skip
        files = [p for p in files if not _hidden(p, path)]
        found = [p for p in files if named_as(p, TEXT_SUFFIXES)]
        if not found:
            raise InputError(f"{path}: directory holds no {'/'.join(TEXT_SUFFIXES)} files")
        for file in found:
            if not file.is_file():
                raise InputError(_not_regular(file))
            _refuse_what_is_not_text(file)
        _log_skipped(path, [p for p in files if not named_as(p, TEXT_SUFFIXES)])
        return found
    if glob.has_magic(item):
        matched = sorted(Path(p) for p in glob.glob(os.path.expanduser(item), recursive=True))
        found = [file for p in matched for file in _matched_files(p, item)]
        if not found:
            raise InputError(f"{item}: glob matches no files")
        return found
    if any(char.isspace() or char == "\0" for char in item):  # a text, most likely: shown quoted, on one line
        shown = item if len(item) <= 80 else f"{item[:60]}..."
        raise InputError(
            f"{shown!r}: no such file or directory ({read_as}: pass texts as an iterator, e.g. iter(texts))"
        )
    if path.exists():  # a pipe, /dev/stdin, a device: read more than once (sizes, fingerprints, stages)
        raise InputError(_not_regular(path))
    raise InputError(f"{path}: no such file or directory")


def _not_regular(path: Path) -> str:
    return f"{path}: not a regular file (a pipe or device cannot be read twice): save it first"


def _files_under(directory: Path) -> list[Path]:
    """Every file below ``directory``, through linked directories too (each real directory once), in
    order. A link to nothing is said, not passed over: a data folder of links (git-annex, DVC) whose
    files were never fetched would otherwise train on less than meant without a word."""
    files, broken, seen = [], [], set()
    for top, dirs, names in os.walk(directory, followlinks=True):
        real = os.path.realpath(top)
        if real in seen:  # a link back up the tree
            dirs.clear()
            continue
        seen.add(real)
        dirs.sort()
        for name in names:
            (files if os.path.exists(os.path.join(top, name)) else broken).append(Path(top) / name)
    if broken:
        shown = ", ".join(str(p.relative_to(directory)) for p in broken[:3]) + (", ..." * (len(broken) > 3))
        log.warning("%s: %d link(s) to nothing not read: %s", directory, len(broken), shown)
    # Pipes, sockets and devices stay in: one named like a corpus file is refused, not passed over.
    return sorted(p for p in files if not p.is_dir())


def _matched_files(path: Path, pattern: str) -> list[Path]:
    """The files a glob's match stands for: itself, or what a directory it matched holds (said, not
    passed over, when that is nothing to read)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    try:
        return _expand(str(path))
    except InputError as exc:
        log.warning("%s matches %s, which is not read: %s", pattern, path, exc)
        return []


#: How files compressed other than with gzip begin (no text does), which would be read as text.
OTHER_COMPRESSION = {
    "xz": regex.compile(rb"\xfd7zXZ\x00"),
    "bzip2": regex.compile(rb"BZh[1-9]1AY&SY"),
    "zstd": regex.compile(rb"\x28\xb5\x2f\xfd"),
    "zip": regex.compile(rb"PK\x03\x04"),
}


def _refuse_what_is_not_text(path: Path) -> None:
    """Files that are not text named as a corpus were read as text, and ``errors=replace``, which their
    invalid UTF-8 pointed to, made a tokenizer of their bytes: saved piece counts (refused, saying how
    they are used) and files compressed other than with gzip."""
    start = b""
    with contextlib.suppress(OSError), open(path, "rb") as file:
        start = file.read(16)
    if start.startswith((SAVED_COUNTS_START, SAVED_COUNTS_START_UNCHECKED)):
        raise InputError(
            f"{path} holds saved piece counts, not text: PieceCounts.load({str(path)!r}) gives them, "
            "and train_bpe takes them in place of the corpus"
        )
    kind = next((name for name, magic in OTHER_COMPRESSION.items() if magic.match(start)), None)
    if kind is not None:
        raise InputError(f"{path}: compressed with {kind}, which is not read (gzip is): decompress it first")


def _hidden(path: Path, directory: Path) -> bool:
    """A dot-file or a file under a dot-directory (``.git/``, ``.DS_Store``): no one meant it as text."""
    return any(part.startswith(".") for part in path.relative_to(directory).parts)


def _log_skipped(directory: Path, skipped: Sequence[Path]) -> None:
    """Say which files of a corpus directory are not read (a ``.json``, ``.md``, ``.zst``, a datasets
    directory inside it): a directory is read by suffix, and a run on less than meant was silent."""
    if skipped:
        shown = ", ".join(str(p.relative_to(directory)) for p in skipped[:3]) + (", ..." * (len(skipped) > 3))
        log.warning(
            "%s: %d file(s) not read (a directory is read for %s; name others as inputs): %s",
            directory, len(skipped), "/".join(TEXT_SUFFIXES), shown,
        )  # fmt: skip


def _saved_dataset_files(path: Path) -> list[Path] | None:
    """The Arrow files of an HF ``datasets`` directory (``save_to_disk``) in order; None if it is not one.

    A ``Dataset`` directory lists its files in ``state.json``; a ``DatasetDict`` directory lists its
    splits (subdirectories) in ``dataset_dict.json``, taken in that order.
    """
    state, splits = path / "state.json", path / "dataset_dict.json"
    try:
        if state.is_file() and (path / "dataset_info.json").is_file():
            entries = json.loads(state.read_text(encoding="utf-8"))["_data_files"]
            return [path / entry["filename"] for entry in entries]
        if splits.is_file():
            names = json.loads(splits.read_text())["splits"]
            if len(names) > 1:  # a test split read with train is a silent contamination
                log.warning("%s: a DatasetDict; reading every split: %s (name a split's directory to read "
                            "only it)", path, ", ".join(names))  # fmt: skip
            found = [_saved_dataset_files(path / split) for split in names]
            return [file for files in found for file in files or []]
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: unreadable datasets directory ({exc})") from None
    return None


def named_as(path: Path | str, suffixes: tuple[str, ...]) -> bool:
    """Whether the name of ``path`` ends in one of ``suffixes`` (lowercase), whatever its case:
    ``DOCS.JSONL`` is JSON lines, not text that happens to be JSON."""
    return str(path).lower().endswith(suffixes)


def is_table(path: Path) -> bool:
    return named_as(path, TABLE_SUFFIXES)


def input_files_state(paths: Iterable[Path]) -> list[list[Any]]:
    """Each corpus file as ``[path, size, mtime_ns]``: the cheap identity of a corpus
    (:func:`fingerprint_of_files`), kept whole so that a refused resume can name the file that changed."""
    state = []
    for path in paths:
        stat = path.stat()
        state.append([str(path.resolve()), stat.st_size, stat.st_mtime_ns])
    return state


def check_unchanged(paths: Sequence[Path], before: Sequence[Sequence[Any]], doing: str) -> None:
    """Refuse a corpus file whose size or time differs from ``before`` (its :func:`input_files_state`
    when reading began): what was read of a file being appended to or cut is some part of it that no
    later read gives again, and the run would record the file as it is now."""
    for path, (_, size, mtime) in zip(paths, before, strict=True):
        stat = path.stat()
        if (stat.st_size, stat.st_mtime_ns) != (size, mtime):
            raise InputError(
                f"{path}: changed while it was {doing} ({size} bytes then, {stat.st_size} now): give "
                "files that no longer change (a copy of one still written to)"
            )


def cut_while_read(path: str | os.PathLike[str], doing: str) -> InputError:
    """The error for a corpus file cut short while the native engine read it from its mapping: what
    it read past the cut was not the file (the same refusal as :func:`check_unchanged`'s, found as
    it happens rather than after)."""
    return InputError(
        f"{path}: changed while it was {doing} (it shrank while it was mapped): give files that no longer "
        "change (a copy of one still written to)"
    )


def fingerprint_of_files(state: Iterable[Sequence[Any]]) -> str:
    """A digest of :func:`input_files_state` for caches and resume checks."""
    digest = hashlib.sha256()
    for path, size, mtime in state:
        # A .json file was once read as text: its mark keeps counts cached then from being taken now.
        read_as = "\0jsonl" if named_as(path, JSON_SUFFIXES) else ""
        digest.update(f"{path}\0{size}\0{mtime}{read_as}\n".encode())
    return digest.hexdigest()[:32]


def input_fingerprint(paths: Iterable[Path]) -> str:
    """The cheap identity of a corpus (path, size, mtime), as :func:`fingerprint_of_files` digests it."""
    return fingerprint_of_files(input_files_state(paths))


def is_jsonl(path: Path) -> bool:
    """One document per line, as a JSON object holding its text."""
    return named_as(path, (".jsonl", ".jsonl.gz", *JSON_SUFFIXES))


GZIP_MAGIC = b"\x1f\x8b"


def is_gzipped(path: Path) -> bool:
    """Whether ``path`` holds gzip data (by magic number, not by name, as :func:`open_binary` reads it)."""
    try:
        with open(path, "rb") as probe:
            return probe.read(2) == GZIP_MAGIC
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def open_binary(path: Path) -> BinaryIO:
    """Open raw or gzip-compressed bytes (by magic number, not by name)."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - returned to the caller
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if raw.peek(2)[:2] == GZIP_MAGIC:
        raw.close()  # opened again by gzip, which then closes it with itself
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return raw


@dataclass(frozen=True)
class Chunk:
    """A slice of one file's (decompressed) bytes, cut where pieces cannot cross; or one part of a table.

    ``jsonl`` means one document per record (JSON lines and tables). A table chunk has no bytes and names
    its parts (row groups or record batches ``start <= i < stop``) in ``table_parts``; ``first_line`` is its
    first row (from 1).
    """

    path: str
    offset: int
    data: bytes
    jsonl: bool
    first_line: int = 1
    table_parts: tuple[int, int] | None = None
    file_bytes: int | None = None  # gzip, tables: the file's bytes on disk this chunk stands for
    documents: tuple[str, ...] | None = None  # a block of a document stream: its texts, no bytes

    @property
    def is_text(self) -> bool:
        """One text given as its bytes: not JSON lines, a table's rows or a stream's documents."""
        return not self.jsonl and self.table_parts is None and self.documents is None

    @property
    def read_bytes(self) -> int:
        """The bytes of the file on disk this chunk stands for: what progress counts, so that it ends at
        the file's size (a gzip file's chunks hold several times more bytes than it has)."""
        return len(self.data) if self.file_bytes is None else self.file_bytes


class ChunkCutter:
    """Finds chunk boundaries that leave the pieces unchanged.

    ``line_cuts`` says whether safe cuts may be used (``Pretokenizer.safe_cuts_hold``); without them
    text is cut only before special tokens. With a ``pretokenizer``, a stretch of :data:`LOCAL_CUT_WINDOW`
    bytes without a safe cut is also cut where its rules allow (``Pretokenizer.first_local_cut``: about
    every word for the built-in patterns), so text whose lines end in whitespace (WikiText's `` \n``)
    still comes in chunks of about the size asked for.
    """

    def __init__(
        self, special_tokens: Sequence[str], line_cuts: bool = True, pretokenizer: Pretokenizer | None = None
    ) -> None:
        self.specials = [t.encode("utf-8") for t in dict.fromkeys(special_tokens) if t]
        self.longest = max(map(len, self.specials), default=0)
        # Special tokens holding U+FFFD also match bytes that errors="replace" reads as U+FFFD, which a
        # search of the raw bytes cannot see: near a cut they are looked for in the decoded text too.
        self.replaced_specials = [t for t in dict.fromkeys(special_tokens) if "\ufffd" in t]
        self.line_cuts = line_cuts
        self.pretokenizer = pretokenizer

    def find(self, buf: bytes, start: int) -> int:
        """The first safe boundary at or after ``start`` (not at 0), or -1 when none is known yet."""
        found = self._find(buf, start)
        if self.pretokenizer is None or (found != -1 and found - start <= LOCAL_CUT_WINDOW):
            return found
        local = self._local_cut(buf, start)
        return local if local != -1 and (found == -1 or local < found) else found

    def _local_cut(self, buf: bytes, start: int) -> int:
        """The first cut of the pre-tokenizer's rules at or after ``start``, judged on a window of the bytes
        around it decoded (-1 when the window has none, or is not valid UTF-8: then its chunk's decoding
        reports it). A cut whose characters or neighbours belong to a special token is not used: the rules
        hold inside one stretch of ordinary text. So is one too near the end of ``buf`` to tell."""
        assert self.pretokenizer is not None
        begin = max(start - 8, 0)
        while begin < start and 0x80 <= buf[begin] < 0xC0:  # start the window on a character
            begin += 1
        # Only where any special token near a cut is wholly in ``buf`` (the rest of the file is not read yet).
        margin = 8 + self.longest
        end = min(start + LOCAL_CUT_WINDOW, len(buf) - margin)
        if end <= start:
            return -1
        window = buf[begin:end]
        try:
            text = codecs.getincrementaldecoder("utf-8")("strict").decode(window, final=False)
        except UnicodeDecodeError:
            return -1
        skip = len(buf[begin:start].decode("utf-8", "ignore"))  # characters before ``start``
        at = self.pretokenizer.first_local_cut(text, skip)
        while at != -1:
            cut = begin + len(text[:at].encode("utf-8"))
            if cut >= start and self._clear_of_specials(buf, cut) and self._clear_of_replaced(buf, cut, 8):
                return cut
            at = self.pretokenizer.first_local_cut(text, at + 1)
        return -1

    def _clear_of_specials(self, buf: bytes, pos: int) -> bool:
        """No special token within the two characters (eight bytes) each side of ``pos``."""
        for special in self.specials:
            # Any occurrence that overlaps [pos - 8, pos + 8], wholly inside the searched range.
            if buf.find(special, max(0, pos - 8 - len(special) + 1), pos + 8 + len(special)) != -1:
                return False
        return True

    def _find(self, buf: bytes, start: int) -> int:
        found = self._first_candidate(buf, start)
        # A special token that straddles a cut is seen only when it lies wholly in ``buf``: a cut nearer
        # its end than the longest special is not known yet, as the bytes after it may complete one.
        return found if found <= len(buf) - self.longest + 1 else -1

    def _first_candidate(self, buf: bytes, start: int) -> int:
        """The first cut at or after ``start`` that no special token wholly in ``buf`` straddles."""
        best = -1
        for special in self.specials:
            pos = buf.find(special, max(start, 1))
            while pos != -1 and not self._outside_specials(buf, pos):
                pos = buf.find(special, pos + 1)
            if pos != -1 and (best == -1 or pos < best):
                best = pos
        if not self.line_cuts:
            return best
        limit = len(buf) if best == -1 else best
        pos = buf.find(b"\n", max(start - 1, 0), limit)
        while pos != -1:
            cut = pos + 1
            if (
                buf[cut : cut + 1] != b"/"
                and _ends_non_space(buf, pos)
                and _starts_non_space(buf, cut)
                and self._outside_specials(buf, cut)
            ):
                return cut
            pos = buf.find(b"\n", cut, limit)
        return best

    def _outside_specials(self, buf: bytes, pos: int) -> bool:
        """True when no special-token occurrence straddles ``pos``."""
        for special in self.specials:
            lo = max(0, pos - len(special) + 1)
            found = buf.find(special, lo, pos + len(special) - 1)
            if found != -1 and found < pos:
                return False
        return self._clear_of_replaced(buf, pos, 0)

    def _clear_of_replaced(self, buf: bytes, pos: int, margin: int) -> bool:
        """No special token holding U+FFFD overlaps the ``margin`` characters each side of ``pos`` (with
        ``margin`` 0: straddles ``pos``) in the text that ``buf`` decodes to with errors="replace".

        Why: such a token matches invalid bytes there (a lone ``0xff`` reads as U+FFFD), so the raw bytes
        do not show it, and a cut through it would leave its two halves to be encoded as plain text. ``pos``
        is a character boundary of the whole decoded text (it follows a newline or starts a special token),
        so the two sides are decoded apart; a window that starts or ends inside a character only reads more
        U+FFFD there, which can only keep a cut from being made. An occurrence spans at most its own UTF-8
        length in raw bytes (each U+FFFD stands for at most three), so the windows see every one near
        ``pos``.
        """
        if not self.replaced_specials:
            return True
        reach = 4 * (self.longest + margin) + 3
        left = buf[max(0, pos - reach) : pos].decode("utf-8", "replace")
        text = left + buf[pos : pos + reach].decode("utf-8", "replace")
        at = len(left)
        for special in self.replaced_specials:
            found = text.find(special, max(0, at - margin - len(special) + 1))
            if found != -1 and found < at + margin and found + len(special) > at - margin:
                return False
        return True


def _ends_non_space(buf: bytes, end: int) -> bool:
    """Whether the character that ends right before ``end`` is a non-space."""
    start = end - 1
    while start > max(end - 4, 0) and 0x80 <= buf[start] < 0xC0:
        start -= 1
    return start >= 0 and _starts_non_space(buf[start:end], 0)


def _starts_non_space(buf: bytes, pos: int) -> bool:
    if pos >= len(buf):
        return False
    byte = buf[pos]
    if byte < 0x80:
        return byte not in _ASCII_SPACE
    char = buf[pos : pos + 4].decode("utf-8", "ignore")[:1]
    return bool(char) and _NON_SPACE.match(char) is not None


def iter_chunks(
    path: Path,
    special_tokens: Sequence[str],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    *,
    line_cuts: bool,
    pretokenizer: Pretokenizer | None = None,
) -> Iterator[Chunk]:
    """Yield a file's bytes in chunks of about ``chunk_bytes`` cut at safe boundaries.

    ``line_cuts`` must come from the pre-tokenizer (``Pretokenizer.safe_cuts_hold``): only then may a
    text be cut at a safe line break; JSON lines are always cut between documents. A ``pretokenizer``
    adds its own cuts where a long stretch has no safe one (:class:`ChunkCutter`).
    """
    if is_table(path):
        yield from _table_chunks(path, max(1, chunk_bytes))
        return
    jsonl = is_jsonl(path)
    cutter = None if jsonl else ChunkCutter(special_tokens, line_cuts, pretokenizer)
    with open_binary(path) as stream:
        yield from cut_stream(stream, str(path), jsonl, cutter, max(1, chunk_bytes))


def cut_stream(
    stream: BinaryIO,
    name: str,
    jsonl: bool,
    cutter: ChunkCutter | None,
    size: int,
    offset: int = 0,
    line: int = 1,
) -> Iterator[Chunk]:
    """Chunks of ``stream``, whose first byte is byte ``offset`` (on line ``line``) of file ``name``."""
    buf, eof = b"", False
    raw = stream.fileobj if isinstance(stream, gzip.GzipFile) else None  # where a gzip file's reads are
    read_before = raw.tell() if raw is not None else 0
    while True:
        cut, searched = -1, size
        while True:
            if len(buf) > searched:
                cut = _next_cut(buf, jsonl, cutter, searched)
                searched = max(size, len(buf) - 64)
            if cut != -1 or eof:
                break
            block = _read(stream, name, size)
            eof = not block
            buf += block
        if cut == -1:
            cut = len(buf)
        if cut == 0:
            return
        data, buf = buf[:cut], buf[cut:]
        compressed = None
        if raw is not None:
            compressed, read_before = raw.tell() - read_before, raw.tell()
        yield Chunk(name, offset, data, jsonl, line, file_bytes=compressed)
        offset += len(data)
        if jsonl:
            line += data.count(b"\n")


def _next_cut(buf: bytes, jsonl: bool, cutter: ChunkCutter | None, start: int) -> int:
    if jsonl:
        pos = buf.find(b"\n", max(start - 1, 0))
        return -1 if pos == -1 else pos + 1
    assert cutter is not None
    return cutter.find(buf, start)


def _read(stream: BinaryIO, name: str, size: int) -> bytes:
    try:
        return stream.read(size)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise InputError(f"{name}: cannot read ({exc})") from None


def decode_chunk(chunk: Chunk, errors: str = "strict") -> str:
    """UTF-8 text of a chunk; an invalid byte is reported with its file and byte offset."""
    try:
        return chunk.data.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        raise invalid_utf8(chunk.path, chunk.offset + exc.start) from None


#: How to read text with invalid UTF-8 anyway, in each place that reads a corpus.
REPLACE_HINT = (
    "data.errors=replace (superbpe-train), errors=replace (superbpe-encode, superbpe-evaluate) or "
    "errors='replace' (library) "
    "reads such bytes as U+FFFD"
)


def invalid_utf8(path: str | os.PathLike[str], offset: int) -> InputError:
    """The error for a corpus byte that is not UTF-8: where it is, and the option that accepts it."""
    return InputError(f"{path}: invalid UTF-8 at byte {offset}; {REPLACE_HINT}")


def chunk_documents(chunk: Chunk, errors: str = "strict", text_field: str = "text") -> Iterator[str]:
    """The independent texts in a chunk: the chunk itself, or one per JSON line (or stream document)."""
    if chunk.documents is not None:
        yield from chunk.documents
        return
    if chunk.table_parts is not None:
        yield from _table_documents(chunk, text_field)
        return
    text = decode_chunk(chunk, errors)
    if not chunk.jsonl:
        yield text
        return
    for number, line in enumerate(io.StringIO(text), start=chunk.first_line):
        if chunk.offset == 0 and number == chunk.first_line:  # a byte-order mark opening the file, as
            line = line.removeprefix("\ufeff")  # Windows tools write one (a shard's first line has none)
        if line.strip():
            record_text = _json_text(line, chunk.path, number, text_field)
            if not record_text.isascii():  # a surrogate escape (ASCII text is valid UTF-8 as it is)
                record_text = _checked_unicode(record_text, f"{chunk.path}: line {number}", errors)
            yield record_text


def _as_lines_hint(path: str) -> str:
    """How a ``.json`` file is read, for an error in one: a whole JSON document there is no JSON lines."""
    if not named_as(path, JSON_SUFFIXES):
        return ""
    return " (a .json file is read as JSON lines: one object per line)"


def _json_text(line: str, path: str, number: int, field: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: line {number}: invalid JSON ({exc.msg}){_as_lines_hint(path)}") from None
    if not isinstance(record, dict):
        kind, hint = type(record).__name__, _as_lines_hint(path)
        raise InputError(f"{path}: line {number}: a JSON {kind}, not an object with a {field!r} field{hint}")
    if not isinstance(record.get(field), str):
        raise InputError(f"{path}: line {number}: {_no_text_field(record, field)}")
    return record[field]


def _no_text_field(record: Mapping[str, Any], field: str) -> str:
    """What a record lacking its text field is told: the fields it has, and the option that picks one."""
    if field in record:
        return f"field {field!r} holds {type(record[field]).__name__}, not a string"
    held = ", ".join(repr(key) for key in list(record)[:8]) or "none"
    return f"no string field {field!r} (its fields: {held}; the text_field option picks another)"


def _pyarrow() -> Any:
    return import_optional("pyarrow", "parquet", "reading .parquet / datasets (.arrow) input")


def _table_sizes(path: Path) -> list[tuple[int, int]]:
    """(rows, bytes) per part: Parquet row groups (from the file's footer) or Arrow record batches."""
    with _table_errors(path):
        if named_as(path, (".parquet",)):
            metadata = _parquet_file(path).metadata
            groups = [metadata.row_group(group) for group in range(metadata.num_row_groups)]
            return [(group.num_rows, group.total_byte_size) for group in groups]
        return [(batch.num_rows, batch.nbytes) for batch in _arrow_batches(path)]


def _table_slice(path: Path, parts: tuple[int, int], field: str) -> Any:
    """Parts ``start <= i < stop`` as one table (only the ``field`` column, where the format allows)."""
    pa = _pyarrow()
    start, stop = parts
    with _table_errors(path):
        if named_as(path, (".parquet",)):
            table = _parquet_file(path)
            columns = [field] if field in table.schema_arrow.names else None
            return table.read_row_groups(list(range(start, stop)), columns=columns)
        # Earlier batches are skipped, not copied: the file is memory-mapped and batches are views of it.
        return pa.Table.from_batches(list(itertools.islice(_arrow_batches(path), start, stop)))


@contextlib.contextmanager
def _table_errors(path: Path) -> Iterator[None]:
    pa = _pyarrow()
    try:
        yield
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: cannot read table ({' '.join(str(exc).split())})") from None


def _parquet_file(path: Path) -> Any:
    _pyarrow()
    import pyarrow.parquet as pq  # an optional extra, checked just above

    return pq.ParquetFile(path)


def _arrow_batches(path: Path) -> Iterator[Any]:
    """Record batches of an Arrow IPC file, memory-mapped (zero-copy): stream format (what ``datasets``
    writes) or file format."""
    pa = _pyarrow()
    import pyarrow.ipc as ipc  # an optional extra, checked just above

    source = pa.memory_map(str(path))
    try:
        yield from ipc.open_stream(source)
    except pa.ArrowInvalid:
        source.seek(0)
        reader = ipc.open_file(source)
        for batch in range(reader.num_record_batches):
            yield reader.get_batch(batch)


def _table_chunks(path: Path, chunk_bytes: int) -> Iterator[Chunk]:
    """Runs of whole parts of about ``chunk_bytes`` (of column data) each; each stands for its share of
    the file on disk, so that progress moves (the last chunk ends it at the file's size)."""
    row = start = size = rows = 0
    sizes = _table_sizes(path)
    total, on_disk, counted = sum(part for _, part in sizes) or 1, path.stat().st_size, 0
    for number, (part_rows, part_bytes) in enumerate(sizes):
        rows, size = rows + part_rows, size + part_bytes
        if size >= chunk_bytes or number == len(sizes) - 1:
            last = number == len(sizes) - 1
            share = on_disk - counted if last else on_disk * size // total
            counted += share
            yield Chunk(str(path), row, b"", True, row + 1, (start, number + 1), file_bytes=share)
            row, start, size, rows = row + rows, number + 1, 0, 0


def _table_documents(chunk: Chunk, field: str) -> Iterator[str]:
    """The ``field`` strings of one table part; a missing column, other type or null is an error."""
    assert chunk.table_parts is not None
    part = _table_slice(Path(chunk.path), chunk.table_parts, field)
    names = part.schema.names
    if field not in names:
        raise InputError(f"{chunk.path}: no column {field!r} (columns: {', '.join(names)})")
    column = part.column(names.index(field))
    pa = _pyarrow()
    if pa.types.is_dictionary(column.type):  # pandas' category dtype: the texts behind their codes
        column = column.cast(column.type.value_type)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise InputError(f"{chunk.path}: column {field!r} holds {column.type}, not strings")
    for offset, text in enumerate(column.to_pylist()):
        if text is None:
            raise InputError(f"{chunk.path}: row {chunk.first_line + offset}: {field!r} is null")
        yield text


def corpus_size(paths: Iterable[Path]) -> int:
    """Bytes on disk (compressed for .gz): the denominator for progress bars."""
    return sum(p.stat().st_size for p in paths)


def check_not_empty(paths: Sequence[Path]) -> None:
    """Refuse a corpus with no bytes at all before any work or output starts."""
    if all(p.stat().st_size == 0 for p in paths):
        what = str(paths[0]) if len(paths) == 1 else f"all {len(paths)} input files"
        raise InputError(f"{what}: corpus is empty")
