"""The python engine's max structure: today's lazy heap against an exact ``SortedList``, same counts.

    python benchmarks/python_max_structure.py CORPUS [--vocab 32000] [--rounds 1]

Counts the corpus once (native engine when built: the counts are the same by contract), then trains
with ``superbpe.engines.python_trainer.train_merges`` (lazy heap: stale entries re-pushed when they
surface) and with an exact ``sortedcontainers.SortedList`` of ``(-count, order key, pair)`` that re-keys
every pair whose count a merge changes (no stale entries). The two alternate round by round, so both are
measured in the same minutes of a machine whose speed drifts; CPU seconds of the training alone are
printed, and the merges must be identical.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping

from sortedcontainers import SortedList

import superbpe
from superbpe.core.errors import SuperBPEError
from superbpe.core.types import Merge
from superbpe.engines.python_trainer import _order_key, _PairTable, train_merges


class _TrackedCounts(dict):
    """The pair table's counts, remembering which pairs changed since the last ``changed.clear()``."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        super().__init__(counts)
        self.changed: set[str] = set()

    def __setitem__(self, key: str, value: int) -> None:
        self.changed.add(key)
        super().__setitem__(key, value)

    def pop(self, key: str, *default: object) -> object:  # type: ignore[override]
        self.changed.add(key)
        return super().pop(key, *default)


def train_exact_sorted(counts: Mapping[bytes, int], num_merges: int) -> list[Merge]:
    """Default-rules BPE with an exact sorted max structure (the alternative to the lazy heap)."""
    table = _PairTable(counts)
    pair_counts = table.pair_counts = _TrackedCounts(table.pair_counts)
    tokens = [bytes([i]) for i in range(256)]
    token_ids = {token: i for i, token in enumerate(tokens)}
    order = [_order_key(token) for token in tokens]

    def entry(pair: str, count: int) -> tuple[int, str, str]:
        return (-count, order[ord(pair[0])] + order[ord(pair[1])], pair)

    entries = {pair: entry(pair, count) for pair, count in pair_counts.items() if count > 0}
    queue = SortedList(entries.values())
    merges: list[Merge] = []
    while len(merges) < num_merges and queue:
        pair = queue.pop(0)[2]
        del entries[pair]
        left, right = tokens[ord(pair[0])], tokens[ord(pair[1])]
        if left + right in token_ids:
            continue
        new = len(tokens)
        tokens.append(left + right)
        token_ids[left + right] = new
        order.append(_order_key(left + right))
        pair_counts.changed.clear()
        table.merge(pair, chr(new))
        for changed in pair_counts.changed:
            old = entries.pop(changed, None)
            if old is not None:
                queue.remove(old)
            count = pair_counts.get(changed, 0)
            if count > 0:
                entries[changed] = entry(changed, count)
                queue.add(entries[changed])
        merges.append((left, right))
    return merges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    specials = ["<|endoftext|>"]
    num_merges = args.vocab - 256 - len(specials)
    if args.rounds < 1:
        raise SystemExit(f"error: --rounds must be at least 1, not {args.rounds}")
    if num_merges < 1:
        least = 256 + len(specials) + 1  # the bytes, the specials and one merge
        raise SystemExit(f"error: --vocab must be at least {least}, not {args.vocab}")
    try:
        counts = dict(superbpe.count(args.corpus, specials, engine="auto").counts)
    except SuperBPEError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"corpus {args.corpus}: {len(counts):,} distinct pieces; {num_merges:,} merges")
    contenders = {
        "lazy heap (train_merges)": lambda: train_merges(counts, num_merges).merges,
        "exact SortedList": lambda: train_exact_sorted(counts, num_merges),
    }
    results: dict[str, list[Merge]] = {}
    for round_ in range(1, args.rounds + 1):
        for name, train in contenders.items():
            start = time.process_time()
            results[name] = train()
            print(f"round {round_}  {name:26s} {time.process_time() - start:7.2f} CPU-s")
    first, second = results.values()
    if first != second:
        raise SystemExit("error: the two max structures chose different merges")
    print("same merges")


if __name__ == "__main__":
    main()
