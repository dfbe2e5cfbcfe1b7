"""Two-level encoding of SuperBPE pieces (docs/DESIGN.md "Encoding"): the same ids as one level and as HF.

The native encoder runs a SuperBPE tokenizer's stage-1 merges per cached word and then its superword
merges over the piece's tokens, where that is exact (``levels`` says which it chose). Random texts of
words, runs of spaces, punctuation, digits, newlines and non-ASCII characters are encoded on two levels,
on one (the reference: BPE of the whole piece), by the python engine and by HF ``tokenizers`` loading
the same files: with the released 200K tokenizer, with small SuperBPE tokenizers trained here under both
compat presets and both stage-2 patterns, and with crafted merges where two levels would be wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import regex
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import superbpe
from superbpe import Tokenizer
from superbpe.core.compat import encoding_pretokenizer, get_compat
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.pretokenize import PATTERNS, Pretokenizer, get_pretokenizer
from superbpe.core.types import Merge
from superbpe.engines import native as native_engine
from superbpe.engines.native import NativeEncoder
from superbpe.formats.gpt2 import MERGES_FILE, VOCAB_FILE

pytestmark = pytest.mark.skipif(
    not native_engine.available(), reason="superbpe._native is not built (run `pip install -e .`)"
)

EXAMPLES = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# What meets at a word boundary inside a stage-2 piece: words (camel case, whose stage-1 merges join
# what the stage-1 pattern splits), runs of spaces and newlines, single and repeated punctuation,
# digits, and non-ASCII letters, spaces and symbols.
WORDS = (
    "the", "of", "and", "in", "to", "a", "was", "is", "for", "on", "as", "with", "by", "he", "it",
    "McCarthy", "McLemore", "iPhone", "YouTube", "JavaScript", "lobster", "Homarus", "gammarus",
    "don't", "it's", "(the", "(born", "U.S.", "@-@", "<unk>", "Straße", "größer", "naïve", "café",
    "Привет", "мир", "中文", "文本", "東京", "ﬁnd", "x", "I",
)
GLUE = (
    " ", " ", " ", "  ", "   ", "\n", "\n\n", " \n", "\n ", "\t", " \t", "\u00a0", " \u00a0", "\u3000",
    ".", ",", " .", " ,", " . ", " , ", "; ", ": ", "...", " -- ", "'", '"', " (", ") ", "!", "?",
    "/", " / ", "=", " = ", "_", "\r\n", "",
)
fragment = st.one_of(
    st.sampled_from(WORDS).map(lambda w: " " + w),
    st.sampled_from(WORDS),
    st.sampled_from(GLUE),
    st.integers(0, 100_000).map(str),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=3),
)
texts = st.lists(fragment, max_size=40).map("".join)


def hf_from_files(directory: Path, pretokenizer: Pretokenizer) -> tokenizers.Tokenizer:
    """HF's BPE over the same files, split as the official encoder splits (stage-2 pattern, ByteLevel)."""
    hf = tokenizers.Tokenizer(
        tokenizers.models.BPE.from_file(str(directory / VOCAB_FILE), str(directory / MERGES_FILE))
    )
    steps = [
        tokenizers.pre_tokenizers.Split(tokenizers.Regex(pretokenizer.pattern), "isolated"),
        tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(steps)
    return hf


def native(tok: Tokenizer, **levels: bool | int) -> NativeEncoder:
    """The tokenizer's native encoder on its own: on two levels, or with ``two_level=False`` on one
    (BPE of every whole piece, the reference)."""
    ids = {token: i for i, token in tok.vocab.items()}  # the tokenizers here have no special tokens
    return NativeEncoder(ids, tok.merges, tok.pretokenizer, whole_pieces=tok.whole_pieces, **levels)


def last_char(token: bytes) -> str | None:
    """The last whole character of a token (None when it ends inside one)."""
    for size in range(1, min(4, len(token)) + 1):
        try:
            tail = token[-size:].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return tail[-1]
    return None


def joins_word_to_space(left: bytes, right: bytes) -> bool:
    """The superword merges: a word (ending in a character that is not white space) and a space."""
    last = last_char(left)
    return right[:1] == b" " and last is not None and not regex.match(r"\s", last)


# -- the released 200K SuperBPE tokenizer ------------------------------------------------------------


@pytest.fixture(scope="module")
def released(official_data: Path) -> tuple[Tokenizer, NativeEncoder, NativeEncoder, tokenizers.Tokenizer]:
    """The released tokenizer read as the official encoder reads it; its native encoder on two levels
    and on one; HF over the same files."""
    directory = official_data / "released_180K_200K"
    tok = Tokenizer.load(directory, engine="native", compat="official")
    return tok, native(tok), native(tok, two_level=False), hf_from_files(directory, tok.pretokenizer)


def test_released_tokenizer_runs_on_two_levels_from_its_first_superword_merge(released):
    tok, two, one, _ = released
    assert tok.encode_levels == two.levels == 2 and two.levels_reason == ""
    assert (one.levels, one.transition, one.levels_reason) == (1, None, "one level was asked for")
    # Stage 1 ran to 180K ids (179,757 merges); the first merge joining a word to the space after
    # it, " of" + " the", comes a little later, and every earlier one runs on the first level.
    assert two.transition == 179_992
    assert tok.merges[two.transition] == (b" of", b" the")
    assert not any(joins_word_to_space(left, right) for left, right in tok.merges[: two.transition])


def test_released_tokenizer_two_levels_equal_one_and_hf_on_camel_case(released):
    """Stage-1 merges of the released tokenizer join across the stage-1 pattern's words (" Mc" + "C",
    " i" + "Phone"): cutting pieces into the stage-1 pattern's words would be wrong here, cutting
    where no stage-1 merge joins is not."""
    tok, _, one, hf = released
    text = "\n Calvin McCarty ( born November 1 ) uses an iPhone and YouTube , said McLemore ."
    assert tok.encode(text) == one.encode_ordinary(text) == hf.encode(text).ids
    assert tok.id_to_token(tok.encode(" McCarty")[0]).startswith(b" McC")


@EXAMPLES
@given(text=texts)
def test_released_tokenizer_two_levels_equal_one_level_and_hf(released, text):
    tok, _, one, hf = released
    ids = tok.encode(text)
    assert ids == one.encode_ordinary(text)
    assert ids == hf.encode(text).ids


def test_released_tokenizer_on_real_text(released, wikitext_text, multilingual_text):
    tok, two, one, hf = released
    for text in (wikitext_text[:200_000], multilingual_text[:100_000]):
        ids = tok.encode(text)
        assert ids == one.encode_ordinary(text) == hf.encode(text).ids
        # Documents in parallel: each thread with its own segment cache.
        docs = text.split("\n")
        flat, ends = two.encode_batch(docs)
        assert flat.tolist() == [i for doc in docs for i in one.encode_ordinary(doc)]
        assert int(ends[-1]) == len(flat)


@pytest.mark.parametrize("name", ["kernel_docs", "corpus_en"])
def test_official_reference_tokenizers_on_two_levels_like_hf(official_data: Path, name: str, wikitext_text):
    """The SuperBPE tokenizers the official scripts trained (HF's trainer and their fork, duplicates merged,
    absent inherited merges dropped), loaded from their tokenizer.json."""
    directory = official_data / name / "superbpe"
    tok = Tokenizer.load(directory, engine="native")
    hf = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    assert tok.encode_levels == 2
    text = (official_data.parent / "data" / "corpus.en").read_text(encoding="utf-8")
    if name == "kernel_docs":  # corpus_en's alphabet is corpus.en's own
        text += wikitext_text[:100_000]
    assert tok.encode(text) == hf.encode(text).ids == native(tok, two_level=False).encode_ordinary(text)


# -- small SuperBPE tokenizers trained here ----------------------------------------------------------


PRESETS_AND_PATTERNS = [(c, p) for c in ("superbpe", "official") for p in ("superbpe", "superbpe-paper")]


@pytest.fixture(scope="module", params=PRESETS_AND_PATTERNS, ids=lambda p: f"{p[0]}-{p[1]}")
def trained(request, sample_texts: Path, tmp_path_factory: pytest.TempPathFactory):
    """A 1,200-token SuperBPE tokenizer (stage 1 to 700) with the preset's encoding choices, saved."""
    compat_name, stage2 = request.param
    compat = get_compat(compat_name)
    corpus = sample_texts / "corpus.en"
    vocab, merges = superbpe.train_superbpe(
        corpus, 1200, 700, stage2_pretokenizer=stage2, compat=compat_name, engine="native"
    )
    pre = encoding_pretokenizer(get_pretokenizer(stage2), compat)
    tok = Tokenizer(vocab, merges, [], pre, "native", whole_pieces=compat.whole_pieces)
    directory = tok.save(tmp_path_factory.mktemp(f"{compat_name}-{stage2}"))
    assert (directory / "superbpe.json").exists()
    reference = Tokenizer(vocab, merges, [], pre, "python", whole_pieces=compat.whole_pieces)
    hf = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    return tok, native(tok, two_level=False), reference, hf


def test_trained_superbpe_tokenizers_run_on_two_levels(trained, tmp_path: Path):
    tok, one, reference, _ = trained
    loaded = Tokenizer.load(tok.save(tmp_path / "saved"))  # through the manifest, as users load it
    assert loaded.encode_levels == 2 and loaded.pretokenizer == tok.pretokenizer
    two = native(tok)
    assert tok.encode_levels == two.levels == 2 and one.levels == 1 and reference.encode_levels == 1
    # The transition is stage 2's first superword merge: stage 1 (700 merges, fewer when the
    # official preset drops inherited merges that never occur) has none.
    assert two.transition is not None and two.transition >= 600
    assert joins_word_to_space(*tok.merges[two.transition])
    assert not any(joins_word_to_space(left, right) for left, right in tok.merges[: two.transition])


@EXAMPLES
@given(text=texts)
def test_trained_superbpe_two_levels_equal_one_level_python_and_hf(trained, text):
    tok, one, reference, hf = trained
    results = [outcome(encode, text) for encode in (tok.encode, one.encode_ordinary, reference.encode)]
    assert results[0] == results[1] == results[2]
    if isinstance(results[0], list):  # HF has no word for a byte the vocabulary lacks
        assert results[0] == hf.encode(text, add_special_tokens=False).ids


def outcome(encode, text: str) -> list[int] | str:
    """The ids, or the error: the official preset keeps only the bytes its corpus had."""
    try:
        return encode(text)
    except InputError as exc:
        return str(exc)


def test_trained_superbpe_on_its_own_corpus(trained, sample_texts: Path):
    tok, one, reference, hf = trained
    text = (sample_texts / "corpus.en").read_text(encoding="utf-8")[:60_000]
    ids = tok.encode(text)
    assert ids == one.encode_ordinary(text) == reference.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False).ids
    superwords = [i for i in set(ids) if regex.search(rb"[^\s] ", tok.id_to_token(i))]
    assert len(superwords) > 20, "the second level made superword tokens"


# -- where two levels would be wrong: the plan keeps one ---------------------------------------------


def crafted(merges: Sequence[tuple[str, str]]) -> tuple[dict[int, bytes], list[Merge]]:
    """Bytes, then one id per new token, for merges given as text."""
    vocab = {b: bytes([b]) for b in range(256)}
    seen = set(vocab.values())
    pairs = [(left.encode(), right.encode()) for left, right in merges]
    for left, right in pairs:
        if left + right not in seen:
            seen.add(left + right)
            vocab[len(vocab)] = left + right
    return vocab, pairs


# "ab" + "cd" (rank 1, below the first superword merge "x" + " " at 2) has a part that a later merge
# makes ("a" + "b", rank 3): whole-piece BPE of "abcd" makes "cd", then "ab", then "abcd"; two levels
# would stop at "ab" "cd", since "ab" + "cd" runs on the first level and "ab" appears on the second.
LATE_PART = [("c", "d"), ("ab", "cd"), ("x", " "), ("a", "b")]
# The same token made twice, once on each side of the transition, and used as a part below it.
TWICE = [("a", "b"), ("ab", "c"), ("abc", "d"), ("y", " "), ("b", "c"), ("a", "bc")]


@pytest.mark.parametrize("merges", [LATE_PART, TWICE], ids=["late-part", "made-twice"])
@pytest.mark.parametrize("pattern", ["superbpe", "superbpe-paper"])
def test_a_merge_enabled_by_a_later_one_keeps_one_level(merges, pattern):
    vocab, pairs = crafted(merges)
    tok = Tokenizer(vocab, pairs, [], pattern, "native", whole_pieces=False)
    reference = Tokenizer(vocab, pairs, [], pattern, "python", whole_pieces=False)
    assert tok.encode_levels == native(tok).levels == 1
    assert "so a later merge could enable an earlier one" in native(tok).levels_reason
    for text in ["abcd", "xabcd abcd", "x abcd\nab cd  abc d", "y abcdy abcd"]:
        assert tok.encode(text) == reference.encode(text)
    assert len(tok.encode("abcd")) == 1


def test_without_superword_merges_one_level_says_why(sample_texts: Path):
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 600, engine="native")
    tok = Tokenizer(vocab, merges, [], "superbpe-stage1", "native")
    assert tok.encode_levels == 1
    assert "no merge joins a word to the space after it" in native(tok).levels_reason


@pytest.mark.parametrize("transition", [0, 1, 3, 60, 400, 600])
def test_an_explicit_transition_is_used_only_where_exact(sample_texts: Path, transition: int):
    """Any transition is exact when no merge below it has a part made at or above it (always so for
    merges whose parts come first); the plan takes it, and the ids stay those of one level."""
    vocab, merges = superbpe.train_superbpe(sample_texts / "corpus.en", 1000, 400, engine="native")
    ids = {token: i for i, token in vocab.items()}
    pre = get_pretokenizer("superbpe")
    two = NativeEncoder(ids, merges, pre, transition=transition)
    one = NativeEncoder(ids, merges, pre, two_level=False)
    assert (two.levels, two.transition) == (2, transition)
    text = (sample_texts / "corpus.en").read_text(encoding="utf-8")[:20_000]
    assert two.encode_ordinary(text) == one.encode_ordinary(text)
    beyond = NativeEncoder(ids, merges, pre, transition=len(merges) + 1)
    assert beyond.levels == 1 and "beyond" in beyond.levels_reason
    with pytest.raises(ConfigError, match="transition must be a merge count"):
        NativeEncoder(ids, merges, pre, transition=-1)


def test_the_python_engine_is_the_one_level_reference():
    vocab, pairs = crafted([("a", "b"), ("ab", " ")])
    assert Tokenizer(vocab, pairs, [], "superbpe", "python").encode_levels == 1
    assert Tokenizer(vocab, pairs, [], "superbpe", "native").encode_levels == 2
    assert set(PATTERNS) >= {"superbpe", "superbpe-paper"}
