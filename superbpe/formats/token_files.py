"""Token files for language-model training: what an encoding job writes, and how to read it back.

A flat encoding is raw little-endian ``uint16`` ids when every id of the tokenizer fits, else ``uint32``,
so it loads with ``np.memmap(path, dtype=...)`` (:func:`open_tokens` takes the dtype from the sidecar and
checks the file against it), plus a JSON sidecar (``<output>.json``) recording dtype, token and document
counts and a hash of the tokenizer files, so a training job can check it reads what it thinks it reads. A
sharded encoding is a directory of such files (``shard-NNNNNN.bin``) and an ``index.json`` written last: a
directory without it is not a finished encoding.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from superbpe.core.errors import ConfigError, InputError
from superbpe.core.util import user_path
from superbpe.formats.gpt2 import MERGES_FILE, VOCAB_FILE
from superbpe.formats.hf import HF_FILE
from superbpe.formats.manifest import MANIFEST_FILE

INDEX_NAME = "index.json"
INDEX_FORMAT = "superbpe-token-shards"
_TOKENIZER_FILES = frozenset({VOCAB_FILE, MERGES_FILE, HF_FILE, MANIFEST_FILE})


@dataclass
class EncodeResult:
    """What a flat encoding wrote: the fields of its sidecar."""

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


#: The element types a token file may have (``dtype=`` of ``superbpe-encode``).
TOKEN_DTYPES = ("uint16", "uint32")


def token_dtype(vocab: Mapping[int, bytes], requested: str | None = None) -> np.dtype:
    """``requested`` (one of :data:`TOKEN_DTYPES`), checked to hold every id; by default uint16 when
    every id fits in 16 bits, else uint32. A loader that expects uint32 whatever the vocabulary asks
    for it; uint16 for a larger vocabulary is refused before anything is written."""
    largest = max(vocab)
    if requested is None:
        return np.dtype(np.uint16) if largest < 1 << 16 else np.dtype(np.uint32)
    if requested not in TOKEN_DTYPES:
        choices = ", ".join(TOKEN_DTYPES)
        raise ConfigError(f"dtype {requested!r} must be one of {choices} (or null: the smallest)")
    dtype = np.dtype(requested)
    if largest > np.iinfo(dtype).max:
        size = len(vocab)
        raise ConfigError(f"dtype={requested} cannot hold token id {largest} (vocab size {size}); use uint32")
    return dtype


def write_ids(handle: Any, ids: Sequence[int] | np.ndarray, dtype: np.dtype) -> int:
    """Append ``ids`` (a list or an array) little-endian; the number written. An array of that type is
    written from its own buffer, not copied first."""
    if len(ids):
        handle.write(np.ascontiguousarray(ids, dtype=dtype.newbyteorder("<")))
    return len(ids)


def tokenizer_hash(directory: Path) -> str:
    """sha256 over the tokenizer's files (names and contents), to tie a token file to its tokenizer."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.iterdir() if p.name in _TOKENIZER_FILES):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def sidecar_path(output: Path) -> Path:
    return output.with_name(output.name + ".json")


def is_token_file_sidecar(path: Path) -> bool:
    """Whether ``path`` is a sidecar an encoding wrote (a JSON object with every field of
    :class:`EncodeResult`), so the token file beside it may be replaced by a new encoding."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(document, dict) and set(EncodeResult.__dataclass_fields__) <= set(document)


def shard_file_name(number: int) -> str:
    return f"shard-{number:06d}.bin"


#: Larger than any sidecar: a file beside an input named like its sidecar is read only below this size.
_SIDECAR_MAX_BYTES = 64 << 20
_SHARD_NAME = re.compile(r"shard-\d{6}\.bin")


def check_not_token_files(paths: Sequence[Path]) -> None:
    """Refuse an input that is a token file an encoding wrote (its sidecar beside it says so) or one of its
    shards (``index.json`` beside it): raw ids are no text. Read as text, they failed at the first byte
    that is not UTF-8 with a hint to ``errors=replace``, which then encodes the ids' bytes; ids whose bytes
    happen to be valid UTF-8 were encoded without a word."""
    for path in paths:
        sidecar = sidecar_path(path)
        with contextlib.suppress(OSError):
            if sidecar.stat().st_size <= _SIDECAR_MAX_BYTES and is_token_file_sidecar(sidecar):
                raise InputError(
                    f"{path} is a token file an encoding wrote (its sidecar {sidecar.name} says so), not "
                    f"text: superbpe.open_tokens({str(path)!r}) reads its ids"
                )
        if _SHARD_NAME.fullmatch(path.name) and (path.parent / INDEX_NAME).is_file():
            raise InputError(
                f"{path} is a shard of a sharded encoding ({INDEX_NAME} beside it), not text: "
                f"superbpe.open_shards({str(path.parent)!r}) reads its ids"
            )


def read_index(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """``index.json`` of a sharded encoding (an error when the directory holds no finished encoding)."""
    if Path(directory).is_file():
        raise InputError(f"{directory} is a flat token file: open_tokens({str(directory)!r}) maps its ids")
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
    """The shard token files as read-only memory maps, in order (what a data loader reads), each
    checked against the token count ``index.json`` gives it."""
    directory = user_path(directory)
    index = read_index(directory)
    dtype = np.dtype(index["dtype"]).newbyteorder("<")
    shards = index["shards"]
    return [_mapped(Path(directory) / entry["file"], dtype, int(entry["tokens"])) for entry in shards]


def open_tokens(path: str | os.PathLike[str]) -> np.ndarray:
    """A flat token file as a read-only memory map, its dtype read from its sidecar (``<path>.json``),
    its size checked against the sidecar's token count."""
    file = user_path(path)
    if file.is_dir():
        raise InputError(f"{file} is a directory of shards: open_shards({str(file)!r}) maps each shard")
    ids_file = file.with_name(file.name.removesuffix(".json"))
    if file.name.endswith(".json") and ids_file.is_file() and not sidecar_path(file).exists():
        raise InputError(f"{file} is the sidecar of {ids_file}: open_tokens({str(ids_file)!r}) maps its ids")
    side = sidecar_path(file)
    try:
        record = json.loads(side.read_text(encoding="utf-8"))
        dtype, tokens = np.dtype(record["dtype"]).newbyteorder("<"), int(record["tokens"])
    except FileNotFoundError:
        missing = file if not file.exists() else side
        raise InputError(f"{missing}: no such file (open_tokens reads a token file and its .json)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{side}: not a token file's sidecar ({exc})") from None
    return _mapped(file, dtype, tokens)


def _mapped(file: Path, dtype: np.dtype, tokens: int) -> np.ndarray:
    """``file`` mapped read-only as ``tokens`` ids of ``dtype``, which its size must be: a file cut
    short (a copy that stopped) or another encoding's record would otherwise read as plausible ids."""
    try:
        size = file.stat().st_size
    except FileNotFoundError:
        raise InputError(f"{file}: no such file (its record is there)") from None
    if size != tokens * dtype.itemsize:
        raise InputError(
            f"{file}: {size} bytes, but its record says {tokens} {dtype.name} ids "
            f"({tokens * dtype.itemsize} bytes): not the file it describes, or cut short"
        )
    if tokens == 0:  # np.memmap cannot map an empty file
        return np.zeros(0, dtype)
    return np.memmap(file, dtype=dtype, mode="r")
