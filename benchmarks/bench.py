"""``python benchmarks/bench.py CORPUS``: our engines vs HF ``tokenizers`` vs ``tiktoken``, in one run.

Needs the ``bench`` extra (``pip install "superbpe[bench]"``: psutil, HF tokenizers, tiktoken); it lives
outside the package so that an install of superbpe does not pull in what only benchmarking needs.

Three comparisons, each contender in its own fresh Python process:

* **train** — ``superbpe.count`` + ``superbpe.train_bpe`` per engine vs the HF BPE trainer configured
  the same way (byte-level, the same split regex with isolated semantics, same vocab size, the
  ``<|endoftext|>`` special, all 256 bytes as the initial alphabet).
* **encode** — the GPT-2 vocabulary and merges (``gpt2_vocab.json``, ``gpt2_merges.txt`` in ``--gpt2-dir``
  or ``$SUPERBPE_GPT2_DIR``) loaded into tiktoken, HF and ``superbpe.Tokenizer``; each encodes the corpus
  single-threaded and the ids must agree.
* **runs** — whole training runs as ``superbpe-train`` makes them (the shipped configs composed with
  Hydra's compose API, then ``superbpe.training.run.run_training``; cache off, checkpoints on):
  ``schedule=bpe`` against ``schedule=superbpe`` at ``--transition``, per engine, and the SuperBPE/BPE time
  ratio. HF has no SuperBPE trainer, so this one is ours against ourselves.

Why one process per contender: peak RSS is a per-process high-water mark, so a contender measured in
a process that already ran another one would inherit its peak. The driver samples the RSS of the
whole process tree (counting workers included) and the worker reports its own kernel high-water mark
(``VmHWM``; ``ru_maxrss`` would carry the driver's peak over fork and exec).
Wall time starts after the imports (interpreter and library start-up are excluded) and includes
reading the corpus; building the encoders from files is reported separately as ``setup``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, load_average  # noqa: E402  (benchmarks/ holds scripts, not a package)

SPECIAL = "<|endoftext|>"
GPT2_EOT_ID = 50256
BLOCK_CHARS = 1 << 20
RSS_SAMPLE_SECONDS = 0.02
MIB = 1 << 20
MB = 1_000_000


class BenchError(Exception):
    """A usage problem, reported as one line and exit status 2."""


# ---------------------------------------------------------------------------------------------
# Shared helpers (driver and workers)
# ---------------------------------------------------------------------------------------------


def load_gpt2(gpt2_dir: Path) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """GPT-2's vocabulary (id -> bytes, ``<|endoftext|>`` included) and merges, via the package's readers."""
    from superbpe.formats.gpt2 import read_merges, read_vocab

    vocab = read_vocab(gpt2_dir / "gpt2_vocab.json", [SPECIAL])
    return vocab, read_merges(gpt2_dir / "gpt2_merges.txt", vocab)


def iter_documents(path: Path, block_chars: int = BLOCK_CHARS) -> Iterator[str]:
    """The texts between ``<|endoftext|>`` tokens, read a block at a time.

    Every contender gets exactly these texts, so HF and tiktoken see the same special-token
    boundaries our engines cut at (HF's trainer would otherwise learn merges inside
    ``<|endoftext|>``). A document longer than a block is cut at a safe cut, which by the design
    contract leaves every piece, and therefore every id, unchanged; memory stays bounded.
    """
    from superbpe.core.pretokenize import last_safe_cut

    with open(path, encoding="utf-8", newline="") as stream:
        buf = ""
        while True:
            block = stream.read(block_chars)
            parts = (buf + block).split(SPECIAL)
            yield from (doc for doc in parts[:-1] if doc)
            buf = parts[-1]
            if not block:
                if buf:
                    yield buf
                return
            if len(buf) > block_chars and (cut := last_safe_cut(buf)) > 0:
                yield buf[:cut]
                buf = buf[cut:]


def prefix_at_document_boundary(data: bytes, max_bytes: int) -> bytes:
    """The longest prefix of ``data`` within ``max_bytes`` that ends a document.

    A document ends right after ``<|endoftext|>``; with no special in range the prefix ends after
    the last newline instead, so the prefix is always valid UTF-8 and never cuts a piece.
    """
    if len(data) <= max_bytes:
        return data
    head = data[:max_bytes]
    special = SPECIAL.encode("utf-8")
    pos = head.rfind(special)
    if pos != -1:
        return head[: pos + len(special)]
    pos = head.rfind(b"\n")
    if pos == -1:
        raise BenchError(f"no document boundary (<|endoftext|> or newline) in the first {max_bytes} bytes")
    return head[: pos + 1]


# ---------------------------------------------------------------------------------------------
# Workers: one contender each, run in a fresh process (``--_worker SPEC``)
# ---------------------------------------------------------------------------------------------


@dataclass
class WorkerSpec:
    """Everything a worker process needs; travels as JSON on its command line."""

    task: str  # "train" | "encode" | "runs"
    kind: str  # "superbpe" | "hf" | "tiktoken"
    engine: str | None
    corpus: str
    vocab: int
    pattern: str
    threads: int | None
    gpt2_dir: str
    out: str
    ids_out: str | None = None
    schedule: str | None = None  # runs: "bpe" | "superbpe"
    transition: float | None = None  # runs: the superbpe schedule's transition


class _Clock:
    """Wall and CPU time (this process plus waited-for children) of one timed region."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = _cpu_seconds()

    def stop(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, _cpu_seconds() - self.cpu


def _cpu_seconds() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _hf_pretokenizer(pattern: str, line_units: bool) -> Any:
    """The HF pre-tokenizer equivalent to our isolated split (as ``superbpe.formats.hf`` writes it)."""
    from tokenizers import Regex, pre_tokenizers

    steps = [
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
    if line_units:
        steps.insert(0, pre_tokenizers.Split("\n", behavior="merged_with_previous"))
    return pre_tokenizers.Sequence(steps)


def _train_superbpe(spec: WorkerSpec) -> dict[str, Any]:
    from superbpe.api import train as api
    from superbpe.engines.interface import get_engine

    engine = get_engine(spec.engine or "python")
    clock = _Clock()
    counts = api.count(spec.corpus, [SPECIAL], pretokenizer=spec.pattern, engine=engine, workers=spec.threads)
    count_wall, count_cpu = clock.stop()
    _, merges = api.train_bpe(counts, spec.vocab, [SPECIAL], engine=engine)
    wall, cpu = clock.stop()
    phases = {"count_s": count_wall, "count_cpu_s": count_cpu, "train_s": wall - count_wall,
              "train_cpu_s": cpu - count_cpu}
    return {"wall_s": wall, "cpu_s": cpu, "phases": phases, "distinct_pieces": len(counts),
            "merges": [[a.hex(), b.hex()] for a, b in merges]}


def _run_schedule(spec: WorkerSpec) -> dict[str, Any]:
    """One whole training run, composed from ``conf/`` exactly as ``scripts/train.py`` would compose it."""
    from hydra import compose, initialize_config_dir

    from superbpe.cli import config_dir
    from superbpe.training.config import TrainConfig, register_configs, to_dataclass
    from superbpe.training.run import run_training

    conf = config_dir()
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=Path(spec.out).parent))
    overrides = [f"data.paths=[{spec.corpus}]", f"vocab_size={spec.vocab}", f"engine={spec.engine}",
                 f"schedule={spec.schedule}", "cache_dir=null", "progress=false", f"output_dir={run_dir}"]
    if spec.schedule == "superbpe":
        overrides.append(f"schedule.transition={spec.transition}")
    else:
        overrides.append(f"pretokenizer={spec.pattern}")
    if spec.threads is not None:
        overrides.append(f"workers={spec.threads}")
    register_configs()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = to_dataclass(compose("train", overrides=overrides), TrainConfig)
    clock = _Clock()
    result = run_training(cfg)
    wall, cpu = clock.stop()
    stages = [{"name": s["name"], "pattern": s.get("pretokenizer", {}).get("name"), "merges": s["merges"],
               "seconds": s["seconds"]} for s in result.metrics["stages"]]
    return {"wall_s": wall, "cpu_s": cpu, "schedule": spec.schedule, "stages": stages,
            "num_merges": len(result.merges), "overrides": overrides[1:]}


def _train_hf(spec: WorkerSpec) -> dict[str, Any]:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from superbpe.core.pretokenize import get_pretokenizer

    pre = get_pretokenizer(spec.pattern)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = _hf_pretokenizer(pre.pattern, pre.line_units)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab,
        show_progress=False,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    clock = _Clock()
    tokenizer.train_from_iterator(iter_documents(Path(spec.corpus)), trainer)
    wall, cpu = clock.stop()
    from superbpe.core.byte_table import token_str_to_bytes

    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    pairs = [m.split(" ") if isinstance(m, str) else m for m in merges]
    decoded = [[token_str_to_bytes(a).hex(), token_str_to_bytes(b).hex()] for a, b in pairs]
    return {"wall_s": wall, "cpu_s": cpu, "merges": decoded}


def _gpt2_encoder(spec: WorkerSpec) -> Any:
    """A function ``str -> list[int]`` for the contender, built from the GPT-2 files."""
    from superbpe.core.pretokenize import PATTERNS

    gpt2_dir = Path(spec.gpt2_dir)
    if spec.kind == "tiktoken":
        import tiktoken

        vocab, _ = load_gpt2(gpt2_dir)
        ranks = {token: i for i, token in vocab.items() if i < GPT2_EOT_ID}
        enc = tiktoken.Encoding(name="gpt2-local", pat_str=PATTERNS["gpt2"], mergeable_ranks=ranks,
                                special_tokens={SPECIAL: GPT2_EOT_ID})
        return enc.encode_ordinary
    if spec.kind == "hf":
        from tokenizers import Tokenizer, decoders, models

        model = models.BPE.from_file(str(gpt2_dir / "gpt2_vocab.json"), str(gpt2_dir / "gpt2_merges.txt"),
                                     ignore_merges=True)
        tokenizer = Tokenizer(model)
        tokenizer.pre_tokenizer = _hf_pretokenizer(PATTERNS["gpt2"], False)
        tokenizer.decoder = decoders.ByteLevel()
        return lambda text: tokenizer.encode(text, add_special_tokens=False).ids
    from superbpe.api.tokenizer import Tokenizer as OurTokenizer

    vocab, merges = load_gpt2(gpt2_dir)
    ours = OurTokenizer(vocab, merges, [SPECIAL], pretokenizer="gpt2", engine=spec.engine or "python")
    return ours.encode_ordinary


def _encode(spec: WorkerSpec) -> dict[str, Any]:
    """Encode every document; ids go to a flat uint32 file (written after the clock stops)."""
    clock = _Clock()
    encode = _gpt2_encoder(spec)
    setup_s, _ = clock.stop()
    ids = array("I")
    clock = _Clock()
    for doc in iter_documents(Path(spec.corpus)):
        ids.extend(encode(doc))
    wall, cpu = clock.stop()
    if spec.ids_out:
        with open(spec.ids_out, "wb") as out:
            ids.tofile(out)
    return {"wall_s": wall, "cpu_s": cpu, "setup_s": setup_s, "tokens": len(ids)}


def _preload(spec: WorkerSpec) -> None:
    """Import what the contender needs before the clock starts: start-up is not what we measure."""
    if spec.kind == "superbpe":
        import superbpe.api.train  # noqa: F401
        from superbpe.engines.interface import get_engine

        get_engine(spec.engine or "python")
        if spec.task == "encode":
            import superbpe.api.tokenizer  # noqa: F401
        if spec.task == "runs":
            import hydra  # noqa: F401

            import superbpe.training.run  # noqa: F401
    elif spec.kind == "hf":
        import tokenizers  # noqa: F401
    else:
        import tiktoken  # noqa: F401
    import superbpe.core.pretokenize  # noqa: F401


def run_worker(spec_json: str) -> int:
    """Entry point of a worker process: run one contender, write its result JSON to ``spec.out``."""
    spec = WorkerSpec(**json.loads(spec_json))
    try:
        _preload(spec)
        if spec.task == "train":
            result = _train_superbpe(spec) if spec.kind == "superbpe" else _train_hf(spec)
        elif spec.task == "runs":
            result = _run_schedule(spec)
        else:
            result = _encode(spec)
    except Exception as exc:  # the driver reports any contender failure as one line
        result = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    result["self_peak_rss"] = _self_peak_rss()
    Path(spec.out).write_text(json.dumps(result), encoding="utf-8")
    return 0


def _self_peak_rss() -> int:
    from superbpe.core.util import peak_rss_bytes  # VmHWM: ru_maxrss would include the driver's peak

    return peak_rss_bytes()


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


@dataclass
class Contender:
    task: str
    kind: str
    engine: str | None = None
    schedule: str | None = None

    @property
    def name(self) -> str:
        if self.kind == "superbpe":
            return f"superbpe[{self.engine}]" + (f" {self.schedule}" if self.schedule else "")
        return "hf-tokenizers" if self.kind == "hf" else "tiktoken"


@dataclass
class Outcome:
    """One contender's measurements (or its error), as the tables and the JSON show them."""

    task: str
    name: str
    kind: str
    engine: str | None
    wall_s: float | None = None
    cpu_s: float | None = None
    mb_s: float | None = None
    peak_rss_mib: float | None = None
    self_peak_rss_mib: float | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def measure(contender: Contender, spec: WorkerSpec, env: dict[str, str]) -> tuple[Outcome, dict[str, Any]]:
    """Run one contender in a fresh process while sampling its process tree's total RSS."""
    import psutil

    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", json.dumps(asdict(spec))]
    load_at_start = load_average()
    Path(spec.out).unlink(missing_ok=True)  # never read a result left by an earlier run
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        tree_peak = _sample_tree_rss(psutil.Process(proc.pid), proc)
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace").strip()
    outcome = Outcome(contender.task, contender.name, contender.kind, contender.engine)
    try:
        result = json.loads(Path(spec.out).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        last = stderr.splitlines()[-1] if stderr else f"exit status {proc.returncode}"
        outcome.error = f"worker died: {last}"
        return outcome, {}
    outcome.self_peak_rss_mib = result.pop("self_peak_rss") / MIB
    outcome.peak_rss_mib = max(tree_peak / MIB, outcome.self_peak_rss_mib)
    outcome.error = result.pop("error", None)
    result["load_avg_at_start"] = load_at_start
    if outcome.error is None:
        outcome.wall_s = result.pop("wall_s")
        outcome.cpu_s = result.pop("cpu_s")
    return outcome, result


def _sample_tree_rss(root: Any, proc: subprocess.Popen[bytes]) -> int:
    """Highest total RSS of ``root`` and its descendants seen until the process exits."""
    import psutil

    peak = 0
    while proc.poll() is None:
        total = 0
        try:
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            members = []
        for member in members:
            with contextlib.suppress(psutil.Error):
                total += member.memory_info().rss
        peak = max(peak, total)
        time.sleep(RSS_SAMPLE_SECONDS)
    return peak


def worker_env(task: str, threads: int | None) -> dict[str, str]:
    """Environment for a worker (the installed package, as the driver imports it); encoding on one thread."""
    env = dict(os.environ)
    env["TOKENIZERS_PARALLELISM"] = "false" if task == "encode" else "true"
    if task == "encode":
        env["RAYON_NUM_THREADS"] = "1"
    elif threads is not None:
        env["RAYON_NUM_THREADS"] = str(threads)
    return env


def plan(args: argparse.Namespace, engines: Sequence[str]) -> list[Contender]:
    """The contenders to run, in order: ours per engine, then HF, then tiktoken."""
    contenders: list[Contender] = []
    if args.only in (None, "train"):
        contenders += [Contender("train", "superbpe", e) for e in engines]
        contenders += [] if args.skip_hf else [Contender("train", "hf")]
    if args.only in (None, "encode"):
        contenders += [Contender("encode", "superbpe", e) for e in engines]
        contenders += [] if args.skip_hf else [Contender("encode", "hf")]
        contenders += [] if args.skip_tiktoken else [Contender("encode", "tiktoken")]
    if args.only in (None, "runs"):
        contenders += [Contender("runs", "superbpe", e, s) for e in engines for s in ("bpe", "superbpe")]
    return contenders


def run_all(args: argparse.Namespace, corpus: Path, engines: Sequence[str], workdir: Path) -> list[Outcome]:
    """Measure every contender and attach the cross-contender checks."""
    size = corpus.stat().st_size
    contenders = plan(args, engines)
    specs = []
    for i, contender in enumerate(contenders):
        spec = WorkerSpec(contender.task, contender.kind, contender.engine, str(corpus), args.vocab,
                          args.pattern, args.threads, str(args.gpt2_dir), str(workdir / f"result{i}.json"),
                          schedule=contender.schedule, transition=args.transition)
        if contender.task == "encode":
            spec.ids_out = str(workdir / f"ids{i}.u32")
        specs.append(spec)
    outcomes: list[Outcome] = []
    merges: dict[str, list[list[str]]] = {}
    ids_files: dict[str, Path] = {}
    for contender, spec, (outcome, result) in zip(contenders, specs, measure_best(args, contenders, specs),
                                                  strict=True):
        if outcome.wall_s:
            outcome.mb_s = size / MB / outcome.wall_s
        if "merges" in result and contender.task == "train":
            merges[contender.name] = result.pop("merges")
            result["num_merges"] = len(merges[contender.name])
        if outcome.error is None and spec.ids_out:
            ids_files[contender.name] = Path(spec.ids_out)
        outcome.extra = result
        outcomes.append(outcome)
    compare_merges(outcomes, merges)
    compare_ids(outcomes, ids_files)
    return outcomes


def measure_best(
    args: argparse.Namespace, contenders: Sequence[Contender], specs: Sequence[WorkerSpec]
) -> list[tuple[Outcome, dict]]:
    """Run every contender ``--repeat`` times, in rounds, and keep each one's fastest run.

    Why the minimum: on a shared machine other load only ever adds time, so the fastest run is
    the closest to the contender's own cost. Why rounds (each contender once, then again): this
    machine's speed drifts over minutes, and ratios between contenders are only fair if each saw
    the same stretch of time. All wall times are kept in ``runs_wall_s``.
    """
    best: list[tuple[Outcome, dict] | None] = [None] * len(contenders)
    walls: list[list[float]] = [[] for _ in contenders]
    failed: set[int] = set()
    for run in range(args.repeat):
        for i, (contender, spec) in enumerate(zip(contenders, specs, strict=True)):
            if i in failed:
                continue
            _progress(args, f"running {contender.task} {contender.name} (run {run + 1}/{args.repeat}) ...")
            outcome, result = measure(contender, spec, worker_env(contender.task, args.threads))
            _progress(args, f"  {_status(outcome)}")
            if outcome.error is not None:
                best[i] = (outcome, result)
                failed.add(i)
                continue
            walls[i].append(outcome.wall_s or 0.0)
            current = best[i]
            if current is None or (outcome.wall_s or 0.0) < (current[0].wall_s or 0.0):
                best[i] = (outcome, result)
    results = []
    for pair, times in zip(best, walls, strict=True):
        assert pair is not None
        if pair[0].error is None:
            pair[1]["runs_wall_s"] = times
        results.append(pair)
    return results


def _progress(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(message, file=sys.stderr, flush=True)


def _status(outcome: Outcome) -> str:
    if outcome.error:
        return f"failed: {outcome.error}"
    return f"{outcome.wall_s:.3f} s, peak RSS {outcome.peak_rss_mib:.0f} MiB"


def leading_agreement(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many merges the two lists share before the first difference."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def compare_merges(outcomes: list[Outcome], merges: dict[str, list[list[str]]]) -> None:
    """Record, per engine, agreement with HF (reported only: tie-breaks differ) and between engines."""
    ours = [o for o in outcomes if o.task == "train" and o.kind == "superbpe" and o.name in merges]
    hf = merges.get("hf-tokenizers")
    reference = merges[ours[0].name] if ours else None
    for outcome in ours:
        mine = merges[outcome.name]
        if hf is not None:
            same = leading_agreement(mine, hf)
            outcome.extra["merges_leading_equal_hf"] = same
            if same < min(len(mine), len(hf)):
                outcome.extra["first_difference_vs_hf"] = {
                    "index": same, "ours": _show_merge(mine[same]), "hf": _show_merge(hf[same])}
            outcome.extra["merges_shared_with_hf"] = len({tuple(m) for m in mine} & {tuple(m) for m in hf})
        if outcome is not ours[0]:
            outcome.extra["merges_equal_to"] = ours[0].name
            outcome.extra["merges_identical"] = mine == reference


def _show_merge(merge: Sequence[str]) -> list[str]:
    """A hex-encoded merge as readable text (repr of the bytes) for reports."""
    return [repr(bytes.fromhex(part)) for part in merge]


def compare_ids(outcomes: list[Outcome], ids_files: dict[str, Path]) -> None:
    """Check every encoder produced the reference ids (tiktoken's when it ran)."""
    import numpy as np

    if not ids_files:
        return
    ref_name = "tiktoken" if "tiktoken" in ids_files else next(iter(ids_files))
    ref = np.fromfile(ids_files[ref_name], dtype=np.uint32)
    for outcome in outcomes:
        if outcome.name not in ids_files or outcome.task != "encode":
            continue
        ids = np.fromfile(ids_files[outcome.name], dtype=np.uint32)
        outcome.extra["ids_reference"] = ref_name
        outcome.extra["ids_identical"] = bool(len(ids) == len(ref) and np.array_equal(ids, ref))
        if not outcome.extra["ids_identical"]:
            n = min(len(ids), len(ref))
            diff = np.flatnonzero(ids[:n] != ref[:n])
            outcome.extra["ids_first_difference"] = int(diff[0]) if len(diff) else n


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def ratios(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """Ours vs HF (train, encode) and vs tiktoken (encode): speed-up (>1 = ours faster) and memory."""
    rows = []
    by_key = {(o.task, o.name): o for o in outcomes if o.error is None}
    for o in outcomes:
        if o.kind != "superbpe" or o.error is not None or o.task == "runs":
            continue
        for other in ("hf-tokenizers", "tiktoken"):
            base = by_key.get((o.task, other))
            if base is None or not o.wall_s:
                continue
            rows.append({"task": o.task, "ours": o.name, "vs": other, "speedup": base.wall_s / o.wall_s,
                         "cpu_speedup": base.cpu_s / o.cpu_s if o.cpu_s else None,
                         "rss_ratio": o.peak_rss_mib / base.peak_rss_mib if base.peak_rss_mib else None})
    return rows


def schedule_ratios(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """Per engine: the whole SuperBPE run's time and peak RSS over the plain BPE run's (<=2x is the aim)."""
    runs = {(o.engine, o.extra.get("schedule")): o for o in outcomes if o.task == "runs" and o.error is None}
    rows = []
    for (engine, schedule), o in runs.items():
        base = runs.get((engine, "bpe"))
        if schedule != "superbpe" or base is None or not base.wall_s or not o.wall_s:
            continue
        rows.append({"engine": engine, "superbpe_over_bpe_wall": o.wall_s / base.wall_s,
                     "superbpe_over_bpe_cpu": o.cpu_s / base.cpu_s if o.cpu_s and base.cpu_s else None,
                     "superbpe_peak_rss_mib": o.peak_rss_mib, "bpe_peak_rss_mib": base.peak_rss_mib})
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(report: dict[str, Any]) -> str:
    """The human-readable tables."""
    c = report["corpus"]
    lines = [f"corpus {c['path']}: {c['bytes'] / MB:.1f} MB ({c['bytes']:,} bytes); "
             f"vocab {report['vocab']}; pattern {report['pattern']}",
             f"machine: {report['machine']['summary']}"]
    outcomes = [Outcome(**o) for o in report["results"]]
    for task, title in (("train", "TRAIN"), ("encode", "ENCODE (GPT-2 vocab, single thread)"),
                        ("runs", f"WHOLE RUNS (run_training as scripts/train.py; superbpe transition "
                                 f"{report.get('transition')})")):
        rows = [o for o in outcomes if o.task == task]
        if rows:
            lines += ["", title, _table(rows, task)]
            lines += [f"  {note}" for o in rows for note in _notes(o)]
    if report["ratios"]:
        lines += ["", "RATIOS (speed-up = their time / our time, >1: ours faster; RSS = ours / theirs)"]
        lines += [f"  {r['task']:6} {r['ours']:18} vs {r['vs']:14} wall speed-up {r['speedup']:7.2f}x   "
                  f"CPU speed-up {_fmt(r['cpu_speedup'], '7.2f')}x   peak RSS {_fmt(r['rss_ratio'], '.2f')}x"
                  for r in report["ratios"]]
    if report.get("schedule_ratios"):
        lines += ["", "SUPERBPE vs BPE (whole runs, same engine; time ratio = superbpe run / bpe run)"]
        lines += [f"  {r['engine']:8} wall {r['superbpe_over_bpe_wall']:5.2f}x   "
                  f"CPU {_fmt(r['superbpe_over_bpe_cpu'], '5.2f')}x   "
                  f"peak RSS {r['superbpe_peak_rss_mib']:.0f} MiB (bpe {r['bpe_peak_rss_mib']:.0f} MiB)"
                  for r in report["schedule_ratios"]]
    return "\n".join(lines)


def _table(rows: list[Outcome], task: str) -> str:
    head = (f"  {'contender':26} {'wall s':>9} {'MB/s':>8} {'CPU s':>9} {'peak RSS MiB':>13} "
            f"{'main RSS MiB':>13} {'load':>5}")
    if task == "encode":
        head += f" {'tokens':>11} {'ids ok':>6}"
    out = [head]
    for o in rows:
        if o.error:
            out.append(f"  {o.name:26} FAILED: {o.error}")
            continue
        line = (f"  {o.name:26} {_fmt(o.wall_s, '9.3f')} {_fmt(o.mb_s, '8.2f')} {_fmt(o.cpu_s, '9.2f')} "
                f"{_fmt(o.peak_rss_mib, '13.1f')} {_fmt(o.self_peak_rss_mib, '13.1f')} "
                f"{_fmt(o.extra.get('load_avg_at_start'), '5.2f')}")
        if task == "encode":
            ok = o.extra.get("ids_identical")
            mark = {None: "-", True: "yes", False: "NO"}[ok]
            mark = "ref" if o.extra.get("ids_reference") == o.name else mark
            line += f" {o.extra.get('tokens', 0):>11,} {mark:>6}"
        out.append(line)
    return "\n".join(out)


def _notes(o: Outcome) -> list[str]:
    notes = []
    if len(o.extra.get("runs_wall_s", ())) > 1:
        notes.append(f"{o.name}: wall per run " + ", ".join(f"{w:.3f}" for w in o.extra["runs_wall_s"])
                     + " s (fastest shown)")
    ph = o.extra.get("phases")
    if ph:
        notes.append(f"{o.name}: count {ph['count_s']:.3f} s (CPU {ph['count_cpu_s']:.2f}) + train "
                     f"{ph['train_s']:.3f} s; {o.extra['distinct_pieces']:,} distinct pieces, "
                     f"{o.extra['num_merges']:,} merges")
    if "merges_leading_equal_hf" in o.extra:
        notes.append(f"{o.name}: first {o.extra['merges_leading_equal_hf']:,} merges identical to HF, "
                     f"{o.extra['merges_shared_with_hf']:,} shared as a set (HF tie-breaks differ)")
        if "first_difference_vs_hf" in o.extra:
            d = o.extra["first_difference_vs_hf"]
            notes.append(f"{o.name}: merge {d['index']}: ours {' + '.join(d['ours'])}, "
                         f"HF {' + '.join(d['hf'])}")
    if "merges_identical" in o.extra:
        notes.append(f"{o.name}: merges identical to {o.extra['merges_equal_to']}: "
                     f"{'yes' if o.extra['merges_identical'] else 'NO'}")
    if o.task == "runs" and "stages" in o.extra:
        stages = [f"{st['name']} ({st['pattern']}) {st['merges']:,} merges {st['seconds']:.3f} s"
                  for st in o.extra["stages"]]
        notes.append(f"{o.name}: " + "; ".join(stages))
    if o.task == "train" and o.kind == "hf" and "num_merges" in o.extra:
        notes.append(f"{o.name}: {o.extra['num_merges']:,} merges")
    if "setup_s" in o.extra:
        notes.append(f"{o.name}: encoder built from the GPT-2 files in {o.extra['setup_s']:.2f} s "
                     "(not in wall)")
    if o.extra.get("ids_identical") is False:
        notes.append(f"{o.name}: ids differ from {o.extra['ids_reference']} at token "
                     f"{o.extra['ids_first_difference']:,}")
    return notes


def machine_info() -> dict[str, Any]:
    """Enough about the machine to read the numbers in context."""
    import psutil

    model = cpu_model()
    from superbpe.core.util import usable_cpus

    cpus = usable_cpus()
    mem = psutil.virtual_memory().total / (1 << 30)
    info: dict[str, Any] = {"cpu": model, "cpus": cpus, "memory_gib": round(mem, 1),
                            "python": platform.python_version(), "platform": platform.platform(),
                            "versions": _versions()}
    vers = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    info["load_avg_at_start"] = load_average()
    info["summary"] = (f"{model}, {cpus} CPUs, {mem:.0f} GiB, Python {info['python']}; {vers}; "
                       f"load average {info['load_avg_at_start']:.2f}")
    return info


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("superbpe", "tokenizers", "tiktoken"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed" if name != "superbpe" else _our_version()
    return out


def _our_version() -> str:
    import superbpe

    return superbpe.__version__


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python benchmarks/bench.py",
        description="Train and encode with superbpe, HF tokenizers and tiktoken side by side.",
    )
    p.add_argument("corpus", type=Path, help="a UTF-8 text file; documents separated by <|endoftext|>")
    p.add_argument("--vocab", type=int, default=32000, help="training vocab size incl. 256 bytes + special")
    p.add_argument("--only", choices=("train", "encode", "runs"), help="run just one of the comparisons")
    p.add_argument("--transition", type=float, default=0.8,
                   help="runs: the superbpe schedule's transition (fraction of merges in stage 1)")
    p.add_argument("--engines", default=None, help="comma list of python,native (default: all available)")
    p.add_argument("--skip-hf", action="store_true", help="leave out HF tokenizers")
    p.add_argument("--skip-tiktoken", action="store_true", help="leave out tiktoken")
    p.add_argument("--max-bytes", type=int, help="use a prefix of the corpus, cut at a document boundary")
    p.add_argument("--pattern", default="gpt2", help="pre-tokenizer for training (a superbpe PATTERNS name)")
    p.add_argument("--threads", type=int, help="training parallelism (our workers, RAYON_NUM_THREADS)")
    gpt2_dir = os.environ.get("SUPERBPE_GPT2_DIR")
    p.add_argument("--gpt2-dir", type=Path, default=Path(gpt2_dir) if gpt2_dir else None,
                   help="directory holding gpt2_vocab.json and gpt2_merges.txt, for the encode comparison "
                        "(default: $SUPERBPE_GPT2_DIR)")
    p.add_argument("--repeat", type=int, default=1, help="runs per contender; the fastest is reported")
    p.add_argument("--json", type=Path, help="also write all results as JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p.parse_args(argv)


def resolve_engines(spec: str | None) -> list[str]:
    from superbpe.engines.interface import native_available

    if spec is None:
        return ["python", "native"] if native_available() else ["python"]
    engines = list(dict.fromkeys(e.strip() for e in spec.split(",") if e.strip()))
    for engine in engines:
        if engine not in ("python", "native"):
            raise BenchError(f"unknown engine {engine!r}; choose from python, native")
        if engine == "native" and not native_available():
            raise BenchError("engine 'native' is not built (superbpe._native does not import)")
    if not engines:
        raise BenchError("--engines is empty")
    return engines


def validate(args: argparse.Namespace) -> None:
    """Catch every usage problem before any contender runs."""
    if not args.corpus.exists():
        raise BenchError(f"corpus not found: {args.corpus}")
    if not args.corpus.is_file():
        raise BenchError(f"corpus is not a file: {args.corpus}")
    if args.corpus.stat().st_size == 0:
        raise BenchError(f"corpus is empty: {args.corpus}")
    if args.json is not None:
        _check_writable(args.json)
    if args.vocab < 258:
        raise BenchError(f"--vocab must be at least 258 (256 bytes, special, a merge), not {args.vocab}")
    if args.max_bytes is not None and args.max_bytes < 1:
        raise BenchError(f"--max-bytes must be positive, not {args.max_bytes}")
    if args.repeat < 1:
        raise BenchError(f"--repeat must be positive, not {args.repeat}")
    if not 0 < args.transition < 1:
        raise BenchError(f"--transition must be a fraction between 0 and 1, not {args.transition}")
    if args.threads is not None and args.threads < 1:
        raise BenchError(f"--threads must be positive, not {args.threads}")
    if args.only in (None, "encode"):
        if args.gpt2_dir is None:
            raise BenchError("the encode comparison needs GPT-2's files: pass --gpt2-dir (or set "
                             "SUPERBPE_GPT2_DIR), or --only train|runs")
        for name in ("gpt2_vocab.json", "gpt2_merges.txt"):
            if not (args.gpt2_dir / name).is_file():
                raise BenchError(f"{args.gpt2_dir / name} not found (needed for encoding; see --gpt2-dir)")
    if args.only != "encode":
        from superbpe.core.errors import SuperBPEError
        from superbpe.core.pretokenize import get_pretokenizer

        try:
            get_pretokenizer(args.pattern)
        except SuperBPEError as exc:
            raise BenchError(str(exc)) from None
    _check_importable(args)


def _check_writable(path: Path) -> None:
    """``--json``'s file can be written: checked first, since it is written after every contender ran."""
    if path.is_dir():
        raise BenchError(f"--json {path} is a directory")
    if not path.parent.is_dir():
        raise BenchError(f"--json {path}: no directory {path.parent} to write it in")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise BenchError(f"--json {path}: not writable")


def _check_importable(args: argparse.Namespace) -> None:
    import importlib.util

    if importlib.util.find_spec("psutil") is None:
        raise BenchError('psutil is not installed: pip install "superbpe[bench]"')
    for flag, module in (("--skip-hf", "tokenizers"), ("--skip-tiktoken", "tiktoken")):
        skipped = args.skip_hf if module == "tokenizers" else args.skip_tiktoken
        if (module == "tiktoken" and args.only in ("train", "runs")) or args.only == "runs":
            continue
        if not skipped and importlib.util.find_spec(module) is None:
            raise BenchError(f'{module} is not installed: pip install "superbpe[bench]" (or pass {flag})')


def prepare_corpus(args: argparse.Namespace, workdir: Path) -> Path:
    """The corpus itself, or its prefix (``--max-bytes``) written to ``workdir``."""
    if args.max_bytes is None or args.corpus.stat().st_size <= args.max_bytes:
        return args.corpus.resolve()
    with open(args.corpus, "rb") as stream:
        head = stream.read(args.max_bytes + 1)
    prefix = workdir / f"{args.corpus.stem}.prefix.txt"
    prefix.write_bytes(prefix_at_document_boundary(head, args.max_bytes))
    return prefix


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--_worker"]:
        return run_worker(argv[1])
    args = parse_args(argv)
    try:
        validate(args)
        engines = resolve_engines(args.engines)
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="superbpe-bench-") as tmp:
        try:
            corpus = prepare_corpus(args, Path(tmp))
        except BenchError as exc:
            print(f"bench: error: {exc}", file=sys.stderr)
            return 2
        machine = machine_info()
        outcomes = run_all(args, corpus, engines, Path(tmp))
        report = build_report(args, corpus, outcomes, machine)
    print(render(report))
    if args.json:
        try:
            args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:  # the results are in the table above
            print(f"bench: error: --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    return 0 if report["ok"] else 1


def build_report(
    args: argparse.Namespace, corpus: Path, outcomes: list[Outcome], machine: dict[str, Any]
) -> dict[str, Any]:
    """Everything measured, JSON-ready; ``ok`` is False on a failure or an engine/id disagreement."""
    bad = [o for o in outcomes if o.error or o.extra.get("ids_identical") is False
           or o.extra.get("merges_identical") is False]
    return {
        "corpus": {"path": str(args.corpus), "bytes": corpus.stat().st_size,
                   "prefix_of_max_bytes": args.max_bytes},
        "vocab": args.vocab,
        "pattern": args.pattern,
        "repeat": args.repeat,
        "machine": machine,
        "results": [asdict(o) for o in outcomes],
        "transition": args.transition,
        "ratios": ratios(outcomes),
        "schedule_ratios": schedule_ratios(outcomes),
        "ok": not bad,
    }


if __name__ == "__main__":
    sys.exit(main())
