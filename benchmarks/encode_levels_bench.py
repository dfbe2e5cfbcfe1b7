"""``python benchmarks/encode_levels_bench.py TOKENIZER_DIR --english TEXT --code TEXT``: encode documents.

Encodes many short documents with a SuperBPE tokenizer (the released 180K->200K one, read as
``compat="official"`` reads it) and compares our encoder on two levels and on one with HF
``tokenizers`` and fastokens (when installed), each loading the same files. Every contender runs in
a fresh process, one thread, several passes over the documents: the first pass starts from a
fresh encoder (no cache warm), the later ones show a warm encoder. The ids must equal HF's.

Documents: ``--english`` (plain or gzip text; each line cut at sentence ends ``" . "`` and packed
into documents of about ``--doc-bytes``, like the short entries of a dictionary) and ``--code``
(the first ``--code-bytes`` of a corpus whose documents are separated by ``<|endoftext|>``).

Contenders (``--only`` picks some): ``ours-docs`` (``Tokenizer.encode`` per document),
``ours-1level-docs`` (the same encoder forced to one level), ``ours-batch`` (``encode_batch`` of all
documents on one thread), ``hf-docs``, ``hf-batch``, ``fastokens-docs``, ``fastokens-batch``
(``encode_batch_flat``). MB/s are bytes of text per second of process CPU time (the machine may be
shared, so wall time is reported too).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SPECIAL = "<|endoftext|>"
CONTENDERS = (
    "ours-docs",
    "ours-1level-docs",
    "ours-batch",
    "hf-docs",
    "hf-batch",
    "fastokens-docs",
    "fastokens-batch",
)
ONE_THREAD = {"RAYON_NUM_THREADS": "1", "RAYON_RS_NUM_CPUS": "1", "TOKENIZERS_PARALLELISM": "false"}


def read_text(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="") as handle:
        return handle.read()


def english_documents(text: str, doc_bytes: int) -> list[str]:
    """Each line cut after its sentences (``" . "``) and packed into documents of about ``doc_bytes``."""
    docs: list[str] = []
    for line in text.splitlines(keepends=True):
        current = ""
        for sentence in line.split(" . "):
            current = f"{current} . {sentence}" if current else sentence
            if len(current.encode("utf-8")) >= doc_bytes:
                docs.append(current)
                current = ""
        if current.strip():
            docs.append(current)
    return docs


def code_documents(text: str, max_bytes: int) -> list[str]:
    """Whole documents (between ``<|endoftext|>``) of the first ``max_bytes`` or so."""
    docs: list[str] = []
    size = 0
    for doc in text.split(SPECIAL):
        if size >= max_bytes:
            break
        if doc:
            docs.append(doc)
            size += len(doc.encode("utf-8"))
    return docs


def _ours(tokenizer_dir: Path, two_level: bool) -> Any:
    from superbpe.core.compat import encoding_for
    from superbpe.engines.native import NativeEncoder
    from superbpe.formats.gpt2 import read_merges, read_vocab

    vocab = read_vocab(tokenizer_dir / "vocab.json")
    merges = read_merges(tokenizer_dir / "merges.txt", vocab)
    pretokenizer, whole_pieces = encoding_for("official")
    ids = {token: token_id for token_id, token in vocab.items()}
    return NativeEncoder(ids, merges, pretokenizer, workers=1, whole_pieces=whole_pieces, two_level=two_level)


def _encoder(name: str, tokenizer_dir: Path, hf_json: Path) -> tuple[Callable[[list[str]], list[Any]], str]:
    """The contender's encode-all-documents function and a note on what it runs."""
    if name == "ours-docs":
        from superbpe import Tokenizer

        tok = Tokenizer.load(tokenizer_dir, compat="official")
        return (lambda docs: [tok.encode(d) for d in docs]), f"levels {tok.encode_levels}"
    if name in ("ours-1level-docs", "ours-batch"):
        enc = _ours(tokenizer_dir, two_level=name == "ours-batch")
        note = f"levels {enc.levels} {enc.levels_reason}".strip()
        if name == "ours-batch":
            return (lambda docs: [enc.encode_batch(docs)]), note
        return (lambda docs: [enc.encode_ordinary(d) for d in docs]), note
    if name.startswith("hf-"):
        import tokenizers

        hf = tokenizers.Tokenizer.from_file(str(hf_json))
        if name == "hf-batch":
            return (lambda docs: [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]), "batch"
        return (lambda docs: [hf.encode(d, add_special_tokens=False).ids for d in docs]), "tokenizers"
    import fastokens  # optional: only this contender needs it

    fast = fastokens.Tokenizer.from_file(str(hf_json))
    if name == "fastokens-batch":
        return (lambda docs: [fast.encode_batch_flat(docs)]), "encode_batch_flat"
    return (lambda docs: [fast.encode(d).ids for d in docs]), "encode"


def _digest(name: str, results: list[Any]) -> str:
    """SHA-256 of all ids as little-endian uint32, whatever form the contender returned them in."""
    import numpy as np

    h = hashlib.sha256()
    for item in results:
        if name == "ours-batch":
            h.update(np.asarray(item[0], dtype="<u4").tobytes())
        elif name == "fastokens-batch":
            h.update(item[0])
        else:
            h.update(np.asarray(item, dtype="<u4").tobytes())
    return h.hexdigest()


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    docs: list[str] = json.loads(Path(spec["docs"]).read_text(encoding="utf-8"))
    size = sum(len(d.encode("utf-8")) for d in docs)
    start = time.perf_counter()
    encode, note = _encoder(spec["name"], Path(spec["tokenizer"]), Path(spec["hf_json"]))
    setup = time.perf_counter() - start
    passes = []
    digests = set()
    for _ in range(spec["passes"]):
        wall, cpu = time.perf_counter(), time.process_time()
        results = encode(docs)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        passes.append({"wall_s": wall, "cpu_s": cpu, "mb_s": size / cpu / 1e6 if cpu else None})
        digests.add(_digest(spec["name"], results))
    return {"name": spec["name"], "note": note, "bytes": size, "docs": len(docs), "setup_s": setup,
            "passes": passes, "digest": digests.pop() if len(digests) == 1 else "passes differ"}


def write_hf_json(tokenizer_dir: Path, out: Path) -> Path:
    """The tokenizer as ``tokenizer.json`` (stage-2 split + ByteLevel, as the official encoder runs it)."""
    from superbpe import Tokenizer

    Tokenizer.load(tokenizer_dir, compat="official").save(out)
    return out / "tokenizer.json"


def documents(args: argparse.Namespace) -> dict[str, list[str]]:
    """The English and code documents, or a one-line exit on what would give no figure or a made-up one:
    a missing or empty input, no pass to time, a size below one byte."""
    if args.passes < 1:
        raise SystemExit(f"error: --passes must be at least 1 (the first pass; more give the repeated one), "
                         f"not {args.passes}")
    for option, value in (("--doc-bytes", args.doc_bytes), ("--code-bytes", args.code_bytes)):
        if value < 1:
            raise SystemExit(f"error: {option} must be at least 1, not {value}")
    for name in ("vocab.json", "merges.txt"):
        if not (args.tokenizer / name).is_file():
            raise SystemExit(f"error: {args.tokenizer}: no {name} in it")
    if args.json is not None and not args.json.parent.is_dir():
        raise SystemExit(f"error: --json {args.json}: no directory {args.json.parent} to write it in")
    texts = {}
    for option, path in (("--english", args.english), ("--code", args.code)):
        try:
            texts[option] = read_text(path)
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise SystemExit(f"error: {option} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    corpora = {
        "english": english_documents(texts["--english"], args.doc_bytes),
        "code": code_documents(texts["--code"][: 2 * args.code_bytes], args.code_bytes),
    }
    for corpus, docs in corpora.items():
        if not docs:
            raise SystemExit(f"error: --{corpus} {getattr(args, corpus)}: no documents in it")
    return corpora


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokenizer", type=Path, help="directory of official vocab.json + merges.txt")
    parser.add_argument("--english", type=Path, required=True)
    parser.add_argument("--code", type=Path, required=True)
    parser.add_argument("--doc-bytes", type=int, default=140)
    parser.add_argument("--code-bytes", type=int, default=20_000_000)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--json", type=Path, help="write the report here too")
    parser.add_argument("--_worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._worker:
        print(json.dumps(worker(json.loads(args._worker))))
        return 0
    corpora = documents(args)
    report: dict[str, Any] = {"load_before": os.getloadavg(), "corpora": {}}
    with tempfile.TemporaryDirectory() as tmp:
        hf_json = write_hf_json(args.tokenizer, Path(tmp) / "tok")
        for corpus, docs in corpora.items():
            path = Path(tmp) / f"{corpus}.json"
            path.write_text(json.dumps(docs), encoding="utf-8")
            rows = []
            for name in args.only:
                spec = {"name": name, "docs": str(path), "tokenizer": str(args.tokenizer.resolve()),
                        "hf_json": str(hf_json), "passes": args.passes}
                env = {**os.environ, **ONE_THREAD}
                done = subprocess.run([sys.executable, __file__, str(args.tokenizer), "--english", "-",
                                       "--code", "-", "--_worker", json.dumps(spec)],
                                      capture_output=True, text=True, env=env, check=False)
                if done.returncode != 0:
                    rows.append({"name": name, "error": done.stderr.strip().splitlines()[-1:]})
                else:
                    rows.append(json.loads(done.stdout))
            report["corpora"][corpus] = rows
            _print(corpus, rows)
    report["load_after"] = os.getloadavg()
    print(f"load average before {report['load_before']}, after {report['load_after']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0


def _figure(mb_s: float | None) -> str:
    """MB/s to one decimal, or a dash where there is no figure: one pass has no repeated one, and a pass
    shorter than the CPU clock's tick has no speed."""
    return "–" if mb_s is None else f"{mb_s:.1f}"


def _print(corpus: str, rows: list[dict[str, Any]]) -> None:
    hf_rows = [r for r in rows if r.get("name", "").startswith("hf-") and "digest" in r]
    reference = hf_rows[0]["digest"] if hf_rows else None
    first = next((r for r in rows if "bytes" in r), {})
    print(f"\n{corpus}: {first.get('docs')} documents, {first.get('bytes')} bytes")
    head = f"{'first MB/s':>10} {'repeat MB/s':>11} {'first wall s':>12} {'setup s':>8}"
    print(f"{'contender':18} {head}  ids  note")
    for row in rows:
        if "error" in row:
            print(f"{row['name']:18} failed: {row['error']}")
            continue
        mbs = [p["mb_s"] for p in row["passes"]]
        repeated = [mb for mb in mbs[1:] if mb is not None]
        same = "?" if reference is None else ("=HF" if row["digest"] == reference else "DIFF")
        print(f"{row['name']:18} {_figure(mbs[0]):>10} {_figure(max(repeated, default=None)):>11} "
              f"{row['passes'][0]['wall_s']:12.2f} {row['setup_s']:8.1f}  {same:4} {row['note']}")


if __name__ == "__main__":
    sys.exit(main())
