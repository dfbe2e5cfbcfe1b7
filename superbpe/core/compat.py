"""The ``compat`` presets: our behaviour (``superbpe``) and the official SuperBPE recipe's (``official``).

The official scripts train with HF ``tokenizers`` (stage 1) and a fork of it (stage 2, "extend"). Where
they differ from us, the difference is one field of :class:`CompatConfig`; the
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

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from superbpe.core.errors import ConfigError
from superbpe.core.pretokenize import Pretokenizer, get_pretokenizer
from superbpe.core.rules import RULE_CHOICES, MergeRules


@dataclass
class CompatConfig:
    """Every setting in which the official SuperBPE recipe (HF ``tokenizers`` + their fork) differs from ours.

    ``conf/compat/superbpe.yaml`` (the default) is our behaviour, ``conf/compat/official.yaml`` theirs;
    this module explains each choice, and :func:`check_compat` checks the values. A plain dataclass: the
    library takes it as it is, and the run's config schema holds it as its ``compat`` group.
    """

    name: str = "superbpe"
    # Training units: None = each pattern's own default; True = every stage counts line by line (HF's
    # file reader makes every line, newline included, its own sequence).
    line_units: bool | None = None
    # Count ties: "bytes" = the greatest (left bytes, right bytes); "ids" = the lowest (left id,
    # right id) in HF's numbering (HF's heap order).
    tie_break: str = "bytes"
    # First ids: "bytes" = all 256 bytes as ids 0-255; "seen" = only the bytes the training text
    # has, ordered by their GPT-2 byte-to-unicode character (as HF's alphabet is).
    alphabet: str = "bytes"
    # A chosen pair whose token already exists: "skip" it (tokens stay unique); "merge" = record it
    # and merge it as HF does (no new id).
    duplicates: str = "skip"
    # An inherited (replayed) merge whose pair never occurs in this stage's text: "keep" it (ids stay
    # as the source has them); "drop" it (the fork skips it, so later ids shift).
    absent_inherited: str = "keep"
    # Encoding: None = as the final stage trained (line units and all); False = the final pattern
    # over the whole text (the official encoder).
    encode_line_units: bool | None = None
    # Encoding: a piece that is itself a token is that token (HF ignore_merges); off = every piece
    # goes through the merges (HF's default, as in the official files).
    whole_pieces: bool = True
    # vocab.json layout: "lines" (ours, diffable) or "hf" (one line, no final newline).
    vocab_style: str = "lines"


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

_CHOICES = {**RULE_CHOICES, "alphabet": ("bytes", "seen"), "vocab_style": ("lines", "hf")}


def get_compat(compat: str | CompatConfig | None) -> CompatConfig:
    """A preset by name, or a (checked) config as given; None is our default."""
    if compat is None:
        return DEFAULT
    if isinstance(compat, str):
        if compat not in PRESETS:
            raise ConfigError(f"unknown compat {compat!r}; choose one of {', '.join(PRESETS)}")
        return PRESETS[compat]
    if not isinstance(compat, CompatConfig):
        raise ConfigError(f"compat must be a preset ({', '.join(PRESETS)}) or a CompatConfig, not {compat!r}")
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
    ours default to GPT-2's, as :meth:`~superbpe.api.tokenizer.Tokenizer.from_files` always did.
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
