"""Differential fuzzing of the native engine: random Unicode text, random piece counts, random merges.

Each property compares Rust with an independent implementation (the ``regex`` module for pieces, the
python engine for counts, merges and ids). CI runs a small number of examples; set
``SUPERBPE_FUZZ_EXAMPLES=20000`` (say) to run a long session locally.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superbpe.core.counts import PieceCounts
from superbpe.core.pretokenize import PATTERNS, get_pretokenizer
from superbpe.core.rules import MergeRules
from superbpe.core.vocab import build_vocab
from superbpe.engines import native as native_engine
from superbpe.engines.python import PythonEngine

pytestmark = pytest.mark.skipif(
    not native_engine.available(), reason="superbpe._native is not built (run `pip install -e .`)"
)

EXAMPLES = int(os.environ.get("SUPERBPE_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Characters where the patterns' alternatives disagree or backtrack: every class the scanners know
# (Lu/Ll/Lt/Lm/Lo/M/N/whitespace), apostrophe contractions and the case-folding LONG S, "/" and
# CR/LF mixes, plus emoji and format characters that are in no class.
TRICKY = (
    "aZ09 \t\n\r\x0b\x0c'sStTdDmMlLrReEvV/!.,-_()\u017f\u0130\u01c5\u02b0\u4e2d\u0301\u0663\u00bd\u2163"
    "\u3000\u0085\u00a0\u2028\u2029\u1680\U0001f600\u200d\ufe0f\u00e9\u0410\u0439\u05d0\u0915\u093f"
    "\u0e01\u0e31\uac00\u2000\u205f\u00ad\x1c\x00\ufffd\U0001d400\U00010400\u16ee\u0488"
)
any_char = st.characters(exclude_categories=("Cs",))
texts = st.text(alphabet=st.one_of(st.sampled_from(TRICKY), any_char), max_size=40)


@pytest.mark.parametrize("name", list(PATTERNS))
@FUZZ
@given(text=texts, line_units=st.booleans())
def test_scanner_matches_regex(name: str, text: str, line_units: bool) -> None:
    pre = get_pretokenizer(name, line_units=line_units)
    assert native_engine._native.pretokenize(pre.pattern, line_units, text) == pre.split(text)


# Runs of ASCII letters, digits, punctuation and whitespace (what the scanners' ASCII fast paths take
# a byte at a time) that end in, or are continued by, characters of the same class beyond ASCII.
FRAGMENTS = ["abc", "Zq", "'s", "'", " ", "  ", "\t", "\n", "\r\n", "12", "345", "!!", ".", "(", "é",
             "\u00a0", "\u3000", "\u4e2d", "\u0663", "\u0301", "\u017f", "\U0001f600", "É", "\u2028"]
RUNS = st.lists(st.sampled_from(FRAGMENTS), max_size=30).map("".join)


@pytest.mark.parametrize("name", list(PATTERNS))
@FUZZ
@given(text=RUNS, line_units=st.booleans())
def test_scanner_ascii_runs_meet_unicode(name: str, text: str, line_units: bool) -> None:
    pre = get_pretokenizer(name, line_units=line_units)
    assert native_engine._native.pretokenize(pre.pattern, line_units, text) == pre.split(text)


# Long texts, mostly plain ASCII code and prose: what the gpt2 scanner takes 64 bytes at a time.
LONG = st.lists(
    st.sampled_from(FRAGMENTS + ["word", " word", " Word", "    ", "\n\t\t", "();", "0x1f", " = ", "\n\n"]),
    min_size=20,
    max_size=150,
).map("".join)


@pytest.mark.parametrize("name", list(PATTERNS))
@FUZZ
@given(text=LONG)
def test_scanner_long_texts(name: str, text: str) -> None:
    pre = get_pretokenizer(name, line_units=False)
    assert native_engine._native.pretokenize(pre.pattern, False, text) == pre.split(text)


@FUZZ
@given(
    body=st.lists(st.sampled_from(["ab", "a b", "\n", "  ", "<s>", "x1", "\n\n", " .\n/", "é"]), max_size=60),
    chunk_bytes=st.integers(1, 64),
    name=st.sampled_from(list(PATTERNS)),
)
def test_counts_never_depend_on_chunking(tmp_path: Path,
    body: list[str], chunk_bytes: int, name: str
) -> None:
    path = tmp_path / "c.txt"
    path.write_text("".join(body), encoding="utf-8")
    if path.stat().st_size == 0:
        return
    pre = get_pretokenizer(name)
    native = native_engine.NativeEngine()
    whole = native.count(path, pre, ["<s>"], workers=1, chunk_bytes=1 << 20).to_dict()
    assert native.count(path, pre, ["<s>"], workers=2, chunk_bytes=chunk_bytes).to_dict() == whole
    expected: dict[bytes, int] = {}
    for segment in "".join(body).split("<s>"):
        for piece in pre.split(segment):
            expected[piece.encode()] = expected.get(piece.encode(), 0) + 1
    assert whole == expected


piece_counts = st.dictionaries(
    st.binary(min_size=1, max_size=12).filter(lambda b: b.count(b"a") + b.count(b" ") > 0)
    | st.text(alphabet="ab c", min_size=1, max_size=12).map(str.encode),
    st.integers(1, 50),
    max_size=25,
)
rules = st.builds(
    MergeRules,
    min_frequency=st.integers(1, 4),
    max_token_bytes=st.none() | st.integers(2, 6),
    max_words_per_token=st.none() | st.integers(1, 2),
    forbidden_substrings=st.sampled_from([(), (b"ba",), (b" c", b"aa")]),
)


@FUZZ
@given(counts=piece_counts, num_merges=st.integers(0, 40), rules=rules, replay_len=st.integers(0, 5))
def test_merges_match_python_engine(
    counts: dict[bytes, int], num_merges: int, rules: MergeRules, replay_len: int
) -> None:
    python = PythonEngine()
    native = native_engine.NativeEngine()
    table = PieceCounts(counts)
    first = python.train(table, num_merges)
    replay = first.merges[: min(replay_len, num_merges)]
    expected = python.train(table, num_merges, rules=rules, replay=replay)
    assert native.train(table, num_merges, rules=rules, replay=replay) == expected


line_counts = st.dictionaries(
    st.text(alphabet="ab c.", min_size=1, max_size=40).map(str.encode), st.integers(1, 50), max_size=25
)


@FUZZ
@given(
    source=piece_counts | line_counts,
    counts=line_counts,
    extra=st.integers(0, 20),
    replay_len=st.integers(0, 30),
)
def test_replay_of_foreign_merges_matches_python_engine(
    source: dict[bytes, int], counts: dict[bytes, int], extra: int, replay_len: int
) -> None:
    """Merges learned on other pieces (as SuperBPE stage 2 replays stage 1's): the native engine cuts
    pieces where no replayed merge can join two bytes and replays the parts through a cache."""
    python = PythonEngine()
    replay = python.train(PieceCounts(source), replay_len).merges
    table = PieceCounts(counts)
    expected = python.train(table, len(replay) + extra, replay=replay)
    assert native_engine.NativeEngine().train(table, len(replay) + extra, replay=replay) == expected


@FUZZ
@given(
    corpus=st.text(alphabet="ab c\n.1", min_size=1, max_size=300),
    text=texts,
    name=st.sampled_from(list(PATTERNS)),
)
def test_ids_match_python_encoder(corpus: str, text: str, name: str) -> None:
    pre = get_pretokenizer(name)
    counts = PieceCounts({piece.encode(): 1 for piece in pre.split(corpus)})
    merges = PythonEngine().train(counts, 60).merges
    vocab = {token: i for i, token in build_vocab(merges).items()}
    ours = native_engine.NativeEngine().encoder(vocab, merges, pre)
    theirs = PythonEngine().encoder(vocab, merges, pre)
    sample = corpus + text
    assert ours.encode_ordinary(sample) == theirs.encode_ordinary(sample)
