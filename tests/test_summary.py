"""What ``superbpe-summarize`` says differs between runs, from their ``metrics.json`` alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from superbpe.cli import jobs_not_run_note
from superbpe.core.errors import InputError
from superbpe.core.pretokenize import PATTERNS
from superbpe.training.summary import (
    COLUMNS,
    Row,
    collect,
    missing_jobs,
    planned_jobs,
    plot,
    timing_note,
    unfinished,
)


def write_run(directory: Path, pretokenizer: str, pattern: str, eval_file: str | None = None) -> None:
    directory.mkdir(parents=True)
    stage = {"name": "bpe", "merges": 100, "pretokenizer": {"name": pretokenizer, "pattern": pattern}}
    metrics = {
        "config": {"schedule": "bpe", "data": ["/data/corpus.txt"], "engine": "native"},
        "stages": [stage],
        "vocab_size": 357, "seconds": 1.0, "peak_rss_bytes": 2**20,
        "eval": {"files": [eval_file], "bytes": 1000, "bytes_per_token": 3.0} if eval_file else None,
    }  # fmt: skip
    (directory / "metrics.json").write_text(json.dumps(metrics))


def test_built_in_patterns_are_named_not_spelt_out(tmp_path: Path) -> None:
    write_run(tmp_path / "0", "gpt2", PATTERNS["gpt2"])
    write_run(tmp_path / "1", "o200k", PATTERNS["o200k"])
    assert [(row.patterns, row.differs) for row in collect(tmp_path)] == [("gpt2", ""), ("o200k", "")]


def test_custom_patterns_and_eval_texts_are_shown_where_they_differ(tmp_path: Path) -> None:
    write_run(tmp_path / "0", "custom", r"\w+", "/a/heldout.txt")
    write_run(tmp_path / "1", "custom", r"\S+", "/b/other.txt")
    assert sorted(row.differs for row in collect(tmp_path)) == [
        'eval=["heldout.txt", 1000] bpe.pattern="\\\\w+"', 'eval=["other.txt", 1000] bpe.pattern="\\\\S+"'
    ]


def test_runs_without_metrics_are_named_as_not_finished(tmp_path: Path) -> None:
    write_run(tmp_path / "0", "gpt2", PATTERNS["gpt2"])
    (tmp_path / "0" / ".hydra").mkdir()
    (tmp_path / "0" / ".hydra" / "overrides.yaml").write_text("- vocab_size=357\n")
    (tmp_path / "1" / ".hydra").mkdir(parents=True)  # started, stopped before its first checkpoint
    (tmp_path / "1" / ".hydra" / "overrides.yaml").write_text("- vocab_size=400\n")
    (tmp_path / "2").mkdir()  # stopped mid-training
    (tmp_path / "2" / "checkpoint.json").write_text("{}")
    assert [row.run for row in collect(tmp_path)] == ["0"] and unfinished(tmp_path) == ["1", "2"]


def test_a_sweep_with_no_finished_run_names_those_it_holds(tmp_path: Path) -> None:
    (tmp_path / "0" / ".hydra").mkdir(parents=True)
    (tmp_path / "0" / ".hydra" / "overrides.yaml").write_text("- vocab_size=400\n")
    with pytest.raises(InputError, match="no metrics.json found; runs not finished: 0"):
        collect(tmp_path)


@pytest.mark.parametrize("text", ["[]", '"done"', '{"config": {"schedule": "bpe"}, "stages": ["bpe"]}'])
def test_a_metrics_json_of_another_shape_is_a_one_line_error(tmp_path: Path, text: str) -> None:
    """Another tool's ``metrics.json`` under the directory (a list of numbers, say) stopped the summary
    with a traceback."""
    write_run(tmp_path / "0", "gpt2", PATTERNS["gpt2"])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "metrics.json").write_text(text)
    with pytest.raises(InputError, match=r"other/metrics.json: not a superbpe metrics file"):
        collect(tmp_path)


def write_sweep_record(sweep: Path, task: list[str], subdir: str = "${hydra.job.num}") -> None:
    """The parts of Hydra's ``multirun.yaml`` that say how many jobs a sweep has."""
    lines = ["hydra:", "  sweep:", f"    subdir: {subdir}", "  overrides:", "    task:"]
    (sweep / "multirun.yaml").write_text("\n".join([*lines, *(f"    - {item}" for item in task)]) + "\n")


def test_jobs_a_killed_sweep_missing_jobs_are_named(tmp_path: Path) -> None:
    """A sweep killed outright leaves no trace of the jobs after the one running: only its record says
    how many there were."""
    task = ["vocab_size=300,400", "schedule=superbpe", "schedule.transition=range(1,4)"]
    write_sweep_record(tmp_path, task)
    write_run(tmp_path / "0", "gpt2", PATTERNS["gpt2"])
    (tmp_path / "1").mkdir()  # started, killed before its first checkpoint
    assert [row.run for row in collect(tmp_path)] == ["0"]
    assert missing_jobs(tmp_path) == ["2", "3", "4", "5"]
    (tmp_path / "0" / "metrics.json").unlink()
    with pytest.raises(InputError, match="no metrics.json found; jobs with no run directory: 2, 3, 4, 5$"):
        collect(tmp_path)
    # Job directories named otherwise, or sweeps it cannot count: nothing is claimed.
    write_sweep_record(tmp_path, ["vocab_size=300,400"], subdir="v${vocab_size}")
    assert missing_jobs(tmp_path) == []
    write_sweep_record(tmp_path, ["vocab_size=interval(300,400)"])
    assert missing_jobs(tmp_path) == []
    (tmp_path / "multirun.yaml").unlink()
    assert missing_jobs(tmp_path) == []


def test_a_sweep_stopped_in_a_job_names_the_jobs_it_leaves_unrun(tmp_path: Path) -> None:
    """Stopped in its last job, a sweep said that "the jobs after" it did not run: there were none."""
    write_sweep_record(tmp_path, ["vocab_size=300,400", "schedule.transition=0.5,0.8"])
    assert planned_jobs(tmp_path) == 4
    assert "; the sweep's jobs 2 to 3 did not run (a sweep is not resumed" in jobs_not_run_note(tmp_path, 1)
    assert "; the sweep's job 3 did not run" in jobs_not_run_note(tmp_path, 2)
    assert jobs_not_run_note(tmp_path, 3) == ""
    write_sweep_record(tmp_path, ["vocab_size=interval(300,400)"])  # a count it cannot tell
    assert planned_jobs(tmp_path) is None
    assert "; the sweep's jobs after job 3 did not run" in jobs_not_run_note(tmp_path, 3)


def test_runs_of_other_schedules_differ_only_where_they_share_a_setting(tmp_path: Path) -> None:
    """A bpe run and a superbpe run share no stage names: every rule of each was listed as differing (the
    other run lacked it), and the plot's legend filled the axes."""
    rules = {"min_frequency": 1, "max_token_bytes": None}
    pre = {"name": "gpt2", "pattern": PATTERNS["gpt2"]}
    for run, stages in {"0": ["bpe"], "1": ["stage1", "stage2"], "2": ["stage1", "stage2"]}.items():
        write_run(tmp_path / run, "gpt2", PATTERNS["gpt2"])
        metrics = json.loads((tmp_path / run / "metrics.json").read_text())
        metrics["stages"] = [{"name": n, "merges": 50, "rules": rules, "pretokenizer": pre} for n in stages]
        metrics["config"]["engine"] = "python" if run == "2" else "native"
        (tmp_path / run / "metrics.json").write_text(json.dumps(metrics))
    differs = [row.differs for row in collect(tmp_path)]
    assert differs == ['engine="native"', 'engine="native"', 'engine="python"']


def test_seconds_of_runs_whose_stages_were_not_trained_are_marked(tmp_path: Path) -> None:
    """A stage taken from the cache (a sweep's later runs) or a source run takes next to no time: its
    run's seconds are starred and the note says why, so they are not read as training times."""
    write_run(tmp_path / "0", "gpt2", PATTERNS["gpt2"])
    write_run(tmp_path / "1", "gpt2", PATTERNS["gpt2"])
    assert timing_note(collect(tmp_path)) is None
    cached = json.loads((tmp_path / "1" / "metrics.json").read_text())
    cached["stages"][0]["from"] = "cache"
    (tmp_path / "1" / "metrics.json").write_text(json.dumps(cached))
    rows = {row.run: row for row in collect(tmp_path)}
    seconds = COLUMNS.index("seconds")
    assert (rows["0"].cells()[seconds], rows["1"].cells()[seconds]) == ("1.0", "1.0*")
    assert "* seconds without training a stage" in (timing_note(list(rows.values())) or "")


def test_the_plot_legend_hides_no_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One-stage runs all sit at transition 1.0: a legend drawn inside the axes covered some of them."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    measured = {"cl100k": 1.9748, "gpt2": 1.9505, "o200k": 1.9768, "superbpe": 1.9241,
                "superbpe-paper": 1.9658, "superbpe-stage1": 1.9768}  # a sweep of pretokenizer=glob(*)
    rows = [
        Row(name, "bpe", name, 800, None, (543,), 1.0, 50.0, value, differs=f"bpe.line_units={units}")
        for name, value in measured.items()
        for units in ["true" if name.startswith("superbpe") and name != "superbpe-stage1" else "false"]
    ]
    hidden: list[tuple[float, float]] = []
    save = Figure.savefig

    def checked_save(fig: Figure, *args: object, **kwargs: object) -> None:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        boxes = [legend.get_window_extent(renderer) for legend in fig.legends]
        boxes += [ax.get_legend().get_window_extent(renderer) for ax in fig.axes if ax.get_legend()]
        for ax in fig.axes:
            for line in ax.get_lines():
                for x, y in ax.transData.transform(line.get_xydata()):
                    hidden.extend((x, y) for box in boxes if box.contains(x, y))
        save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", checked_save)
    assert plot(rows, tmp_path / "summary.png") == tmp_path / "summary.png"
    assert hidden == []


def test_a_file_of_a_run_names_that_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A shell's completion gives ``run/metrics.json``: it was refused as "no such directory"."""
    from superbpe.cli import summarize  # the command, which resolves the path given

    write_run(tmp_path / "run", "gpt2", PATTERNS["gpt2"])
    (tmp_path / "run" / "train.log").write_text("")
    for given in ("metrics.json", "train.log"):
        summarize([str(tmp_path / "run" / given), "--no-plot"])
        assert "gpt2" in capsys.readouterr().out
    (tmp_path / "loose.txt").write_text("")
    with pytest.raises(SystemExit):
        summarize([str(tmp_path / "loose.txt"), "--no-plot"])
    assert "is a file, not one of a run: give the directory" in capsys.readouterr().err


def test_a_plot_path_under_a_file_is_refused_before_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was found only when the plot was saved, after the table, as ``[Errno 17] File exists``."""
    pytest.importorskip("matplotlib")
    from superbpe.cli import summarize  # the command, which checks --plot first

    write_run(tmp_path / "run", "gpt2", PATTERNS["gpt2"], "/a/heldout.txt")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(SystemExit):
        summarize([str(tmp_path / "run"), "--plot", str(tmp_path / "notes.txt" / "plot.png")])
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: plot path {tmp_path / 'notes.txt' / 'plot.png'}: cannot")
    assert "notes.txt: it is a file" in err


def test_an_empty_sweep_dir_is_refused_not_taken_for_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``superbpe-summarize "$SWEEP"`` with SWEEP unset summarized every run below the working directory
    (and drew its plot there)."""
    from superbpe.cli import summarize  # the command, which reads its arguments

    write_run(tmp_path / "run", "gpt2", PATTERNS["gpt2"])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        summarize(["", "--no-plot"])
    out, err = capsys.readouterr()
    assert out == "" and "empty path: give the directory of a sweep or of a run" in err


def test_ctrl_c_of_summarize_says_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stopped while drawing its plot, after its table: the console script said "before the command
    started, nothing done"."""
    pytest.importorskip("matplotlib")
    import superbpe.cli as cli  # the command, whose plot is stopped

    def ctrl_c(*args: object) -> None:
        raise KeyboardInterrupt

    write_run(tmp_path / "run", "gpt2", PATTERNS["gpt2"], "/a/heldout.txt")
    monkeypatch.setattr(cli, "plot", ctrl_c)
    with pytest.raises(SystemExit) as stopped:
        cli.summarize([str(tmp_path / "run")])
    assert stopped.value.code == 130
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "interrupted: the summary stopped before its end (a plot is written whole or not at all)"
