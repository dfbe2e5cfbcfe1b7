"""SuperBPE against BPE as the corpus grows: wall time and peak RSS per corpus size, side by side.

    python benchmarks/scale.py CORPUS --sizes 120M,360M,1.2G --vocab 64000 --transition 0.8 \\
        --rounds 2 --workdir /tmp/scale --out benchmarks/results/scale

Each size is a prefix of CORPUS cut at a line break (``all`` = the whole file). In every round each size
trains ``schedule=bpe`` and then ``schedule=superbpe`` as child processes (``scripts/train.py``, native
engine, cache off), so the pair is measured in the same minutes (this machine's speed drifts by tens of
percent within minutes; compare ratios, not absolute times across rounds). Before each run the corpus is
read into the page cache (``--page-cache warm``, the default), so both runs of a pair start from the same
state whatever the run before left there (a superbpe run of 10 GB evicts part of the file); ``cold``
evicts it before each run instead (a first run on data not read since boot), ``asis`` leaves it alone.
``--samples 0.5,0.25`` adds SuperBPE runs with the stage-2 approximation
(``schedule.stage2_approx_sample``), named ``superbpe@0.5``, to the same rounds; ``--eval FILE``
(held-out text) adds each tokenizer's bytes per token on it, the compression the approximation costs.
``--include A.json`` adds the rows an earlier run wrote (e.g. another corpus at another vocab) to the
table and plot, each against a bpe run of its own file. Peak RSS is the child's (``wait4`` rusage).
The stage-2 sizes (distinct pieces and bytes, symbols) come from the run's ``metrics.json``. Each row
records the CPU it ran on, when it started (UTC) and the 1-minute load average then. Writes ``<out>.md``
(a line naming the machine, the runs' start times and loads, then a table) and ``<out>.png`` (RSS and
time of the exact SuperBPE runs against distinct stage-2 bytes), and prints both.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe, load_average  # noqa: E402  (benchmarks/ holds scripts, not a package)

ROOT = Path(__file__).resolve().parents[1]
print = functools.partial(print, flush=True)  # noqa: A001 - progress of a long benchmark, unbuffered
_UNITS = {"K": 10**3, "M": 10**6, "G": 10**9}
SCHEDULES = ("bpe", "superbpe")


@dataclass
class Measure:
    size: str
    corpus_bytes: int
    schedule: str
    round: int
    seconds: float
    peak_rss: int
    stage2: dict[str, int]
    bytes_per_token: float | None = None
    cpu_seconds: float | None = None  # user + system time of the child
    machine: str | None = None  # the CPU model and vCPUs (the VM's host changes between boots)
    started: str | None = None  # UTC, "YYYY-MM-DD HH:MM:SS"
    load: float | None = None  # the 1-minute load average when the run started


def parse_size(text: str) -> int | None:
    """``120M`` -> 120_000_000; ``all`` -> None (the whole file). Anything else, or a size below one
    byte, is a ``ValueError`` naming the size."""
    if text == "all":
        return None
    unit = _UNITS.get(text[-1:].upper())
    try:
        size = int(float(text[:-1]) * unit) if unit else int(text)
    except (ValueError, OverflowError):
        raise ValueError(f"--sizes: {text!r} is not a byte count (1000, 500K, 1.2G) or 'all'") from None
    if size < 1:
        raise ValueError(f"--sizes: {text!r} is below one byte")
    return size


def prefix(corpus: Path, size: int | None, workdir: Path) -> Path:
    """The first ``size`` bytes of ``corpus``, ending at a line break (made once, reused)."""
    if size is None or size >= corpus.stat().st_size:
        return corpus
    path = workdir / f"{corpus.stem}-{size}.txt"
    if path.exists():
        return path
    with corpus.open("rb") as source, tempfile.NamedTemporaryFile(dir=workdir, delete=False) as out:
        left = size
        while left > 0:
            block = source.read(min(left, 1 << 24))
            if not block:
                break
            left -= len(block)
            out.write(block)
        out.write(source.readline())  # finish the line
    os.replace(out.name, path)
    return path


def set_page_cache(path: Path, state: str) -> None:
    """Put ``path`` in the page cache (``warm``: read through once), out of it (``cold``: the kernel is
    told its clean pages are not needed), or leave it (``asis``)."""
    if state == "asis":
        return
    with path.open("rb", buffering=0) as file:
        if state == "cold":
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            return
        block = bytearray(1 << 24)
        while file.readinto(block):
            pass


def train(
    corpus: Path, run: str, vocab: int, transition: float, out: Path
) -> tuple[float, float, int, dict]:
    """One training run (``bpe``, ``superbpe`` or ``superbpe@SHARE``) in a child process: wall seconds,
    CPU seconds, child peak RSS, stage-2 sizes."""
    schedule, _, share = run.partition("@")
    args = [
        sys.executable,
        str(ROOT / "scripts" / "train.py"),
        f"data.paths=[{corpus}]",
        f"vocab_size={vocab}",
        f"schedule={schedule}",
        "engine=native",
        "cache_dir=null",
        "progress=false",
        f"output_dir={out}",
    ]
    if schedule == "superbpe":
        args.append(f"schedule.transition={transition}")
    if share:
        args.append(f"schedule.stage2_approx_sample={share}")
    start = time.monotonic()
    with open(out.parent / f"{out.name}.log", "w") as log:  # names hold dots (superbpe@0.5)
        child = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, usage = os.wait4(child.pid, 0)
    seconds = time.monotonic() - start
    if status != 0:
        raise SystemExit(f"{run} on {corpus} failed; see {out.parent / f'{out.name}.log'}")
    metrics = json.loads((out / "metrics.json").read_text())
    stages = metrics.get("stages", [])
    last = stages[-1] if stages else {}
    keys = (
        "distinct_pieces", "distinct_bytes", "estimated_symbols", "estimated_build_peak_bytes",
        "estimated_peak_bytes",
    )  # fmt: skip
    sizes = {k: last[k] for k in keys if k in last}
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, sizes


def bytes_per_token(tokenizer_dir: Path, held_out: Path) -> float:
    """The tokenizer's bytes per token on held-out text (what ``superbpe-evaluate`` reports)."""
    from superbpe.api.tokenizer import Tokenizer
    from superbpe.jobs.evaluate import evaluate

    return evaluate(Tokenizer.load(tokenizer_dir), held_out).bytes_per_token


def _estimate_cells(r: Measure) -> str:
    """The memory estimates made at the last stage's build (what the build will reach; the stage's peak,
    which is the build's unless the stage peaked before it), the second against the measured peak."""
    build = r.stage2.get("estimated_build_peak_bytes")
    estimate = r.stage2.get("estimated_peak_bytes")
    build_cell = f"| {build / 2**30:.2f} GiB " if build else "| "
    return build_cell + (f"| {estimate / 2**30:.2f} GiB ({r.peak_rss / estimate:.2f}) " if estimate else "| ")


def bpe_pairs(results: list[list[Measure]]) -> list[tuple[Measure, Measure | None]]:
    """Every run with the bpe run it is compared with: the one of its size and round in the same results
    (one ``scale.py`` run: one corpus, one vocab), so that runs of other results are never its baseline,
    whatever their labels; None where those results hold no such bpe run."""
    pairs = []
    for rows in results:
        bpes = {(r.size, r.round): r for r in rows if r.schedule == "bpe"}
        pairs += [(r, bpes.get((r.size, r.round))) for r in rows]
    return pairs


def table(results: list[list[Measure]]) -> str:
    """One line per run, each against the bpe run of its size and round in the same results (an empty
    cell where there is none)."""
    lines = [
        "| corpus | round | run | wall | CPU | peak RSS | wall / bpe | stage-2 distinct bytes "
        "| stage-2 symbols | RSS per distinct stage-2 byte | estimated build peak "
        "| estimated peak (measured / estimated) "
        "| bytes/token held out |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, bpe in bpe_pairs(results):
        distinct = r.stage2.get("distinct_bytes", 0) if r.schedule != "bpe" else 0
        lines.append(
            f"| {r.size} ({r.corpus_bytes / 1e6:.0f} MB) | {r.round} | {r.schedule} | {r.seconds:.1f} s "
            + (f"| {r.cpu_seconds:.0f} s " if r.cpu_seconds is not None else "| ")
            + f"| {r.peak_rss / 2**30:.2f} GiB "
            + (f"| {r.seconds / bpe.seconds:.2f}x " if bpe else "| ")
            + (
                f"| {distinct / 1e6:.0f} MB | {r.stage2.get('estimated_symbols', 0) / 1e6:.0f}M "
                f"| {r.peak_rss / distinct:.2f} "
                + _estimate_cells(r)
                if distinct
                else "| | | | | "
            )
            + (f"| {r.bytes_per_token:.4f} |" if r.bytes_per_token is not None else "| |")
        )
    return "\n".join(lines)


def measured_on(results: list[list[Measure]]) -> str:
    """Where and when the runs were made: each machine with the UTC span of its runs' starts and the
    load average they started at (rows of an older ``OUT.json`` that did not record them are left out)."""
    by_machine: dict[str, list[Measure]] = {}
    for r in (r for rows in results for r in rows if r.machine and r.started and r.load is not None):
        by_machine.setdefault(r.machine, []).append(r)
    parts = []
    for machine, rows in by_machine.items():
        starts, loads = sorted(r.started for r in rows), [r.load for r in rows]
        parts.append(f"{machine}: runs started {starts[0]}–{starts[-1]} UTC at a 1-minute load of "
                     f"{min(loads):.2f}–{max(loads):.2f}")
    return "Measured on " + "; ".join(parts) + "." if parts else ""


def plot(results: list[list[Measure]], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print(f"no plot written to {path}: matplotlib is not installed (pip install \".[plot]\")")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = sorted(
        ((r, bpe) for r, bpe in bpe_pairs(results) if r.schedule == "superbpe" and bpe is not None),
        key=lambda pair: pair[0].stage2["distinct_bytes"],
    )
    x = [r.stage2["distinct_bytes"] / 1e9 for r, _ in pairs]
    fig, (ax_rss, ax_time) = plt.subplots(1, 2, figsize=(10, 4))
    ax_rss.plot(x, [r.peak_rss / 2**30 for r, _ in pairs], "o-", label="superbpe")
    ax_rss.plot(x, [bpe.peak_rss / 2**30 for _, bpe in pairs], "s--", label="bpe")
    ax_rss.set(xlabel="distinct stage-2 bytes (GB)", ylabel="peak RSS (GiB)", title="memory")
    ax_time.plot(x, [r.seconds for r, _ in pairs], "o-", label="superbpe")
    ax_time.plot(x, [bpe.seconds for _, bpe in pairs], "s--", label="bpe")
    ax_time.set(xlabel="distinct stage-2 bytes (GB)", ylabel="wall (s)", title="time")
    for ax in (ax_rss, ax_time):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def output(out: Path, suffix: str) -> Path:
    """``out`` with ``suffix`` added to its whole name: ``--out en.v2`` writes ``en.v2.md``, not ``en.md``."""
    return out.with_name(out.name + suffix)


def load_results(path: Path) -> list[Measure]:
    """The rows of an earlier run's ``OUT.json`` (``--include``)."""
    try:
        return [Measure(**row) for row in json.loads(path.read_text())]
    except OSError as exc:
        raise ValueError(f"--include {path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError):
        raise ValueError(f"--include {path}: not the OUT.json of a scale.py run") from None


def checked(args: argparse.Namespace) -> tuple[list[str], list[str], list[list[Measure]]]:
    """The sizes, the runs of a round and the included results, or a ``ValueError`` naming what is wrong:
    everything is checked before the first run, which may be hours before the last."""
    if not args.corpus.is_file():
        raise ValueError(f"corpus {args.corpus}: no such file")
    if args.eval is not None and not args.eval.is_file():
        raise ValueError(f"--eval {args.eval}: no such file")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, not {args.rounds}")
    sizes = args.sizes.split(",")
    for size in sizes:
        parse_size(size)
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"--sizes {args.sizes}: a size is given twice")
    order = args.order.split(",")
    for run in order:
        if run not in SCHEDULES:
            raise ValueError(f"--order {args.order}: {run!r} is not one of {', '.join(SCHEDULES)}")
    if len(set(order)) != len(order):
        raise ValueError(f"--order {args.order}: a schedule is given twice")
    shares = [share for share in args.samples.split(",") if share]
    for share in shares:
        try:
            fraction = float(share)
        except ValueError:
            fraction = float("nan")
        if not 0 < fraction <= 1:
            raise ValueError(f"--samples {args.samples}: {share!r} is not a fraction in (0, 1]")
    included = [load_results(Path(earlier)) for earlier in args.include.split(",") if earlier]
    return sizes, order + [f"superbpe@{share}" for share in shares], included


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--sizes", default="120M,360M,all", help="comma-separated prefix sizes, or 'all'")
    parser.add_argument("--vocab", type=int, default=64000)
    parser.add_argument("--transition", type=float, default=0.8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--order", default="bpe,superbpe", help="schedules in the order each round runs them")
    parser.add_argument("--samples", default="", help="stage-2 shares for extra approximate superbpe runs")
    parser.add_argument(
        "--page-cache", choices=("warm", "cold", "asis"), default="warm",
        help="the corpus in the page cache before each run (warm), out of it (cold), or as left (asis)",
    )
    parser.add_argument("--eval", type=Path, help="held-out text: adds each tokenizer's bytes/token")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "superbpe-scale")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.md, OUT.json and OUT.png")
    parser.add_argument(
        "--include", default="", help="OUT.json of earlier runs (another corpus) to add to the table and plot"
    )
    args = parser.parse_args()
    try:
        sizes, runs, included = checked(args)
        args.workdir.mkdir(parents=True, exist_ok=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
    except (ValueError, OSError) as exc:
        raise SystemExit(f"error: {exc}") from None
    # The runs are children in ROOT: every path they are given is absolute.
    corpus, workdir = args.corpus.resolve(), args.workdir.resolve()
    held_out = args.eval.resolve() if args.eval is not None else None
    corpora = {size: prefix(corpus, parse_size(size), workdir) for size in sizes}
    machine = describe()
    rows: list[Measure] = []
    for round_ in range(1, args.rounds + 1):
        for size in sizes:
            for run in runs:
                out = Path(tempfile.mkdtemp(dir=workdir, prefix=f"{run}-{size}-"))
                set_page_cache(corpora[size], args.page_cache)
                started, load = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), load_average()
                seconds, cpu, rss, stage2 = train(corpora[size], run, args.vocab, args.transition, out)
                size_bytes = corpora[size].stat().st_size
                label = f"{corpus.stem} {size}, {args.vocab // 1000}K"
                measure = Measure(label, size_bytes, run, round_, seconds, rss, stage2, cpu_seconds=cpu,
                                  machine=machine, started=started, load=load)
                if held_out is not None:
                    measure.bytes_per_token = bytes_per_token(out, held_out)
                rows.append(measure)
                print(f"{size} #{round_} {run}: {seconds:.1f} s ({cpu:.0f} CPU s), {rss / 2**30:.2f} GiB, "
                      f"started {started} UTC at load {load:.2f}", stage2)
    output(args.out, ".json").write_text(json.dumps([asdict(row) for row in rows], indent=1) + "\n")
    results = [rows, *included]
    text = "\n\n".join(part for part in (measured_on(results), table(results)) if part)
    output(args.out, ".md").write_text(text + "\n")
    plot(results, output(args.out, ".png"))
    print(text)


if __name__ == "__main__":
    main()
