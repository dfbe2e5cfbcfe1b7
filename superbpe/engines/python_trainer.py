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
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import add

from superbpe.core.byte_table import byte_to_unicode
from superbpe.core.counts import bad_piece_count
from superbpe.core.rules import MergeRules, MergesSoFar, TrainResult, check_replay, check_train_args
from superbpe.core.types import Merge

# Symbols are characters (see _PairTable), so ids stop at the largest code point.
MAX_MERGES = 0x110000 - 256

# Byte x -> 255 - x: reverses the order of equal-length byte strings.
_COMPLEMENT = bytes(range(255, -1, -1))
# Greater than every complemented byte, so a shorter token sorts after its extensions (it is smaller).
_END = "\u0100"
# HF numbers its alphabet by character; the GPT-2 byte-to-unicode characters all lie below this.
_HF_FIRST_MERGED = 0x144


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
            if (type(piece) is not bytes or type(freq) is not int or freq < 0) and (
                problem := bad_piece_count(piece, freq)
            ) is not None:
                raise problem
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
    check_train_args(num_merges, replay, callback_every, max_merges=MAX_MERGES, callback=callback)
    check_replay(replay)
    table = _PairTable(counts)
    tokens = [bytes([i]) for i in range(256)]
    token_ids = {token: i for i, token in enumerate(tokens)}
    merges = _replay(table, replay, tokens, token_ids, drop_absent=rules.absent_inherited == "drop")
    stopped = _choose(table, num_merges, rules, tokens, token_ids, merges, callback, callback_every)
    return TrainResult(merges=merges, stopped=stopped)


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
