"""The plain library entry point: train a byte-level BPE tokenizer from text files.

``train_bpe`` keeps the CS336 signature (``input_path, vocab_size, special_tokens`` in,
``(vocab, merges)`` out) so existing course code and tests can switch to superbpe unchanged.
"""

from __future__ import annotations

import logging
import numbers
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from superbpe.core.compat import CompatConfig, get_compat, training_pretokenizer, training_rules
from superbpe.core.counts import PieceCounts
from superbpe.core.errors import ConfigError
from superbpe.core.pretokenize import (
    Pretokenizer,
    SpecialSplitter,
    get_pretokenizer,
    special_token_list,
    splits_into_words,
)
from superbpe.core.rules import MergeCallback, MergeRules, check_callback, make_rules
from superbpe.core.sources import DEFAULT_CHUNK_BYTES, DocumentStream, InputSpec, is_document_stream
from superbpe.core.types import Merge
from superbpe.core.util import caller_stacklevel, whole_number
from superbpe.core.vocab import (
    Vocab,
    alphabet_order,
    build_vocab,
    check_special_tokens,
    check_vocab_size,
    hf_vocab,
    merge_budget,
    most_seen_merges,
)
from superbpe.engines.interface import Engine, get_engine

log = logging.getLogger("superbpe")


def count(
    input_path: InputSpec | DocumentStream,
    special_tokens: Sequence[str] = (),
    *,
    pretokenizer: str | Pretokenizer = "gpt2",
    engine: str | Engine = "auto",
    workers: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    errors: str = "strict",
    text_field: str = "text",
    compat: str | CompatConfig | None = None,
) -> PieceCounts:
    """Pre-tokenize and count a corpus once, to train on (or add up) later.

    ``input_path`` is files (a path, a list of paths, a directory or a glob) or documents: any other
    iterable of strings, such as a generator or a ``datasets`` stream (rows that are mappings give
    their ``text_field``). A stream is read once, in blocks of about ``chunk_bytes`` characters
    counted in parallel, so it is never held whole; its counts equal those of the same documents
    written one per line to a ``.jsonl`` file. ``compat`` counts in its training units (``"official"``:
    line by line), as ``train_bpe`` with that ``compat`` trains on them.
    """
    pre = training_pretokenizer(get_pretokenizer(pretokenizer), get_compat(compat))
    SpecialSplitter(special_tokens)
    return get_engine(engine, [pre]).count(
        input_path,
        pre,
        special_tokens,
        workers=workers,
        chunk_bytes=whole_number(chunk_bytes, "chunk_bytes"),
        errors=errors,
        text_field=text_field,
    )


def train_bpe(
    input_path: InputSpec | DocumentStream | PieceCounts,
    vocab_size: int,
    special_tokens: Sequence[str] = (),
    *,
    pretokenizer: str | Pretokenizer | None = None,
    engine: str | Engine = "auto",
    workers: int | None = None,
    replay: Sequence[Merge] = (),
    callback: MergeCallback | None = None,
    callback_every: int = 1000,
    compat: str | CompatConfig | None = None,
    **options: Any,
) -> tuple[Vocab, list[Merge]]:
    """Train byte-level BPE on text files, documents (see :func:`count`) or saved piece counts and return
    ``(vocab, merges)``.

    ``pretokenizer`` (default ``gpt2``) splits text; piece counts are trained as they were made, and a
    ``pretokenizer`` or ``special_tokens`` other than theirs is refused.
    Options: ``min_frequency``, ``max_token_bytes``, ``max_words_per_token``,
    ``forbidden_substrings``, ``chunk_bytes``, ``errors`` ("strict" or "replace"), ``text_field``.
    ``compat="official"`` trains as HF ``tokenizers`` does (see :mod:`superbpe.core.compat`): line units,
    HF's tie-break and ids, the alphabet of the bytes seen. When the corpus runs out of pairs before
    ``vocab_size``, the smaller vocabulary is returned with a warning (``warnings`` and the log).
    ``callback(merges)`` is called every ``callback_every`` merges chosen; returning True stops training.
    Its ``merges`` is a read-only live view of the list as it grows, not a copy (copying at every call made
    long runs quadratic): to keep the merges so far, keep ``list(merges)``.
    """
    chosen_compat = get_compat(compat)
    special_tokens = special_token_list(special_tokens)
    SpecialSplitter(special_tokens)
    check_special_tokens(special_tokens)
    check_callback(callback, callback_every)
    seen_alphabet = chosen_compat.alphabet == "seen"
    vocab_size = check_vocab_size(vocab_size)
    # With the seen alphabet, the budget is known once the text is counted (see below).
    num_merges = 0 if seen_alphabet else merge_budget(vocab_size, special_tokens)
    read_options = _read_options(options)
    rules = training_rules(make_rules(**_rule_options(options)), chosen_compat)
    if isinstance(input_path, PieceCounts):
        _check_counts_made_alike(input_path, pretokenizer, special_tokens, chosen_compat)
    pretokenizer = training_pretokenizer(get_pretokenizer(pretokenizer or "gpt2"), chosen_compat)
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
    if not result.stopped:
        warn_if_short("train_bpe", result.merges, num_merges, rules)
    if alphabet is not None:
        return hf_vocab(alphabet, result.merges, special_tokens), result.merges
    return build_vocab(result.merges, special_tokens), result.merges


def _check_counts_made_alike(
    counts: PieceCounts,
    pretokenizer: str | Pretokenizer | None,
    special_tokens: list[str],
    compat: CompatConfig,
) -> None:
    """Refuse a pre-tokenizer, special tokens or compat training units other than those ``counts`` were
    made with.

    Why: counts are text already split, so training on them cannot apply another pattern, cut at other
    specials or split the text into lines; each was ignored without a word (merges of the counts' pattern
    under the name given, a special token's text trained on as ordinary text, other merges than
    ``compat="official"`` makes of the corpus).
    """
    made = counts.meta.get("pretokenizer") or {}
    given = None if pretokenizer is None else get_pretokenizer(pretokenizer)
    if given is not None and made and given.pattern != made.get("pattern"):
        raise ConfigError(
            f"these counts were made with pretokenizer {made.get('name')}, not {given.name}: leave "
            "pretokenizer out, or count again with it"
        )
    units = compat.line_units
    if made and units is not None and bool(made.get("line_units")) != units:
        how = "each line apart" if units else "whole documents"
        raise ConfigError(
            f"compat {compat.name} trains on {how}, but these counts were made otherwise: count them with "
            "the same compat, superbpe.count(..., compat=...)"
        )
    counted = counts.meta.get("special_tokens")
    if counted is not None and set(counted) != set(special_tokens):
        raise ConfigError(
            f"these counts were cut at special tokens {counted}, not {special_tokens}: train with the "
            "same special tokens, or count again with these"
        )


def warn_if_short(caller: str, merges: Sequence[Merge], wanted: int, rules: MergeRules) -> None:
    """Warn when training made fewer tokens than asked: the vocabulary is smaller than ``vocab_size``,
    which a caller sizing an embedding table must know. Logged too where logging is set up (an
    unconfigured logger would print the same line a second time, beside the warning)."""
    made = len({left + right for left, right in merges})
    if made >= wanted:
        return
    why = "no pair of adjacent tokens is left in the corpus"
    if rules.min_frequency > 1:
        why += f" that occurs at least min_frequency={rules.min_frequency} times"
    if rules.restricts_tokens:
        why += " (of those the merge rules allow)"
    message = (
        f"{caller} made {made} of the {wanted} merges asked for, so the vocabulary is {wanted - made} "
        f"tokens smaller than vocab_size: {why}; give more text or a smaller vocab_size"
    )
    if log.hasHandlers():
        log.warning(message)
    warnings.warn(message, UserWarning, stacklevel=caller_stacklevel())


def train_superbpe(
    input_path: InputSpec | DocumentStream,
    vocab_size: int,
    transition: int | float = 0.8,
    special_tokens: Sequence[str] = (),
    *,
    pretokenizer: str | Pretokenizer = "superbpe-stage1",
    stage2_pretokenizer: str | Pretokenizer = "superbpe",
    max_words_per_token: int | None = 4,
    forbidden_substrings: Iterable[str | bytes] = (": ",),
    engine: str | Engine = "auto",
    workers: int | None = None,
    callback: MergeCallback | None = None,
    callback_every: int = 1000,
    compat: str | CompatConfig | None = None,
    **options: Any,
) -> tuple[Vocab, list[Merge]]:
    """Train a SuperBPE tokenizer (Liu et al. 2025) and return ``(vocab, merges)``, the merges that
    ``superbpe-train schedule=superbpe`` makes with the same settings.

    Stage 1 is BPE with ``pretokenizer`` (words; the official recipe's pattern by default) up to
    ``transition`` merges (an int, or a fraction in (0, 1) of all merges); stage 2 replays them, counts
    with ``stage2_pretokenizer`` (whole lines, so tokens may span words) and merges up to ``vocab_size``
    under ``max_words_per_token`` and ``forbidden_substrings``. ``input_path`` is files or documents (see
    :func:`count`): a stream is read once, counting both patterns as it goes. Other options, as for
    :func:`train_bpe`: ``min_frequency`` and ``max_token_bytes`` (both stages), ``chunk_bytes``,
    ``errors``, ``text_field``; ``engine``, ``workers``, ``compat`` and ``callback`` (a live view of the
    merges: keep ``list(merges)``) likewise. Each stage calls ``callback`` every ``callback_every`` merges it
    chooses, counted from its start: stage 2's calls come at ``transition + callback_every``,
    ``transition + 2 * callback_every``, ...

    Encode with the stage-2 pattern: ``Tokenizer(vocab, merges, special_tokens,
    pretokenizer=stage2_pretokenizer)``. A built-in ``stage2_pretokenizer`` that splits text into words
    (``gpt2``, ...) is refused: stage 2 would make no superwords.
    """
    if isinstance(input_path, PieceCounts):
        raise ConfigError(
            "train_superbpe needs the corpus (files or documents), not piece counts: each stage counts "
            "it with its own pattern (train_bpe trains on counts)"
        )
    chosen_compat = get_compat(compat)
    special_tokens = special_token_list(special_tokens)
    SpecialSplitter(special_tokens)
    check_special_tokens(special_tokens)
    check_callback(callback, callback_every)
    seen_alphabet = chosen_compat.alphabet == "seen"
    if seen_alphabet:
        total = most_seen_merges(vocab_size, special_tokens)
    else:
        total = merge_budget(vocab_size, special_tokens)
    stage1_end = _transition_end(transition, total, seen_alphabet)
    read_options = _read_options(options)
    shared = _rule_options(options, "train_superbpe")  # both stages: min_frequency, max_token_bytes
    rules1 = training_rules(make_rules(**shared), chosen_compat)
    words = {"max_words_per_token": max_words_per_token, "forbidden_substrings": forbidden_substrings}
    rules2 = training_rules(make_rules(**shared, **words), chosen_compat)
    pre1 = training_pretokenizer(get_pretokenizer(pretokenizer), chosen_compat)
    if isinstance(stage2_pretokenizer, str) and splits_into_words(stage2_pretokenizer):
        raise ConfigError(
            f"stage2_pretokenizer={stage2_pretokenizer!r} splits text into words, so stage 2 would make no "
            "superwords; it takes a pattern whose pieces cross words: 'superbpe' or 'superbpe-paper'"
        )
    pre2 = training_pretokenizer(get_pretokenizer(stage2_pretokenizer), chosen_compat)
    chosen = get_engine(engine, [pre1, pre2])
    counts1, counts2 = _count_stages(chosen, input_path, [pre1, pre2], special_tokens, workers, read_options)
    stage2_end = total
    if seen_alphabet:  # the bytes seen take the first ids; the merges left depend on them (as in runs)
        merge_budget(vocab_size, special_tokens, alphabet_order(counts1.bytes_seen()), stage1_end + 1)
        alphabet = alphabet_order(counts2.bytes_seen())
        stage2_end = merge_budget(vocab_size, special_tokens, alphabet, stage1_end + 1)
    train = {"callback": callback, "callback_every": callback_every, "consume_counts": True}
    stage1 = chosen.train(counts1, stage1_end, rules=rules1, **train)
    merges = list(stage1.merges)
    if not stage1.stopped:
        stage2 = chosen.train(counts2, stage2_end, rules=rules2, replay=merges, **train)
        merges = list(stage2.merges)
        if not stage2.stopped:
            warn_if_short("train_superbpe", merges, stage2_end, rules2)
    if seen_alphabet:
        return hf_vocab(alphabet, merges, special_tokens), merges
    return build_vocab(merges, special_tokens), merges


def _transition_end(transition: int | float, total: int, seen_alphabet: bool) -> int:
    """Stage 1's last merge: an int is a merge count, a float in (0, 1) a fraction of ``total``. numpy's
    integers and floats (a sweep's ``np.arange``) count as the Python numbers they equal."""
    if isinstance(transition, bool) or not isinstance(transition, numbers.Real):
        raise ConfigError(
            f"transition must be a merge count (int) or a fraction in (0, 1), not {transition!r}"
        )
    transition = int(transition) if isinstance(transition, numbers.Integral) else float(transition)
    if isinstance(transition, float):
        if seen_alphabet:
            raise ConfigError(
                f"transition {transition} is a fraction, but with the seen alphabet (compat official) the "
                "number of merges is known only once the text is counted; give a merge count"
            )
        if not 0.0 < transition < 1.0:
            raise ConfigError(
                f"transition {transition} is a fraction and must be in (0, 1); use an int for a merge count"
            )
        end = round(transition * total)
    else:
        end = transition
    if not 1 <= end < total:
        # A fraction is named with the merge count it gives: "transition 0" alone reads as a value
        # the caller never wrote.
        given = f"transition {transition}" + (f" gives {end} merges, but" if end != transition else ":")
        raise ConfigError(
            f"{given} stage 1 needs at least 1 merge and stage 2 the rest of the {total} merges vocab_size "
            "leaves (at least 1): give a transition in that range or a larger vocab_size"
        )
    if transition == 1 and isinstance(transition, int):  # read as "all of them", it trains superwords only
        warnings.warn(
            "transition 1 is a merge count: stage 1 makes 1 merge and stage 2 all the rest (a fraction of "
            "all merges is a float in (0, 1); plain BPE is train_bpe)",
            UserWarning,
            stacklevel=caller_stacklevel(),
        )
    return end


def _count_stages(
    engine: Engine,
    inputs: InputSpec | DocumentStream,
    pretokenizers: Sequence[Pretokenizer],
    special_tokens: Sequence[str],
    workers: int | None,
    read_options: dict[str, Any],
) -> list[PieceCounts]:
    """The corpus counted with each stage's pattern: files once per pattern, a stream in one pass."""
    if is_document_stream(inputs):
        stream = engine.count_documents
        return list(stream(inputs, pretokenizers, special_tokens, workers=workers, **read_options))
    # Each stage's trainer takes its counts over and frees them, so the counts may leave pieces in
    # the files (see `Engine.count`: only long, mostly distinct ones, a stage 2's lines of web text).
    return [
        engine.count(inputs, p, special_tokens, workers=workers, borrow_files=True, **read_options)
        for p in pretokenizers
    ]


def _read_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options that say how the corpus is read, taken out of ``options``, ``chunk_bytes`` checked."""
    read = {k: options.pop(k) for k in ("chunk_bytes", "errors", "text_field") if k in options}
    if "chunk_bytes" in read:
        read["chunk_bytes"] = whole_number(read["chunk_bytes"], "chunk_bytes")
    return read


def _rule_options(options: dict[str, Any], caller: str = "train_bpe") -> dict[str, Any]:
    known = {"min_frequency", "max_token_bytes", "max_words_per_token", "forbidden_substrings"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown {caller} option(s): {', '.join(unknown)}")
    return options
