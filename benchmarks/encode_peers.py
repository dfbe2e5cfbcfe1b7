"""``python benchmarks/encode_peers.py --data D --official O --code FILE``: encoding against the fastest.

Every contender encodes the same documents with the same vocabulary, side by side in one run, and each
one's ids are compared with a reference before its speed is believed: tiktoken for the byte-level
patterns it implements, HF ``tokenizers`` for the released SuperBPE tokenizer (tiktoken cannot encode
it: its ids are not merge ranks, and its encoder applies merges even to a piece that is itself a
token). A contender whose ids differ anywhere is reported as a mismatch, never with a speed; one that is
not installed, or cannot load a vocabulary, is skipped with the reason.

Contenders and the API each is timed with (its fastest for the job):

* superbpe — ``Tokenizer.encode_array`` per document (a numpy array; ``Tokenizer.encode`` gives the same
  ids as a list); batches through the native engine's ``NativeEncoder.encode_batch`` (flat ids plus
  offsets, no Python object per token).
* gigatoken — ``Tokenizer.encode`` (a numpy array) per document; ``encode_batch`` (an awkward array: one
  flat buffer plus offsets).
* fastokens — ``Tokenizer.encode(text).ids``; ``encode_batch_flat`` (flat buffer plus offsets).
* tiktoken — ``Encoding.encode(text, allowed_special="all")``; ``encode_batch`` (lists; its only batch API).
* HF tokenizers — ``Tokenizer.encode(text, add_special_tokens=False).ids``; ``encode_batch`` (its only
  batch API).

Vocabularies: GPT-2 (``gpt2_vocab.json``/``gpt2_merges.txt`` in ``--data``), cl100k and o200k, and the
released SuperBPE 200K tokenizer (``--official``: its ``vocab.json``/``merges.txt``, encoded as its
authors do: stage-2 pattern over the whole text, merges applied to every piece). tiktoken's own cl100k
and o200k vocabularies download from its blob store at first use; when that fails (no network) the
GPT-2 merges are paired with the cl100k / o200k pattern instead, which keeps what these rows are about,
the pattern's pre-tokenizer cost, and the table says which was used.

Texts: English, short documents of about 140 bytes (consecutive sentences of WikiText-103's
valid+test paragraphs, its tokenisation undone, in order), and code, the whole documents
(``<|endoftext|>`` between them) of a prefix of ``--code`` (20 MB by default).

Each (vocabulary, contender, thread count) runs in a fresh Python process pinned to that many CPUs
(``sched_setaffinity``; Rayon pools size themselves from it, and ``RAYON_NUM_THREADS`` says it too).
Figures are MB of UTF-8 text per wall second. A *first pass* is the
first encode of the texts by a fresh encoder object (piece caches cold; building it is not timed); a
*repeated pass* is the best of ``--repeats`` passes that follow it on the same object. Per-document
encoding is measured with one thread only (every contender's single-text call runs on the calling
thread). The table goes into ``BENCHMARKS.md`` under "Encoding against the fastest encoders", replacing
the section of an earlier run.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe, load_average  # noqa: E402  (benchmarks/ holds scripts, not a package)
from make_english_corpus import wikitext_paragraph  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Encoding against the fastest encoders"
SPECIAL = "<|endoftext|>"
CONTENDERS = ("superbpe", "gigatoken", "fastokens", "tiktoken", "hf")
LABELS = {
    "superbpe": "superbpe",
    "gigatoken": "gigatoken",
    "fastokens": "fastokens",
    "tiktoken": "tiktoken",
    "hf": "HF tokenizers",
}
VOCABS = ("gpt2", "cl100k", "o200k", "superbpe200k")
#: The pre-tokenizer (a name in ``superbpe.core.pretokenize.PATTERNS``) of each vocabulary.
PATTERN_OF = {"gpt2": "gpt2", "cl100k": "cl100k", "o200k": "o200k", "superbpe200k": "superbpe"}
#: tiktoken's name for the official vocabulary of each pattern.
TIKTOKEN_NAME = {"gpt2": "gpt2", "cl100k": "cl100k_base", "o200k": "o200k_base"}
DATASETS = ("english", "code")
ENGLISH_TARGET_BYTES = 140
MB = 1_000_000

# WikiText's tokenisation, undone (as benchmarks/make_english_corpus.py does).
_SENTENCE_END = re.compile(r"(?<=[.!?]) ")


class BenchError(Exception):
    """A usage problem, reported as one line and exit status 2."""


# ---------------------------------------------------------------------------------------------
# Texts
# ---------------------------------------------------------------------------------------------


def english_documents(wikitext: Path, target_bytes: int = ENGLISH_TARGET_BYTES) -> list[str]:
    """Short English documents: consecutive sentences of each paragraph until ~``target_bytes``.

    A document closes once it holds at least 70% of the target, so lengths centre on the target
    without cutting a sentence; the order and the cuts depend on the file alone.
    """
    docs: list[str] = []
    with gzip.open(wikitext, "rt", encoding="utf-8") as f:
        for raw in f:
            line = wikitext_paragraph(raw)
            if not line:
                continue
            current = ""
            for sentence in _SENTENCE_END.split(line):
                current = f"{current} {sentence}" if current else sentence
                if len(current.encode("utf-8")) >= target_bytes * 0.7:
                    docs.append(current)
                    current = ""
            if current:
                docs.append(current)
    if not docs:
        raise BenchError(f"{wikitext}: no English text in it")
    return docs


def code_documents(path: Path, max_bytes: int) -> list[str]:
    """The whole documents (``<|endoftext|>`` between them) within the first ``max_bytes`` of ``path``."""
    with open(path, "rb") as f:
        head = f.read(max_bytes + 1)
    if len(head) > max_bytes:
        cut = head.rfind(SPECIAL.encode("utf-8"), 0, max_bytes)
        if cut == -1:
            raise BenchError(f"{path}: no {SPECIAL} within the first {max_bytes} bytes")
        head = head[:cut]
    docs = [doc for doc in head.decode("utf-8").split(SPECIAL) if doc]
    if not docs:
        raise BenchError(f"{path}: no documents")
    return docs


# ---------------------------------------------------------------------------------------------
# Vocabularies
# ---------------------------------------------------------------------------------------------


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merges a tiktoken rank table implies, in rank order.

    Each multi-byte token is what BPE with the lower-ranked tokens makes of its bytes, so running that
    BPE on the token stops at exactly two parts: its merge.
    """
    merges: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) != 2:
            raise BenchError(f"token {token!r} (rank {rank}) is not a merge of two lower-ranked tokens")
        merges.append((parts[0], parts[1]))
    return merges


@dataclass
class VocabSpec:
    """A prepared vocabulary: a saved superbpe tokenizer directory and how the others load it."""

    name: str
    directory: str  # superbpe manifest + vocab/merges + tokenizer.json (+ tokenizer.tiktoken)
    pattern: str  # superbpe pattern name
    tiktoken_ok: bool  # ids are merge ranks and whole pieces map to their token, as tiktoken does
    reference: str  # contender whose ids are the reference
    source: str  # what the table says about where the vocabulary came from


def prepare_vocabs(names: Sequence[str], data: Path, official: Path | None, workdir: Path) -> list[VocabSpec]:
    """Save each vocabulary as a superbpe tokenizer directory (tokenizer.json and, where tiktoken can
    express it, tokenizer.tiktoken beside our files) that every contender loads."""
    from superbpe import Tokenizer

    specs = []
    gpt2 = None
    for name in names:
        out = workdir / name
        if name == "superbpe200k":
            if official is None:
                raise BenchError("superbpe200k needs --official DIR (the released vocab.json and merges.txt)")
            tok = Tokenizer.load(official, compat="official")
            tok.save(out)
            specs.append(VocabSpec(name, str(out), "superbpe", False, "hf", "released SuperBPE 200K"))
            continue
        official_ranks, why = _official_tiktoken_ranks(name)
        if official_ranks is not None:
            vocab = {rank: token for token, rank in official_ranks.items()}
            tok = Tokenizer(vocab, merges_from_ranks(official_ranks), [], pretokenizer=PATTERN_OF[name])
            source = f"tiktoken's {TIKTOKEN_NAME[name]}"
        else:
            if gpt2 is None:
                gpt2 = Tokenizer.from_files(data / "gpt2_vocab.json", data / "gpt2_merges.txt")
            tok = Tokenizer(gpt2.vocab, gpt2.merges, gpt2.special_tokens, pretokenizer=PATTERN_OF[name])
            source = "GPT-2" if name == "gpt2" else f"GPT-2 merges with the {name} pattern ({why})"
        tok.save(out, tiktoken=True)
        specs.append(VocabSpec(name, str(out), PATTERN_OF[name], True, "tiktoken", source))
    return specs


def _official_tiktoken_ranks(name: str) -> tuple[dict[bytes, int] | None, str]:
    """tiktoken's own cl100k/o200k ranks when it can load them, else None and why not."""
    if name == "gpt2":
        return None, ""
    try:
        import tiktoken
    except ImportError:
        return None, "tiktoken is not installed"
    try:
        return dict(tiktoken.get_encoding(TIKTOKEN_NAME[name])._mergeable_ranks), ""
    except Exception as exc:  # network errors come in many types; any of them means "not here"
        return None, f"tiktoken cannot load {TIKTOKEN_NAME[name]} here: {type(exc).__name__}"


# ---------------------------------------------------------------------------------------------
# Contenders (in the worker process)
# ---------------------------------------------------------------------------------------------

Flat = tuple[Any, Any]  # (uint32 ids, int64 lengths) as numpy arrays


@dataclass
class Contender:
    """How one library loads a vocabulary and encodes: a factory for fresh encoder objects, the
    per-document call, and the batch call (flat ids and per-text lengths)."""

    make: Callable[[], Any]
    one: Callable[[Any], Callable[[str], Any]]
    batch: Callable[[Any, list[str]], Any]
    flatten: Callable[[Any], Flat]
    # What the table should say about how an encoder object runs (None: nothing), so that a
    # figure from a lesser mode (ours on one level with a SuperBPE tokenizer) shows as such.
    describe: Callable[[Any], str | None] = lambda obj: None


def _lengths(offsets: Any) -> Any:
    import numpy as np

    return np.diff(np.asarray(offsets, dtype=np.int64))


def _from_lists(lists: Sequence[Any]) -> Flat:
    import numpy as np

    lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
    flat = (
        np.concatenate([np.asarray(x, dtype=np.uint32) for x in lists]) if lists else np.zeros(0, np.uint32)
    )
    return flat.astype(np.uint32, copy=False), lengths


def contender(kind: str, spec: VocabSpec, threads: int) -> Contender:
    """The adapter of ``kind``; raises ``ImportError``/``BenchError`` when it cannot run this vocabulary."""
    import numpy as np

    directory = Path(spec.directory)
    if kind == "superbpe":
        from superbpe import Tokenizer
        from superbpe.engines.native import NativeEncoder

        def make_superbpe() -> Any:
            tok = Tokenizer.load(directory, engine="native")
            specials = set(tok.special_tokens)
            ordinary = {
                token: i for i, token in tok.vocab.items() if token.decode("utf-8", "replace") not in specials
            }
            core = NativeEncoder(
                ordinary, tok.merges, tok.pretokenizer, workers=threads, whole_pieces=tok.whole_pieces
            )
            return tok, core

        def flatten_superbpe(out: Any) -> Flat:
            ids, ends = out
            return ids.astype(np.uint32, copy=False), _lengths(np.concatenate([[0], ends]))

        def describe_superbpe(o: Any) -> str | None:
            if spec.pattern != "superbpe":
                return None
            return f"encodes on {o[0].encode_levels} level(s) per document, {o[1].levels} in batches"

        return Contender(
            make_superbpe,
            lambda o: o[0].encode_array,
            lambda o, texts: o[1].encode_batch(texts),
            flatten_superbpe,
            describe_superbpe,
        )
    if kind == "gigatoken":
        import gigatoken

        if spec.tiktoken_ok:
            from superbpe import Tokenizer

            saved = Tokenizer.load(directory)
            specials = {s: saved.token_to_id(s) for s in saved.special_tokens}

            def make_giga() -> Any:
                return gigatoken.Tokenizer.from_tiktoken(
                    str(directory / "tokenizer.tiktoken"), pretokenizer=spec.pattern, special_tokens=specials
                )
        else:
            text = (directory / "tokenizer.json").read_text(encoding="utf-8")

            def make_giga() -> Any:
                return gigatoken.Tokenizer.from_json(text)

        def flatten_giga(out: Any) -> Flat:
            layout = out.layout
            return np.asarray(layout.content.data, dtype=np.uint32), _lengths(layout.offsets.data)

        return Contender(
            make_giga,
            lambda t: t.encode,
            lambda t, texts: t.encode_batch(texts, parallel=threads > 1),
            flatten_giga,
        )
    if kind == "fastokens":
        import fastokens

        path = str(directory / "tokenizer.json")

        def flatten_fast(out: Any) -> Flat:
            ids, offsets = out
            return np.frombuffer(ids, dtype="<u4"), _lengths(np.frombuffer(offsets, dtype="<u8"))

        return Contender(
            lambda: fastokens.Tokenizer.from_file(path),
            lambda t: lambda s: t.encode(s).ids,
            lambda t, texts: t.encode_batch_flat(texts),
            flatten_fast,
        )
    if kind == "tiktoken":
        import tiktoken

        if not spec.tiktoken_ok:
            raise BenchError(
                "cannot express this vocabulary (ids are not merge ranks; merges apply inside tokens)"
            )
        from superbpe import Tokenizer
        from superbpe.core.pretokenize import PATTERNS
        from superbpe.formats.tiktoken_files import tiktoken_ranks

        tok = Tokenizer.load(directory)
        ranks = tiktoken_ranks(tok.vocab, tok.special_tokens, tok.merges)
        specials = {s: tok.token_to_id(s) for s in tok.special_tokens}

        def make_tiktoken() -> Any:
            return tiktoken.Encoding(
                spec.name, pat_str=PATTERNS[spec.pattern], mergeable_ranks=ranks, special_tokens=specials
            )

        return Contender(
            make_tiktoken,
            lambda e: lambda s: e.encode(s, allowed_special="all"),
            lambda e, texts: e.encode_batch(texts, num_threads=threads, allowed_special="all"),
            _from_lists,
        )
    if kind == "hf":
        from tokenizers import Tokenizer as HFTokenizer

        path = str(directory / "tokenizer.json")
        return Contender(
            lambda: HFTokenizer.from_file(path),
            lambda t: lambda s: t.encode(s, add_special_tokens=False).ids,
            lambda t, texts: t.encode_batch(texts, add_special_tokens=False),
            lambda out: _from_lists([e.ids for e in out]),
        )
    raise BenchError(f"unknown contender {kind!r}")


def digest(flat: Flat) -> str:
    """One hash of every text's ids (lengths included, so a shifted boundary shows)."""
    import numpy as np

    ids, lengths = flat
    h = hashlib.sha256(np.asarray(lengths, dtype="<i8").tobytes())
    h.update(np.asarray(ids, dtype="<u4").tobytes())
    return h.hexdigest()


def _passes(run: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    """Seconds of the first call, the best of ``repeats`` more, and the first call's result."""
    start = time.perf_counter()
    first = run()
    first_s = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return first_s, best, first


def worker(spec_path: Path) -> dict[str, Any]:
    """Time one contender on one vocabulary at one thread count (this process is already pinned)."""
    job = json.loads(spec_path.read_text(encoding="utf-8"))
    os.sched_setaffinity(0, job["cpus"])
    vocab = VocabSpec(**job["vocab"])
    threads, repeats = job["threads"], job["repeats"]
    texts = json.loads(Path(job["texts"]).read_text(encoding="utf-8"))
    result: dict[str, Any] = {}
    try:
        c = contender(job["kind"], vocab, threads)
        start = time.perf_counter()
        made = c.make()
        result["setup_s"] = time.perf_counter() - start
        result["note"] = c.describe(made)
    except Exception as exc:
        return {"skipped": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".strip()}
    for name in DATASETS:
        docs = texts[name]
        nbytes = sum(len(d.encode("utf-8")) for d in docs)
        row: dict[str, Any] = {"bytes": nbytes, "docs": len(docs)}
        try:
            if threads == 1:
                one = c.one(c.make())
                first, best, out = _passes(lambda one=one, docs=docs: [one(d) for d in docs], repeats)
                row["doc"] = {
                    "first": nbytes / first / MB,
                    "repeated": nbytes / best / MB,
                    "digest": digest(_from_lists(out)),
                }
            obj = c.make()
            first, best, out = _passes(lambda obj=obj, docs=docs: c.batch(obj, docs), repeats)
            row["batch"] = {
                "first": nbytes / first / MB,
                "repeated": nbytes / best / MB,
                "digest": digest(c.flatten(out)),
            }
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        result[name] = row
    return result


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def run_worker(job: dict[str, Any], workdir: Path, timeout: float) -> dict[str, Any]:
    """One worker process, pinned to ``job["threads"]`` CPUs."""
    threads = job["threads"]
    spec_path = workdir / f"job-{job['vocab']['name']}-{job['kind']}-{threads}.json"
    env = dict(
        os.environ,
        RAYON_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="true",
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
    )
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < threads:
        return {"skipped": f"{threads} threads need {threads} CPUs; this process may use {len(cpus)}"}
    job["cpus"] = cpus[:threads]
    spec_path.write_text(json.dumps(job), encoding="utf-8")
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", str(spec_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"skipped": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["no output"]
        return {"skipped": f"worker failed: {lines[-1]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(
    specs: Sequence[VocabSpec],
    kinds: Sequence[str],
    threads: Sequence[int],
    texts_path: Path,
    workdir: Path,
    repeats: int,
    timeout: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Every (vocabulary, contender, threads) result, with each measurement checked against the reference."""
    results: dict[str, Any] = {}
    for spec in specs:
        order = [spec.reference] + [k for k in kinds if k != spec.reference]
        per_vocab: dict[str, Any] = {}
        for kind in order:
            for n in threads:
                job = {
                    "vocab": asdict(spec),
                    "kind": kind,
                    "threads": n,
                    "repeats": repeats,
                    "texts": str(texts_path),
                }
                log(f"{spec.name}: {kind}, {n} thread(s) (load {load_average():.2f})")
                res = run_worker(job, workdir, timeout)
                res["load"] = load_average()
                per_vocab[f"{kind}/{n}"] = res
        _check_ids(spec, per_vocab)
        results[spec.name] = per_vocab
    return results


def _check_ids(spec: VocabSpec, per_vocab: dict[str, Any]) -> None:
    """Mark every measurement whose ids differ from the reference's per-document ids."""
    ref = per_vocab.get(f"{spec.reference}/1", {})
    for name in DATASETS:
        expected = ref.get(name, {}).get("doc", {}).get("digest")
        for res in per_vocab.values():
            row = res.get(name)
            if not isinstance(row, dict):
                continue
            for mode in ("doc", "batch"):
                cell = row.get(mode)
                if cell is None:
                    continue
                if expected is None:
                    cell["check"] = "no reference"
                elif cell["digest"] != expected:
                    cell["check"] = "mismatch"


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------

ROWS = (
    ("per document, 1 thread", "doc", 1),
    ("batch, 1 thread", "batch", 1),
    ("batch, 2 threads", "batch", 2),
)


def _cell(per_vocab: dict[str, Any], kind: str, mode: str, threads: int, which: str) -> str:
    res = per_vocab.get(f"{kind}/{threads}")
    if res is None:
        return "–"
    if "skipped" in res:
        return "skipped"
    parts = []
    for name in DATASETS:
        row = res.get(name, {})
        cell = row.get(mode)
        if cell is None:
            parts.append("error" if "error" in row else "–")
        elif cell.get("check") == "mismatch":
            parts.append("**ids differ**")
        elif cell.get("check") == "no reference":
            parts.append("unchecked")
        else:
            parts.append(f"{cell[which]:.1f}")
    return " / ".join(parts)


def render(
    results: dict[str, Any], specs: Sequence[VocabSpec], kinds: Sequence[str], meta: dict[str, Any]
) -> str:
    """The BENCHMARKS.md section."""
    lines = [
        SECTION,
        "",
        "MB of text per second, **English / code** in each cell: English is "
        f"{meta['english_docs']:,} short documents ({meta['english_bytes'] / MB:.1f} MB, "
        f"{meta['english_bytes'] / meta['english_docs']:.0f} bytes on average, WikiText-103 sentences), "
        "code the "
        f"{meta['code_docs']:,} documents of a {meta['code_bytes'] / MB:.1f} MB prefix of "
        f"{meta['code_name']} (C). "
        "*First* is the first pass of a fresh encoder object (piece caches cold), *repeated* the best of "
        f"{meta['repeats']} passes after it. Each contender runs in its own process pinned to the row's "
        "number of CPUs. Ids are compared with the reference's (tiktoken; HF for SuperBPE 200K) for every "
        "cell: a contender that differs shows **ids differ** instead of a speed. Per-document calls: "
        "superbpe `Tokenizer.encode_array` (a numpy array), gigatoken `encode` (a numpy array), fastokens "
        "`encode(...).ids`, tiktoken `encode`, HF `encode(...).ids`; batches: superbpe "
        "`NativeEncoder.encode_batch`, gigatoken "
        "`encode_batch` and fastokens `encode_batch_flat` (flat buffers plus offsets), tiktoken and HF "
        "`encode_batch` (lists).",
        "",
        f"Measured {meta['date']} ({meta['machine']}); 1-minute load at the start {meta['load_start']:.2f}, "
        f"at the end {meta['load_end']:.2f}; {meta['versions']}.",
        "",
        "```sh",
        meta["command"],
        "```",
        "",
    ]
    for spec in specs:
        per_vocab = results[spec.name]
        present = [k for k in kinds if any(key.startswith(f"{k}/") for key in per_vocab)]
        lines.append(f"**{spec.name}** ({spec.source}; reference {LABELS[spec.reference]})")
        lines.append("")
        lines.append("| | " + " | ".join(LABELS[k] for k in present) + " |")
        lines.append("| --- |" + " --- |" * len(present))
        for title, mode, threads in ROWS:
            if not any(f"{k}/{threads}" in per_vocab for k in present):
                continue
            for which in ("first", "repeated"):
                cells = [_cell(per_vocab, k, mode, threads, which) for k in present]
                lines.append(f"| {title}, {which} pass | " + " | ".join(cells) + " |")
        notes = []
        for k in present:
            described = {
                res["note"] for key, res in per_vocab.items() if key.startswith(f"{k}/") and res.get("note")
            }
            notes.extend(f"{LABELS[k]} {note}" for note in sorted(described))
            for key, res in per_vocab.items():
                if key.startswith(f"{k}/") and "skipped" in res:
                    notes.append(f"{LABELS[k]} ({key.split('/')[1]} thread(s)) skipped: {res['skipped']}")
                    break
            for key, res in per_vocab.items():
                if key.startswith(f"{k}/"):
                    for name in DATASETS:
                        if "error" in res.get(name, {}):
                            notes.append(
                                f"{LABELS[k]} {name} ({key.split('/')[1]} thread(s)): {res[name]['error']}"
                            )
        lines.append("")
        if notes:
            lines.extend(f"- {note}" for note in notes)
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def replace_section(document: str, section: str) -> str:
    """``document`` with its section replaced, or ``section`` appended. The section ends at the next
    ``## `` heading or at its first ``### `` subsection: subsections are written by hand (other
    measurements of encoding) and stay."""
    start = document.find(SECTION + "\n")
    if start == -1:
        return document.rstrip() + "\n\n" + section
    ends = [document.find(h, start + len(SECTION)) for h in ("\n## ", "\n### ")]
    end = min((e for e in ends if e != -1), default=-1)
    tail = document[end + 1 :] if end != -1 else ""
    return document[:start] + section + ("\n" + tail if tail else "")


def _versions(kinds: Sequence[str]) -> str:
    from importlib.metadata import PackageNotFoundError, version

    names = {
        "superbpe": "superbpe",
        "gigatoken": "gigatoken",
        "fastokens": "fastokens",
        "tiktoken": "tiktoken",
        "hf": "tokenizers",
    }
    parts = [f"Python {platform.python_version()}"]
    for k in kinds:
        try:
            parts.append(f"{names[k]} {version(names[k])}")
        except PackageNotFoundError:
            parts.append(f"{names[k]} not installed")
    return ", ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(argv) if argv is not None else sys.argv[1:]
    if argv[:1] == ["--worker"]:
        print(json.dumps(worker(Path(argv[1]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        required=True,
        help="directory with gpt2_vocab.json, gpt2_merges.txt, wikitext103_valid_test.txt.gz",
    )
    parser.add_argument("--official", type=Path, help="the released SuperBPE 200K vocab.json + merges.txt")
    parser.add_argument("--code", type=Path, required=True, help="C source, <|endoftext|> between documents")
    parser.add_argument("--code-mb", type=float, default=20.0, help="prefix of --code to encode (MB)")
    parser.add_argument("--english-docs", type=int, default=0, help="use only the first N English documents")
    parser.add_argument("--vocabs", default=",".join(VOCABS))
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per worker process")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing it")
    parser.add_argument("--json", type=Path, help="also write every raw result here")
    args = parser.parse_args(argv)
    try:
        return _main(args, argv)
    except BenchError as exc:
        print(f"encode_peers: {exc}", file=sys.stderr)
        return 2


def _thread_counts(text: str) -> list[int]:
    try:
        threads = sorted({int(t) for t in text.split(",") if t})
    except ValueError:
        raise BenchError(f"--threads {text}: give whole numbers, comma-separated (1,2)") from None
    if any(n < 1 for n in threads):
        raise BenchError(f"--threads {text}: a thread count is at least 1")
    if 1 not in threads:
        raise BenchError("--threads must include 1 (the reference ids are per-document, one thread)")
    return threads


def _check_inputs(args: argparse.Namespace, vocabs: Sequence[str]) -> None:
    """The files the run reads, and the counts it divides by, checked before the first worker starts."""
    if args.repeats < 1:
        raise BenchError(f"--repeats must be at least 1 (a repeated pass is their best), not {args.repeats}")
    if args.english_docs < 0:
        raise BenchError(f"--english-docs must be 0 (all) or more, not {args.english_docs}")
    needed = ["wikitext103_valid_test.txt.gz"]
    if any(v != "superbpe200k" for v in vocabs):
        needed += ["gpt2_vocab.json", "gpt2_merges.txt"]
    for name in needed:
        if not (args.data / name).is_file():
            raise BenchError(f"--data {args.data}: no {name} in it")
    if not args.code.is_file():
        raise BenchError(f"--code {args.code}: no such file")
    if args.official is not None:
        for name in ("vocab.json", "merges.txt"):
            if not (args.official / name).is_file():
                raise BenchError(f"--official {args.official}: no {name} in it")
    elif "superbpe200k" in vocabs:
        raise BenchError("superbpe200k needs --official DIR (the released vocab.json and merges.txt)")
    if args.json is not None and not args.json.parent.is_dir():
        raise BenchError(f"--json {args.json}: no directory {args.json.parent} to write it in")


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    vocabs = [v for v in args.vocabs.split(",") if v]
    kinds = [k for k in args.contenders.split(",") if k]
    threads = _thread_counts(args.threads)
    for v in vocabs:
        if v not in VOCABS:
            raise BenchError(f"unknown vocabulary {v!r}; known: {', '.join(VOCABS)}")
    for k in kinds:
        if k not in CONTENDERS:
            raise BenchError(f"unknown contender {k!r}; known: {', '.join(CONTENDERS)}")
    _check_inputs(args, vocabs)
    log = lambda msg: print(f"[encode_peers] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    load_start = load_average()
    english = english_documents(args.data / "wikitext103_valid_test.txt.gz")
    if args.english_docs:
        english = english[: args.english_docs]
    code = code_documents(args.code, int(args.code_mb * MB))
    with tempfile.TemporaryDirectory(prefix="encode-peers-") as tmp:
        workdir = Path(tmp)
        texts_path = workdir / "texts.json"
        texts_path.write_text(json.dumps({"english": english, "code": code}), encoding="utf-8")
        specs = prepare_vocabs(vocabs, args.data, args.official, workdir)
        results = measure(specs, kinds, threads, texts_path, workdir, args.repeats, args.timeout, log)
    # Each vocabulary's reference runs whether or not it was asked for (measure() puts it first).
    shown = [k for k in CONTENDERS if k in kinds or any(spec.reference == k for spec in specs)]
    meta = {
        "english_docs": len(english),
        "english_bytes": sum(len(d.encode("utf-8")) for d in english),
        "code_docs": len(code),
        "code_bytes": sum(len(d.encode("utf-8")) for d in code),
        "code_name": args.code.name,
        "repeats": args.repeats,
        "date": time.strftime("%Y-%m-%d"),
        "machine": describe(),
        "load_start": load_start,
        "load_end": load_average(),
        "versions": _versions(shown),
        "command": _command(args, argv),
    }
    section = render(results, specs, shown, meta)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1), encoding="utf-8")
    if args.no_write:
        print(section)
    else:
        doc = args.output.read_text(encoding="utf-8") if args.output.exists() else "# Benchmarks\n"
        args.output.write_text(replace_section(doc, section), encoding="utf-8")
        log(f"wrote {SECTION[3:]!r} into {args.output}")
    return 0


def placeholder_dirs() -> dict[str, Path]:
    """The directories BENCHMARKS.md calls ``$C``, ``$D`` and ``$O``: the environment's ``C``, ``D``, ``O``
    when set, else the ones it names beside the checkout (``../corpora``, ``../shared/data``,
    ``../shared/official``)."""
    beside = ROOT.parent
    defaults = {"C": beside / "corpora", "D": beside / "shared" / "data", "O": beside / "shared" / "official"}
    return {name: Path(os.environ.get(name) or default) for name, default in defaults.items()}


def shown_path(path: Path, dirs: dict[str, Path]) -> str:
    """``path`` as the command shown gives it: under the deepest of ``dirs`` that holds it, that directory's
    placeholder (``$C/code100M.txt``), so that the command reads the same on every machine; else as given."""
    resolved = path.resolve()
    holders = [(name, base.resolve()) for name, base in dirs.items()]
    holders = [(name, base) for name, base in holders if resolved == base or resolved.is_relative_to(base)]
    if not holders:
        return shlex.quote(str(path))
    name, base = max(holders, key=lambda holder: len(holder[1].parts))
    rest = resolved.relative_to(base).as_posix()
    shown = f"${name}" if rest == "." else f"${name}/{rest}"
    return shown if shlex.quote(rest) == rest else f'"{shown}"'


def _command(args: argparse.Namespace, argv: list[str]) -> str:
    """The command that reproduces the run: its own paths (as placeholders where they can be), then the
    options given that are worth repeating."""
    dirs = placeholder_dirs()
    paths = [("--data", args.data), ("--official", args.official), ("--code", args.code)]
    given = "".join(f" {option} {shown_path(path, dirs)}" for option, path in paths if path is not None)
    return "python benchmarks/encode_peers.py" + given + "".join(f" {a}" for a in _shown_options(argv))


def _shown_options(argv: list[str]) -> list[str]:
    """The options worth repeating in the command shown (paths are replaced by $D, $O, $C)."""
    shown, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--data", "--official", "--code", "--output", "--json"):
            skip = "=" not in arg
            continue
        if name == "--no-write":
            continue
        shown.append(arg)
    return shown


if __name__ == "__main__":
    sys.exit(main())
