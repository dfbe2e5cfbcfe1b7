"""Pre-tokenization: cut text into the pieces that BPE merges may never cross.

Every named pattern is applied with *isolated-split* semantics: each regex match and each
non-empty gap between matches becomes a piece, so no byte of the text is ever dropped (for
gpt2/cl100k/o200k this equals ``findall`` because those patterns match everything). The
stage-2 SuperBPE patterns only carve out digits and punctuation runs; everything in the gaps
stays together, which is what lets superword tokens form.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import regex

from superbpe.core.errors import ConfigError

_O200K_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_O200K_WORD_A = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
_O200K_WORD_B = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
_O200K_REST = r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"

#: The built-in patterns, by the names configs and manifests use.
PATTERNS: dict[str, str] = {
    "gpt2": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "cl100k": (
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
        r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
    ),
    "o200k": "|".join(
        [_O200K_WORD_A + _O200K_CONTRACTIONS, _O200K_WORD_B + _O200K_CONTRACTIONS, _O200K_REST]
    ),
    # o200k without contractions: the word-bounded stage 1 of the official SuperBPE code.
    "superbpe-stage1": "|".join([_O200K_WORD_A, _O200K_WORD_B, _O200K_REST]),
    # Stage 2 as the official SuperBPE code has it today: digits and punctuation runs are cut out.
    "superbpe": r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]{2,}[\r\n/]*| +(?!\S)",
    # Stage 2 as in the paper's tokenizers: only digit runs, in groups of <= 3 aligned from the right.
    "superbpe-paper": r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))",
}

#: Text on which regex engines tend to read one pattern differently (letters beyond ASCII, which POSIX classes
#: and ``\w`` take or not; case pairs, marks, digits of other scripts, every kind of space, line ends,
#: emoji): what a user's pattern is tried on before it is exported to an engine other than ours. Characters
#: a class may or may not hold sit beside letters, where a difference changes the pieces: Oniguruma's ``\w``
#: takes ``²`` and the zero-width joiners, and a case-blind ``[a-z]`` takes ``İ`` in ``regex`` alone.
SPLIT_PROBE = (
    "Straße naïve Café ÜNÏCÖDÉ ĳ ǅ ǆ e\u0301 ﬁ ŉ — “quotes” ‘x’ «y» ½ ² x²y ¼b İstanbul क्\u200dष "
    "👩\u200d💻 a\u200cb ٣٤ ४२ 〇 Ⅻ 日本語のテキスト 한국어 "
    "Ελληνικά русский עברית العربية ไทย 🙂👍🏽 x\t\u00a0\u2003\u3000y\r\nz\n\n  w\v\f 123 4567 3.14 a_b "
    "foo-bar don't I'M we'll $50 #tag @user http://x.y/z?q=1&r=2 <b>bold</b> ... !!! ?? ::\x00\x1f\x7f end"
)


def split_difference(pretokenizer: Pretokenizer, theirs: list[bytes], engine: str) -> str | None:
    """Where another engine's pieces of :data:`SPLIT_PROBE` (``theirs``) part from the pre-tokenizer's,
    said as the next few pieces of each; None when they are the same."""
    ours = [piece.encode("utf-8") for piece in pretokenizer.split(SPLIT_PROBE)]
    if ours == theirs:
        return None
    pairs = enumerate(zip(ours, theirs, strict=False))  # one may end first
    at = next((i for i, (a, b) in pairs if a != b), min(len(ours), len(theirs)))
    shown = [[piece.decode("utf-8", "replace") for piece in side[at : at + 3]] for side in (theirs, ours)]
    return f"{engine} splits text otherwise: {shown[0]} where the pattern gives {shown[1]}"


#: Patterns whose alternatives match every character, so ``findall`` already is the isolated split.
COVERING_PATTERNS = frozenset({"gpt2", "cl100k", "o200k", "superbpe-stage1"})

#: Patterns that cut text into lines first unless told otherwise (as the official trainer does).
LINE_UNIT_PATTERNS = frozenset({"superbpe", "superbpe-paper"})

_NAME_SHAPE = regex.compile(r"[a-z0-9][a-z0-9_\-]*")
_SAFE_CUT = regex.compile(r"(?<=\S\n)(?=[^\s/])")
_LINE = regex.compile(r"[^\n]*\n|[^\n]+")


def _compile(pattern: str) -> regex.Pattern[str]:
    try:
        compiled = regex.compile(pattern)
    except regex.error as exc:
        raise ConfigError(f"invalid pre-tokenizer pattern {pattern!r}: {exc}") from None
    if compiled.flags & regex.REVERSE:
        # A reverse search finds the last match first: the pieces came out in reverse order (or twice), and
        # decoding the ids gave another text.
        raise ConfigError(
            f"pre-tokenizer pattern {pattern!r} searches backwards ((?r)): pieces are found from the start "
            "of the text; leave the flag out"
        )
    return compiled


@dataclass(frozen=True)
class Pretokenizer:
    """A named regex plus the line-unit switch: everything needed to reproduce the pieces."""

    name: str
    pattern: str
    line_units: bool = False

    @cached_property
    def compiled(self) -> regex.Pattern[str]:
        return _compile(self.pattern)

    @cached_property
    def _split_line(self) -> Callable[[str], list[str]]:
        """The fastest exact isolated split for this pattern (a C-level regex call when possible)."""
        if self.word_level:
            return self.compiled.findall
        if self.compiled.groups == 0:
            splitter = _compile(f"({self.pattern})").split
            return lambda text: [piece for piece in splitter(text) if piece]
        compiled = self.compiled
        return lambda text: isolated_split(compiled, text)

    def split(self, text: str) -> list[str]:
        """The pieces of ``text``, in order; concatenated they give ``text`` back."""
        split_line = self._split_line
        if not self.line_units:
            return split_line(text)
        pieces: list[str] = []
        for line in _LINE.findall(text):
            pieces.extend(split_line(line))
        return pieces

    def __getstate__(self) -> dict[str, object]:
        """Pickle only the fields (worker processes recompile), not cached regex objects."""
        return {"name": self.name, "pattern": self.pattern, "line_units": self.line_units}

    def __setstate__(self, state: dict[str, object]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)

    @property
    def safe_cuts_hold(self) -> bool:
        """Whether cutting at safe cuts leaves the pieces unchanged.

        True for the built-in patterns whose alternatives cover every character, and whenever lines are
        split alone. Gap pieces of the stage-2 patterns (without line units) and custom patterns may
        span a newline, so those are cut only at special tokens.
        """
        return self.line_units or self.word_level

    @property
    def word_level(self) -> bool:
        """One of the built-in word-level patterns, exactly (``COVERING_PATTERNS``): their alternatives
        cover every character, and their pieces are words, never runs of them."""
        return self._builtin in COVERING_PATTERNS

    @cached_property
    def _builtin(self) -> str | None:
        """The built-in pattern this is (by name and exact pattern), or None for a custom one."""
        return self.name if PATTERNS.get(self.name) == self.pattern else None

    def last_stream_cut(self, text: str) -> int:
        """The last position ``p`` where ``text`` may be cut for good, or 0 when none is known.

        Whatever text follows, the pieces of ``text[:p]`` and of ``text[p:] + more`` pre-tokenized apart are
        the pieces of the whole (see :data:`STREAM_CUT_RULES`); with line units a line end is such a
        position for every pattern. A custom pattern has no proven rule and uses :meth:`_custom_cut`.
        Streaming encode cuts here, so its buffer holds at most the last unfinished piece and the text
        its pattern may still read, not everything since the last line break.
        """
        cut = text.rfind("\n") + 1 if self.line_units else 0
        if self._builtin is None:
            return cut + self._custom_cut(text[cut:])
        # A reverse search: the last match at or after ``cut``.
        found = _STREAM_CUTS[self._builtin].search(text, cut)
        return found.start() if found else cut

    def first_local_cut(self, text: str, start: int = 0) -> int:
        """The first position ``p >= start`` (``0 < p <= len(text)``) that a built-in pattern's rules, or a
        line end with line units, make a cut from the characters around it alone; -1 when there is none (or
        the pattern is a custom one).

        What precedes ``text`` and what follows it cannot matter: the rules read only the few characters
        around ``p``, so a window of a longer text finds cuts of the longer text. Chunks of a file are cut
        here when it has no safe cut (``core/sources.py``).
        """
        cuts = []
        if self.line_units and (end := text.find("\n", max(start - 1, 0))) != -1:
            cuts.append(end + 1)
        if self._builtin is not None and (found := _LOCAL_CUTS[self._builtin].search(text, max(start, 1))):
            cuts.append(found.start())
        return min(cuts, default=-1)

    def _custom_cut(self, text: str) -> int:
        """A cut for a custom pattern, under an assumption about it: no match attempt (lookarounds included)
        reads more than :data:`CUSTOM_REACH` characters on from where it starts, behind or ahead.

        Then every match of ``text`` that starts at least that far before its end is a match of any longer
        text too (every attempt of the search that found it read only text we have), and so is every piece
        boundary up to the end of the last such match. The cut is the last of those boundaries that has
        another one at least the reach after it, so the text it starts begins at a piece the same in both;
        it is made only when ``text[:cut]`` and ``text[cut:]`` split apart give exactly those pieces (a
        pattern that looks at where text starts, ``^`` or a lookbehind, fails this and is not cut there).
        """
        limit = len(text) - CUSTOM_REACH
        if limit <= CUSTOM_REACH:
            return 0
        bounds: list[int] = []  # boundaries of the matches every longer text shares, in order
        for match in self.compiled.finditer(text):
            if match.start() >= limit:
                break
            bounds += (match.start(), match.end())
        if not bounds:
            return 0
        final = bounds[-1]
        cut = next((b for b in reversed(bounds) if b + CUSTOM_REACH <= final and b > 0), 0)
        if not cut:
            return 0
        known = isolated_split(self.compiled, text[:final])  # the pieces up to ``final``, scanned whole
        left = isolated_split(self.compiled, text[:cut])
        right = isolated_split(self.compiled, text[cut:final])
        return cut if left + right == known else 0

    def spec(self) -> dict[str, object]:
        """The JSON form stored in manifests, checkpoints and count files."""
        return {"name": self.name, "pattern": self.pattern, "line_units": self.line_units}

    @classmethod
    def from_spec(cls, spec: dict[str, object]) -> Pretokenizer:
        pre = cls(str(spec["name"]), str(spec["pattern"]), bool(spec.get("line_units", False)))
        pre.compiled  # noqa: B018 - validate the pattern now, not at first use
        return pre


#: How far a custom pattern's match attempts are assumed to read (characters, either way); see
#: ``Pretokenizer._custom_cut``. Streaming encode keeps about twice this much text undecided.
CUSTOM_REACH = 1 << 12

#: Positions where each built-in pattern may be cut for good: the pieces of the two sides split apart are
#: those of the whole, whatever precedes or follows the window the rule reads. Searched backwards from the
#: end of a buffer (``(?r)``). Why each rule holds (tests/test_pretokenize.py checks them on random text):
#:
#: - ``\S`` then a space (covering patterns): no alternative makes a piece of a non-space followed by a
#:   space (a space only ever leads a piece: `` ?\p{L}+``, ``[^\r\n\p{L}\p{N}]?\p{L}+``, or starts a
#:   whitespace run), so a piece ends before the space; what ends there (a letter, digit or punctuation
#:   run, a contraction) stops at the space or at the end of the text alike, and no lookahead reads it.
#: - whitespace, a space, then ``\S`` (covering): the whitespace run before the space, with the space,
#:   is cut by ``\s+(?!\S)`` (or ``\s*[\r\n]+``, which ends at the run's last line break) right before
#:   that space, since the space is followed by a non-space; alone, the run ends the text and the same
#:   alternative takes it whole, up to the same place.
#: - ``\S`` ``\n`` then neither whitespace nor ``/`` (covering): the safe cut (``safe_cuts``).
#: - a digit then a non-digit (every built-in): digits are only ever matched by digit runs (``\p{N}+``,
#:   ``\p{N}{1,3}``, the paper pattern's right-aligned groups), which end at the run's end whether a
#:   non-digit or the end of the text follows, and no other alternative takes a digit.
#: - a space then whitespace other than a space (``superbpe``): `` +(?!\S)`` takes the space run up to there
#:   (its lookahead sees whitespace, or the end of the text), and no other alternative takes a space after
#:   a space or ends with one.
#:
#: Line units add every line end (``Pretokenizer.last_stream_cut``). The stage-2 patterns without line
#: units have gap pieces that hold whole sentences, so only these few positions are cuts there.
STREAM_CUT_RULES: dict[str, str] = {
    **dict.fromkeys(
        COVERING_PATTERNS,
        r"(?<=\S)(?= )|(?<=\s)(?= \S)|(?<=\S\n)(?=[^\s/])|(?<=\p{N})(?=\P{N})",
    ),
    "superbpe": r"(?<=\p{N})(?=\P{N})|(?<= )(?=[^\S ])",
    "superbpe-paper": r"(?<=\p{N})(?=\P{N})",
}
_STREAM_CUTS = {name: regex.compile(f"(?r){rule}") for name, rule in STREAM_CUT_RULES.items()}
_LOCAL_CUTS = {name: regex.compile(rule) for name, rule in STREAM_CUT_RULES.items()}


def isolated_split(compiled: regex.Pattern[str], text: str) -> list[str]:
    """Matches and the gaps between them, empty ones dropped (a zero-width match is a cut)."""
    pieces: list[str] = []
    pos = 0
    for match in compiled.finditer(text):
        start, end = match.span()
        if start > pos:
            pieces.append(text[pos:start])
        if end > start:
            pieces.append(text[start:end])
        pos = end
    if pos < len(text):
        pieces.append(text[pos:])
    return pieces


def get_pretokenizer(
    name_or_pattern: str | Pretokenizer, *, line_units: bool | None = None, pattern: str | None = None
) -> Pretokenizer:
    """Resolve a built-in name, ``"custom"`` with ``pattern=``, ``"custom:<regex>"`` or a raw regex.

    A string shaped like a name that is not one (or a built-in name in another case) is an error
    rather than a literal regex, so a typo such as ``gtp2`` or ``GPT2`` is caught instead of silently
    training on a nonsense pattern.
    """
    if isinstance(name_or_pattern, Pretokenizer):
        pre = name_or_pattern
        return pre if line_units is None else Pretokenizer(pre.name, pre.pattern, line_units)
    name = name_or_pattern
    if not isinstance(name, str):
        raise ConfigError(
            "pretokenizer takes a built-in name, 'custom:<regex>' or a Pretokenizer, "
            f"not {type(name).__name__}"
        )
    if name in PATTERNS:
        if pattern is not None and pattern != PATTERNS[name]:
            raise ConfigError(f"pre-tokenizer {name!r} is built in; use name 'custom' to give a pattern")
        units = name in LINE_UNIT_PATTERNS if line_units is None else line_units
        return Pretokenizer(name, PATTERNS[name], units)
    if name == "custom" or name.startswith("custom:"):
        pattern = pattern if name == "custom" else name[len("custom:") :]
        if not pattern:
            raise ConfigError("custom pre-tokenizer needs a non-empty pattern")
        return _custom(pattern, line_units)
    # A built-in name in another case ("GPT2") is a typo too: as a regex it would match only that word.
    if _NAME_SHAPE.fullmatch(name) or name.lower() in PATTERNS:
        known = ", ".join(sorted(PATTERNS))
        raise ConfigError(f"unknown pre-tokenizer {name!r}; known: {known}, or custom:<regex>")
    return _custom(name, line_units)


def _custom(pattern: str, line_units: bool | None) -> Pretokenizer:
    pre = Pretokenizer("custom", pattern, bool(line_units))
    pre.compiled  # noqa: B018 - fail on a bad pattern now
    return pre


def safe_cuts(text: str) -> Iterator[int]:
    """Positions where text may be cut without changing any piece: ``p`` with ``text[p-2:p+1]``
    being non-space, newline, non-space other than ``/``.

    No built-in pattern makes a piece that holds a newline followed by a non-space character other
    than ``/`` (o200k's punctuation runs may end in ``[\\r\\n/]*``), and
    with a non-space before the newline no whitespace-run lookahead (``\\s+(?!\\S)``) can read
    past the cut, so counting and streaming encode may process the two sides separately.
    """
    for match in _SAFE_CUT.finditer(text):
        yield match.start()


def last_safe_cut(text: str) -> int:
    """The last safe cut in ``text``, or 0 when there is none."""
    pos = text.rfind("\n")
    while pos >= 0:
        if _SAFE_CUT.match(text, pos + 1):
            return pos + 1
        pos = text.rfind("\n", 0, pos)
    return 0


#: Up to this many special tokens, ``SpecialSplitter.occurs_in`` searches for each one with ``in``;
#: beyond it one regex search is cheaper.
_SUBSTRING_SEARCHES_MAX = 8


def splits_into_words(pattern: str) -> bool:
    """Whether built-in ``pattern`` keeps every piece within a word: as SuperBPE's stage-2 pattern it
    would make no superwords (custom patterns are the user's to judge)."""
    return pattern in PATTERNS and not get_pretokenizer(pattern).line_units


def specials_shown(specials: Sequence[str]) -> str:
    """Special tokens quoted (``"\\n\\n"`` and ``" of"`` are seen), for a message; beyond eight, the first
    four and how many in all: a padded vocabulary's reserved tokens would fill the screen."""
    if len(specials) <= 8:
        return ", ".join(map(repr, specials))
    return f"{', '.join(map(repr, specials[:4]))}, ... ({len(specials)} in all)"


def special_token_list(special_tokens: Iterable[str] | None) -> list[str]:
    """The special tokens as a list, in order (None is none). One string given where a list goes is an
    error (it would otherwise be read as its characters, each a special token), and so is a token given
    twice: a repeat is most likely a typo for another token, which would then be missing unnoticed."""
    if special_tokens is None:
        return []
    if isinstance(special_tokens, str | bytes):
        raise ConfigError(f"special_tokens takes a list of strings: [{special_tokens!r}]")
    if not isinstance(special_tokens, Iterable):
        raise ConfigError(f"special_tokens takes a list of strings, not {type(special_tokens).__name__}")
    if isinstance(special_tokens, set | frozenset):  # its order, and so the tokens' ids, change per process
        shown = sorted(special_tokens, key=str)
        raise ConfigError(
            f"special_tokens takes a list of strings, not a {type(special_tokens).__name__}: their order "
            f"gives their ids, and a set's order changes from one process to the next; give a list, {shown!r}"
        )
    specials = list(special_tokens)
    seen: set[str] = set()
    for token in specials:
        if isinstance(token, str):  # other types are refused by SpecialSplitter
            if token in seen:
                raise ConfigError(f"special token {token!r} is given twice in special_tokens; list it once")
            seen.add(token)
    return specials


class SpecialSplitter:
    """Splits text at special tokens, longest first, so specials are never counted or merged."""

    def __init__(self, special_tokens: Sequence[str]) -> None:
        specials = special_token_list(special_tokens)
        for token in specials:
            if not isinstance(token, str) or not token:
                raise ConfigError("special tokens must be non-empty strings")
            if not token.isascii():
                try:
                    token.encode("utf-8")
                except UnicodeEncodeError:
                    raise ConfigError(f"special token {token!r} holds a lone surrogate, not text") from None
        self.special_tokens: tuple[str, ...] = tuple(specials)
        ordered = sorted(specials, key=len, reverse=True)
        self._pattern = regex.compile("|".join(regex.escape(t) for t in ordered)) if ordered else None

    def split(self, text: str) -> list[tuple[str, bool]]:
        """``(segment, is_special)`` pairs covering ``text``; empty segments are dropped."""
        if self._pattern is None:
            return [(text, False)] if text else []
        parts: list[tuple[str, bool]] = []
        pos = 0
        for match in self._pattern.finditer(text):
            if match.start() > pos:
                parts.append((text[pos : match.start()], False))
            parts.append((match.group(), True))
            pos = match.end()
        if pos < len(text):
            parts.append((text[pos:], False))
        return parts

    def encode(
        self, text: str, special_ids: Mapping[str, int], encode_ordinary: Callable[[str], list[int]]
    ) -> list[int]:
        """Ids of ``text``: each special token's id from ``special_ids``, the text between them through
        ``encode_ordinary``. The one definition of encoding with special tokens, so ``Tokenizer.encode`` and
        the python engine's batches cannot drift apart (the native engine does the same in Rust)."""
        if self._pattern is None:
            return encode_ordinary(text)
        ids: list[int] = []
        for segment, is_special in self.split(text):
            if is_special:
                ids.append(special_ids[segment])
            else:
                ids.extend(encode_ordinary(segment))
        return ids

    def occurs_in(self, text: str) -> bool:
        """Whether any special token occurs in ``text``: a few substring searches (C loops, no match
        objects) where a text with no special token, the common case, would otherwise pay for a split."""
        if self._pattern is None:
            return False
        if len(self.special_tokens) > _SUBSTRING_SEARCHES_MAX:
            return self._pattern.search(text) is not None
        for token in self.special_tokens:  # noqa: SIM110 (a generator in any() costs more than the searches)
            if token in text:
                return True
        return False

    def ordinary_segments(self, text: str) -> Iterator[str]:
        """Just the text between specials: what gets pre-tokenized and counted."""
        if self._pattern is None:
            if text:
                yield text
            return
        for segment in self._pattern.split(text):
            if segment:
                yield segment

    def __bool__(self) -> bool:
        return bool(self.special_tokens)
