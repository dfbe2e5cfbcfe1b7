"""Merge rules and what every trainer shares: which tokens a merge may make, the checks run before
training, and the result and live view a trainer hands back. Both engines take these, so they sit in the
core rather than beside either trainer."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from superbpe.core.errors import ConfigError, SuperBPEError
from superbpe.core.types import Merge
from superbpe.core.util import whole_number

#: Called with the merges so far (a read-only live view); True stops training.
MergeCallback = Callable[[Sequence[Merge]], "bool | None"]

#: The values of the rules' choice fields (the compat presets set them; see :mod:`superbpe.core.compat`).
RULE_CHOICES = {
    "tie_break": ("bytes", "ids"),
    "duplicates": ("skip", "merge"),
    "absent_inherited": ("keep", "drop"),
}


@dataclass(frozen=True)
class MergeRules:
    """Which merged tokens may be created, and when choosing stops.

    ``min_frequency`` stops training once the best remaining pair occurs fewer times. The other fields
    reject individual tokens; a rejected pair is skipped for good and costs no id.
    """

    min_frequency: int = 1
    max_token_bytes: int | None = None
    max_words_per_token: int | None = None  # words = maximal runs of non-0x20 bytes
    forbidden_substrings: tuple[bytes, ...] = ()
    # How the official recipe differs (see superbpe.core.compat): count ties to the greatest bytes or the
    # lowest HF ids; a pair whose token exists skipped or merged (no new id); a replayed merge whose
    # pair never occurs kept or dropped.
    tie_break: str = "bytes"
    duplicates: str = "skip"
    absent_inherited: str = "keep"

    def __post_init__(self) -> None:
        """The one validation of rules, whoever builds them (:func:`make_rules` only converts strings).

        A token of one byte is never made by a merge, so ``max_token_bytes`` below 2 would forbid every
        merge; ``min_frequency`` 0 would mean the same as 1. A numpy integer (a sweep's ``np.arange``) is
        stored as the int it equals, which the native engine takes.
        """
        for name, value, low in (
            ("min_frequency", self.min_frequency, 1),
            ("max_token_bytes", self.max_token_bytes, 2),
            ("max_words_per_token", self.max_words_per_token, 1),
        ):
            if isinstance(value, numbers.Integral) and not isinstance(value, bool | int):
                value = int(value)
                object.__setattr__(self, name, value)
            if (value is not None or name == "min_frequency") and (
                isinstance(value, bool) or not isinstance(value, int) or value < low
            ):
                raise ConfigError(f"{name} must be an integer >= {low}, not {value!r}")
        forbidden = tuple(self.forbidden_substrings)
        if any(not isinstance(s, bytes) or not s for s in forbidden):
            raise ConfigError(f"forbidden_substrings must be non-empty bytes, got {forbidden!r}")
        # Lists from configs are accepted; store a tuple so the rules stay hashable.
        object.__setattr__(self, "forbidden_substrings", forbidden)
        for name, choices in RULE_CHOICES.items():
            if getattr(self, name) not in choices:
                raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")

    @property
    def restricts_tokens(self) -> bool:
        """Whether :meth:`allows` can ever say no (lets the trainer skip the call)."""
        return (
            self.max_token_bytes is not None
            or self.max_words_per_token is not None
            or bool(self.forbidden_substrings)
        )

    def allows(self, token: bytes) -> bool:
        """Whether a merge may create ``token``."""
        if self.max_token_bytes is not None and len(token) > self.max_token_bytes:
            return False
        if self.max_words_per_token is not None and count_words(token) > self.max_words_per_token:
            return False
        return not any(s in token for s in self.forbidden_substrings)


class MergesSoFar(Sequence[Merge]):
    """A read-only live view of a growing merges list, handed to training callbacks.

    Why a view: a callback runs every few merges, so copying the list for it costs O(merges^2) over a
    run (28 s at 128K merges); a view costs nothing, and being read-only it cannot corrupt the trainer.
    """

    __slots__ = ("_merges",)

    def __init__(self, merges: list[Merge]) -> None:
        self._merges = merges

    def __len__(self) -> int:
        return len(self._merges)

    def __getitem__(self, index):  # type: ignore[no-untyped-def] -- int -> Merge, slice -> list copy
        return self._merges[index]

    def __iter__(self) -> Iterator[Merge]:
        # The list's own iterator: Sequence's default calls __getitem__ per item, which made
        # list(view) in checkpoint saves cost 0.5 s of a 5 s run.
        return iter(self._merges)

    def __repr__(self) -> str:
        return f"MergesSoFar({len(self._merges)} merges)"


@dataclass
class TrainResult:
    """The outcome of :func:`train_merges`."""

    merges: list[Merge]  # replayed + chosen, in order
    stopped: bool  # True when the callback asked to stop early


def count_words(token: bytes) -> int:
    """Number of maximal runs of non-space (0x20) bytes in ``token``."""
    return sum(1 for word in token.split(b" ") if word)



def make_rules(
    min_frequency: int = 1,
    max_token_bytes: int | None = None,
    max_words_per_token: int | None = None,
    forbidden_substrings: Iterable[str | bytes] = (),
) -> MergeRules:
    """Merge rules from user-facing option values: strings become UTF-8; ``MergeRules`` validates.

    One string where the list goes is an error: iterated, it would forbid each of its characters (": "
    would forbid every space, and so every superword)."""
    if isinstance(forbidden_substrings, str | bytes):
        raise ConfigError(f"forbidden_substrings takes a list of strings: [{forbidden_substrings!r}]")
    forbidden = []
    for s in forbidden_substrings:
        if not isinstance(s, str | bytes):
            raise ConfigError(f"forbidden_substrings takes strings, not {type(s).__name__} ({s!r})")
        forbidden.append(s.encode("utf-8") if isinstance(s, str) else s)
    return MergeRules(min_frequency, max_token_bytes, max_words_per_token, tuple(forbidden))


def check_train_args(
    num_merges: int,
    replay: Sequence[Merge],
    callback_every: int,
    *,
    max_merges: int | None = None,
    callback: object = None,
) -> None:
    """Argument checks every engine runs before training, so both fail with the same messages."""
    check_callback(callback, callback_every)
    if num_merges < 0:
        raise ConfigError(f"num_merges must be >= 0, got {num_merges}")
    if max_merges is not None and num_merges > max_merges:
        raise ConfigError(f"num_merges must be <= {max_merges}, got {num_merges}")
    if len(replay) > num_merges:
        raise ConfigError(f"{len(replay)} merges to replay but only {num_merges} merges in total")


def check_callback(callback: object, callback_every: int) -> None:
    """A training callback is callable and ``callback_every`` a whole number of merges (checked before a
    corpus is counted, and again by each engine)."""
    if callback is not None and not callable(callback):
        raise ConfigError(f"callback must be a function of the merges so far, not {type(callback).__name__}")
    whole_number(callback_every, "callback_every")


def check_replay(replay: Sequence[Merge]) -> None:
    """Replayed merges must be byte pairs of existing tokens that each make a new token."""
    tokens = {bytes([i]) for i in range(256)}
    for index, merge in enumerate(replay):
        if len(merge) != 2 or not all(isinstance(part, bytes) for part in merge):
            raise SuperBPEError(f"replay merge {index} is not a pair of bytes: {merge!r}")
        left, right = merge
        for part in (left, right):
            if part not in tokens:
                raise SuperBPEError(f"replay merge {index} {merge!r}: {part!r} is not a token yet")
        token = left + right
        if token in tokens:
            raise SuperBPEError(f"replay merge {index} {merge!r}: token {token!r} already exists")
        tokens.add(token)
