"""An English-like corpus of any size whose lines are nearly all distinct, like deduplicated web text.

    python benchmarks/make_english_corpus.py OUT --size 1.2G [--seed 0] [--source FILE ...]
        [--heldout HELDOUT.txt]

SuperBPE is trained on deduplicated web text: paragraph-length lines, almost none repeated. Repeating a
small English text would make every stage-2 piece (a run of words between punctuation) repeat too, which is
the easy case; sampling words independently would not be English. So lines are spliced from a real English
text with an order-2 word chain: copy a run of 2–7 consecutive words of the source, then jump to a random
place in the source where the same two words stand and go on copying from there. Every splice point reads
as English locally, and a long run of words between two punctuation marks is almost never copied whole.
Web text also has a long tail of words seen once or twice (typos, names); so the last word of 10% of the
runs is misspelt (two letters swapped, one dropped or doubled), which gives the BPE stage its millions of
rare words.

Source: WikiText-103 (valid + test, ``../shared/data/wikitext103_valid_test.txt.gz``, CC BY-SA, not
vendored), with its tokenisation undone (``" @-@ "`` -> ``"-"``, spaces before punctuation dropped) and
headings left out; any ``--source`` files (plain or gzip text, a paragraph per line) instead. Every 10th
source paragraph is kept out of the chain and written to ``--heldout``: English the tokenizers were not
trained on, for bytes per token.

Lines are 80–2,000 bytes (log-normal, median ~450) and end at a sentence end where one is near; after
about 15% of lines a document ends (``<|endoftext|>`` on a line of its own). The output depends only on the
source, ``--seed`` and ``--size``: blocks of ``BLOCK_LINES`` lines are drawn from their own seeds, in
worker processes, and written in order. The file is written to a temporary name and renamed when whole.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import multiprocessing
import os
import re
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "data" / "wikitext103_valid_test.txt.gz"
EOT = b"<|endoftext|>\n"
BLOCK_LINES = 20_000
DOC_END_RATE = 0.15
RUN_WORDS = (2, 7)
HELDOUT_EVERY = 10
TYPO_RATE = 0.1
_UNITS = {"K": 10**3, "M": 10**6, "G": 10**9}

# WikiText's tokenisation, undone: (pattern, replacement), applied in order.
_DETOKENIZE = [
    (re.compile(r" @(.)@ "), r"\1"),
    (re.compile(r" ([.,;:!?)\]}%])"), r"\1"),
    (re.compile(r"([(\[{$]) "), r"\1"),
    (re.compile(r" (n't|'s|'re|'ve|'m|'ll|'d)\b"), r"\1"),
    (re.compile(r"\" (.*?) \""), r'"\1"'),
]


class CorpusError(ValueError):
    """A bad argument or source: reported as one line."""


def parse_size(text: str) -> int:
    """``1.2G`` -> 1_200_000_000; plain digits are bytes."""
    unit = _UNITS.get(text[-1:].upper())
    try:
        value = int(float(text[:-1]) * unit) if unit else int(text)
    except ValueError:
        raise CorpusError(f"--size {text!r}: expected bytes such as 500M or 1.2G") from None
    if value <= 0:
        raise CorpusError(f"--size {text!r}: must be positive")
    return value


def wikitext_paragraph(raw: str) -> str:
    """A WikiText line as plain text (its tokenisation undone), or "" for a heading or a blank line."""
    line = raw.strip()
    if not line or line.startswith("="):
        return ""
    line = line.replace(" <unk>", "").replace("<unk> ", "")
    for pattern, replacement in _DETOKENIZE:
        line = pattern.sub(replacement, line)
    return line


def read_paragraphs(sources: list[Path]) -> list[str]:
    """Source paragraphs (one per non-empty line), WikiText tokenisation undone, headings left out."""
    paragraphs = []
    for path in sources:
        if not path.is_file():
            raise CorpusError(f"{path}: no such source file")
        opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            paragraphs.extend(p for p in map(wikitext_paragraph, f) if p)
    if not paragraphs:
        raise CorpusError("the sources hold no text")
    return paragraphs


class Chain:
    """The source as words plus, for every place, the other places where the same two words stand."""

    def __init__(self, paragraphs: list[str]) -> None:
        words = " ".join(paragraphs).encode("utf-8").split(b" ")
        words = [w for w in words if w]
        if len(words) < 100:
            raise CorpusError(f"the sources hold {len(words)} words; the chain needs at least 100")
        self.text = b" ".join(words)
        lengths = np.fromiter((len(w) + 1 for w in words), dtype=np.int64, count=len(words))
        self.start = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        self.end = self.start + lengths - 1
        _, ids = np.unique(np.array(words, dtype=object), return_inverse=True)
        ids = ids.astype(np.int64)
        bigram = np.empty(len(words), dtype=np.int64)
        bigram[0] = -1
        bigram[1:] = ids[:-1] * (int(ids.max()) + 1) + ids[1:]
        # Places grouped by bigram: `order[group_start[g]:group_start[g + 1]]` share bigram g.
        self.order = np.argsort(bigram, kind="stable")
        keys, group_of_sorted = np.unique(bigram[self.order], return_inverse=True)
        self.group = np.empty(len(words), dtype=np.int64)
        self.group[self.order] = group_of_sorted
        self.group_start = np.searchsorted(group_of_sorted, np.arange(len(keys) + 1))
        ends = [i + 1 for i, w in enumerate(words[:-1]) if w.endswith((b".", b"!", b"?"))]
        self.sentence_starts = np.array(ends or [0], dtype=np.int64)
        self.words = len(words)


_CHAIN: Chain | None = None


def _init_worker(chain: Chain) -> None:
    global _CHAIN
    _CHAIN = chain


def _sentence_cut(line: bytes, target: int) -> bytes:
    """``line`` cut after the last sentence end past half of ``target``, or whole if there is none."""
    cut = max(line.rfind(b". ", target // 2), line.rfind(b"? ", target // 2), line.rfind(b"! ", target // 2))
    return line[: cut + 1] if cut > 0 else line


def typo(word: bytes, u: float) -> bytes:
    """``word`` misspelt as people do (letters swapped, dropped or doubled), chosen by ``u`` in [0, 1).

    Trailing punctuation stays; a long word may get two slips, so the misspellings rarely repeat.
    """
    core = word.rstrip(b".,;:!?\")'")
    tail = word[len(core) :]
    if len(core) < 4 or not core.isalpha():
        return word
    for slip in range(1 + (len(core) >= 7)):
        digits = int(u * 10**9) // 1000**slip
        k = 1 + digits % (len(core) - 2)
        kind = digits // 7 % 3
        if kind == 0:
            core = core[:k] + core[k + 1 : k + 2] + core[k : k + 1] + core[k + 2 :]
        elif kind == 1:
            core = core[:k] + core[k + 1 :]
        else:
            core = core[:k] + core[k : k + 1] + core[k:]
    return core + tail


def make_block(args: tuple[int, int]) -> bytes:
    """Block ``index`` of the corpus with ``seed``: ``BLOCK_LINES`` lines (and document ends)."""
    seed, index = args
    chain = _CHAIN
    if chain is None:
        raise RuntimeError("make_block runs only after _init_worker")
    rng = np.random.default_rng([seed, index])
    targets = np.clip(rng.lognormal(np.log(450), 0.7, BLOCK_LINES), 80, 2000).astype(np.int64)
    doc_ends = rng.random(BLOCK_LINES) < DOC_END_RATE
    starts = rng.choice(chain.sentence_starts, BLOCK_LINES)
    # Plenty of draws for the runs; refilled if a block needs more.
    runs = rng.integers(RUN_WORDS[0], RUN_WORDS[1] + 1, 1 << 16).tolist()
    jumps = rng.random(1 << 16).tolist()
    typos = rng.random(1 << 16).tolist()
    text, start, end = chain.text, chain.start.tolist(), chain.end.tolist()
    group, group_start, order = chain.group.tolist(), chain.group_start.tolist(), chain.order.tolist()
    last = chain.words - 1
    out: list[bytes] = []
    j = 0
    for target, doc_end, p in zip(targets.tolist(), doc_ends.tolist(), starts.tolist(), strict=True):
        parts: list[bytes] = []
        size = 0
        while size < target:
            if j == len(runs):
                runs = rng.integers(RUN_WORDS[0], RUN_WORDS[1] + 1, 1 << 16).tolist()
                jumps = rng.random(1 << 16).tolist()
                typos = rng.random(1 << 16).tolist()
                j = 0
            e = min(p + runs[j] - 1, last)
            piece = text[start[p] : end[e]]
            if typos[j] < TYPO_RATE:
                piece = text[start[p] : start[e]] + typo(text[start[e] : end[e]], typos[j] / TYPO_RATE)
            parts.append(piece)
            size += len(piece) + 1
            g = group[e]
            lo, hi = group_start[g], group_start[g + 1]
            p = min(order[lo + int(jumps[j] * (hi - lo))] + 1, last)
            j += 1
        out.append(_sentence_cut(b" ".join(parts), target) + b"\n")
        if doc_end:
            out.append(EOT)
    return b"".join(out)


@contextlib.contextmanager
def _block_map(workers: int) -> Iterator[Callable]:
    """``map`` over blocks: in this process for one worker, else in forked worker processes, which
    find the chain in place (pickling it to each would cost more than a block)."""
    if workers == 1:
        yield map
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        yield pool.map


def write_corpus(chain: Chain, out: Path, size: int, seed: int, workers: int) -> int:
    """Write blocks in order until ``size`` bytes, cut at the last line that fits; returns the bytes."""
    tmp = out.with_name(f".{out.name}.tmp")
    written = 0
    _init_worker(chain)
    try:
        with open(tmp, "wb") as f, _block_map(workers) as map_blocks:
            index = 0
            while written < size:
                batch = [(seed, index + i) for i in range(workers * 2)]
                index += len(batch)
                for block in map_blocks(make_block, batch):
                    if written + len(block) >= size:
                        # The last block: cut after its last whole line that fits.
                        cut = block.rfind(b"\n", 0, size - written) + 1
                        if written + cut == 0:
                            first = block.index(b"\n") + 1
                            raise CorpusError(f"--size {size}: below the corpus's first line ({first} bytes)")
                        f.write(block[:cut])
                        written = size
                        break
                    f.write(block)
                    written += len(block)
                print(f"\r{written / 1e9:.2f} / {size / 1e9:.2f} GB", end="", file=sys.stderr, flush=True)
            written = f.tell()
        print(file=sys.stderr)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", default="100M", help="bytes to write: 500M, 1.2G, 10G, ... (default 100M)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--source", type=Path, action="append", help="English text (default: WikiText-103)")
    parser.add_argument("--heldout", type=Path, help="write the held-out source paragraphs here")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    try:
        for path in filter(None, (args.out, args.heldout)):
            if not path.parent.is_dir():
                raise CorpusError(f"{path}: its directory does not exist")
        if args.workers < 1:
            raise CorpusError(f"--workers {args.workers}: must be at least 1")
        size = parse_size(args.size)
        paragraphs = read_paragraphs(args.source or [DEFAULT_SOURCE])
        kept = [p for i, p in enumerate(paragraphs) if i % HELDOUT_EVERY]
        chain = Chain(kept)
        written = write_corpus(chain, args.out, size, args.seed, args.workers)
        if args.heldout:  # after the corpus: a run refused there writes nothing
            heldout = "\n".join(p for i, p in enumerate(paragraphs) if i % HELDOUT_EVERY == 0) + "\n"
            args.heldout.write_text(heldout, encoding="utf-8")
    except CorpusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.out}: {written:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
