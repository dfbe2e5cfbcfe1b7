"""``python benchmarks/threads_bench.py {batch,corpus,stream} ...``: what threads buy in encoding, measured
one thread count against another within the same minutes.

- ``batch TOKENIZER TEXT``: ``Tokenizer.encode_batch`` (lists) and ``encode_batch_flat`` (arrays) of about
  ``--mb`` MB of short documents (the text's lines cut into sentences of about 140 bytes), with
  ``threads=1`` and ``threads=2`` (``--threads``) interleaved, ``--rounds`` times each.
- ``corpus TOKENIZER CORPUS``: ``encode_corpus`` (what ``superbpe-encode`` runs, tokenizer load included)
  with ``workers=1`` and ``workers=2`` interleaved (every output must be byte-identical), then its
  encoding phase alone (the tokenizer loaded once; the load is a serial part of the whole), then
  ``evaluate`` (what ``superbpe-evaluate`` runs, the tokenizer loaded once) with the same worker counts.
- ``stream TOKENIZER TEXT``: ``encode_iterable`` over ``--mb`` MB of the text's lines (repeated), with the
  peak of Python memory (tracemalloc) and of RSS above the start.

``TOKENIZER`` is a tokenizer directory (``Tokenizer.load``). Each row is printed as JSON with the load
average at its end: on a shared machine a ratio means something only next to the load it was taken under,
and next to what two busy processes get at that time (the first row of ``batch`` and ``corpus``).
Other work on the machine slows both sides of an interleaved pair alike, which is why pairs are compared,
and the best and median of the rounds are both given.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

from superbpe.api.tokenizer import Tokenizer
from superbpe.core.sources import iter_chunks
from superbpe.formats.token_files import token_dtype
from superbpe.jobs.encode import ChunkEncoder, encode_corpus
from superbpe.jobs.evaluate import evaluate
from superbpe.jobs.executors import threads_in_order


def read_text(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read()


def short_documents(text: str, total: int, size: int = 140) -> list[str]:
    """About ``total`` bytes of documents of about ``size`` bytes: lines cut after the first sentence
    end (" . ") past ``size``, repeated with a counter in front once the text runs out."""
    pieces: list[str] = []
    for line in text.splitlines(keepends=True):
        while len(line) > 2 * size and (end := line.find(" . ", size)) != -1:
            pieces.append(line[: end + 3])
            line = line[end + 3 :]
        pieces.append(line)
    documents: list[str] = []
    filled = round_number = 0
    while filled < total:
        for piece in pieces:
            document = piece if round_number == 0 else f"{round_number} {piece}"
            documents.append(document)
            filled += len(document.encode("utf-8"))
            if filled >= total:
                break
        round_number += 1
    return documents


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compare(label: str, runs: dict[int, Callable[[], object]], rounds: int, extra: dict[str, object]) -> None:
    """Time each run ``rounds`` times, interleaved, and print the times and the ratios to the first."""
    times: dict[int, list[float]] = {count: [] for count in runs}
    for _ in range(rounds):
        for count, run in runs.items():
            times[count].append(timed(run))
    first = next(iter(runs))
    row: dict[str, object] = {"what": label, **extra}
    for count, values in times.items():
        row[f"{count}_seconds"] = [round(v, 3) for v in values]
        if count != first:
            row[f"best_{first}_over_{count}"] = round(min(times[first]) / min(values), 2)
            row[f"median_{first}_over_{count}"] = round(
                statistics.median(times[first]) / statistics.median(values), 2
            )
    row["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(row), flush=True)


def machine_ceiling(rounds: int = 3) -> None:
    """What two busy threads get here: one CPU-bound process against two at once, interleaved. On a shared
    or throttled VM two threads may get far less than two cores; a thread-count ratio is to be read
    against this one."""
    code = "s = 0\nfor i in range(12_000_000): s += i"

    def processes(count: int) -> None:
        running = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]
        for process in running:
            process.wait()

    times: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(rounds):
        for count in (1, 2):
            times[count].append(timed(lambda count=count: processes(count)))
    cores = [round(2 * one / two, 2) for one, two in zip(times[1], times[2], strict=True)]
    row = {"what": "cores_two_busy_processes_get", "per_round": cores,
           "load_average": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(row), flush=True)


def bench_batch(args: argparse.Namespace) -> None:
    tok = Tokenizer.load(args.tokenizer)
    documents = short_documents(args.content, int(args.mb * 1e6))
    size = sum(len(d.encode("utf-8")) for d in documents)
    extra = {"documents": len(documents), "mb": round(size / 1e6, 2), "mean_bytes": size // len(documents)}
    tok.encode_batch(documents[:20_000], threads=1)  # the piece cache warm for both sides
    counts = [1, *args.threads]
    lists = {n: lambda n=n: tok.encode_batch(documents, n) for n in counts}
    compare("encode_batch", lists, args.rounds, extra)
    compare(
        "encode_batch_flat",
        {n: lambda n=n: tok.encode_batch_flat(documents, n) for n in counts},
        args.rounds,
        extra,
    )


def bench_corpus(args: argparse.Namespace) -> None:
    """The whole ``encode_corpus`` (tokenizer load included), then its encoding phase alone: the same
    chunks, ``ChunkEncoder`` and ``threads_in_order`` with the tokenizer loaded once, nothing written."""
    compat = args.compat
    separator = None if compat else "<|endoftext|>"
    size = args.corpus.stat().st_size
    counts = [1, *args.threads]
    with tempfile.TemporaryDirectory() as scratch:
        outputs: dict[int, Path] = {}

        def run(workers: int) -> None:
            outputs[workers] = Path(scratch) / f"w{workers}.bin"
            encode_corpus(
                args.tokenizer, args.corpus, outputs[workers], workers=workers, progress=False,
                compat=compat, separator=separator,
            )  # fmt: skip

        runs = {n: lambda n=n: run(n) for n in counts}
        compare("encode_corpus", runs, args.rounds, {"mb": round(size / 1e6, 1)})
        contents = {outputs[n].read_bytes() for n in counts}
        if len(contents) != 1:
            raise SystemExit("the token files differ between worker counts")
    start = time.perf_counter()
    tok = Tokenizer.load(args.tokenizer, compat=compat)
    load = time.perf_counter() - start
    separator_id = None if separator is None else tok.token_to_id(separator)
    encoder = ChunkEncoder(tok, separator_id, "text", "strict", token_dtype(tok.vocab))

    def phase(workers: int) -> None:
        chunks = iter_chunks(
            args.corpus, tok.special_tokens, 1 << 20, line_cuts=tok.pretokenizer.safe_cuts_hold,
            pretokenizer=tok.pretokenizer,
        )  # fmt: skip
        if workers == 1:
            for chunk in chunks:
                encoder.encode(chunk)
        else:
            for _ in threads_in_order(encoder.encode, chunks, workers):
                pass

    extra = {"mb": round(size / 1e6, 1), "tokenizer_load_seconds": round(load, 2)}
    compare("encode_corpus_encoding_phase", {n: lambda n=n: phase(n) for n in counts}, args.rounds, extra)
    results = {}

    def measured(workers: int) -> None:
        results[workers] = evaluate(tok, args.corpus, separator=separator, workers=workers)

    compare("evaluate", {n: lambda n=n: measured(n) for n in counts}, args.rounds, extra)
    if len({(r.bytes, r.tokens, r.documents) for r in results.values()}) != 1:
        raise SystemExit("the evaluations differ between worker counts")


def bench_stream(args: argparse.Namespace) -> None:
    tok = Tokenizer.load(args.tokenizer)
    lines = args.content.splitlines(keepends=True)
    total = int(args.mb * 1e6)

    def stream() -> Iterator[str]:
        sent = 0
        while sent < total:
            for line in lines:
                sent += len(line)
                yield line

    def rss() -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    start_rss = peak_rss = rss()
    tracemalloc.start()
    start = time.perf_counter()
    ids = tok.encode_iterable(stream())
    count = 0
    while taken := sum(1 for _ in itertools.islice(ids, 1 << 20)):  # ids are counted, never kept
        count += taken
        peak_rss = max(peak_rss, rss())
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    row = {
        "what": "encode_iterable",
        "mb": args.mb,
        "ids": count,
        "seconds": round(seconds, 2),
        "tracemalloc_peak_mb": round(peak / 1e6, 2),
        "rss_growth_mb": round((peak_rss - start_rss) / 1e6, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(row), flush=True)


def checked(args: argparse.Namespace) -> str:
    """Refuse, in one line and before any timing, what would make a mode loop forever or divide by zero:
    an empty text (the documents and the stream repeat it until ``--mb`` MB are filled), a size or count
    below one. Returns the text of ``batch`` and ``stream`` (read once, here)."""
    if args.mb <= 0 and args.mode != "corpus":
        raise SystemExit(f"error: --mb must be above 0, not {args.mb:g}")
    if args.rounds < 1:
        raise SystemExit(f"error: --rounds must be at least 1, not {args.rounds}")
    if any(count < 1 for count in args.threads):
        raise SystemExit(f"error: --threads counts must be at least 1, not {args.threads}")
    if not args.source.exists():
        raise SystemExit(f"error: {args.source} does not exist")
    if args.mode == "corpus":
        return ""
    try:
        content = read_text(args.source)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise SystemExit(f"error: cannot read {args.source}: {exc}") from None
    if not content:
        raise SystemExit(f"error: {args.source} is empty: there is no text to make {args.mode} input from")
    return content


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["batch", "corpus", "stream"])
    parser.add_argument("tokenizer", type=Path)
    parser.add_argument("source", type=Path, help="the text (batch, stream) or corpus (corpus)")
    parser.add_argument("--mb", type=float, default=8.0, help="MB of documents (batch) or of stream")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[2], help="counts compared with 1")
    parser.add_argument("--compat", default=None, help="corpus: the load's compat (official: no separator)")
    args = parser.parse_args()
    args.text = args.corpus = args.source
    args.content = checked(args)
    if args.mode != "stream":
        machine_ceiling()
    {"batch": bench_batch, "corpus": bench_corpus, "stream": bench_stream}[args.mode](args)


if __name__ == "__main__":
    main()
