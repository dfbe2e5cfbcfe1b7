"""Tokenizer files: ``vocab.json``, ``merges.txt``, HF ``tokenizer.json`` and the ``superbpe.json`` manifest.

Byte-level tokens are arbitrary bytes, but JSON and text files want printable strings, so every token is
written through the GPT-2 byte<->unicode table (each byte becomes one printable character). That keeps the
files readable by HF ``tokenizers``/``transformers`` and by the many scripts written for GPT-2's files.

Every reader raises :class:`~superbpe.errors.InputError` with one line naming the file; every writer goes
through :func:`~superbpe.util.atomic_write` so a crash never leaves a half-written file behind.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from superbpe.errors import ConfigError, InputError
from superbpe.pretokenize import Pretokenizer, get_pretokenizer
from superbpe.types import Merge
from superbpe.util import atomic_write_text

VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
HF_FILE = "tokenizer.json"
HF_CONFIG_FILE = "tokenizer_config.json"
HF_SPECIAL_MAP_FILE = "special_tokens_map.json"
TIKTOKEN_FILE = "tokenizer.tiktoken"
TIKTOKEN_META_FILE = "tiktoken.json"
#: The roles transformers gives special tokens; "auto" picks ``<|endoftext|>`` when it is a special token.
TOKEN_ROLES = ("bos_token", "eos_token", "pad_token", "unk_token")
DEFAULT_ROLES = {"bos_token": "auto", "eos_token": "auto", "pad_token": None, "unk_token": None}
AUTO_SPECIAL = "<|endoftext|>"
MANIFEST_FILE = "superbpe.json"
MERGES_HEADER = "#version: 0.2"
MANIFEST_FORMAT = "superbpe-tokenizer"
MANIFEST_VERSION = 1


# ---------------------------------------------------------------------------------------------------------
# GPT-2 byte <-> unicode table


@lru_cache(maxsize=1)
def byte_to_unicode() -> tuple[str, ...]:
    """Character for each byte value: printable Latin-1 bytes stand for themselves, the rest are shifted.

    The 188 bytes that are visible, non-space characters in Latin-1 keep their code point; the other 68
    (controls, space, NBSP, soft hyphen, ...) get code points 256, 257, ... in byte order. So a space is
    written as U+0120 "Ġ" and a newline as U+010A "Ċ", exactly as in GPT-2's files.
    """
    visible = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    chars: list[str] = []
    shifted = 0
    for byte in range(256):
        if byte in visible:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + shifted))
            shifted += 1
    return tuple(chars)


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """Inverse of :func:`byte_to_unicode`."""
    return {char: byte for byte, char in enumerate(byte_to_unicode())}


@lru_cache(maxsize=1)
def _encode_table() -> dict[int, str]:
    return dict(enumerate(byte_to_unicode()))


def bytes_to_token_str(token: bytes) -> str:
    """The printable form of a byte-level token."""
    return token.decode("latin-1").translate(_encode_table())


def token_str_to_bytes(text: str) -> bytes:
    """Bytes of a printable token; ``KeyError`` (the offending character) if it is not in the table."""
    try:
        return text.translate(_decode_table()).encode("latin-1")
    except UnicodeEncodeError:
        table = unicode_to_byte()
        raise KeyError(next(char for char in text if char not in table)) from None


@lru_cache(maxsize=1)
def _decode_table() -> dict[int, str]:
    """``str.translate`` table: table character -> the Latin-1 character of its byte.

    Latin-1 characters that are not table characters (space, controls) map to U+0100, which then fails
    the Latin-1 encode, so a foreign character is never silently taken for a byte.
    """
    table = {ord(char): chr(byte) for char, byte in unicode_to_byte().items()}
    for code in range(256):
        table.setdefault(code, "\u0100")
    return table


# ---------------------------------------------------------------------------------------------------------
# Reading and writing helpers


def _json_text(document: Any, indent: int) -> str:
    """UTF-8 JSON (not ``\\u`` escapes: byte-table tokens stay readable), newline-terminated."""
    return json.dumps(document, ensure_ascii=False, indent=indent) + "\n"


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a file") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: invalid UTF-8 at byte {exc.start}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def _no_duplicate_keys(path: Path) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """A json ``object_pairs_hook``: JSON allows repeated keys, but a repeated token is an error here."""
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise InputError(f"{path}: duplicate key {key!r}")
            result[key] = value
        return result

    return hook


def _read_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys(path))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: malformed JSON line {exc.lineno} col {exc.colno}: {exc.msg}") from None


def _token_bytes(path: Path, text: str, special_tokens: Iterable[str]) -> bytes:
    """Bytes of a token string from a file; special tokens may also be stored verbatim (as HF does)."""
    try:
        return token_str_to_bytes(text)
    except KeyError as exc:
        if text in special_tokens:
            return text.encode("utf-8")
        raise InputError(f"{path}: token {text!r} has char {exc.args[0]!r} outside the byte table") from None


def _vocab_from_mapping(
    path: Path, mapping: Any, special_tokens: Sequence[str], special_ids: Mapping[str, int] | None = None
) -> dict[int, bytes]:
    """Validate a ``{token string: id}`` object and turn it into ``{id: bytes}``.

    ``special_ids`` (from a tokenizer.json's added tokens) marks entries that are special tokens written
    verbatim: those are UTF-8 text, not byte-table strings, whatever characters they use.
    """
    if not isinstance(mapping, dict):
        raise InputError(f"{path}: expected a JSON object mapping token strings to ids")
    specials = set(special_tokens)
    verbatim = special_ids or {}
    vocab: dict[int, bytes] = {}
    seen: dict[bytes, str] = {}
    for text, token_id in mapping.items():
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise InputError(f"{path}: id of token {text!r} must be a non-negative integer, not {token_id!r}")
        is_verbatim = verbatim.get(text) == token_id
        token = text.encode("utf-8") if is_verbatim else _token_bytes(path, text, specials)
        if token in seen:
            raise InputError(f"{path}: duplicate token {token!r} ({seen[token]!r} and {text!r})")
        if token_id in vocab:
            raise InputError(f"{path}: duplicate id {token_id}")
        seen[token] = text
        vocab[token_id] = token
    return vocab


def _check_merges(path: Path, merges: list[Merge], vocab: Mapping[int, bytes], where: list[str]) -> None:
    """Every merge must join two tokens into a token, all in the vocab (else ids cannot be given)."""
    tokens = set(vocab.values())
    for (left, right), place in zip(merges, where, strict=True):
        for part in (left, right):
            if part not in tokens:
                shown = bytes_to_token_str(part)
                raise InputError(f"{path}: {place}: merge part {shown!r} is not in the vocab")
        if left + right not in tokens:
            raise InputError(
                f"{path}: {place}: merged token {bytes_to_token_str(left + right)!r} is not in the vocab"
            )


# ---------------------------------------------------------------------------------------------------------
# vocab.json and merges.txt


#: ``vocab.json`` layouts: ours (one entry per line, diffable) and HF's (one line, no final newline).
VOCAB_STYLES = ("lines", "hf")


def vocab_to_json_text(vocab: Mapping[int, bytes], style: str = "lines") -> str:
    """``{token string: id}`` in id order; ``style="hf"`` writes it exactly as HF ``tokenizers`` does."""
    ordered = {bytes_to_token_str(token): token_id for token_id, token in sorted(vocab.items())}
    if style == "hf":
        return json.dumps(ordered, ensure_ascii=False, separators=(",", ":"))
    if style != "lines":
        raise ConfigError(f"vocab style must be one of {', '.join(VOCAB_STYLES)}, not {style!r}")
    return _json_text(ordered, indent=0)


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
    return _vocab_from_mapping(path, _read_json(path), special_tokens)


def unmerged_tokens(vocab: Mapping[int, bytes], merges: Sequence[Merge]) -> list[str]:
    """Tokens of two or more bytes that no merge makes, as text, in id order (GPT-2's ``<|endoftext|>``).

    BPE can never produce such a token, so in a GPT-2 style ``vocab.json`` + ``merges.txt`` they are the
    special tokens. Ones that are not UTF-8 cannot be matched in text and are left as they are.
    """
    made = {left + right for left, right in merges}
    found = []
    for _, token in sorted(vocab.items()):
        if len(token) > 1 and token not in made:
            try:
                found.append(token.decode("utf-8"))
            except UnicodeDecodeError:
                continue
    return found


def read_merges(path: str | Path, vocab: Mapping[int, bytes] | None = None) -> list[Merge]:
    """``merges.txt`` with or without the ``#version`` header; checked against ``vocab`` when given."""
    path = Path(path)
    merges: list[Merge] = []
    where: list[str] = []
    for number, line in enumerate(_read_text(path).split("\n"), start=1):
        line = line.rstrip("\r")
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise InputError(f"{path}: line {number}: expected two tokens and one space, got {line!r}")
        try:
            merges.append((token_str_to_bytes(parts[0]), token_str_to_bytes(parts[1])))
        except KeyError as exc:
            raise InputError(f"{path}: line {number}: {exc.args[0]!r} is outside the byte table") from None
        where.append(f"line {number}")
    if vocab is not None:
        _check_merges(path, merges, vocab, where)
    return merges


# ---------------------------------------------------------------------------------------------------------
# tokenizer.json (HF tokenizers)


def hf_tokenizer_json(
    vocab: Mapping[int, bytes],
    merges: Sequence[Merge],
    special_tokens: Sequence[str],
    pretokenizer: Pretokenizer,
    whole_pieces: bool = True,
) -> dict[str, Any]:
    """The HF ``tokenizers`` document that encodes exactly like our :class:`~superbpe.tokenizer.Tokenizer`.

    ``ignore_merges`` is ``whole_pieces``: on, our encoder maps a piece that is itself a token straight to
    its id (off, as in the official SuperBPE files, every piece goes through the merges); the
    regex split is ``Isolated`` (matches and gaps are pieces, as ours); ByteLevel only maps bytes to the
    printable table (``use_regex=false``) since the split already happened.
    """
    by_bytes = {token: token_id for token_id, token in vocab.items()}
    missing = [special for special in special_tokens if special.encode("utf-8") not in by_bytes]
    if missing:
        raise ConfigError(f"special token {missing[0]!r} is not in the vocab")
    added = [
        {
            "id": by_bytes[special.encode("utf-8")],
            "content": special,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for special in special_tokens
    ]
    splits: list[dict[str, Any]] = []
    if pretokenizer.line_units:
        splits.append({"type": "Split", "pattern": {"String": "\n"}, "behavior": "MergedWithPrevious",
                       "invert": False})
    splits.append({"type": "Split", "pattern": {"Regex": pretokenizer.pattern}, "behavior": "Isolated",
                   "invert": False})
    splits.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False})
    model = {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": whole_pieces,
        "vocab": _hf_vocab(vocab, special_tokens),
        "merges": [f"{bytes_to_token_str(left)} {bytes_to_token_str(right)}" for left, right in merges],
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": splits},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "model": model,
    }


def _hf_vocab(vocab: Mapping[int, bytes], special_tokens: Sequence[str]) -> dict[str, int]:
    """Model vocab in byte-table spelling, except special tokens, which HF looks up verbatim.

    HF gives an added token the model's id for its *content* (and appends a new id when the content is
    missing), so each special is listed under its own text. A special whose text is the byte-table
    spelling of another token (say "é", which also spells byte 0xE9) would get that token's id in HF:
    such a tokenizer cannot be exported, which is an error rather than a file that encodes differently.
    """
    result = {bytes_to_token_str(token): token_id for token_id, token in sorted(vocab.items())}
    by_bytes = {token: token_id for token_id, token in vocab.items()}
    for special in special_tokens:
        token_id = by_bytes[special.encode("utf-8")]
        if result.get(special, token_id) != token_id:
            raise ConfigError(
                f"special token {special!r} is spelled like token id {result[special]} in tokenizer.json"
            )
        result.pop(bytes_to_token_str(special.encode("utf-8")))
        result[special] = token_id
    return dict(sorted(result.items(), key=lambda item: item[1]))


def write_hf_tokenizer(
    path: str | Path,
    vocab: Mapping[int, bytes],
    merges: Sequence[Merge],
    special_tokens: Sequence[str],
    pretokenizer: Pretokenizer,
    whole_pieces: bool = True,
) -> None:
    document = hf_tokenizer_json(vocab, merges, special_tokens, pretokenizer, whole_pieces)
    atomic_write_text(Path(path), _json_text(document, indent=1))


@dataclass
class HFTokenizerData:
    """What we take from a ``tokenizer.json``: enough to encode the same way or to extend it."""

    vocab: dict[int, bytes]
    merges: list[Merge]
    special_tokens: list[str]
    pattern: str | None  # the Split regex, when the pre-tokenizer has one
    line_units: bool  # whether a Split on "\n" (merged with previous) comes first
    ignore_merges: bool = False  # the model's flag (HF's default when absent is off)


def read_hf_tokenizer(path: str | Path) -> HFTokenizerData:
    """Read a byte-level BPE ``tokenizer.json`` (ours or HF's), e.g. to extend an existing tokenizer."""
    path = Path(path)
    document = _read_json(path)
    model = document.get("model") if isinstance(document, dict) else None
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE":
        raise InputError(f"{path}: not a BPE tokenizer.json (no model of type BPE)")
    added = document.get("added_tokens", [])
    if not isinstance(added, list) or not all(isinstance(a, dict) for a in added):
        raise InputError(f"{path}: added_tokens must be a list of objects")
    # HF cuts every added token out of the text before the model sees it, special or not.
    special_tokens = [str(a.get("content")) for a in added]
    added_ids = {str(a.get("content")): a.get("id") for a in added}
    vocab = _vocab_from_mapping(path, model.get("vocab"), special_tokens, added_ids)
    _add_added_tokens(path, vocab, added)
    merges, where = _hf_merges(path, model.get("merges", []))
    _check_merges(path, merges, vocab, where)
    pattern, line_units = _hf_split(document.get("pre_tokenizer"))
    ignore_merges = bool(model.get("ignore_merges", False))
    return HFTokenizerData(vocab, merges, special_tokens, pattern, line_units, ignore_merges)


def _add_added_tokens(path: Path, vocab: dict[int, bytes], added: list[dict[str, Any]]) -> None:
    """Added tokens missing from the model vocab still own their ids."""
    by_bytes = {token: token_id for token_id, token in vocab.items()}
    for entry in added:
        content, token_id = entry.get("content"), entry.get("id")
        bad_id = isinstance(token_id, bool) or not isinstance(token_id, int)
        if not isinstance(content, str) or not content or bad_id:
            raise InputError(f"{path}: added token needs non-empty 'content' and integer 'id': {entry!r}")
        token = content.encode("utf-8")
        if by_bytes.get(token, token_id) != token_id or vocab.get(token_id, token) != token:
            raise InputError(f"{path}: added token {content!r} (id {token_id}) clashes with the model vocab")
        vocab[token_id] = token
        by_bytes[token] = token_id


def _hf_merges(path: Path, raw: Any) -> tuple[list[Merge], list[str]]:
    """Merges as ``"a b"`` strings (older files) or ``["a", "b"]`` pairs (tokenizers >= 0.20)."""
    if not isinstance(raw, list):
        raise InputError(f"{path}: model.merges must be a list")
    merges: list[Merge] = []
    where: list[str] = []
    for index, item in enumerate(raw):
        parts = item.split(" ") if isinstance(item, str) else item
        if not isinstance(parts, list) or len(parts) != 2 or not all(isinstance(p, str) and p for p in parts):
            raise InputError(f"{path}: merge #{index} is not two tokens: {item!r}")
        try:
            merges.append((token_str_to_bytes(parts[0]), token_str_to_bytes(parts[1])))
        except KeyError as exc:
            raise InputError(f"{path}: merge #{index}: {exc.args[0]!r} is outside the byte table") from None
        where.append(f"merge #{index}")
    return merges, where


def _hf_split(pre: Any) -> tuple[str | None, bool]:
    """The first regex Split and whether a newline Split precedes it (our line-units encoding)."""
    steps = pre.get("pretokenizers", []) if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    pattern: str | None = None
    line_units = False
    for step in steps:
        if not isinstance(step, dict) or step.get("type") != "Split":
            continue
        target = step.get("pattern") or {}
        if target.get("String") == "\n" and step.get("behavior") == "MergedWithPrevious" and pattern is None:
            line_units = True
        elif "Regex" in target and pattern is None:
            pattern = str(target["Regex"])
    return pattern, line_units


def pretokenizer_from_hf(data: HFTokenizerData) -> Pretokenizer:
    """Name a known pattern by its name (so manifests say ``gpt2``), else a custom one; default gpt2."""
    if data.pattern is None:
        return get_pretokenizer("gpt2", line_units=data.line_units)
    from superbpe.pretokenize import PATTERNS

    for name, pattern in PATTERNS.items():
        if pattern == data.pattern:
            return get_pretokenizer(name, line_units=data.line_units)
    return get_pretokenizer("custom", pattern=data.pattern, line_units=data.line_units)


# ---------------------------------------------------------------------------------------------------------
# transformers: tokenizer_config.json + special_tokens_map.json beside tokenizer.json


def resolve_roles(roles: Mapping[str, str | None] | None, special_tokens: Sequence[str]) -> dict[str, str]:
    """Role -> special token (``auto``: ``<|endoftext|>`` if it is one, else no token for that role)."""
    given = {**DEFAULT_ROLES, **(roles or {})}
    unknown = sorted(set(given) - set(TOKEN_ROLES))
    if unknown:
        raise ConfigError(f"unknown token role {unknown[0]!r}; roles are {', '.join(TOKEN_ROLES)}")
    resolved = {}
    for role, token in given.items():
        if token == "auto":
            token = AUTO_SPECIAL if AUTO_SPECIAL in special_tokens else None
        if token is None:
            continue
        if token not in special_tokens:
            raise ConfigError(f"{role} {token!r} is not one of the special tokens {list(special_tokens)}")
        resolved[role] = token
    return resolved


def transformers_documents(
    vocab: Mapping[int, bytes], special_tokens: Sequence[str], roles: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """``tokenizer_config.json`` and ``special_tokens_map.json`` for ``AutoTokenizer.from_pretrained``.

    The class is the generic ``PreTrainedTokenizerFast`` over our ``tokenizer.json``, so encoding is exactly
    the HF ``tokenizers`` one (no BOS/EOS added: ``tokenizer.json`` has no post-processor), and
    ``clean_up_tokenization_spaces`` is off because it would rewrite " ." to "." on decode.
    """
    by_bytes = {token: token_id for token_id, token in vocab.items()}
    added = {
        str(by_bytes[special.encode("utf-8")]): {
            "content": special, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True,
        }
        for special in special_tokens
    }
    others = [special for special in special_tokens if special not in roles.values()]
    special_map: dict[str, Any] = dict(roles)
    if others:
        special_map["additional_special_tokens"] = others
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": added,
        **{role: roles.get(role) for role in TOKEN_ROLES},
        "additional_special_tokens": others,
    }
    return {HF_CONFIG_FILE: config, HF_SPECIAL_MAP_FILE: special_map}


# ---------------------------------------------------------------------------------------------------------
# tiktoken: ranks file + pattern


#: Line-confined forms of the built-in line-unit patterns. Under line units each line is split alone, so no
#: piece crosses a line end; the only part of these patterns that could run past a "\n" in whole text is the
#: trailing ``[\r\n/]*`` of a punctuation run, which within one line is ``[\r/]*\n?`` (the "\n" is last).
#: Their lookaheads see only digits or the next character of the same line, so they agree too.
_LINE_CONFINED = {
    "superbpe": r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]{2,}[\r/]*\n?| +(?!\S)",
    "superbpe-paper": r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))",
}


def tiktoken_pattern(pretokenizer: Pretokenizer) -> str:
    """A pattern whose plain matches (all tiktoken keeps) are exactly our isolated-split pieces.

    tiktoken drops the text between matches, so the gaps become an alternative of their own: the longest
    run of characters at none of which the pattern matches. With line units, matches use the line-confined
    form of the pattern and gaps stop after a "\n" (which no built-in stage-2 pattern starts a match at).
    """
    if not pretokenizer.line_units:
        match = f"(?:{pretokenizer.pattern})"
        return f"{match}|(?:(?!{match})[\\s\\S])+"
    confined = _LINE_CONFINED.get(pretokenizer.name)
    if confined is None or pretokenizer.pattern != get_pretokenizer(pretokenizer.name).pattern:
        raise ConfigError(
            f"no tiktoken pattern for pre-tokenizer {pretokenizer.name!r} with line units "
            f"(only {', '.join(_LINE_CONFINED)} have one)"
        )
    match = f"(?:{confined})"
    return f"{match}|(?:(?!{match})[^\\n])+\\n?|\\n"


def tiktoken_ranks(vocab: Mapping[int, bytes], special_tokens: Sequence[str]) -> dict[bytes, int]:
    """Ordinary tokens -> id. tiktoken merges the pair whose joined bytes have the lowest rank, so the ids
    must grow in merge order (they do for trained and GPT-2 vocabs); specials are passed separately."""
    specials = {special.encode("utf-8") for special in special_tokens}
    return {token: token_id for token_id, token in vocab.items() if token not in specials}


def check_ranks_follow_merges(ranks: Mapping[bytes, int], merges: Sequence[Merge]) -> None:
    last = 255
    for left, right in merges:
        rank = ranks.get(left + right)
        if rank is None or rank <= last:
            raise ConfigError("token ids do not grow in merge order: tiktoken ranks would encode differently")
        last = rank


def tiktoken_texts(
    vocab: Mapping[int, bytes],
    merges: Sequence[Merge],
    special_tokens: Sequence[str],
    pretokenizer: Pretokenizer,
) -> dict[str, str]:
    """``tokenizer.tiktoken`` (``base64 rank`` lines, tiktoken's own format) and ``tiktoken.json`` (name,
    pattern, special tokens): ``tiktoken.Encoding(pat_str=..., mergeable_ranks=load_tiktoken_bpe(...),
    special_tokens=...)`` rebuilds the encoding."""
    import base64

    by_bytes = {token: token_id for token_id, token in vocab.items()}
    ranks = tiktoken_ranks(vocab, special_tokens)
    check_ranks_follow_merges(ranks, merges)
    lines = "".join(f"{base64.b64encode(token).decode('ascii')} {rank}\n"
                    for token, rank in sorted(ranks.items(), key=lambda item: item[1]))
    meta = {
        "name": pretokenizer.name,
        "pat_str": tiktoken_pattern(pretokenizer),
        "special_tokens": {special: by_bytes[special.encode("utf-8")] for special in special_tokens},
        "ranks_file": TIKTOKEN_FILE,
    }
    return {TIKTOKEN_FILE: lines, TIKTOKEN_META_FILE: _json_text(meta, indent=2)}


# ---------------------------------------------------------------------------------------------------------
# superbpe.json manifest


@dataclass
class Manifest:
    """How a tokenizer was made: enough to reload it exactly and to explain it later."""

    pretokenizer: dict[str, Any]
    special_tokens: list[str]
    vocab_size: int
    stages: list[dict[str, Any]] = field(default_factory=list)
    training: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = MANIFEST_VERSION
    whole_pieces: bool = True  # encoding: a piece that is a token is that token (HF ignore_merges)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "format_version": self.format_version,
            "pretokenizer": self.pretokenizer,
            "special_tokens": self.special_tokens,
            "vocab_size": self.vocab_size,
            "whole_pieces": self.whole_pieces,
            "stages": self.stages,
            "training": self.training,
            "extra": self.extra,
        }


def write_manifest(path: str | Path, manifest: Manifest) -> None:
    atomic_write_text(Path(path), _json_text(manifest.to_json(), indent=2))


def read_manifest(path: str | Path) -> Manifest:
    path = Path(path)
    data = _read_json(path)
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise InputError(f"{path}: not a superbpe manifest (missing \"format\": \"{MANIFEST_FORMAT}\")")
    version = data.get("format_version")
    if version != MANIFEST_VERSION:
        raise InputError(f"{path}: unsupported manifest format_version {version!r} (this version reads 1)")
    pre = data.get("pretokenizer")
    if not isinstance(pre, dict) or not all(isinstance(pre.get(key), str) for key in ("name", "pattern")):
        raise InputError(f"{path}: 'pretokenizer' must be an object with 'name' and 'pattern'")
    specials = data.get("special_tokens", [])
    if not isinstance(specials, list) or not all(isinstance(s, str) and s for s in specials):
        raise InputError(f"{path}: 'special_tokens' must be a list of non-empty strings")
    vocab_size = data.get("vocab_size")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise InputError(f"{path}: 'vocab_size' must be an integer")
    defaults: dict[str, Any] = {"stages": [], "training": {}, "extra": {}}
    parts = {key: data.get(key, default) for key, default in defaults.items()}
    for key, value in parts.items():
        if not isinstance(value, list if key == "stages" else dict):
            raise InputError(f"{path}: '{key}' has the wrong type")
    whole_pieces = data.get("whole_pieces", True)
    if not isinstance(whole_pieces, bool):
        raise InputError(f"{path}: 'whole_pieces' must be true or false")
    return Manifest(
        pre, specials, vocab_size, parts["stages"], parts["training"], parts["extra"], version, whole_pieces
    )


def manifest_pretokenizer(path: Path, manifest: Manifest) -> Pretokenizer:
    """The manifest's pre-tokenizer, with a bad pattern reported against the manifest file."""
    try:
        return Pretokenizer.from_spec(manifest.pretokenizer)
    except Exception as exc:  # any failure here means a bad manifest
        raise InputError(f"{path}: bad pretokenizer: {exc}") from None


# ---------------------------------------------------------------------------------------------------------
# Whole tokenizer directories


def save_tokenizer_dir(
    directory: str | Path,
    vocab: Mapping[int, bytes],
    merges: Sequence[Merge],
    special_tokens: Sequence[str],
    pretokenizer: Pretokenizer,
    *,
    stages: Sequence[Mapping[str, Any]] = (),
    training: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    whole_pieces: bool = True,
    vocab_style: str = "lines",
    roles: Mapping[str, str | None] | None = None,
    tiktoken: bool = False,
) -> Path:
    """Write ``vocab.json``, ``merges.txt``, ``tokenizer.json`` (+ the two transformers files) and
    ``superbpe.json`` into ``directory``; with ``tiktoken``, also ``tokenizer.tiktoken`` + ``tiktoken.json``.

    ``roles`` maps transformers' ``bos_token`` / ``eos_token`` / ``pad_token`` / ``unk_token`` to special
    tokens (default: ``<|endoftext|>`` as bos and eos when it is a special token). ``whole_pieces`` is how
    the tokenizer encodes (see :class:`Manifest`); ``vocab_style`` the ``vocab.json`` layout. Every
    document is built (and so validated) before the first file is written.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise InputError(f"{directory}: exists and is not a directory; the tokenizer needs a directory")
    manifest = Manifest(
        pretokenizer=pretokenizer.spec(),
        special_tokens=list(special_tokens),
        vocab_size=len(vocab),
        stages=[dict(stage) for stage in stages],
        training=dict(training or {}),
        extra=dict(extra or {}),
        whole_pieces=whole_pieces,
    )
    hf_document = hf_tokenizer_json(vocab, merges, special_tokens, pretokenizer, whole_pieces)
    texts = {
        VOCAB_FILE: vocab_to_json_text(vocab, vocab_style),
        MERGES_FILE: merges_to_text(merges),
        HF_FILE: _json_text(hf_document, indent=1),
        MANIFEST_FILE: _json_text(manifest.to_json(), indent=2),
    }
    hf_roles = resolve_roles(roles, special_tokens)
    for name, document in transformers_documents(vocab, special_tokens, hf_roles).items():
        texts[name] = _json_text(document, indent=2)
    if tiktoken:
        texts.update(tiktoken_texts(vocab, merges, special_tokens, pretokenizer))
    for name, text in texts.items():
        atomic_write_text(directory / name, text)
    return directory
