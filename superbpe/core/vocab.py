"""The vocabulary's layout: which ids the bytes, the merges and the special tokens get, and how many merges
a ``vocab_size`` leaves room for. One place, so training, runs and exports count alike."""

from __future__ import annotations

import logging
import re
from collections.abc import Container, Iterable, Sequence
from itertools import chain

from superbpe.core.byte_table import byte_to_unicode, token_str_to_bytes, unicode_to_byte
from superbpe.core.errors import ConfigError
from superbpe.core.types import Merge
from superbpe.core.util import whole_number

Vocab = dict[int, bytes]
log = logging.getLogger("superbpe")
_PLAIN_WORD = re.compile(r"\w+")


def build_vocab(merges: Sequence[Merge], special_tokens: Iterable[str] = ()) -> Vocab:
    """Ids 0-255 are the bytes, then one id per merge in order, then the special tokens.

    A str where the list of special tokens goes, or merges of str, are refused: the first would be read as
    its characters, each a special token, and the second would put text in the vocab, not bytes."""
    if isinstance(special_tokens, str | bytes):
        raise ConfigError(f"special_tokens takes a list of strings: [{special_tokens!r}]")
    vocab: Vocab = {i: bytes([i]) for i in range(256)}
    for left, right in merges:
        if type(left) is not bytes or type(right) is not bytes:
            raise ConfigError(f"merge #{len(vocab) - 256} must be two bytes objects, not {(left, right)!r}")
        vocab[len(vocab)] = left + right
    tokens = set(vocab.values())
    for token in dict.fromkeys(special_tokens):
        if token.encode("utf-8") in tokens:
            raise ConfigError(f"special token {token!r} has the bytes of a learned token; choose another")
        vocab[len(vocab)] = token.encode("utf-8")
    return vocab


def check_merge_parts(tokens: Container[bytes], merges: Sequence[Merge]) -> None:
    """Every merge joins two tokens (``tokens``: the vocab's). One whose part is not there (a vocab that
    lacks a byte a merge uses) gives ids on an encoder that starts from bytes and none on one that starts
    from the bytes' ids; HF refuses to load such a file. The error names the first such merge."""
    if all(map(tokens.__contains__, chain.from_iterable(merges))):  # the common case, at C speed
        return
    for index, (left, right) in enumerate(merges):
        for part in (left, right):
            if part not in tokens:
                shown = f"merge #{index} ({left!r}, {right!r})"
                raise ConfigError(f"{shown} joins {part!r}, which is not in the vocab")


def check_special_tokens(special_tokens: Sequence[str]) -> None:
    """Refuse special tokens that would share a spelling with a byte token; warn about plain words.

    A one-byte special ("x") has the bytes of byte token 120, so ``vocab.json`` would hold two ids
    under one key; a one-character special in the GPT-2 byte table ("é", "Ġ") is written verbatim in
    ``tokenizer.json`` under the key of a byte token. Both make files that do not load or that encode
    differently, so they are errors before any training. A longer special written in the byte table's
    characters ("Ġthe", "ĊĊ") spells the text of another token (" the", two newlines) in
    ``tokenizer.json`` whenever the merges learn that text, which is known only after training: it is
    refused before too. One whose byte-table reading is not text ("<|résumé|>": its "é" reads as a lone
    byte 0xE9) is the spelling of no learned token and is allowed. A special that is a plain word is
    allowed but worth a warning: text is cut at every occurrence, inside longer words too. The tokens are ones
    a :class:`SpecialSplitter` took (a list of non-empty strings), which every caller makes first.
    """
    for token in special_tokens:
        if len(token.encode("utf-8")) == 1 or token in unicode_to_byte():
            raise ConfigError(
                f"special token {token!r} is spelled like a byte token; "
                f"use a longer text, say {f'<|{token}|>'!r}"
            )
        spelled = byte_table_spelling_of(token)
        if spelled is not None:
            raise ConfigError(
                f"special token {token!r} is how tokenizer.json spells the text {spelled!r} (GPT-2's byte "
                f"table), which the merges may learn as a token, and then the two cannot both be written; "
                f"spell the special token in plain text"
            )
        if _PLAIN_WORD.fullmatch(token):
            log.warning(
                "special token %r is a plain word: every %r in the text becomes this token, inside longer "
                "words too; markup such as '<|%s|>' avoids that",
                token,
                token,
                token,
            )


def byte_table_spelling_of(token: str) -> str | None:
    """The text whose tokenizer.json spelling ``token`` is, when that is another text than the token's own."""
    try:
        spelled = token_str_to_bytes(token)
    except KeyError:
        return None  # a character outside the byte table: no token is spelled with it
    if spelled == token.encode("utf-8"):
        return None
    try:
        return spelled.decode("utf-8")
    except UnicodeDecodeError:
        return None


RESERVED_FORMAT = "<|reserved_{}|>"


def reserved_tokens(size: int, multiple: int | None, taken: Iterable[str] = ()) -> list[str]:
    """Special tokens ``<|reserved_0|>``, ... that round a vocab of ``size`` up to a multiple of ``multiple``
    (GPU-friendly embedding sizes). Names already in ``taken`` are skipped, so they never collide."""
    if multiple is None:
        return []
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ConfigError(f"pad_vocab_to_multiple_of must be a positive integer, not {multiple!r}")
    taken = set(taken)
    names: list[str] = []
    number = 0
    while (size + len(names)) % multiple:
        name = RESERVED_FORMAT.format(number)
        number += 1
        if name not in taken:
            names.append(name)
    return names


#: The largest vocabulary either engine trains: the python engine's symbols are characters, so its ids
#: stop at the last code point. Checked before a corpus is counted, so a typo fails at once and alike.
MAX_VOCAB_SIZE = 0x110000


def check_vocab_size(vocab_size: int) -> int:
    """``vocab_size`` as an int if it is an integer, numpy's too (a float or a bool from a config is an
    error), at most :data:`MAX_VOCAB_SIZE`."""
    vocab_size = whole_number(vocab_size, "vocab_size", low=None)
    if vocab_size > MAX_VOCAB_SIZE:
        raise ConfigError(
            f"vocab_size {vocab_size:,} is above {MAX_VOCAB_SIZE:,}, the largest vocabulary trained"
        )
    return vocab_size


def merge_budget(
    vocab_size: int, special_tokens: Sequence[str], alphabet: bytes | None = None, at_least: int = 0
) -> int:
    """Merges (new tokens) a vocabulary of ``vocab_size`` leaves beside its first ids and the specials.

    ``alphabet`` None: all 256 bytes are ids, and a ``vocab_size`` below them and the specials is an
    error. Else only ``alphabet``'s bytes are (the seen alphabet): as HF's trainer, a ``vocab_size`` they
    and the specials already fill gives no merges (and a vocabulary larger than asked); ``at_least`` is
    what the schedule needs (its fixed stage ends), an error when the budget is below it.
    """
    vocab_size = check_vocab_size(vocab_size)
    if alphabet is None:
        floor = 256 + len(special_tokens)
        if vocab_size < floor:
            raise ConfigError(
                f"vocab_size {vocab_size} is below 256 bytes + {len(special_tokens)} special tokens = {floor}"
            )
        return vocab_size - floor
    budget = vocab_size - len(special_tokens) - len(alphabet)
    if max(budget, 0) < at_least:
        raise ConfigError(
            f"vocab_size {vocab_size} leaves {budget} merges after the {len(alphabet)} bytes seen and "
            f"{len(special_tokens)} special tokens; the schedule needs at least {at_least}"
        )
    return max(budget, 0)


def most_seen_merges(vocab_size: int, special_tokens: Sequence[str]) -> int:
    """With the seen alphabet, the most merges ``vocab_size`` can leave (a text has at least one byte).

    The true number is known once the text is counted (:func:`merge_budget` with its alphabet); before
    that, stage ends are checked against this bound.
    """
    if check_vocab_size(vocab_size) < 1:
        raise ConfigError(f"vocab_size must be positive, not {vocab_size}")
    return merge_budget(vocab_size, special_tokens, alphabet=b"\0")


def alphabet_order(byte_values: Iterable[int]) -> bytes:
    """Byte values sorted as HF numbers its alphabet: by the code point of their byte-table character."""
    table = byte_to_unicode()
    return bytes(sorted(set(byte_values), key=lambda b: ord(table[b])))


def hf_vocab(
    alphabet: bytes, merges: Sequence[Merge], special_tokens: Iterable[str] = ()
) -> dict[int, bytes]:
    """HF's ids: the special tokens, the alphabet, then each new merged token in order (one a merge
    makes again gets no id)."""
    vocab: dict[int, bytes] = {}
    known: set[bytes] = set()
    specials = [special.encode("utf-8") for special in dict.fromkeys(special_tokens)]
    for token in [*specials, *(bytes([b]) for b in alphabet), *(left + right for left, right in merges)]:
        if token not in known:
            known.add(token)
            vocab[len(vocab)] = token
    return vocab
