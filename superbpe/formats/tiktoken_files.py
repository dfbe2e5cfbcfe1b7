"""tiktoken's files: ``tokenizer.tiktoken`` (base64 token + rank lines) and ``tiktoken.json`` (name,
pattern, special tokens)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence

from superbpe.core.compat import CompatConfig
from superbpe.core.errors import ConfigError
from superbpe.core.pretokenize import PATTERNS, SPLIT_PROBE, Pretokenizer, get_pretokenizer, split_difference
from superbpe.core.types import Merge
from superbpe.formats.json_files import json_text

TIKTOKEN_FILE = "tokenizer.tiktoken"
TIKTOKEN_META_FILE = "tiktoken.json"

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


def check_compat_for_tiktoken(compat: CompatConfig) -> None:
    """tiktoken encodes with every byte a token, each token once, ranked in the order merges make them,
    and a piece that is a token taken whole. A preset that trains or encodes otherwise could not be
    exported with the same ids: refused before training, where the export would fail after it."""
    reasons = []
    if compat.alphabet == "seen":
        reasons.append("alphabet=seen (bytes the text lacks get no token)")
    if compat.duplicates == "merge":
        reasons.append("duplicates=merge (a merge may make a token that exists)")
    if not compat.whole_pieces:
        reasons.append("whole_pieces=false (tiktoken takes a piece that is a token whole)")
    if reasons:
        raise ConfigError(
            f"export.tiktoken=true cannot give the same ids under compat={compat.name}: {'; '.join(reasons)}"
        )


def tiktoken_split_problem(pretokenizer: Pretokenizer) -> str | None:
    """How tiktoken (whose regex engine is fancy-regex) would read a user's pattern otherwise than ours: not
    at all, or with other pieces of :data:`SPLIT_PROBE`; None when alike, for a built-in pattern (tested
    alike), or without ``tiktoken`` installed. The probe's pieces are made tokens of their own, so tiktoken
    encodes each piece it cuts as one token exactly when its pieces are ours."""
    if PATTERNS.get(pretokenizer.name) == pretokenizer.pattern:
        return None
    try:
        import tiktoken  # optional: the check is only worth its import where the library is there
    except ImportError:
        return None
    ranks = {bytes([i]): i for i in range(256)}
    for piece in pretokenizer.split(SPLIT_PROBE):
        ranks.setdefault(piece.encode("utf-8"), len(ranks))
    try:
        encoding = tiktoken.Encoding("probe", pat_str=tiktoken_pattern(pretokenizer), mergeable_ranks=ranks,
                                     special_tokens={})  # fmt: skip
        ids = encoding.encode(SPLIT_PROBE, disallowed_special=())
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever it raises, the pattern does not work there
        return f"tiktoken cannot use the pattern ({' '.join(str(exc).split())})"
    by_id = {rank: token for token, rank in ranks.items()}
    return split_difference(pretokenizer, [by_id[i] for i in ids], "tiktoken")


def tiktoken_ranks(
    vocab: Mapping[int, bytes], special_tokens: Sequence[str], merges: Sequence[Merge]
) -> dict[bytes, int]:
    """Ordinary tokens -> id. tiktoken merges the pair whose joined bytes have the lowest rank, so the ids
    must grow in merge order (they do for trained and GPT-2 vocabs); specials are passed separately, and
    a special that merges also make (``" the"``) is a rank as well, or the merges could not reach it."""
    made = {left + right for left, right in merges} if special_tokens else set()
    specials = {special.encode("utf-8") for special in special_tokens} - made
    return {token: token_id for token_id, token in vocab.items() if token not in specials}


def check_specials_for_tiktoken(special_tokens: Sequence[str]) -> None:
    """Refuse special tokens one of which begins another (``<|a|>`` and ``<|a|><|b|>``): where both start,
    this tokenizer takes the longer, while tiktoken tries its specials in no set order and may take the
    shorter, which gives other ids."""
    ordered = sorted(special_tokens)
    for shorter, longer in zip(ordered, ordered[1:], strict=False):
        if longer.startswith(shorter):
            raise ConfigError(
                f"special token {shorter!r} begins {longer!r}: where both start this tokenizer takes the "
                "longer, tiktoken may take the shorter, so tiktoken files would not give the same ids"
            )


def check_ranks_follow_merges(ranks: Mapping[bytes, int], merges: Sequence[Merge]) -> None:
    last = 255
    for left, right in merges:
        rank = ranks.get(left + right)
        if rank is None or rank <= last:
            raise ConfigError(
                "token ids do not grow in merge order (as under compat=official, whose ids follow HF's "
                "layout): tiktoken ranks are ids in merge order, so tiktoken would encode differently"
            )
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

    by_bytes = {token: token_id for token_id, token in vocab.items()}
    ranks = tiktoken_ranks(vocab, special_tokens, merges)
    check_ranks_follow_merges(ranks, merges)
    lines = "".join(f"{base64.b64encode(token).decode('ascii')} {rank}\n"
                    for token, rank in sorted(ranks.items(), key=lambda item: item[1]))
    meta = {
        "name": pretokenizer.name,
        "pat_str": tiktoken_pattern(pretokenizer),
        "special_tokens": {special: by_bytes[special.encode("utf-8")] for special in special_tokens},
        "ranks_file": TIKTOKEN_FILE,
    }
    return {TIKTOKEN_FILE: lines, TIKTOKEN_META_FILE: json_text(meta, indent=2)}
