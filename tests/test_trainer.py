"""Tests for the python engine's trainer (superbpe/trainer.py).

The incremental trainer is checked against a brute-force trainer that recounts every pair before every
merge: simple enough to be obviously right, and too slow for anything but small corpora.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superbpe.core.counts import PieceCounts
from superbpe.core.errors import SuperBPEError
from superbpe.core.rules import MergeRules, TrainResult, count_words
from superbpe.engines.python_count import count_pieces
from superbpe.engines.python_trainer import MAX_MERGES, train_merges

EOT = "<|endoftext|>"

Merge = tuple[bytes, bytes]


# --- brute-force reference -------------------------------------------------------------------------------


def merge_word(word: list[bytes], pair: Merge) -> list[bytes]:
    """Merge non-overlapping occurrences of ``pair`` left to right."""
    out: list[bytes] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def brute_force(
    counts: Mapping[bytes, int],
    num_merges: int,
    rules: MergeRules = MergeRules(),  # noqa: B008 -- frozen
    replay: Sequence[Merge] = (),
) -> list[Merge]:
    """Recount every pair before every merge; choose (count, left, right) maximal among allowed new tokens."""
    words = [([bytes([b]) for b in piece], n) for piece, n in counts.items() if n > 0]
    vocab = {bytes([i]) for i in range(256)}
    merges: list[Merge] = []

    def apply(pair: Merge) -> None:
        words[:] = [(merge_word(word, pair), n) for word, n in words]
        vocab.add(pair[0] + pair[1])
        merges.append(pair)

    for pair in replay:
        apply(pair)
    while len(merges) < num_merges:
        pairs: Counter[Merge] = Counter()
        for word, n in words:
            for pair in zip(word, word[1:], strict=False):
                pairs[pair] += n
        candidates = [
            (n, pair)
            for pair, n in pairs.items()
            if pair[0] + pair[1] not in vocab and rules.allows(pair[0] + pair[1])
        ]
        if not candidates:
            break
        n, pair = max(candidates)
        if n < rules.min_frequency:
            break
        apply(pair)
    return merges


# --- reference corpus ----------------------------------------------------------------------------------


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for every byte: printable Latin-1 maps to itself, the rest to 256 + n."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    table = {b: chr(b) for b in [*printable, *range(ord("®"), ord("ÿ") + 1)]}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def gpt2_decode(text: str) -> bytes:
    to_byte = {ch: b for b, ch in gpt2_bytes_to_unicode().items()}
    return bytes(to_byte[ch] for ch in text)


def count_corpus(path: Path) -> PieceCounts:
    """GPT-2 pre-tokenization of a text file; the special token splits documents and is dropped."""
    return count_pieces(path, "gpt2", [EOT], workers=1)


def test_bytes_to_unicode_is_a_bijection_onto_printable_chars() -> None:
    table = gpt2_bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"


def test_reference_corpus_merges_and_vocab(shared_data: Path) -> None:
    counts = count_corpus(shared_data / "corpus.en")
    result = train_merges(counts, 500 - 256 - 1)
    lines = (shared_data / "train-bpe-reference-merges.txt").read_text(encoding="utf-8").splitlines()
    expected = [tuple(gpt2_decode(part) for part in line.split(" ")) for line in lines]
    assert result.merges == expected
    assert result.stopped is False
    reference_vocab = json.loads((shared_data / "train-bpe-reference-vocab.json").read_text(encoding="utf-8"))
    ours = [bytes([i]) for i in range(256)] + [a + b for a, b in result.merges] + [EOT.encode()]
    assert len(ours) == len(set(ours)) == 500
    assert set(ours) == {gpt2_decode(token) for token in reference_vocab}


# --- against brute force -------------------------------------------------------------------------------

# A tiny alphabet with a space and ": " makes ties, overlaps ("aaaa", "abab") and every rule likely.
pieces = st.binary(min_size=1, max_size=10).map(lambda raw: bytes(b"ab :"[x % 4] for x in raw))
corpora = st.dictionaries(pieces, st.integers(min_value=1, max_value=6), max_size=12)
rules_strategy = st.builds(
    MergeRules,
    min_frequency=st.integers(min_value=1, max_value=4),
    max_token_bytes=st.none() | st.integers(min_value=2, max_value=6),
    max_words_per_token=st.none() | st.integers(min_value=1, max_value=2),
    forbidden_substrings=st.sampled_from([(), (b": ",), (b"aa", b"b:")]),
)
fast = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fast
@given(corpora, st.integers(min_value=0, max_value=40))
def test_matches_brute_force(counts: dict[bytes, int], num_merges: int) -> None:
    assert train_merges(counts, num_merges).merges == brute_force(counts, num_merges)


@fast
@given(corpora, st.integers(min_value=0, max_value=40), rules_strategy)
def test_matches_brute_force_with_rules(counts: dict[bytes, int], num_merges: int, rules: MergeRules) -> None:
    result = train_merges(counts, num_merges, rules=rules)
    assert result.merges == brute_force(counts, num_merges, rules)
    assert all(rules.allows(a + b) for a, b in result.merges)


@fast
@given(corpora, corpora, st.integers(min_value=0, max_value=10), st.integers(min_value=0, max_value=30))
def test_replay_matches_brute_force(
    earlier: dict[bytes, int], counts: dict[bytes, int], keep: int, extra: int
) -> None:
    """Replay merges learnt on another corpus (many of them absent here), then keep choosing."""
    replay = brute_force(earlier, keep)
    num_merges = len(replay) + extra
    result = train_merges(counts, num_merges, replay=replay)
    assert result.merges[: len(replay)] == replay
    assert result.merges == brute_force(counts, num_merges, replay=replay)


@fast
@given(
    st.lists(st.text(alphabet="ab :\n", min_size=20, max_size=120), min_size=1, max_size=4),
    st.integers(min_value=1, max_value=60),
)
def test_long_pieces_match_brute_force(lines: list[str], num_merges: int) -> None:
    """SuperBPE stage 2 trains on whole lines: few pieces, many symbols, many occurrences per piece."""
    counts = dict(Counter(line.encode() for line in lines))
    assert train_merges(counts, num_merges).merges == brute_force(counts, num_merges)


# --- stop and continue ---------------------------------------------------------------------------------


def stop_after(calls: int) -> tuple[list[list[Merge]], object]:
    seen: list[list[Merge]] = []

    def callback(merges: Sequence[Merge]) -> bool:
        seen.append(list(merges))
        return len(seen) == calls

    return seen, callback


@pytest.mark.parametrize(
    "rules", [MergeRules(), MergeRules(max_token_bytes=5, forbidden_substrings=(b"e ",))]
)
@pytest.mark.parametrize("every,calls", [(1, 1), (7, 1), (25, 3), (100, 2)])
def test_stop_and_continue_equals_uninterrupted(
    rules: MergeRules, every: int, calls: int, sample_texts: Path
) -> None:
    counts = count_corpus(sample_texts / "tinystories_sample.txt")
    full = train_merges(counts, 300, rules=rules)
    seen, callback = stop_after(calls)
    first = train_merges(counts, 300, rules=rules, callback=callback, callback_every=every)
    assert first.stopped is True
    assert len(first.merges) == every * calls
    assert seen[-1] == first.merges == full.merges[: every * calls]
    rest = train_merges(counts, 300, rules=rules, replay=first.merges)
    assert rest.stopped is False
    assert rest.merges == full.merges


def test_callback_sees_every_chosen_merges_but_not_replayed_ones() -> None:
    counts = {b"abcdefgh": 3, b"hgfedcba": 2}
    replay = train_merges(counts, 2).merges
    seen: list[list[Merge]] = []
    result = train_merges(counts, 7, replay=replay, callback=lambda m: seen.append(list(m)), callback_every=2)
    assert result.stopped is False
    assert [len(merges) for merges in seen] == [4, 6]
    assert seen[-1] == result.merges[:6]


# --- rules ---------------------------------------------------------------------------------------------


def test_count_words_counts_runs_of_non_spaces() -> None:
    tokens = (b"", b"  ", b"a", b" a", b"a b", b" a  b ", b"a\nb")
    assert [count_words(t) for t in tokens] == [0, 0, 1, 1, 2, 2, 1]


def test_rules_allows() -> None:
    rules = MergeRules(max_token_bytes=6, max_words_per_token=2, forbidden_substrings=[b": "])
    assert rules.forbidden_substrings == (b": ",)
    assert rules.allows(b" ab cd")
    assert not rules.allows(b"abcdefg")
    assert not rules.allows(b"a b c")
    assert not rules.allows(b"a: b")
    assert MergeRules().allows(b"anything at all: yes")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_frequency": -1},
        {"max_token_bytes": 0},
        {"max_words_per_token": 0},
        {"forbidden_substrings": (b"",)},
    ],
)
def test_bad_rules_are_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(SuperBPEError):
        MergeRules(**kwargs)


def test_rejected_pair_costs_no_id() -> None:
    counts = {b"ab": 10, b"cd": 5}
    result = train_merges(counts, 5, rules=MergeRules(forbidden_substrings=(b"ab",)))
    assert result.merges == [(b"c", b"d")]


def test_min_frequency_stops_at_the_best_allowed_pair() -> None:
    counts = {b"ab": 10, b"cd": 3, b"ef": 2}
    rules = MergeRules(min_frequency=3, forbidden_substrings=(b"ab",))
    assert train_merges(counts, 10, rules=rules).merges == [(b"c", b"d")]


def test_existing_token_is_skipped_for_good() -> None:
    # "abc" is made from (ab, c) first; later (a, bc) would make "abc" again and must be skipped.
    counts = {b"abc": 10, b"bc": 4, b"xbc": 4}
    merges = train_merges(counts, 10).merges
    assert merges == [(b"b", b"c"), (b"a", b"bc"), (b"x", b"bc")]
    counts = {b"abc": 10, b"ab": 6, b"bcd": 7}
    merges = train_merges(counts, 10).merges
    tokens = [a + b for a, b in merges]
    assert len(tokens) == len(set(tokens))
    assert merges == brute_force(counts, 10)


# --- edge cases ----------------------------------------------------------------------------------------


def test_empty_and_trivial_inputs() -> None:
    assert train_merges({}, 10) == TrainResult(merges=[], stopped=False)
    assert train_merges({b"a": 5, b"b": 1, b"": 3}, 10).merges == []
    assert train_merges({b"abc": 5}, 0).merges == []
    assert train_merges({b"abc": 0}, 5).merges == []
    assert train_merges({b"abcd": 1}, 10).merges == [(b"c", b"d"), (b"b", b"cd"), (b"a", b"bcd")]


def test_tie_break_prefers_greatest_bytes() -> None:
    assert train_merges({b"ab": 2, b"ba": 2}, 1).merges == [(b"b", b"a")]
    # Left bytes decide before right bytes, and a longer token beats its prefix.
    assert train_merges({b"az": 1, b"ba": 1}, 1).merges == [(b"b", b"a")]
    counts = {b"abc": 1, b"abx": 1, b"xab": 1}
    assert train_merges(counts, 2).merges == [(b"a", b"b"), (b"x", b"ab")]
    assert train_merges({b"\xffa": 1, b"\x00b": 1}, 1).merges == [(b"\xff", b"a")]
    assert train_merges({b"abb": 1, b"\x00": 1}, 3).merges == [(b"b", b"b"), (b"a", b"bb")]


def test_overlapping_occurrences() -> None:
    # "aaaa" holds (a, a) three times but merges into two tokens; "aaa" leaves one "a".
    assert train_merges({b"aaaa": 1}, 2).merges == [(b"a", b"a"), (b"aa", b"aa")]
    assert train_merges({b"aaa": 2, b"aab": 1}, 3).merges == brute_force({b"aaa": 2, b"aab": 1}, 3)
    assert train_merges({b"ababab": 1}, 3).merges == [(b"a", b"b"), (b"ab", b"ab"), (b"abab", b"ab")]
    counts = {b"abab": 3, b"aaaaa": 2, b"baba": 1}
    assert train_merges(counts, 8).merges == brute_force(counts, 8)


def test_counts_beyond_64_bits_do_not_overflow() -> None:
    big = 2**70
    assert train_merges({b"ab": big, b"cd": big - 1}, 2).merges == [(b"a", b"b"), (b"c", b"d")]


def test_replayed_merges_keep_their_ids_even_when_absent() -> None:
    replay = [(b"x", b"y"), (b"xy", b"z")]
    result = train_merges({b"abab": 2, b"ba": 1}, 4, replay=replay, rules=MergeRules(max_token_bytes=2))
    # Replay ignores rules (xyz is 3 bytes); chosen merges still follow them.
    assert result.merges == [(b"x", b"y"), (b"xy", b"z"), (b"a", b"b"), (b"b", b"a")]


@pytest.mark.parametrize(
    "replay,match",
    [
        ([(b"a", b"b"), (b"abc", b"d")], "replay merge 1"),
        ([(b"a", b"b"), (b"a", b"b")], "replay merge 1"),
        ([(b"a", "b")], "replay merge 0"),
    ],
)
def test_bad_replay_is_an_error(replay: list[Merge], match: str) -> None:
    with pytest.raises(SuperBPEError, match=match):
        train_merges({b"abcd": 1}, 5, replay=replay)


def test_bad_arguments_are_errors() -> None:
    with pytest.raises(SuperBPEError):
        train_merges({b"ab": 1}, 1, replay=[(b"a", b"b"), (b"ab", b"c")])
    with pytest.raises(SuperBPEError):
        train_merges({b"ab": 1}, -1)
    with pytest.raises(SuperBPEError, match="num_merges must be <="):
        train_merges({b"ab": 1}, MAX_MERGES + 1)
    with pytest.raises(SuperBPEError):
        train_merges({b"ab": 1}, 1, callback_every=0)
    with pytest.raises(SuperBPEError):
        train_merges({b"ab": -1}, 1)


def test_merges_so_far_is_a_read_only_view_that_iterates_like_the_list() -> None:
    from superbpe.core.rules import MergesSoFar

    merges = [(b"a", b"b"), (b"ab", b"c")]
    view = MergesSoFar(merges)
    assert list(view) == merges and view[-1] == (b"ab", b"c") and view[:1] == merges[:1]
    merges.append((b"x", b"y"))
    assert len(view) == 3 and list(view) == merges and (b"x", b"y") in view
    with pytest.raises(TypeError):
        view[0] = (b"q", b"r")  # type: ignore[index]
    assert not hasattr(view, "append")
