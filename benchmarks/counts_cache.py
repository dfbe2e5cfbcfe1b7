"""``python benchmarks/counts_cache.py CORPUS [--pattern superbpe] [--rounds 2]``: whether a run's cache of
piece counts pays for itself on a corpus.

Counts CORPUS with the pattern as a run's later stage does (native engine, two workers, lines left in
the mapped file), writes the ``.counts`` file a cache entry would hold, and reads it back into a native
table as a later run would, ``--rounds`` times (count and read back alternate; the file is written once).
Prints each time, the file's size and its share of the corpus: where reading back is not clearly
faster than counting, a cache entry only costs the first run its writing (runs skip such entries, see
``counts_not_worth_caching`` in ``superbpe/training/cache.py``). The file is read back from the page
cache, just written: the best case for reading.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from superbpe.core.pretokenize import get_pretokenizer
from superbpe.engines import native as native_engine

EOT = "<|endoftext|>"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--pattern", default="superbpe", help="pre-tokenizer (default: SuperBPE stage 2's)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args(argv)
    if not args.corpus.is_file():
        print(f"counts_cache: {args.corpus}: no such file", file=sys.stderr)
        return 2
    if not native_engine.available():
        print("counts_cache: superbpe._native is not built", file=sys.stderr)
        return 2
    engine, pre = native_engine.NativeEngine(), get_pretokenizer(args.pattern)
    path = args.workdir / f"counts-cache-bench-{os.getpid()}.counts"
    corpus_bytes = args.corpus.stat().st_size
    try:
        for round_ in range(1, args.rounds + 1):
            start = time.perf_counter()
            counts = engine.count(args.corpus, pre, [EOT], workers=2, borrow_files=True)
            counted = time.perf_counter() - start
            if round_ == 1:
                start = time.perf_counter()
                counts.save(path)
                written, size = time.perf_counter() - start, path.stat().st_size
                share = 100 * size / corpus_bytes
                print(f"write {written:.2f} s, {size / 1e6:,.0f} MB ({share:.0f}% of the corpus)", flush=True)
            del counts
            start = time.perf_counter()
            loaded = native_engine.load_counts(path)
            read = time.perf_counter() - start
            del loaded
            print(f"round {round_}: count {counted:.2f} s, read back {read:.2f} s", flush=True)
    finally:
        path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
