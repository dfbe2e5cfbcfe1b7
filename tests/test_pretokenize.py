"""Pre-tokenizers: every built-in pattern follows the isolated-split rule exactly."""

from __future__ import annotations

import pytest
import regex
from hypothesis import example, given, settings
from hypothesis import strategies as st

from superbpe.core.errors import ConfigError
from superbpe.core.pretokenize import (
    PATTERNS,
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


@pytest.mark.parametrize("bad", ["gtp2", "o200", "superbpe2"])
def test_unknown_pattern_name_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown pre-tokenizer '{bad}'"):
        get_pretokenizer(bad)


def test_invalid_custom_regex_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="invalid pre-tokenizer pattern"):
        get_pretokenizer("custom:(unclosed")
    with pytest.raises(ConfigError, match="non-empty pattern"):
        get_pretokenizer("custom")


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
