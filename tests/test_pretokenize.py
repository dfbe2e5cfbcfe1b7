"""Pre-tokenizers: every built-in pattern follows the isolated-split rule exactly."""

from __future__ import annotations

import pytest
import regex
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import superbpe.core.pretokenize as pretokenize_module
from superbpe.core.errors import ConfigError
from superbpe.core.pretokenize import (
    PATTERNS,
    STREAM_CUT_RULES,
    Pretokenizer,
    SpecialSplitter,
    get_pretokenizer,
    last_safe_cut,
    safe_cuts,
)


def reference_split(pattern: str, text: str, line_units: bool) -> list[str]:
    """The rule written plainly: matches and gaps, empties dropped; lines first if asked."""
    compiled = regex.compile(pattern)
    units = regex.findall(r"[^\n]*\n|[^\n]+", text) if line_units else [text]
    pieces: list[str] = []
    for unit in units:
        pos = 0
        for match in compiled.finditer(unit):
            pieces += [unit[pos : match.start()], match.group()]
            pos = match.end()
        pieces.append(unit[pos:])
    return [p for p in pieces if p]


UNICODE_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(list(" \t\n\r\x0b\x0c\u00a0\u2028\u3000'’sdtlmvre0123456789٣४:,.!?/-")),
    ),
    max_size=80,
)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_builtin_patterns_follow_isolated_split_on_multilingual(name: str, multilingual_text: str) -> None:
    pre = get_pretokenizer(name)
    text = multilingual_text[:300_000]
    pieces = pre.split(text)
    assert pieces == reference_split(PATTERNS[name], text, pre.line_units)
    assert "".join(pieces) == text


@pytest.mark.parametrize("name", sorted(PATTERNS))
@settings(max_examples=150, deadline=None)
@given(text=UNICODE_TEXT)
def test_builtin_patterns_follow_isolated_split_on_random_unicode(name: str, text: str) -> None:
    pre = get_pretokenizer(name)
    assert pre.split(text) == reference_split(PATTERNS[name], text, pre.line_units)


def test_custom_pattern_keeps_gaps_and_zero_width_matches_cut() -> None:
    pre = get_pretokenizer("custom:\\d+")
    assert pre.split("ab12cd3") == ["ab", "12", "cd", "3"]
    assert get_pretokenizer("custom:(?=b)").split("abab") == ["a", "ba", "b"]
    grouped = get_pretokenizer("custom", pattern="(a)(b)?")
    assert grouped.split("xaby") == ["x", "ab", "y"]


def test_superbpe_paper_groups_digits_from_the_right() -> None:
    pre = get_pretokenizer("superbpe-paper")
    assert pre.split("pay 12345 now: ok\nnext 7") == ["pay ", "12", "345", " now: ok\n", "next ", "7"]


def test_stage2_patterns_cut_at_line_ends_by_default() -> None:
    pre = get_pretokenizer("superbpe")
    assert pre.line_units
    assert pre.split("a b\n\nc d") == ["a b\n", "\n", "c d"]
    assert not get_pretokenizer("superbpe", line_units=False).line_units
    assert not get_pretokenizer("gpt2").line_units


def test_stage2_superbpe_pattern_keeps_words_together() -> None:
    assert get_pretokenizer("superbpe").split("the cat sat, and 2024 ok") == [
        "the cat sat, and ",
        "202",
        "4",
        " ok",
    ]


@pytest.mark.parametrize("bad", ["gtp2", "o200", "superbpe2", "GPT2", "O200k", "SuperBPE-stage1"])
def test_unknown_pattern_name_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown pre-tokenizer '{bad}'"):
        get_pretokenizer(bad)


def test_invalid_custom_regex_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="invalid pre-tokenizer pattern"):
        get_pretokenizer("custom:(unclosed")
    with pytest.raises(ConfigError, match="non-empty pattern"):
        get_pretokenizer("custom")


@pytest.mark.parametrize("pattern", [r"(?r)\w+|\s+", r"\w+(?r)", r"a(?r:b)"])
def test_a_pattern_that_searches_backwards_is_refused(pattern: str) -> None:
    """Its matches come last first: "ab cd" split into ["cd", " ", "ab"], and its ids decoded to "cd ab"."""
    with pytest.raises(ConfigError, match=r"searches backwards \(\(\?r\)\)"):
        get_pretokenizer(f"custom:{pattern}")


def test_spec_round_trip_and_pickle() -> None:
    import pickle

    pre = get_pretokenizer("o200k")
    assert Pretokenizer.from_spec(pre.spec()) == pre
    pre.split("warm the cache")
    assert pickle.loads(pickle.dumps(pre)).split("Hello World") == ["Hello", " World"]


def test_special_splitter_prefers_the_longest_token() -> None:
    eot = "<|endoftext|>"
    splitter = SpecialSplitter([eot, eot + eot])
    assert splitter.split(f"a{eot}{eot}b{eot}") == [
        ("a", False),
        (eot + eot, True),
        ("b", False),
        (eot, True),
    ]
    assert list(splitter.ordinary_segments(f"{eot}x{eot}{eot}y")) == ["x", "y"]


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("<|ab>x\u00e9")), max_size=30), many=st.booleans())
def test_occurs_in_agrees_with_split(text: str, many: bool) -> None:
    """The quick check ``Tokenizer.encode`` makes first: substring searches for a few specials, one
    regex search for many; either way true exactly when the split finds a special token."""
    specials = ["<|a|>", "<|ab|>", "x>"] + ([f"<{i}>" for i in range(10)] if many else [])
    splitter = SpecialSplitter(specials)
    assert splitter.occurs_in(text) == any(is_special for _, is_special in splitter.split(text))
    assert not SpecialSplitter([]).occurs_in(text)


def test_empty_special_token_is_rejected() -> None:
    with pytest.raises(ConfigError, match="non-empty"):
        SpecialSplitter(["<|endoftext|>", ""])


DENSE_TEXT = st.text(alphabet=st.sampled_from(list("ab \n\n\r\t.,/'s1\u00a0\u3000")), max_size=40)


@pytest.mark.parametrize("name", sorted(PATTERNS))
@settings(max_examples=300, deadline=None)
@given(text=st.one_of(UNICODE_TEXT, DENSE_TEXT))
@example(text="a\n\nb\nc")
@example(text="a.\n/b")
def test_safe_cuts_never_change_the_pieces(name: str, text: str) -> None:
    pre = get_pretokenizer(name)
    cuts = [0, *safe_cuts(text), len(text)]
    joined = [piece for a, b in zip(cuts, cuts[1:], strict=False) for piece in pre.split(text[a:b])]
    assert joined == pre.split(text)
    last = last_safe_cut(text)
    assert last == (cuts[-2] if len(cuts) > 2 else 0)


# Characters where the stream-cut rules could go wrong: every kind of whitespace, marks, digits of other
# scripts, contractions, cased letters, the punctuation the patterns treat apart ("/" after a newline).
CUT_TEXT = st.text(
    alphabet=st.sampled_from(
        list("aB \n\n\r\t./'sLlVEd1\u0085\u2028\u00a0\u0301\u3000\u00b2\u2167\u0663!?-_,")
    ),
    max_size=60,
)


@pytest.mark.parametrize("line_units", [False, True])
@pytest.mark.parametrize("name", sorted(PATTERNS))
@settings(max_examples=400, deadline=None)
@given(text=st.one_of(CUT_TEXT, UNICODE_TEXT), data=st.data())
@example(text=" a \n b", data=None)
@example(text="a\n\n b", data=None)
def test_stream_cuts_never_change_the_pieces(
    name: str, line_units: bool, text: str, data: st.DataObject
) -> None:
    """Every position a rule finds, and the cut found in any prefix, splits the whole text's pieces."""
    pre = get_pretokenizer(name, line_units=line_units)
    whole = pre.split(text)
    for match in regex.finditer(STREAM_CUT_RULES[name], text):
        cut = match.start()
        assert pre.split(text[:cut]) + pre.split(text[cut:]) == whole, cut
    end = data.draw(st.integers(0, len(text))) if data is not None else len(text)
    cut = pre.last_stream_cut(text[:end])
    assert 0 <= cut <= end
    assert pre.split(text[:cut]) + pre.split(text[cut:]) == whole


WIKI_LINES = " = Title = \n \n The 2nd line , with words . \n \n" * 20


@pytest.mark.parametrize(
    ("name", "line_units"), [(name, None) for name in sorted(PATTERNS)] + [("superbpe", False)]
)
def test_stream_cuts_come_often_on_wikitext_lines(name: str, line_units: bool | None) -> None:
    """Lines ending in " \n" (as WikiText's do) still give a cut within a line of the end of any prefix."""
    pre = get_pretokenizer(name, line_units=line_units)
    assert max(end - pre.last_stream_cut(WIKI_LINES[:end]) for end in range(100, len(WIKI_LINES))) < 50


def test_paper_pattern_without_line_units_cuts_only_after_digits() -> None:
    """Its gaps hold everything but digit groups, so only the end of a digit run is a cut."""
    pre = get_pretokenizer("superbpe-paper", line_units=False)
    assert pre.last_stream_cut(WIKI_LINES) == WIKI_LINES.rindex("2nd") + 1


CUSTOM_PATTERNS = [
    r"\w+|[^\w\s]+|\s+(?!\S)|\s+",
    r"(?<=\s)\w+|\w+|\s|[^\w\s]",  # a lookbehind at the start of text behaves differently
    r"^\w+|\w+|\W",  # so does an anchor
    r"\d{1,3}(?=(?:\d{3})*\b)",  # matches only digits: long gap pieces
    r"(?<=x)yy|\w|\s|\W",  # a cut between "x" and "yy" would split "yy" on the right: refused
]
# Words of at most five characters, each followed by one whitespace character: no run (and so no attempt of
# the patterns above) is longer than six characters.
_words = st.lists(
    st.tuples(
        st.sampled_from(["ab", "c", "1", "1234", ".", "!?", "\u00e9t\u00e9", "a.b", "xyy"]),
        st.sampled_from([" ", "\n", "\t"]),
    ),
    max_size=40,
).map(lambda words: "".join(word + space for word, space in words))


@pytest.mark.parametrize("pattern", CUSTOM_PATTERNS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_words, data=st.data())
def test_custom_pattern_cuts_hold_within_their_reach(
    pattern: str, text: str, data: st.DataObject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a reach of 6 characters (texts whose attempts read no further), a custom cut never changes
    the pieces, whatever follows the prefix it was found in."""
    monkeypatch.setattr(pretokenize_module, "CUSTOM_REACH", 6)
    pre = get_pretokenizer(f"custom:{pattern}")
    end = data.draw(st.integers(0, len(text)))
    cut = pre.last_stream_cut(text[:end])
    assert 0 <= cut <= max(0, end - 6)
    assert pre.split(text[:cut]) + pre.split(text[cut:]) == pre.split(text)


def test_custom_cuts_are_checked_against_where_text_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookbehind sees nothing before a cut: a cut that would change the pieces after it is not made."""
    monkeypatch.setattr(pretokenize_module, "CUSTOM_REACH", 3)
    pre = get_pretokenizer(r"custom:(?<=x)yy|\w|\s")
    cuts = []
    for end in range(10, 40):
        text = ("xyy " * 10)[:end]
        cuts.append(pre.last_stream_cut(text))
        assert pre.split(text[: cuts[-1]]) + pre.split(text[cuts[-1] :] + "xyy") == pre.split(text + "xyy")
    assert any(cuts) and all(cut % 4 != 1 for cut in cuts)  # cuts, but never between "x" and "yy"


def test_custom_pattern_cuts_keep_twice_the_reach() -> None:
    pre = get_pretokenizer(r"custom:\w+|\s+|[^\w\s]+")
    text = "word, " * 4000
    cut = pre.last_stream_cut(text)
    undecided = len(text) - cut  # about twice the reach: its last pieces and what may still change them
    assert abs(undecided - 2 * pretokenize_module.CUSTOM_REACH) < 10
    assert pre.split(text[:cut]) + pre.split(text[cut:]) == pre.split(text)
    assert pre.last_stream_cut(text[: 2 * pretokenize_module.CUSTOM_REACH]) == 0  # too short to decide
