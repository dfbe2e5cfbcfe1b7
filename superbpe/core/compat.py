"""The ``compat`` presets: our behaviour (``superbpe``) and the official SuperBPE recipe's (``official``).

The official scripts train with HF ``tokenizers`` (stage 1) and a fork of it (stage 2, "extend"). Where
they differ from us, the difference is one field of :class:`~superbpe.config.CompatConfig`; the
``official`` preset sets them all so that a run writes their ``merges.txt`` and ``vocab.json`` byte for
byte. Why our defaults differ:

- ``tie_break``: greatest bytes reproduces the CS336 reference and does not depend on id layout.
- ``alphabet``: all 256 bytes as ids 0-255 means any text encodes, and ids are the same for any corpus.
- ``duplicates``: unique tokens are what tiktoken-style encoders require; HF records a merge whose
  token already exists. (Training from scratch, or extending a list with its absent merges dropped, never
  meets one, in HF or here: the setting matters only for kept inherited merges that never occur.)
- ``absent_inherited``: keeping every inherited merge keeps stage-1 ids stable across stage 2.
- ``line_units`` (stage 1) off: a document is one sequence, not each of its lines.
- ``encode_line_units``: we encode the way the stage trained (line by line for the stage-2 patterns);
  the official encoder runs the stage-2 regex over the whole text.
- ``whole_pieces``: a piece that is a token maps straight to it (what tiktoken does), which our merge
  lists make equal to BPE; HF applies the merges to every piece.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, fields, replace
from typing import Any

from superbpe.config import CompatConfig
from superbpe.errors import ConfigError
from superbpe.files import byte_to_unicode
from superbpe.pretokenize import Pretokenizer, get_pretokenizer
from superbpe.trainer import MergeRules

Merge = tuple[bytes, bytes]

DEFAULT = CompatConfig()
OFFICIAL = CompatConfig(
    name="official",
    line_units=True,
    tie_break="ids",
    alphabet="seen",
    duplicates="merge",
    absent_inherited="drop",
    encode_line_units=False,
    whole_pieces=False,
    vocab_style="hf",
)
PRESETS = {"superbpe": DEFAULT, "official": OFFICIAL}

_CHOICES = {
    "tie_break": ("bytes", "ids"),
    "alphabet": ("bytes", "seen"),
    "duplicates": ("skip", "merge"),
    "absent_inherited": ("keep", "drop"),
    "vocab_style": ("lines", "hf"),
}


def get_compat(compat: str | CompatConfig | None) -> CompatConfig:
    """A preset by name, or a (checked) config as given; None is our default."""
    if compat is None:
        return DEFAULT
    if isinstance(compat, str):
        if compat not in PRESETS:
            raise ConfigError(f"unknown compat {compat!r}; choose one of {', '.join(PRESETS)}")
        return PRESETS[compat]
    return check_compat(compat)


def check_compat(compat: CompatConfig) -> CompatConfig:
    """Every choice field holds one of its values (one-line error naming the field otherwise)."""
    for name, choices in _CHOICES.items():
        value = getattr(compat, name)
        if value not in choices:
            raise ConfigError(f"compat.{name} must be one of {', '.join(choices)}, not {value!r}")
    return compat


def describe(compat: CompatConfig) -> dict[str, object]:
    """JSON form (for manifests and resume checks)."""
    return asdict(compat)


def training_rules(rules: MergeRules, compat: CompatConfig) -> MergeRules:
    """A stage's merge rules with the compat choices the trainer makes."""
    return replace(
        rules,
        tie_break=compat.tie_break,
        duplicates=compat.duplicates,
        absent_inherited=compat.absent_inherited,
    )


def training_pretokenizer(pre: Pretokenizer, compat: CompatConfig) -> Pretokenizer:
    """A stage's pre-tokenizer with the compat choice of training units."""
    return pre if compat.line_units is None else get_pretokenizer(pre, line_units=compat.line_units)


def encoding_pretokenizer(pre: Pretokenizer, compat: CompatConfig) -> Pretokenizer:
    """The final stage's pre-tokenizer as the tokenizer encodes with it."""
    if compat.encode_line_units is None:
        return pre
    return get_pretokenizer(pre, line_units=compat.encode_line_units)


def encoding_for(compat: str | CompatConfig) -> tuple[Pretokenizer, bool]:
    """(pre-tokenizer, whole_pieces) for bare ``vocab.json`` + ``merges.txt`` made under ``compat``.

    Such files do not say how they encode. Official SuperBPE files encode with the stage-2 pattern;
    ours default to GPT-2's, as :meth:`~superbpe.tokenizer.Tokenizer.from_files` always did.
    """
    chosen = get_compat(compat)
    name = "superbpe" if chosen.name == "official" else "gpt2"
    return encoding_pretokenizer(get_pretokenizer(name), chosen), chosen.whole_pieces


def recorded_compat(training: Mapping[str, Any]) -> CompatConfig | None:
    """The compat a training run recorded in its manifest (``training.compat``), or None."""
    recorded = training.get("compat")
    if not isinstance(recorded, dict):
        return None
    known = {f.name for f in fields(CompatConfig)}
    return CompatConfig(**{key: value for key, value in recorded.items() if key in known})


def check_directory_compat(
    where: str,
    given: str | CompatConfig,
    pretokenizer: Pretokenizer,
    whole_pieces: bool,
    recorded: CompatConfig | None = None,
) -> None:
    """Refuse a ``compat`` that contradicts how a tokenizer directory says it encodes.

    A manifest or ``tokenizer.json`` says how to encode, and that is what is used; ``given`` is then a
    claim about the directory, and a wrong claim is an error rather than silently ignored: the preset
    must be the one the run recorded (``recorded``), and its encoding choices (``whole_pieces``, and
    ``encode_line_units`` when it fixes them) must be the directory's.
    """
    chosen = get_compat(given)
    if recorded is not None and recorded.name != chosen.name:
        raise ConfigError(
            f"{where} was trained with compat={recorded.name}, not compat={chosen.name}: "
            "leave compat out to use the recorded one"
        )
    differs = []
    if chosen.whole_pieces != whole_pieces:
        differs.append(f"whole_pieces={str(whole_pieces).lower()}")
    if chosen.encode_line_units is not None and chosen.encode_line_units != pretokenizer.line_units:
        differs.append(f"line_units={str(pretokenizer.line_units).lower()}")
    if differs:
        raise ConfigError(
            f"{where} encodes with {' and '.join(differs)}, which compat={chosen.name} contradicts: "
            "leave compat out to encode as the directory says"
        )


def seen_alphabet(pieces: Iterable[bytes]) -> bytes:
    """The bytes that occur in ``pieces``, in HF's alphabet order (by GPT-2 byte-to-unicode character)."""
    seen: set[int] = set()
    for piece in pieces:
        seen.update(piece)
        if len(seen) == 256:
            break
    return alphabet_order(seen)


def alphabet_order(byte_values: Iterable[int]) -> bytes:
    """Byte values sorted as HF numbers its alphabet: by the code point of their byte-table character."""
    table = byte_to_unicode()
    return bytes(sorted(set(byte_values), key=lambda b: ord(table[b])))


def most_seen_merges(vocab_size: int, special_tokens: Sequence[str]) -> int:
    """With the seen alphabet, the most merges ``vocab_size`` can leave (a text has at least one byte).

    The true number is known once the text is counted (:func:`seen_budget`); before that, stage ends
    are checked against this bound.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise ConfigError(f"vocab_size must be an integer, not {vocab_size!r}")
    if vocab_size < 1:
        raise ConfigError(f"vocab_size must be positive, not {vocab_size}")
    return max(vocab_size - len(special_tokens) - 1, 0)


def seen_budget(vocab_size: int, alphabet: bytes, special_tokens: Sequence[str], at_least: int = 0) -> int:
    """Merges (new tokens) a vocabulary of ``vocab_size`` leaves beside the seen bytes and the specials.

    As HF's trainer, a ``vocab_size`` the alphabet and specials already fill gives no merges (and a
    vocabulary of all of them, larger than asked); ``at_least`` is what the schedule needs (its
    fixed stage ends), an error when the budget is below it.
    """
    budget = vocab_size - len(special_tokens) - len(alphabet)
    if max(budget, 0) < at_least:
        raise ConfigError(
            f"vocab_size {vocab_size} leaves {budget} merges after the {len(alphabet)} bytes seen and "
            f"{len(special_tokens)} special tokens; the schedule needs at least {at_least}"
        )
    return max(budget, 0)


def hf_vocab(
    alphabet: bytes, merges: Sequence[Merge], special_tokens: Iterable[str] = ()
) -> dict[int, bytes]:
    """HF's ids: the special tokens, the alphabet, then each new merged token in order (one a merge
    makes again gets no id)."""
    vocab: dict[int, bytes] = {}
    known: set[bytes] = set()
    specials = [special.encode("utf-8") for special in dict.fromkeys(special_tokens)]
    for token in [*specials, *(bytes([b]) for b in alphabet), *(left + right for left, right in merges)]:
        if token not in known:
            known.add(token)
            vocab[len(vocab)] = token
    return vocab
