"""``python benchmarks/stream_bench.py CORPUS``: counting documents from a stream against the same file.

The corpus's paragraphs (text between blank lines) are the documents. The file side writes them once to
a JSON-lines file and times ``superbpe.count(path)``; the stream side times ``superbpe.count`` of a
generator that reads the corpus line by line and yields paragraphs, so the documents are never all in
memory. Each count runs in a fresh process (peak RSS is per process); both must give the same table.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def paragraphs(path: Path) -> Iterator[str]:
    """The corpus's paragraphs, read lazily."""
    lines: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.strip():
                lines.append(line)
            elif lines:
                yield "".join(lines)
                lines = []
    if lines:
        yield "".join(lines)


def count_once(mode: str, source: Path, engine: str, digest: Path) -> None:
    """One count in this process; prints its wall time and peak RSS, writes the table's digest."""
    import hashlib

    import superbpe

    start = time.perf_counter()
    inputs = paragraphs(source) if mode == "stream" else source
    counts = superbpe.count(inputs, ["<|endoftext|>"], engine=engine)
    wall = time.perf_counter() - start
    digest.write_text(hashlib.sha256(counts.to_bytes()).hexdigest())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = {"mode": mode, "engine": engine, "seconds": round(wall, 2), "peak_rss_mib": round(peak)}
    print(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--engines", default="native,python")
    parser.add_argument("--one", nargs=4, metavar=("MODE", "SOURCE", "ENGINE", "DIGEST"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        mode, source, engine, digest = args.one
        count_once(mode, Path(source), engine, Path(digest))
        return
    with tempfile.TemporaryDirectory(prefix="stream-bench-") as tmp:
        jsonl = Path(tmp) / "docs.jsonl"
        with open(jsonl, "w", encoding="utf-8") as out:
            out.writelines(json.dumps({"text": doc}) + "\n" for doc in paragraphs(args.corpus))
        for engine in args.engines.split(","):
            digests = []
            for mode, source in (("file", jsonl), ("stream", args.corpus)):
                digest = Path(tmp) / f"{engine}-{mode}.sha"
                command = [sys.executable, __file__, "x", "--one", mode, str(source), engine, str(digest)]
                subprocess.run(command, check=True)
                digests.append(digest.read_text())
            if digests[0] != digests[1]:
                raise SystemExit(f"{engine}: the stream's counts differ from the file's")


if __name__ == "__main__":
    main()
