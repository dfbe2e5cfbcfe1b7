"""The python engine's BPE trainer: piece counts in, merges out.

Every unique pre-tokenized piece is kept once, as a string of symbols (``chr(id)``), with its count. We
keep the count of every adjacent pair (weighted by piece counts) and an inverted index pair -> pieces, so a
merge only visits the pieces that contain the merged pair and only adjusts the pairs next to each
occurrence -- whole pieces are never recounted. That matters for SuperBPE stage 2, where a piece is a whole
line of hundreds of symbols.

Choosing the best pair uses a lazy max-heap (``heapq`` on negated counts). Only pairs that contain the token
just created can grow; every other count only shrinks. So a heap entry holds an upper bound of its pair's
count: a popped entry whose count is stale is pushed back with the current count, and an entry whose count is
current is the true maximum. Ties go to the lexicographically greatest ``(left_bytes, right_bytes)``; each
token carries an order-reversing string key so the whole heap comparison stays in C. The lazy heap beat a
``sortedcontainers.SortedList`` kept exact on every count change (numbers in ``_choose``) because most count
changes never touch the heap.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import add

from superbpe.errors import ConfigError, SuperBPEError
from superbpe.files import byte_to_unicode
from superbpe.types import Merge

# Symbols are characters (see _PairTable), so ids stop at the largest code point.
MAX_MERGES = 0x110000 - 256

# Byte x -> 255 - x: reverses the order of equal-length byte strings.
_COMPLEMENT = bytes(range(255, -1, -1))
# Greater than every complemented byte, so a shorter token sorts after its extensions (it is smaller).
_END = "\u0100"
_CHOICES = {
    "tie_break": ("bytes", "ids"),
    "duplicates": ("skip", "merge"),
    "absent_inherited": ("keep", "drop"),
}
# HF numbers its alphabet by character; the GPT-2 byte-to-unicode characters all lie below this.
_HF_FIRST_MERGED = 0x144


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
    # How the official recipe differs (see superbpe.compat): count ties to the greatest bytes or the
    # lowest HF ids; a pair whose token exists skipped or merged (no new id); a replayed merge whose
    # pair never occurs kept or dropped.
    tie_break: str = "bytes"
    duplicates: str = "skip"
    absent_inherited: str = "keep"

    def __post_init__(self) -> None:
        """The one validation of rules, whoever builds them (``api.make_rules`` only converts strings).

        A token of one byte is never made by a merge, so ``max_token_bytes`` below 2 would forbid every
        merge; ``min_frequency`` 0 would mean the same as 1.
        """
        for name, value, low in (
            ("min_frequency", self.min_frequency, 1),
            ("max_token_bytes", self.max_token_bytes, 2),
            ("max_words_per_token", self.max_words_per_token, 1),
        ):
            if (value is not None or name == "min_frequency") and (
                isinstance(value, bool) or not isinstance(value, int) or value < low
            ):
                raise ConfigError(f"{name} must be an integer >= {low}, not {value!r}")
        forbidden = tuple(self.forbidden_substrings)
        if any(not isinstance(s, bytes) or not s for s in forbidden):
            raise ConfigError(f"forbidden_substrings must be non-empty bytes, got {forbidden!r}")
        # Lists from configs are accepted; store a tuple so the rules stay hashable.
        object.__setattr__(self, "forbidden_substrings", forbidden)
        for name, choices in _CHOICES.items():
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


def _order_key(token: bytes) -> str:
    """A string whose ascending order is the descending byte order of tokens (prefix-free, so keys concat)."""
    return token.translate(_COMPLEMENT).decode("latin-1") + _END


def _hf_order_key(token_id: int) -> str:
    """One character whose order is HF's id order: bytes by their byte-table character, then merged
    tokens in the order they were made (ids are given to new tokens only)."""
    if token_id < 256:
        return byte_to_unicode()[token_id]
    return chr(_HF_FIRST_MERGED + token_id - 256)


class _PairTable:
    """Unique pieces, weighted pair counts, and the inverted index pair -> pieces.

    A symbol (token id) is the one-character string ``chr(id)``: a piece is then a ``str``, so finding a
    pair is ``str.find`` and merging it everywhere is one ``str.replace``, both in C, and a pair is the
    two-character string -- a cheap, hashable key. That keeps long pieces (SuperBPE stage 2 lines) fast:
    Python code runs per occurrence of the pair, never per symbol, and a piece costs 1-4 bytes a symbol.
    """

    def __init__(self, counts: Mapping[bytes, int]) -> None:
        self.seqs: list[str] = []
        self.freqs: list[int] = []
        self.pair_counts: dict[str, int] = {}
        self.where: defaultdict[str, set[int]] = defaultdict(set)
        seqs, freqs, where = self.seqs, self.freqs, self.where
        pair_counts = self.pair_counts
        get = pair_counts.get
        for piece, freq in counts.items():
            if freq < 0:
                raise SuperBPEError(f"piece {piece!r} has a negative count {freq}")
            if len(piece) < 2 or freq == 0:
                continue  # no pair can ever form inside it
            index = len(seqs)
            seq = piece.decode("latin-1")  # byte b -> chr(b), the symbol of id b
            seqs.append(seq)
            freqs.append(freq)
            for pair in map(add, seq, seq[1:]):  # every adjacent two-character slice
                pair_counts[pair] = get(pair, 0) + freq
                where[pair].add(index)

    def merge(self, pair: str, new: str) -> list[str]:
        """Replace every non-overlapping occurrence of ``pair`` by ``new``, scanning left to right.

        Only the pairs next to each occurrence change: (before, left) and (right, after) lose the piece's
        count, (before, new) and (new, after) gain it. The new pairs are gathered by their other symbol and
        registered once at the end. When an occurrence directly follows the previous one ("abab", "aaaa"),
        its left neighbour is that occurrence's ``new``, and the (new, left) gained there is taken back.
        Returns the new pairs that occur, all containing ``new``.
        """
        pair_counts = self.pair_counts
        seqs = self.seqs
        freqs = self.freqs
        left = pair[0]
        before_counts: defaultdict[str, int] = defaultdict(int)  # x -> count of (x, new)
        after_counts: defaultdict[str, int] = defaultdict(int)  # y -> count of (new, y)
        before_where: defaultdict[str, set[int]] = defaultdict(set)
        after_where: defaultdict[str, set[int]] = defaultdict(set)
        for index in self.where.pop(pair, ()):
            seq = seqs[index]
            j = seq.find(pair)
            if j < 0:
                continue  # stale index entry: the pair left this piece in an earlier merge
            freq = freqs[index]
            size = len(seq)
            follows = -1  # where an occurrence directly after the previous one would start
            while j >= 0:
                if j:
                    if j == follows:
                        after_counts[left] -= freq
                        before = new
                    else:
                        pair_counts[seq[j - 1 : j + 1]] -= freq
                        before = seq[j - 1]
                    before_counts[before] += freq
                    before_where[before].add(index)
                follows = j + 2
                if follows < size:
                    pair_counts[seq[j + 1 : j + 3]] -= freq
                    after = seq[follows]
                    after_counts[after] += freq
                    after_where[after].add(index)
                j = seq.find(pair, follows)
            seqs[index] = seq.replace(pair, new)
        pair_counts.pop(pair, None)
        return self._register([(x + new, n, before_where[x]) for x, n in before_counts.items()]) + (
            self._register([(new + y, n, after_where[y]) for y, n in after_counts.items()])
        )

    def _register(self, created: list[tuple[str, int, set[int]]]) -> list[str]:
        """Record the counts and pieces of pairs a merge created; return those that occur."""
        live = []
        pair_counts = self.pair_counts
        where = self.where
        for pair, count, pieces in created:
            if count > 0:  # zero: (new, left) in "abab", gained and taken back
                # A pair exists already only when the merge made a token that was there before
                # (duplicates="merge"); its counts add up.
                pair_counts[pair] = pair_counts.get(pair, 0) + count
                if pair in where:
                    where[pair] |= pieces
                else:
                    where[pair] = pieces
                live.append(pair)
        return live


def train_merges(
    counts: Mapping[bytes, int],
    num_merges: int,
    *,
    rules: MergeRules = MergeRules(),  # noqa: B008 -- frozen, so a shared default is safe
    replay: Sequence[Merge] = (),
    callback: Callable[[list[Merge]], bool | None] | None = None,
    callback_every: int = 1000,
) -> TrainResult:
    """Learn up to ``num_merges`` merges (replayed ones included) from piece counts.

    ``counts`` maps a pre-tokenized piece's UTF-8 bytes to how often it occurs. Ids 0-255 are the bytes and
    merge i creates id 256 + i. ``replay`` merges are applied first, in order, unchecked against ``rules``
    (an earlier stage chose them under its own rules), and keep their ids even where the pair never occurs
    (``rules.absent_inherited="drop"``: such a merge, and any later one that needs its token, is left out).
    Then pairs are chosen by highest count, ties to the greatest ``(left_bytes, right_bytes)`` (or the
    lowest HF ids, ``rules.tie_break="ids"``). With ``rules.duplicates="merge"`` a pair whose token
    exists is merged and recorded without a new id, and ``num_merges`` counts new tokens.
    ``callback(merges_so_far)`` runs after every ``callback_every`` chosen merges with a read-only live view
    (handing over a copy each time made long runs quadratic; copy it to keep it); returning True stops the
    run, and calling again with ``replay=result.merges`` continues it exactly.
    """
    check_train_args(num_merges, replay, callback_every, max_merges=MAX_MERGES)
    check_replay(replay)
    table = _PairTable(counts)
    tokens = [bytes([i]) for i in range(256)]
    token_ids = {token: i for i, token in enumerate(tokens)}
    merges = _replay(table, replay, tokens, token_ids, drop_absent=rules.absent_inherited == "drop")
    stopped = _choose(table, num_merges, rules, tokens, token_ids, merges, callback, callback_every)
    return TrainResult(merges=merges, stopped=stopped)


def check_train_args(
    num_merges: int, replay: Sequence[Merge], callback_every: int, *, max_merges: int | None = None
) -> None:
    """Argument checks every engine runs before training, so both fail with the same messages."""
    if num_merges < 0:
        raise ConfigError(f"num_merges must be >= 0, got {num_merges}")
    if max_merges is not None and num_merges > max_merges:
        raise ConfigError(f"num_merges must be <= {max_merges}, got {num_merges}")
    if len(replay) > num_merges:
        raise ConfigError(f"{len(replay)} merges to replay but only {num_merges} merges in total")
    if callback_every < 1:
        raise ConfigError(f"callback_every must be >= 1, got {callback_every}")


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


def _replay(
    table: _PairTable,
    replay: Iterable[Merge],
    tokens: list[bytes],
    token_ids: dict[bytes, int],
    *,
    drop_absent: bool = False,
) -> list[Merge]:
    """Apply earlier (already checked) merges in order; each keeps id 256 + its index, occurring or not.

    ``drop_absent`` leaves out a merge whose pair is not in the table (it never occurred, or a part was left
    out), as the official fork does, and ids then count only the merges kept. A pair is in the table from
    the moment it occurs until it is merged, even when its count has fallen to zero since, which is exactly
    when HF's queue holds it.
    """
    merges: list[Merge] = []
    for left, right in replay:
        token = left + right
        new = len(tokens)
        if drop_absent:
            left_id, right_id = token_ids.get(left), token_ids.get(right)
            if left_id is None or right_id is None:
                continue
            if chr(left_id) + chr(right_id) not in table.pair_counts:
                continue
        table.merge(chr(token_ids[left]) + chr(token_ids[right]), chr(new))
        tokens.append(token)
        token_ids[token] = new
        merges.append((left, right))
    return merges


def _choose(
    table: _PairTable,
    num_merges: int,
    rules: MergeRules,
    tokens: list[bytes],
    token_ids: dict[bytes, int],
    merges: list[Merge],
    callback: Callable[[list[Merge]], bool | None] | None,
    callback_every: int,
) -> bool:
    """Choose merges until ``num_merges`` are in ``merges`` or no pair qualifies; True if stopped by callback.

    Max structure: a lazy heap of ``(-count, order key, pair)``. Each pair has at most one entry; only pairs
    created by the latest merge are pushed, and a stale entry is re-pushed when it reaches the top. An
    exact ``SortedList`` needs a remove + add for every count a merge changes, and costs about twice the
    training time (figures in docs/DESIGN.md, "Why a lazy heap"), so the heap stays.
    """
    pair_counts = table.pair_counts
    order_key = (lambda token: _hf_order_key(token_ids[token])) if rules.tie_break == "ids" else _order_key
    order_keys = [order_key(token) for token in tokens]
    heap = [
        (-count, order_keys[ord(pair[0])] + order_keys[ord(pair[1])], pair)
        for pair, count in pair_counts.items()
        if count > 0
    ]
    heapq.heapify(heap)
    heappop, heappush, heapreplace = heapq.heappop, heapq.heappush, heapq.heapreplace
    min_frequency = rules.min_frequency
    allows = rules.allows if rules.restricts_tokens else None
    merge_existing = rules.duplicates == "merge"
    chosen = 0
    while len(tokens) - 256 < num_merges and heap:
        negated, order, pair = heap[0]
        count = pair_counts.get(pair, 0)
        if count != -negated:  # stale upper bound: put it back where it belongs now
            if count > 0:
                heapreplace(heap, (-count, order, pair))
            else:
                heappop(heap)
            continue
        if count < min_frequency:
            break
        heappop(heap)
        left = tokens[ord(pair[0])]
        right = tokens[ord(pair[1])]
        token = left + right
        if allows is not None and not allows(token):
            continue  # skipped for good: an old pair is never pushed again
        new = token_ids.get(token)
        if new is None:
            new = len(tokens)
            tokens.append(token)
            token_ids[token] = new
            order_keys.append(order_key(token))
        elif not merge_existing:
            continue  # tokens stay unique: skipped for good, like a rule violation
        for fresh in table.merge(pair, chr(new)):
            order = order_keys[ord(fresh[0])] + order_keys[ord(fresh[1])]
            heappush(heap, (-pair_counts[fresh], order, fresh))
        merges.append((left, right))
        chosen += 1
        if callback is not None and chosen % callback_every == 0 and callback(MergesSoFar(merges)):
            return True
    return False
