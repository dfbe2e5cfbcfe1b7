"""Summaries of sweeps: one table row per run, and a plot of bytes/token against the transition.

Reads only the ``metrics.json`` files a sweep left in its run directories, so it works on any
finished (or partly finished) multirun directory, and on copies of one.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from superbpe.core.errors import InputError
from superbpe.core.pretokenize import PATTERNS
from superbpe.core.util import atomic_write, directory_problem, import_optional
from superbpe.formats.checkpoints import CHECKPOINT_FILE

COLUMNS = (
    "run", "schedule", "patterns", "vocab", "transition", "merges/stage", "seconds", "peak MB", "bytes/token",
    "differs",
)


@dataclass(frozen=True)
class Row:
    run: str
    schedule: str
    patterns: str  # pre-tokenizer per stage, so sweeps over `pretokenizer=` stay readable
    vocab_size: int
    transition: float | None  # fraction of merges in stage 1 (None for one-stage runs)
    stage_merges: tuple[int, ...]
    seconds: float
    peak_rss_mb: float
    bytes_per_token: float | None
    settings: tuple[tuple[str, str], ...] = ()  # what else made the run (see `_settings`)
    differs: str = ""  # the settings no other column shows that are not the same in every row
    untimed: bool = False  # merges of a stage taken (the cache, a source run), not trained: `timing_note`

    def cells(self) -> list[str]:
        return [
            self.run,
            self.schedule,
            self.patterns,
            str(self.vocab_size),
            "-" if self.transition is None else f"{self.transition:.3f}",
            "+".join(map(str, self.stage_merges)),
            f"{self.seconds:.1f}{'*' if self.untimed else ''}",
            f"{self.peak_rss_mb:.0f}",
            "-" if self.bytes_per_token is None else f"{self.bytes_per_token:.4f}",
            self.differs or "-",
        ]


def summarized_dir(path: Path) -> Path:
    """The directory to summarize for ``path``: itself, or for a file in a run or a sweep (its
    ``metrics.json``, ``train.log``, ``multirun.yaml``) that run or sweep, since a shell's completion
    naming one of its files names the run just as well."""
    if path.is_dir():
        return path
    if not path.exists():
        raise InputError(f"{path}: no such directory")
    marks = ("metrics.json", CHECKPOINT_FILE, ".hydra", "multirun.yaml")  # what a run or a sweep holds
    for parent in path.parents:
        if any((parent / name).exists() for name in marks):
            return parent
    raise InputError(f"{path} is a file, not one of a run: give the directory of a run or of a sweep")


def collect(sweep_dir: Path) -> list[Row]:
    """A row per ``metrics.json`` under ``sweep_dir``, sorted by schedule, vocab size, transition; each says
    the settings that differ between the rows beyond those columns."""
    if not sweep_dir.is_dir():
        raise InputError(f"{sweep_dir}: no such directory")
    rows = [_row(path, sweep_dir) for path in sorted(sweep_dir.rglob("metrics.json"))]
    if not rows:
        left, missing = unfinished(sweep_dir), missing_jobs(sweep_dir)
        runs = f"; runs not finished: {', '.join(left)}" if left else ""
        runs += f"; jobs with no run directory: {', '.join(missing)}" if missing else ""
        raise InputError(f"{sweep_dir}: no metrics.json found{runs or ' (is it a sweep directory?)'}")
    # Among the runs that have the setting: a bpe run has no stage2.* settings, which differ by schedule.
    settings = [dict(row.settings) for row in rows]
    varying = {key for key in {k for row in rows for k, _ in row.settings}
               if len({found[key] for found in settings if key in found}) > 1}  # fmt: skip
    rows = [
        replace(row, differs=" ".join(f"{key}={value}" for key, value in row.settings if key in varying))
        for row in rows
    ]
    return sorted(rows, key=_order)


def unfinished(sweep_dir: Path) -> list[str]:
    """The run directories under ``sweep_dir`` that hold a run but no ``metrics.json`` (stopped or failed,
    or still running), relative to it: the table has no row for them, and must not read as the sweep."""
    started = {path.parent.parent for path in sweep_dir.rglob(".hydra/overrides.yaml")}
    started |= {path.parent for path in sweep_dir.rglob(CHECKPOINT_FILE)}
    left = [run for run in started if not (run / "metrics.json").is_file()]
    return sorted(str(run.relative_to(sweep_dir)) or "." for run in left)


def missing_jobs(sweep_dir: Path) -> list[str]:
    """The job directories the sweep's record (``multirun.yaml``) plans that do not exist: a sweep killed
    outright (SIGKILL, out of memory) never ran its later jobs, and a job that failed before its first
    checkpoint removed its directory; no other file says so (the sweep's own log names a failed job).
    Empty when the number of jobs cannot be told: a sweep of other than choices and ranges, job
    directories named otherwise than by job number, or no record."""
    hydra = _sweep_record(sweep_dir)
    jobs = planned_jobs(sweep_dir)
    if hydra is None or jobs is None or hydra.get("sweep", {}).get("subdir") != "${hydra.job.num}":
        return []
    return [str(job) for job in range(jobs) if not (sweep_dir / str(job)).exists()]


def planned_jobs(sweep_dir: Path) -> int | None:
    """How many jobs the sweep's record (``multirun.yaml``) plans, or None when that cannot be told (a
    sweep of other than choices and ranges, or no record)."""
    hydra = _sweep_record(sweep_dir)
    if hydra is None:
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser  # the commands' dependency

    try:
        jobs = 1
        for override in OverridesParser.create().parse_overrides(hydra["overrides"]["task"]):
            if override.is_sweep_override():
                jobs *= len(list(override.sweep_string_iterator()))
    except Exception:  # noqa: BLE001 - a record that cannot be read this way only says nothing here
        return None
    return jobs


def _sweep_record(sweep_dir: Path) -> dict[str, Any] | None:
    """The ``hydra`` part of the sweep's ``multirun.yaml``, unresolved, or None without a readable one."""
    record = sweep_dir / "multirun.yaml"
    if not record.is_file():
        return None
    from omegaconf import OmegaConf  # loaded by the commands only: library runs never need it

    try:
        hydra = OmegaConf.to_container(OmegaConf.load(record), resolve=False)["hydra"]  # type: ignore[index]
    except Exception:  # noqa: BLE001 - a record that cannot be read this way only says nothing here
        return None
    return hydra if isinstance(hydra, dict) else None


def _order(row: Row) -> tuple[Any, ...]:
    return (row.schedule, row.vocab_size, row.transition or 1.0, row.patterns, row.differs, row.run)


def _settings(metrics: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """What made a run besides the columns of its own: the corpus, specials, engine, a custom pattern,
    each stage's rules and sample share, the held-out text (names and size) of its bytes/token. Runs of
    a sweep over any of them differ there and nowhere else, so the table shows those that vary, where
    the rows looked alike."""
    config = metrics["config"]
    found: dict[str, Any] = {
        "data": [Path(path).name for path in config.get("data") or []],
        **{key: config.get(key) for key in ("special_tokens", "engine", "from_run", "from_tokenizer")},
    }
    evaluation = metrics.get("eval")
    if evaluation:  # bytes/token on one held-out text is not comparable with another's
        names = [Path(path).name for path in evaluation.get("files") or []]
        found["eval"] = [*names, evaluation.get("bytes")]
    for number, stage in enumerate(metrics["stages"], start=1):  # read leniently: older files hold less
        name, pre = stage.get("name", f"stage{number}"), stage.get("pretokenizer") or {}
        if PATTERNS.get(pre.get("name")) != pre.get("pattern"):  # a built-in one is named by `patterns`
            found[f"{name}.pattern"] = pre.get("pattern")
        found[f"{name}.line_units"] = pre.get("line_units")
        found.update({f"{name}.{key}": value for key, value in (stage.get("rules") or {}).items()})
        found[f"{name}.approx_sample"] = stage.get("approx_sample")
    return tuple((key, json.dumps(value, ensure_ascii=False)) for key, value in found.items())


def _row(path: Path, root: Path) -> Row:
    try:
        metrics: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        evaluation = metrics.get("eval") or {}
        return Row(
            run=str(path.parent.relative_to(root)) or ".",
            schedule=str(metrics["config"]["schedule"]),
            patterns=">".join(str(s["pretokenizer"]["name"]) for s in metrics["stages"]),
            vocab_size=int(metrics["vocab_size"]),
            transition=metrics.get("transition_fraction"),
            stage_merges=tuple(int(s["merges"]) for s in metrics["stages"]),
            seconds=float(metrics["seconds"]),
            peak_rss_mb=int(metrics["peak_rss_bytes"]) / 2**20,
            bytes_per_token=evaluation.get("bytes_per_token"),
            settings=_settings(metrics),
            untimed=any(stage.get("from", "trained") != "trained" for stage in metrics["stages"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # AttributeError: JSON not an object
        raise InputError(f"{path}: not a superbpe metrics file ({exc})") from None


def timing_note(rows: list[Row]) -> str | None:
    """The footnote of the seconds marked ``*``: a stage whose merges came from the cache or a source run
    took next to no time, so such a run's seconds are not its training time and compare with no other's."""
    if not any(row.untimed for row in rows):
        return None
    return ("* seconds without training a stage whose merges were taken from the cache or a source run "
            "(metrics.json: stages[].from); cache_dir=null times every stage")  # fmt: skip


def table(rows: list[Row]) -> str:
    """A fixed-width text table."""
    cells = [list(COLUMNS), *(row.cells() for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def check_plot_path(output: Path) -> str:
    """The file type ``output`` names (by suffix, PNG without one); refused when it is a directory, lies
    where no file can be written (under a file), or is a type matplotlib does not write: checked before
    anything is printed or drawn, so that a bad ``--plot`` leaves no half-done summary."""
    if output.is_dir():
        raise InputError(f"plot path {output} is a directory; give the PNG file's path")
    if (problem := directory_problem(output.parent)) is not None:
        raise InputError(f"plot path {output}: cannot write in {output.parent}: {problem} "
                         "(--plot PATH draws it elsewhere, --no-plot skips it)")  # fmt: skip
    import_optional("matplotlib", "plot", "the bytes/token plot (or pass --no-plot)")
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # reason: an optional extra, checked above
    from matplotlib.figure import Figure  # reason: an optional extra, checked above

    supported = FigureCanvasAgg(Figure()).get_supported_filetypes()
    kind = output.suffix.lower().lstrip(".") or "png"
    if kind not in supported:
        kinds = ", ".join(sorted(supported))
        raise InputError(f"plot path {output}: matplotlib writes {kinds}, not {kind}; name the file with one")
    return kind


def plot(rows: list[Row], output: Path) -> Path | None:
    """bytes/token against transition, one line per vocab size; one-stage runs sit at transition 1.0.
    The file's type follows its suffix (PNG without one).

    Returns None when no run has an eval result to plot.
    """
    if output.is_dir():
        raise InputError(f"plot path {output} is a directory; give the PNG file's path")
    series: dict[tuple[int, str, str], list[tuple[float, float]]] = defaultdict(list)
    for row in rows:
        if row.bytes_per_token is not None:
            # One line per vocab, stage-1 pattern and whatever else differs between the runs.
            key = (row.vocab_size, row.patterns.split(">")[0], row.differs)
            series[key].append((1.0 if row.transition is None else row.transition, row.bytes_per_token))
    if not series:
        return None
    kind = check_plot_path(output)  # before drawing
    matplotlib = import_optional("matplotlib", "plot", "the bytes/token plot (or pass --no-plot)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # an optional extra, checked just above

    # Taller by a line of legend per series, so that a long legend below does not squeeze the axes.
    fig, ax = plt.subplots(figsize=(6.4, 4.2 + 0.2 * len(series)), layout="constrained")
    several_patterns = len({pattern for _, pattern, _ in series}) > 1
    for vocab_size, pattern, differs in sorted(series):
        points = sorted(series[(vocab_size, pattern, differs)])
        label = f"vocab {vocab_size}" + (f", stage 1 {pattern}" if several_patterns else "")
        label += f", {differs}" if differs else ""
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xlabel("transition (fraction of merges in stage 1; 1.0 = plain BPE)")
    ax.set_ylabel("bytes per token (eval file)")
    ax.set_title("SuperBPE sweep")
    ax.grid(True, alpha=0.3)
    # Below the axes: inside them, a legend of several lines hid the points of a sweep (one-stage runs all
    # sit at 1.0); the saved figure grows to hold it.
    fig.legend(fontsize="small", loc="outside lower center")
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_write(output) as out:  # no half-written plot, nor a temporary file, on any failure
            fig.savefig(out, format=kind, dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    return output
