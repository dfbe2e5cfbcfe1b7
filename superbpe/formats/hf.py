"""HF's files: ``tokenizer.json`` (read and written) and transformers' ``tokenizer_config.json`` +
``special_tokens_map.json`` beside it."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superbpe.core.byte_table import bytes_to_token_str, token_str_to_bytes
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.pretokenize import (
    PATTERNS,
    SPLIT_PROBE,
    Pretokenizer,
    get_pretokenizer,
    specials_shown,
    split_difference,
)
from superbpe.core.types import Merge
from superbpe.core.vocab import byte_table_spelling_of
from superbpe.formats.gpt2 import check_merges, decode_merge_items, parse_merge, vocab_from_mapping
from superbpe.formats.json_files import parse_json, read_text

try:  # the extension reads a large model's vocab and merges far faster; without it they are read here
    from superbpe import _native
except ImportError:
    _native = None  # type: ignore[assignment]

log = logging.getLogger("superbpe")

HF_FILE = "tokenizer.json"
HF_CONFIG_FILE = "tokenizer_config.json"
HF_SPECIAL_MAP_FILE = "special_tokens_map.json"
#: Where transformers 5 saves a chat template (one named ``default``) and any other named ones.
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
#: The roles transformers gives special tokens; "auto" picks ``<|endoftext|>`` when it is a special token.
TOKEN_ROLES = ("bos_token", "eos_token", "pad_token", "unk_token")
DEFAULT_ROLES = {"bos_token": "auto", "eos_token": "auto", "pad_token": None, "unk_token": None}
AUTO_SPECIAL = "<|endoftext|>"
#: The ``tokenizer_config.json`` keys a save writes from the tokenizer itself (its class, its special tokens
#: and their roles). A load keeps every other key as a setting of the user's, written back as it was read.
OWN_CONFIG_KEYS = frozenset(
    {"tokenizer_class", "added_tokens_decoder", "additional_special_tokens", "extra_special_tokens",
     *TOKEN_ROLES}
)  # fmt: skip
#: Settings a save writes when the tokenizer has none of its own (``clean_up_tokenization_spaces`` would
#: rewrite " ." to "." on decode, so that the text differs from the tokens').
DEFAULT_SETTINGS: dict[str, Any] = {"clean_up_tokenization_spaces": False}


def hf_tokenizer_json(
    vocab: Mapping[int, bytes],
    merges: Sequence[Merge],
    special_tokens: Sequence[str],
    pretokenizer: Pretokenizer,
    whole_pieces: bool = True,
    plain_added: Collection[str] = (),
) -> dict[str, Any]:
    """The HF ``tokenizers`` document that encodes exactly like our
    :class:`~superbpe.api.tokenizer.Tokenizer`.

    Every special token is an added token; those in ``plain_added`` are written as transformers'
    ``add_tokens`` makes them (``"special": false``, normalized), so a decode that skips special tokens keeps
    them. HF matches normalized added tokens only after the others, which we do not: a pair of the two kinds
    that could overlap in text is a ``ConfigError`` (:func:`added_tokens_problem`).

    ``ignore_merges`` is ``whole_pieces``: on, our encoder maps a piece that is itself a token straight to
    its id (off, as in the official SuperBPE files, every piece goes through the merges); the
    regex split is ``Isolated`` (matches and gaps are pieces, as ours); ByteLevel only maps bytes to the
    printable table (``use_regex=false``) since the split already happened.
    """
    by_bytes = {token: token_id for token_id, token in vocab.items()}
    missing = [special for special in special_tokens if special.encode("utf-8") not in by_bytes]
    if missing:
        raise ConfigError(f"special token {missing[0]!r} is not in the vocab")
    if problem := added_tokens_problem([s for s in special_tokens if s not in plain_added], plain_added):
        raise ConfigError(f"tokenizer.json cannot give the same ids: {problem}")
    if whole_pieces:
        _check_specials_spell_no_piece(special_tokens)
    added = [
        {
            "id": by_bytes[special.encode("utf-8")],
            "content": special,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": special in plain_added,
            "special": special not in plain_added,
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
        "vocab": _hf_vocab(vocab, special_tokens, merges),
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


def hf_split_problem(pretokenizer: Pretokenizer) -> str | None:
    """How HF ``tokenizers`` (whose regex engine is Oniguruma) would read a user's pattern otherwise than
    ours: not at all, or with other pieces of :data:`SPLIT_PROBE`; None when alike, for a built-in pattern
    (tested alike), or without ``tokenizers`` installed (nothing to ask)."""
    if PATTERNS.get(pretokenizer.name) == pretokenizer.pattern:
        return None
    try:
        import tokenizers  # optional: the check is only worth its import where the library is there
    except ImportError:
        return None
    byte_vocab = {i: bytes([i]) for i in range(256)}
    document = hf_tokenizer_json(byte_vocab, [], [], pretokenizer)
    try:
        hf = tokenizers.Tokenizer.from_str(json.dumps(document))
    except Exception as exc:  # noqa: BLE001 - whatever it raises, the pattern does not load there
        return f"HF tokenizers cannot load the pattern ({' '.join(str(exc).split())})"
    theirs = [token_str_to_bytes(piece) for piece, _ in hf.pre_tokenizer.pre_tokenize_str(SPLIT_PROBE)]
    return split_difference(pretokenizer, theirs, "HF tokenizers")


def _check_specials_spell_no_piece(special_tokens: Sequence[str]) -> None:
    """Refuse a special token written in the byte table's characters that spells another text ("Ġthe" is
    how tokenizer.json spells " the"), under ``ignore_merges``.

    Why: HF then looks a whole piece up in the model vocab by its byte-table spelling, where the special
    token is listed under its own text, so every piece " the" of the text got the special token's id
    (ours encodes " the" as its bytes and merges). Training refuses such specials up front
    (``vocab.check_special_tokens``); a tokenizer built or loaded with one is refused here, as a file that
    would encode otherwise. Without ``ignore_merges`` HF reaches a token only by merges, which make it
    only when it is a learned token too, and that is refused as a clash in :func:`_hf_vocab`.
    """
    for special in special_tokens:
        spelled = byte_table_spelling_of(special)
        if spelled is not None:
            raise ConfigError(
                f"special token {special!r} is how tokenizer.json spells the text {spelled!r} (GPT-2's byte "
                f"table): HF would give every piece {spelled!r} its id (ignore_merges, our whole_pieces); "
                "spell the special token in plain text, or build the tokenizer with whole_pieces=False"
            )


def _hf_vocab(
    vocab: Mapping[int, bytes], special_tokens: Sequence[str], merges: Sequence[Merge]
) -> dict[str, int]:
    """Model vocab in byte-table spelling, except special tokens, which HF looks up verbatim.

    HF gives an added token the model's id for its *content* (and appends a new id when the content is
    missing), so each special is listed under its own text. A special whose text is the byte-table
    spelling of another token (say "é", which also spells byte 0xE9) would get that token's id in HF:
    such a tokenizer cannot be exported, which is an error rather than a file that encodes differently.
    A special that merges also make (``" the"``) keeps its byte-table spelling too, under the same id:
    the merges name it so, and HF refuses a merge whose token is not in the vocab.
    """
    result = {bytes_to_token_str(token): token_id for token_id, token in sorted(vocab.items())}
    by_bytes = {token: token_id for token_id, token in vocab.items()}
    made = {left + right for left, right in merges} if special_tokens else set()
    for special in special_tokens:
        token = special.encode("utf-8")
        token_id = by_bytes[token]
        if result.get(special, token_id) != token_id:
            raise ConfigError(
                f"special token {special!r} is spelled like token id {result[special]} in tokenizer.json"
            )
        if token not in made:
            result.pop(bytes_to_token_str(token))
        result[special] = token_id
    return dict(sorted(result.items(), key=lambda item: item[1]))



@dataclass
class HFTokenizerData:
    """What we take from a ``tokenizer.json``: enough to encode the same way or to extend it."""

    vocab: dict[int, bytes]
    merges: list[Merge]
    special_tokens: list[str]
    pattern: str | None  # the Split regex, when the pre-tokenizer has one
    line_units: bool  # whether a Split on "\n" (merged with previous) comes first
    ignore_merges: bool = False  # the model's flag (HF's default when absent is off)
    valid: bool = False
    """Whether the vocab and merges are as a tokenizer needs them (non-negative int ids, distinct non-empty
    byte tokens, merges of two tokens into a token), so that it need not check them again."""
    plain_added: list[str] = field(default_factory=list)
    """The added tokens that are not special (``"special": false``: transformers' ``add_tokens``)."""


def read_hf_tokenizer(path: str | Path) -> HFTokenizerData:
    """Read a byte-level BPE ``tokenizer.json`` (ours or HF's), e.g. to extend an existing tokenizer."""
    path = Path(path)
    text = read_text(path)
    native = _model_read_natively(path, text)
    document = native[0] if native is not None else parse_json(path, text)
    model = document.get("model") if isinstance(document, dict) else None
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE":
        raise InputError(f"{path}: not a BPE tokenizer.json (no model of type BPE)")
    added = document.get("added_tokens", [])
    if not isinstance(added, list) or not all(isinstance(a, dict) for a in added):
        raise InputError(f"{path}: added_tokens must be a list of objects")
    # HF cuts every added token out of the text before the model sees it, special or not.
    special_tokens = [str(a.get("content")) for a in added]
    plain_added = [str(a.get("content")) for a in added if not a.get("special", False)]
    if native is not None:  # checked as the extension read them, merges against the model's vocab
        vocab, merges, where = native[1], native[2], None
        _add_added_tokens(path, vocab, added)
    else:
        added_ids = {str(a.get("content")): a.get("id") for a in added}
        vocab = vocab_from_mapping(path, model.get("vocab"), special_tokens, added_ids)
        _add_added_tokens(path, vocab, added)
        merges, where = _hf_merges(path, model.get("merges", []), list(vocab.values()))
    if where is not None:  # read item by item: checked here, where a fault is named
        check_merges(path, merges, vocab, where)
    _check_encodes_alike(path, document, model)
    _check_added_tokens(path, added)
    pattern, line_units = _hf_split(document.get("pre_tokenizer"))
    ignore_merges = bool(model.get("ignore_merges", False))
    # Ids and tokens were checked as they were read, but for empty tokens and an added token's negative
    # id (the tokenizer names those).
    valid = all(vocab.values()) and min(vocab, default=0) >= 0
    return HFTokenizerData(vocab, merges, special_tokens, pattern, line_units, ignore_merges, valid,
                           plain_added)  # fmt: skip


_NativeModel = tuple[dict[str, Any], dict[int, bytes], list[Merge]]


def _model_read_natively(path: Path, text: str) -> _NativeModel | None:
    """The document without its model's vocab and merges, and those two as the extension read them; None
    when it is not built or leaves the document to the reader above (which names any problem).

    The extension reads a vocab string as a byte-table string where it can, and hands back any other as
    text. An added token found in the model's vocab is UTF-8 text there: as text, it is taken as such
    here; where its byte-table reading differs from its UTF-8, the whole document is read above."""
    if _native is None:
        return None
    parts = _native.hf_model_parts(text)
    if parts is None:
        return None
    skeleton, vocab, merges, texts = parts
    try:
        document = parse_json(path, skeleton)
    except InputError:
        return None  # named from the whole text, where the line and column are the file's
    added = document.get("added_tokens", [])
    if not isinstance(added, list) or not all(isinstance(a, dict) for a in added):
        return None
    contents: set[str] = set()
    for entry in added:
        content, token_id = entry.get("content"), entry.get("id")
        if not isinstance(content, str) or type(token_id) is not int:
            return None
        contents.add(content)
        try:
            spelt = token_str_to_bytes(content)
        except KeyError:
            continue  # not a table string, so not read as one
        if vocab.get(token_id) == spelt and spelt != content.encode("utf-8"):
            return None
    for token_id in texts:
        if vocab[token_id] not in contents:
            return None  # a token outside the byte table that is no special token: named above
        vocab[token_id] = vocab[token_id].encode("utf-8")
    if texts and len(set(vocab.values())) != len(vocab):
        return None
    return document, vocab, merges


def _add_added_tokens(path: Path, vocab: dict[int, bytes], added: list[dict[str, Any]]) -> None:
    """Added tokens missing from the model vocab still own their ids (the vocab's tokens are distinct)."""
    by_bytes: dict[bytes, int] | None = None  # made only for a token not in the vocab yet (a 200K vocab)
    for entry in added:
        content, token_id = entry.get("content"), entry.get("id")
        bad_id = isinstance(token_id, bool) or not isinstance(token_id, int)
        if not isinstance(content, str) or not content or bad_id:
            raise InputError(f"{path}: added token needs non-empty 'content' and integer 'id': {entry!r}")
        token = content.encode("utf-8")
        held = vocab.get(token_id)
        if held is None:
            if by_bytes is None:
                by_bytes = {known: known_id for known_id, known in vocab.items()}
            held = token if by_bytes.setdefault(token, token_id) == token_id else None
        if held != token:
            raise InputError(f"{path}: added token {content!r} (id {token_id}) clashes with the model vocab")
        vocab[token_id] = token


def _hf_merges(
    path: Path, raw: Any, tokens: list[bytes] | None = None
) -> tuple[list[Merge], list[str] | None]:
    """Merges as ``"a b"`` strings (older files) or ``["a", "b"]`` pairs (tokenizers >= 0.20), and where
    each was in the file. Where is None when the extension read them, checked against ``tokens`` when
    given."""
    if not isinstance(raw, list):
        raise InputError(f"{path}: model.merges must be a list")
    fast = decode_merge_items(raw, tokens)
    if fast is not None:
        return fast, None
    merges: list[Merge] = []
    where: list[str] = []
    for index, item in enumerate(raw):
        parts = item.split(" ") if isinstance(item, str) else item
        if not isinstance(parts, list) or len(parts) != 2 or not all(isinstance(p, str) and p for p in parts):
            raise InputError(f"{path}: merge #{index} is not two tokens: {item!r}")
        place = f"merge #{index}"
        merges.append(parse_merge(path, place, *parts))
        where.append(place)
    return merges, where


def _check_encodes_alike(path: Path, document: dict[str, Any], model: dict[str, Any]) -> None:
    """Refuse a ``tokenizer.json`` setting our encoder does not reproduce: it loaded without a word and
    then gave other ids than HF (a normalizer, a prefix space, another pre-tokenizer, dropout).

    What we read is byte-level BPE as we and the official SuperBPE write it, and as GPT-2's files are:
    pre-tokenizer steps that are a regex Split (isolated), a newline Split merged with the previous piece
    (line units) and ByteLevel without a prefix space (its own GPT-2 regex only when no Split comes first).
    """
    problems = _model_problems(document, model) + _pre_tokenizer_problems(document.get("pre_tokenizer"))
    if problems:
        raise InputError(
            f"{path}: {problems[0]}: superbpe does not reproduce it (it would encode other ids than HF); "
            "it reads byte-level BPE, a regex Split and a ByteLevel step without a prefix space"
        )


def _check_added_tokens(path: Path, added: list[dict[str, Any]]) -> None:
    """Refuse added tokens HF cuts out of text otherwise than we would: with their spaces around them
    (``lstrip``, ``rstrip``), only as whole words, or in an order our one pass does not follow."""
    for entry in added:
        flags = [flag for flag in ("lstrip", "rstrip", "single_word") if entry.get(flag)]
        if flags:
            raise InputError(
                f"{path}: added token {entry.get('content')!r} has {flags[0]}: superbpe does not reproduce "
                "it (it would encode other ids than HF); it cuts added tokens out of text as they are"
            )
    # An added token's "normalized" defaults as AddedToken's does in HF: on unless it is special.
    normal = {str(e["content"]): bool(e.get("normalized", not e.get("special", False))) for e in added}
    verbatim = [token for token, normalized in normal.items() if not normalized]
    if problem := added_tokens_problem(verbatim, [token for token in normal if normal[token]]):
        raise InputError(
            f"{path}: {problem}: superbpe matches every added token at once (it would give other ids than HF)"
        )


def added_tokens_problem(verbatim: Collection[str], normalized: Collection[str]) -> str | None:
    """How HF would cut these added tokens out of a text otherwise than we do, or None when it cannot.

    HF matches the added tokens it does not normalize first and the normalized ones in what is left; we
    take the leftmost longest of all at once. The two agree unless a token of one kind can overlap one of
    the other in some text (one holds the other, or one ends with the other's beginning): where none can, no
    match of one kind touches a place the other kind matches, so each kind's matches are the same either
    way."""
    for first in verbatim:
        for second in normalized:
            if _can_overlap(first, second):
                return (f"added tokens {first!r} and {second!r} can overlap, and HF matches {second!r} "
                        f"(normalized) only after {first!r}")  # fmt: skip
    return None


def _can_overlap(a: str, b: str) -> bool:
    """Whether occurrences of ``a`` and ``b`` can share a character in some text."""
    if a in b or b in a:
        return True
    return any(a.endswith(b[:k]) or b.endswith(a[:k]) for k in range(1, min(len(a), len(b))))


def _model_problems(document: dict[str, Any], model: dict[str, Any]) -> list[str]:
    normalizer = document.get("normalizer")
    problems = [f"normalizer {normalizer.get('type', '?')}"] if isinstance(normalizer, dict) else []
    if model.get("dropout"):
        problems.append(f"BPE dropout {model['dropout']}")
    for key in ("continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"):
        if model.get(key):
            problems.append(f"{key} {model[key]!r}")
    return problems


def _pre_steps(pre: Any) -> list[Any]:
    """The steps of a ``tokenizer.json`` pre-tokenizer: a Sequence's, or the one step (none for null)."""
    steps = pre.get("pretokenizers", []) if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    return [step for step in steps if step]


def _pre_tokenizer_problems(pre: Any) -> list[str]:
    steps = [step if isinstance(step, dict) else {"type": repr(step)} for step in _pre_steps(pre)]
    problems = []
    split = False
    for step in steps:
        kind, target, behavior = step.get("type"), step.get("pattern") or {}, step.get("behavior")
        if kind == "ByteLevel" and step.get("add_prefix_space"):
            problems.append("ByteLevel with add_prefix_space")
        elif kind == "ByteLevel" and step.get("use_regex", True) and split:
            problems.append("ByteLevel's own regex after a Split")
        elif kind == "Split" and not step.get("invert") and "Regex" in target and behavior == "Isolated":
            split = True
        elif kind == "Split" and target.get("String") == "\n" and behavior == "MergedWithPrevious":
            continue
        elif kind == "Split":
            problems.append(f"a Split on {target} ({behavior}{', inverted' if step.get('invert') else ''})")
        elif kind != "ByteLevel":
            problems.append(f"pre-tokenizer {kind}")
    if not any(step.get("type") == "ByteLevel" for step in steps):
        problems.append("no ByteLevel pre-tokenizer (not byte-level BPE)")
    return problems


def _hf_split(pre: Any) -> tuple[str | None, bool]:
    """The first regex Split and whether a newline Split precedes it (our line-units encoding)."""
    pattern: str | None = None
    line_units = False
    for step in _pre_steps(pre):
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

    for name, pattern in PATTERNS.items():
        if pattern == data.pattern:
            return get_pretokenizer(name, line_units=data.line_units)
    return get_pretokenizer("custom", pattern=data.pattern, line_units=data.line_units)


def read_roles(directory: Path, special_tokens: Sequence[str]) -> dict[str, str | None] | None:
    """The token roles a directory gives (a role it lacks has no token), or None without a usable file.

    Roles are read as transformers reads them: from ``tokenizer_config.json``, with those that
    ``special_tokens_map.json`` names taking their place. transformers 5 writes roles only in the first and
    leaves the second as it was, so a role set there and saved over our directory (a pad token) is in the
    config alone. transformers writes a role as ``{"content": ...}``, we as the token itself. Encoding never
    depends on these files, so one that cannot be read, or a role naming no special token, is passed over
    with a warning naming it rather than refused."""
    found: dict[str, str | None] | None = None
    for name in (HF_CONFIG_FILE, HF_SPECIAL_MAP_FILE):
        path = directory / name
        roles = _roles_in(path, special_tokens) if path.is_file() else None
        if roles is not None:
            found = {**(found or {}), **roles}
    return None if found is None else {role: found.get(role) for role in TOKEN_ROLES}


def _roles_in(path: Path, special_tokens: Sequence[str]) -> dict[str, str | None] | None:
    """The token roles one JSON file of ``read_roles`` names (a role it leaves out is not in the dict)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("%s: not read (%s); its token roles and settings are not kept", path, exc)
        return None
    if not isinstance(data, dict):
        log.warning("%s: not a JSON object of token roles; its roles and settings are not kept", path)
        return None
    roles: dict[str, str | None] = {}
    for role in (role for role in TOKEN_ROLES if role in data):
        token = data[role]
        token = token.get("content") if isinstance(token, dict) else token
        if token is not None and (not isinstance(token, str) or token not in special_tokens):
            log.warning("%s: %s %r is not a special token here; that role is not kept", path, role, token)
            token = None
        roles[role] = token
    return roles


#: Why a role cannot name a reserved padding token (``pad_vocab_to_multiple_of``) at training time.
_RESERVED_ROLE_HINT = (
    " (the reserved padding tokens are made with the vocabulary, after the roles are checked; give the role "
    "a special token of your own, e.g. special_tokens=[..., '<|pad|>'])"
)


def resolve_roles(roles: Mapping[str, str | None] | None, special_tokens: Sequence[str]) -> dict[str, str]:
    """Role -> special token (``auto``: ``<|endoftext|>`` if it is one, else no token for that role)."""
    if roles is not None and not isinstance(roles, Mapping):
        example = "{'pad_token': '<|pad|>'}"
        raise ConfigError(f"roles must map a role to a special token, e.g. {example}; got {roles!r}")
    given = {**DEFAULT_ROLES, **(roles or {})}
    unknown = sorted(set(given) - set(TOKEN_ROLES), key=repr)
    if unknown:
        raise ConfigError(f"unknown token role {unknown[0]!r}; roles are {', '.join(TOKEN_ROLES)}")
    resolved = {}
    for role, token in given.items():
        if token == "auto":
            token = AUTO_SPECIAL if AUTO_SPECIAL in special_tokens else None
        if token is None:
            continue
        if not isinstance(token, str):
            raise ConfigError(f"{role} must be a special token (a str) or None, not {token!r}")
        if token not in special_tokens:
            hint = _RESERVED_ROLE_HINT if token.startswith("<|reserved_") else ""
            listed = specials_shown(special_tokens)
            raise ConfigError(f"{role} {token!r} is not one of the special tokens [{listed}]{hint}")
        resolved[role] = token
    return resolved


def read_transformers_settings(directory: Path) -> dict[str, Any]:
    """The settings a directory gives transformers beyond the tokenizer itself: every key of its
    ``tokenizer_config.json`` but :data:`OWN_CONFIG_KEYS` (``model_max_length``, ``padding_side``,
    ``clean_up_tokenization_spaces``, ``chat_template``, ...), and its chat templates.

    A save writes them back, so a tokenizer loaded from a directory transformers saved keeps them (a chat
    template of the user's would otherwise vanish without a word). Templates are read as transformers reads
    them: its files (``chat_template.jinja``, ``additional_chat_templates/*.jinja``) win over the config's
    key, one ``default`` template as a str, several as a dict by name. Encoding never depends on them, so a
    file that cannot be read is passed over with a warning naming it (``read_roles`` names a config file
    that it cannot read, once)."""
    path = directory / HF_CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        config = {}
    if not isinstance(config, dict):
        config = {}
    settings = {key: value for key, value in config.items() if key not in OWN_CONFIG_KEYS}
    templates = _chat_templates_in(directory)
    if templates:
        settings["chat_template"] = templates["default"] if list(templates) == ["default"] else templates
    return settings


def _chat_templates_in(directory: Path) -> dict[str, str]:
    """The chat templates saved as files in ``directory``, by name (``default`` for chat_template.jinja)."""
    files = {"default": directory / CHAT_TEMPLATE_FILE}
    if (directory / CHAT_TEMPLATE_DIR).is_dir():
        files.update((file.stem, file) for file in sorted((directory / CHAT_TEMPLATE_DIR).glob("*.jinja")))
    templates = {}
    for name, file in files.items():
        if not file.is_file():
            continue
        try:
            templates[name] = file.read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:
            log.warning("%s: not read (%s); that chat template is not kept", file, exc)
    return templates


def chat_template_texts(settings: Mapping[str, Any]) -> dict[str, str]:
    """The files a ``chat_template`` setting is saved as, by path in the directory, as transformers 5 saves
    it: a str, or a dict's ``default``, as ``chat_template.jinja``, other names under
    ``additional_chat_templates/``. Any other value (transformers 4's list of named templates) stays in
    ``tokenizer_config.json``, where transformers reads it too, and makes no file."""
    template = settings.get("chat_template")
    named = {"default": template} if isinstance(template, str) else template
    if not isinstance(named, Mapping):
        return {}
    texts = {}
    for name, text in named.items():
        if not isinstance(name, str) or not isinstance(text, str) or not _plain_file_name(name):
            raise ConfigError(f"chat_template {name!r} must be a template (a str) named by a plain file name")
        texts[CHAT_TEMPLATE_FILE if name == "default" else f"{CHAT_TEMPLATE_DIR}/{name}.jinja"] = text
    return texts


def _plain_file_name(name: str) -> bool:
    """Whether ``name`` names a file in one directory (no separator, not ``.``/``..``, not empty)."""
    return bool(name) and name not in (".", "..") and not any(sep in name for sep in ("/", "\\", "\0"))


def transformers_documents(
    vocab: Mapping[int, bytes],
    special_tokens: Sequence[str],
    roles: Mapping[str, str],
    settings: Mapping[str, Any] | None = None,
    plain_added: Collection[str] = (),
) -> dict[str, dict[str, Any]]:
    """``tokenizer_config.json`` and ``special_tokens_map.json`` for ``AutoTokenizer.from_pretrained``.

    The class is the generic ``PreTrainedTokenizerFast`` over our ``tokenizer.json``, so encoding is exactly
    the HF ``tokenizers`` one (no BOS/EOS added: ``tokenizer.json`` has no post-processor), and
    ``clean_up_tokenization_spaces`` is off unless ``settings`` (:func:`read_transformers_settings`) turn it
    on. The other ``settings`` follow as they were read, but for chat templates saved as files
    (:func:`chat_template_texts`). Tokens of ``plain_added`` are added tokens that are not special, as
    in :func:`hf_tokenizer_json`.
    """
    by_bytes = {token: token_id for token_id, token in vocab.items()}
    added = {
        str(by_bytes[special.encode("utf-8")]): {
            "content": special, "lstrip": False, "normalized": special in plain_added, "rstrip": False,
            "single_word": False, "special": special not in plain_added,
        }
        for special in special_tokens
    }
    others = [s for s in special_tokens if s not in roles.values() and s not in plain_added]
    special_map: dict[str, Any] = dict(roles)
    if others:
        special_map["additional_special_tokens"] = others
    settings = {**DEFAULT_SETTINGS, **(settings or {})}
    if chat_template_texts(settings):
        del settings["chat_template"]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": settings.pop("clean_up_tokenization_spaces"),
        "added_tokens_decoder": added,
        **{role: roles.get(role) for role in TOKEN_ROLES},
        "additional_special_tokens": others,
        **settings,
    }
    return {HF_CONFIG_FILE: config, HF_SPECIAL_MAP_FILE: special_map}
