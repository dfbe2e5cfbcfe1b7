"""GPT-2's tokenizer files: ``vocab.json`` and ``merges.txt``, tokens in byte-table spelling.

Every reader raises :class:`~superbpe.core.errors.InputError` with one line naming the file; every writer goes
through :func:`~superbpe.core.util.atomic_write` so a crash never leaves a half-written file behind.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, starmap
from pathlib import Path
from typing import Any

from superbpe.core.byte_table import bytes_to_token_str, token_str_to_bytes
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.types import Merge
from superbpe.core.util import atomic_write_text, user_path
from superbpe.formats.json_files import json_text, parse_json, read_text

try:  # the extension reads the files' strings far faster; without it they are read here alone
    from superbpe import _native
except ImportError:
    _native = None  # type: ignore[assignment]

VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
MERGES_HEADER = "#version: 0.2"


def token_bytes(path: Path, text: str, special_tokens: Iterable[str]) -> bytes:
    """Bytes of a token string from a file; special tokens may also be stored verbatim (as HF does)."""
    try:
        return token_str_to_bytes(text)
    except KeyError as exc:
        if text in special_tokens:
            return text.encode("utf-8")
        raise InputError(f"{path}: token {text!r} has char {exc.args[0]!r} outside the byte table") from None


def vocab_from_mapping(
    path: Path, mapping: Any, special_tokens: Sequence[str], special_ids: Mapping[str, int] | None = None
) -> dict[int, bytes]:
    """Validate a ``{token string: id}`` object and turn it into ``{id: bytes}``.

    ``special_ids`` (from a tokenizer.json's added tokens) marks entries that are special tokens written
    verbatim: those are UTF-8 text, not byte-table strings, whatever characters they use.
    """
    if not isinstance(mapping, dict):
        raise InputError(f"{path}: expected a JSON object mapping token strings to ids")
    fast = _native_vocab(mapping, special_ids or {})
    if fast is not None:
        return fast
    specials = set(special_tokens)
    verbatim = special_ids or {}
    vocab: dict[int, bytes] = {}
    seen: dict[bytes, str] = {}
    verbatim_bytes = {text.encode("utf-8") for text in verbatim}
    for text, token_id in mapping.items():
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise InputError(f"{path}: id of token {text!r} must be a non-negative integer, not {token_id!r}")
        is_verbatim = verbatim.get(text) == token_id
        token = text.encode("utf-8") if is_verbatim else token_bytes(path, text, specials)
        if vocab.get(token_id) == token and token in verbatim_bytes:  # a special that merges also make,
            continue  # spelled both ways under one id (byte-table for the merges, verbatim for HF's lookup)
        if token in seen:
            raise InputError(f"{path}: duplicate token {token!r} ({seen[token]!r} and {text!r})")
        if token_id in vocab:
            raise InputError(f"{path}: duplicate id {token_id}")
        seen[token] = text
        vocab[token_id] = token
    return vocab


def _native_vocab(mapping: dict[Any, Any], verbatim: Mapping[str, int]) -> dict[int, bytes] | None:
    """What :func:`vocab_from_mapping` makes of ``mapping``, decoded by the extension, or None (not
    built, or something to refuse or to read another way: then the Python loop reads it and names
    the problem). The checks here are whole-list ones, which run at C speed."""
    ids = list(mapping.values())
    if _native is None or not ids or set(map(type, ids)) != {int}:
        return None
    if min(ids) < 0 or len(set(ids)) != len(ids):
        return None
    texts = list(mapping)
    kept = {text: token_id for text, token_id in verbatim.items() if mapping.get(text) == token_id}
    if kept:  # special tokens written verbatim are UTF-8, whatever characters they use
        texts = ["" if text in kept else text for text in texts]
    tokens = _native.gpt2_token_bytes(texts)
    if tokens is None:
        return None
    if kept:
        position = {text: index for index, text in enumerate(mapping)}
        for text in kept:
            tokens[position[text]] = text.encode("utf-8")
    if len(set(tokens)) != len(tokens):
        return None
    return dict(zip(ids, tokens, strict=True))


def decode_merge_items(items: list[Any], tokens: list[bytes] | None = None) -> list[Merge] | None:
    """Merges from ``tokenizer.json`` items, all ``"left right"`` strings or all ``[left, right]`` lists
    of byte-table strings, decoded by the extension and, given the vocab's ``tokens``, checked against
    them there; None when it is not built, any item is not two such strings or, with ``tokens``, a
    merge does not fit them (the caller's own loop then reads them and names the fault)."""
    if _native is None or not items:
        return None
    kinds = set(map(type, items))
    if kinds == {list} and set(map(len, items)) == {2}:
        texts = list(chain.from_iterable(items))
        if set(map(type, texts)) - {str}:
            return None
        # Table strings hold no space or line break, so each pair is one "left right" line.
        if "".join(texts).count(" "):
            return None
        lines = list(map(" ".join, items))
    elif kinds == {str}:
        lines = items
    else:
        return None
    text = "\n".join(lines)  # as the lines of a merges.txt, each line exactly one item
    if "\r" in text or text.count("\n") != len(items) - 1:
        return None
    merges = _native.gpt2_merges(text, tokens)
    return merges if merges is not None and len(merges) == len(items) else None


def _merges_fit(merges: Sequence[Merge], tokens: set[bytes]) -> bool:
    """Whether every merge's parts and the token it makes are in ``tokens``: whole-set steps at C speed
    (a 200K vocab is loaded before anything is encoded)."""
    return tokens.issuperset(chain.from_iterable(merges)) and tokens.issuperset(starmap(operator.add, merges))


def check_merges(
    path: Path, merges: list[Merge], vocab: Mapping[int, bytes], where: list[str] | None = None
) -> None:
    """Every merge must join two tokens into a token, all in the vocab (else ids cannot be given).

    ``where`` names each merge's place in the file for errors (default: ``merge #i``)."""
    tokens = set(vocab.values())
    if _merges_fit(merges, tokens):
        return  # the loop below only names the fault
    places = where if where is not None else [f"merge #{index}" for index in range(len(merges))]
    for (left, right), place in zip(merges, places, strict=True):
        for part in (left, right):
            if part not in tokens:
                shown = bytes_to_token_str(part)
                raise InputError(f"{path}: {place}: merge part {shown!r} is not in the vocab")
        if left + right not in tokens:
            raise InputError(
                f"{path}: {place}: merged token {bytes_to_token_str(left + right)!r} is not in the vocab"
            )


#: ``vocab.json`` layouts: ours (one entry per line, diffable) and HF's (one line, no final newline).
VOCAB_STYLES = ("lines", "hf")


def vocab_to_json_text(vocab: Mapping[int, bytes], style: str = "lines") -> str:
    """``{token string: id}`` in id order; ``style="hf"`` writes it exactly as HF ``tokenizers`` does."""
    ordered = {bytes_to_token_str(token): token_id for token_id, token in sorted(vocab.items())}
    if style == "hf":
        return json.dumps(ordered, ensure_ascii=False, separators=(",", ":"))
    if style != "lines":
        raise ConfigError(f"vocab style must be one of {', '.join(VOCAB_STYLES)}, not {style!r}")
    return json_text(ordered, indent=0)


def merges_to_text(merges: Sequence[Merge]) -> str:
    lines = [MERGES_HEADER]
    lines.extend(f"{bytes_to_token_str(left)} {bytes_to_token_str(right)}" for left, right in merges)
    return "\n".join(lines) + "\n"


def write_vocab(path: str | Path, vocab: Mapping[int, bytes], style: str = "lines") -> None:
    atomic_write_text(Path(path), vocab_to_json_text(vocab, style))


def write_merges(path: str | Path, merges: Sequence[Merge]) -> None:
    atomic_write_text(Path(path), merges_to_text(merges))


def read_vocab(path: str | Path, special_tokens: Sequence[str] = ()) -> dict[int, bytes]:
    """``vocab.json`` -> ``{id: bytes}``. Special tokens may appear verbatim rather than byte-mapped."""
    path = Path(path)
    text = read_text(path)
    if _native is not None:
        fast = _native.gpt2_vocab(text)
        if fast is not None:
            return fast
    return _vocab_in_python(path, text, special_tokens)


def _vocab_in_python(path: Path, text: str, special_tokens: Sequence[str]) -> dict[int, bytes]:
    """:func:`read_vocab` of ``text`` without the extension (which names what it refuses)."""
    return vocab_from_mapping(path, parse_json(path, text), special_tokens)


def unmerged_tokens(vocab: Mapping[int, bytes], merges: Sequence[Merge]) -> list[str]:
    """Tokens of two or more bytes that no merge makes, as text, in id order (GPT-2's ``<|endoftext|>``).

    BPE can never produce such a token, so in a GPT-2 style ``vocab.json`` + ``merges.txt`` they are the
    special tokens. Ones that are not UTF-8 cannot be matched in text and are left as they are.
    """
    unmade = set(vocab.values())  # whole-set steps at C speed: a 200K vocab is loaded before any encoding
    unmade.difference_update(starmap(operator.add, merges))
    unmade = {token for token in unmade if len(token) > 1}
    return _utf8_in_id_order((token_id, token) for token_id, token in vocab.items() if token in unmade)


def _utf8_in_id_order(entries: Iterable[tuple[int, bytes]]) -> list[str]:
    """The tokens of ``(id, token)`` entries as text, in id order; those that are not UTF-8 are left out."""
    found = []
    for _, token in sorted(entries):
        try:
            found.append(token.decode("utf-8"))
        except UnicodeDecodeError:
            continue
    return found


def parse_merge(path: Path, place: str, left: str, right: str) -> Merge:
    """A merge from its two tokens in byte-table spelling; an error names the file and ``place``."""
    try:
        return token_str_to_bytes(left), token_str_to_bytes(right)
    except KeyError as exc:
        raise InputError(f"{path}: {place}: {exc.args[0]!r} is outside the byte table") from None


@dataclass(frozen=True)
class Gpt2Files:
    """A ``vocab.json`` + ``merges.txt`` pair as read by :func:`read_gpt2_files`."""

    vocab: dict[int, bytes]
    merges: list[Merge]
    unmade: list[str] | None
    """:func:`unmerged_tokens` of the two, when asked for."""
    valid: bool
    """Whether the extension read both and found them a valid vocab (distinct non-negative int ids,
    distinct non-empty tokens) and merges that fit it, so a tokenizer need not check them again."""


def read_gpt2_files(
    vocab_path: str | Path,
    merges_path: str | Path,
    special_tokens: Sequence[str] = (),
    *,
    unmade: bool = False,
) -> Gpt2Files:
    """:func:`read_vocab` and :func:`read_merges` checked against it, and with ``unmade`` the
    :func:`unmerged_tokens`. The extension reads both files and finds the unmade tokens in one pass
    (a 200K vocab is loaded before anything is encoded); without it, or for what it leaves to Python
    (e.g. special tokens written verbatim), the functions above read them and name any fault."""
    vocab_path, merges_path = user_path(vocab_path), user_path(merges_path)
    vocab_text, merges_text = read_text(vocab_path), read_text(merges_path)
    vocab = None if _native is None else _native.gpt2_vocab(vocab_text)
    if vocab is not None:
        read = _native.gpt2_merges_unmade(merges_text, list(vocab.values()))
        if read is not None:
            merges, positions = read
            found = _unmade_text(vocab, positions) if unmade else None
            return Gpt2Files(vocab, merges, found, valid=True)
    else:
        vocab = _vocab_in_python(vocab_path, vocab_text, special_tokens)
    # What the extension did not take is read here, once more, so that the fault is named.
    merges = _merges_in_python(merges_path, merges_text, vocab)
    return Gpt2Files(vocab, merges, unmerged_tokens(vocab, merges) if unmade else None, valid=False)


def _unmade_text(vocab: Mapping[int, bytes], positions: Sequence[int]) -> list[str]:
    """:func:`unmerged_tokens` from the positions (in ``vocab``'s order) of its unmade tokens."""
    ids, tokens = list(vocab), list(vocab.values())
    return _utf8_in_id_order((ids[position], tokens[position]) for position in positions)


def read_merges(path: str | Path, vocab: Mapping[int, bytes] | None = None) -> list[Merge]:
    """``merges.txt`` with or without the ``#version`` header; checked against ``vocab`` when given."""
    path = Path(path)
    text = read_text(path)
    if _native is not None:
        fast = _native.gpt2_merges(text, None if vocab is None else list(vocab.values()))
        if fast is not None:
            return fast
    return _merges_in_python(path, text, vocab)


def _merges_in_python(path: Path, text: str, vocab: Mapping[int, bytes] | None) -> list[Merge]:
    """:func:`read_merges` of ``text`` without the extension: line by line, so a fault is named."""
    merges: list[Merge] = []
    where: list[str] = []
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise InputError(f"{path}: line {number}: expected two tokens and one space, got {line!r}")
        place = f"line {number}"
        merges.append(parse_merge(path, place, *parts))
        where.append(place)
    if vocab is not None:
        check_merges(path, merges, vocab, where)
    return merges
