"""The plain library entry point: train a byte-level BPE tokenizer from text files.

``train_bpe`` keeps the CS336 signature (``input_path, vocab_size, special_tokens`` in,
``(vocab, merges)`` out) so existing course code and tests can switch to superbpe unchanged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from superbpe.compat import (
    alphabet_order,
    get_compat,
    hf_vocab,
    seen_budget,
    training_pretokenizer,
    training_rules,
)
from superbpe.config import CompatConfig
from superbpe.counting import PieceCounts
from superbpe.engine import Engine, Merge, MergeCallback, get_engine
from superbpe.errors import ConfigError
from superbpe.pretokenize import Pretokenizer, SpecialSplitter, get_pretokenizer
from superbpe.sources import DEFAULT_CHUNK_BYTES, InputSpec
from superbpe.trainer import MergeRules

Vocab = dict[int, bytes]
log = logging.getLogger("superbpe")
_PLAIN_WORD = re.compile(r"\w+")


def build_vocab(merges: Sequence[Merge], special_tokens: Iterable[str] = ()) -> Vocab:
    """Ids 0-255 are the bytes, then one id per merge in order, then the special tokens."""
    vocab: Vocab = {i: bytes([i]) for i in range(256)}
    for left, right in merges:
        vocab[len(vocab)] = left + right
    tokens = set(vocab.values())
    for token in dict.fromkeys(special_tokens):
        if token.encode("utf-8") in tokens:
            raise ConfigError(f"special token {token!r} has the bytes of a learned token; choose another")
        vocab[len(vocab)] = token.encode("utf-8")
    return vocab


def check_special_tokens(special_tokens: Sequence[str]) -> None:
    """Refuse special tokens that would share a spelling with a byte token; warn about plain words.

    A one-byte special ("x") has the bytes of byte token 120, so ``vocab.json`` would hold two ids
    under one key; a one-character special in the GPT-2 byte table ("é", "Ġ") is written verbatim in
    ``tokenizer.json`` under the key of a byte token. Both make files that do not load or that encode
    differently, so they are errors before any training. A special that is a plain word is allowed
    but worth a warning: text is cut at every occurrence, inside longer words too.
    """
    from superbpe.files import unicode_to_byte

    for token in special_tokens:
        if len(token.encode("utf-8")) == 1 or token in unicode_to_byte():
            raise ConfigError(
                f"special token {token!r} is spelled like a byte token; use a longer text, say '<|{token}|>'"
            )
        if _PLAIN_WORD.fullmatch(token):
            log.warning(
                "special token %r is a plain word: every %r in the text becomes this token, inside longer "
                "words too; markup such as '<|%s|>' avoids that",
                token,
                token,
                token,
            )


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


def merge_budget(vocab_size: int, special_tokens: Sequence[str]) -> int:
    """How many merges a vocabulary of ``vocab_size`` leaves room for."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise ConfigError(f"vocab_size must be an integer, not {vocab_size!r}")
    floor = 256 + len(special_tokens)
    if vocab_size < floor:
        raise ConfigError(
            f"vocab_size {vocab_size} is below 256 bytes + {len(special_tokens)} special tokens = {floor}"
        )
    return vocab_size - floor


def make_rules(
    min_frequency: int = 1,
    max_token_bytes: int | None = None,
    max_words_per_token: int | None = None,
    forbidden_substrings: Iterable[str | bytes] = (),
) -> MergeRules:
    """Merge rules from user-facing option values: strings become UTF-8; ``MergeRules`` validates."""
    forbidden = tuple(s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in forbidden_substrings)
    return MergeRules(min_frequency, max_token_bytes, max_words_per_token, forbidden)


def count(
    input_path: InputSpec,
    special_tokens: Sequence[str] = (),
    *,
    pretokenizer: str | Pretokenizer = "gpt2",
    engine: str | Engine = "auto",
    workers: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    errors: str = "strict",
    text_field: str = "text",
) -> PieceCounts:
    """Pre-tokenize and count a corpus once, to train on (or add up) later."""
    pre = get_pretokenizer(pretokenizer)
    SpecialSplitter(special_tokens)
    return get_engine(engine, [pre]).count(
        input_path,
        pre,
        special_tokens,
        workers=workers,
        chunk_bytes=chunk_bytes,
        errors=errors,
        text_field=text_field,
    )


def train_bpe(
    input_path: InputSpec | PieceCounts,
    vocab_size: int,
    special_tokens: Sequence[str] = (),
    *,
    pretokenizer: str | Pretokenizer = "gpt2",
    engine: str | Engine = "auto",
    workers: int | None = None,
    replay: Sequence[Merge] = (),
    callback: MergeCallback | None = None,
    callback_every: int = 1000,
    compat: str | CompatConfig | None = None,
    **options: Any,
) -> tuple[Vocab, list[Merge]]:
    """Train byte-level BPE on text files (or on saved piece counts) and return ``(vocab, merges)``.

    Options: ``min_frequency``, ``max_token_bytes``, ``max_words_per_token``,
    ``forbidden_substrings``, ``chunk_bytes``, ``errors`` ("strict" or "replace"), ``text_field``.
    ``compat="official"`` trains as HF ``tokenizers`` does (see :mod:`superbpe.compat`): line units,
    HF's tie-break and ids, the alphabet of the bytes seen.
    """
    chosen_compat = get_compat(compat)
    special_tokens = list(dict.fromkeys(special_tokens))
    SpecialSplitter(special_tokens)
    check_special_tokens(special_tokens)
    seen_alphabet = chosen_compat.alphabet == "seen"
    # With the seen alphabet, the budget is known once the text is counted (see below).
    num_merges = merge_budget(vocab_size, special_tokens) if not seen_alphabet else 0
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise ConfigError(f"vocab_size must be an integer, not {vocab_size!r}")
    read_options = {k: options.pop(k) for k in ("chunk_bytes", "errors", "text_field") if k in options}
    rules = training_rules(make_rules(**_rule_options(options)), chosen_compat)
    pretokenizer = training_pretokenizer(get_pretokenizer(pretokenizer), chosen_compat)
    splits = [] if isinstance(input_path, PieceCounts) else [pretokenizer]
    chosen = get_engine(engine, splits)
    if isinstance(input_path, PieceCounts):
        counts = input_path
    else:
        counts = count(
            input_path,
            special_tokens,
            pretokenizer=pretokenizer,
            engine=chosen,
            workers=workers,
            **read_options,
        )
    alphabet = alphabet_order(counts.bytes_seen()) if seen_alphabet else None
    if alphabet is not None:  # the bytes never seen take no ids, so merges may use them
        num_merges = seen_budget(vocab_size, alphabet, special_tokens)
    result = chosen.train(
        counts, num_merges, rules=rules, replay=replay, callback=callback, callback_every=callback_every
    )
    if alphabet is not None:
        return hf_vocab(alphabet, result.merges, special_tokens), result.merges
    return build_vocab(result.merges, special_tokens), result.merges


def _rule_options(options: dict[str, Any]) -> dict[str, Any]:
    known = {"min_frequency", "max_token_bytes", "max_words_per_token", "forbidden_substrings"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown train_bpe option(s): {', '.join(unknown)}")
    return options
