"""The plain library entry point: train a byte-level BPE tokenizer from text files.

``train_bpe`` keeps the CS336 signature (``input_path, vocab_size, special_tokens`` in,
``(vocab, merges)`` out) so existing course code and tests can switch to superbpe unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from superbpe.core.compat import CompatConfig, get_compat, training_pretokenizer, training_rules
from superbpe.core.counts import PieceCounts
from superbpe.core.errors import ConfigError
from superbpe.core.pretokenize import Pretokenizer, SpecialSplitter, get_pretokenizer
from superbpe.core.rules import MergeCallback, make_rules
from superbpe.core.sources import DEFAULT_CHUNK_BYTES, InputSpec
from superbpe.core.types import Merge
from superbpe.core.vocab import (
    Vocab,
    alphabet_order,
    build_vocab,
    check_special_tokens,
    check_vocab_size,
    hf_vocab,
    merge_budget,
)
from superbpe.engines.interface import Engine, get_engine


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
    ``compat="official"`` trains as HF ``tokenizers`` does (see :mod:`superbpe.core.compat`): line units,
    HF's tie-break and ids, the alphabet of the bytes seen.
    """
    chosen_compat = get_compat(compat)
    special_tokens = list(dict.fromkeys(special_tokens))
    SpecialSplitter(special_tokens)
    check_special_tokens(special_tokens)
    seen_alphabet = chosen_compat.alphabet == "seen"
    check_vocab_size(vocab_size)
    # With the seen alphabet, the budget is known once the text is counted (see below).
    num_merges = 0 if seen_alphabet else merge_budget(vocab_size, special_tokens)
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
        num_merges = merge_budget(vocab_size, special_tokens, alphabet)
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
