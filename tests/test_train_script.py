"""scripts/train.py and scripts/summarize.py as real subprocesses: runs, sweeps, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_helpers import SCRIPTS, assert_one_line_error, run_script

import superbpe
from superbpe.api.tokenizer import Tokenizer
from superbpe.core.errors import ConfigError
from superbpe.formats.gpt2 import MERGES_FILE, read_merges
from superbpe.formats.manifest import MANIFEST_FILE
from superbpe.training.directories import place_run

OUTPUT_FILES = {"vocab.json", "merges.txt", "tokenizer.json", "superbpe.json", "metrics.json"}


@pytest.fixture
def corpus(sample_texts: Path) -> Path:
    return sample_texts / "corpus.en"


def train(tmp_path: Path, *overrides: str, run_dir: Path | None = None, default_dir: bool = False):
    """``train.py`` in ``tmp_path`` with its cache in ``tmp_path/cache``; the run in ``run_dir`` (default
    ``tmp_path/run``), in the ``output_dir=`` given, or with ``default_dir`` where a user's run goes:
    ``outputs/DATE/TIME``."""
    run_dir = run_dir or tmp_path / "run"
    placed = default_dir or any(override.startswith("output_dir=") for override in overrides)
    return run_script(
        "train.py",
        *([] if placed else [f"hydra.run.dir={run_dir}"]),
        "engine=python",
        *overrides,
        cwd=tmp_path,
        cache_dir=tmp_path / "cache",
    )


def test_train_writes_a_loadable_tokenizer_and_metrics(tmp_path, corpus, sample_texts):
    heldout = sample_texts / "tinystories_sample.txt"
    proc = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=400", f"eval={heldout}")
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "run"
    assert f"tokenizer: {run}" in proc.stdout
    assert {p.name for p in run.iterdir()} >= OUTPUT_FILES
    tok = Tokenizer.load(run)
    assert tok.vocab_size == 400
    text = "The quick brown fox<|endoftext|>jumps."
    assert tok.decode(tok.encode(text)) == text
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["config"]["vocab_size"] == 400 and metrics["config"]["schedule"] == "bpe"
    assert [s["merges"] for s in metrics["stages"]] == [400 - 257]
    assert metrics["stages"][0]["seconds"] > 0 and metrics["stages"][0]["peak_rss_bytes"] > 10 << 20
    held = heldout.read_text(encoding="utf-8")
    documents = held.count("<|endoftext|>") + bool(held.rsplit("<|endoftext|>", 1)[-1])  # text after the last
    assert metrics["eval"]["bytes_per_token"] > 1.5 and metrics["eval"]["documents"] == documents
    assert "merging (bpe)" in proc.stderr + (run / "train.log").read_text()  # progress as log lines


@pytest.mark.slow
def test_default_job_runs_on_the_embedded_corpus(tmp_path):
    proc = train(tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "run"
    assert Tokenizer.load(run).vocab_size == 8192
    assert json.loads((run / "metrics.json").read_text())["config"]["data"][0].endswith(".py")


def test_two_point_multirun_writes_two_metrics_and_a_summary(tmp_path, corpus, sample_texts):
    sweep = tmp_path / "sweep"
    proc = run_script(
        "train.py",
        "-m",
        f"hydra.sweep.dir={sweep}",
        "engine=python",
        f"data.paths=[{corpus}]",
        "vocab_size=500",
        "schedule=superbpe",
        "schedule.transition=0.8,0.5",
        f"eval={sample_texts / 'tinystories_sample.txt'}",
        cwd=tmp_path,
        cache_dir=tmp_path / "cache",
    )
    assert proc.returncode == 0, proc.stderr
    # Its last line says how to compare the runs: nothing else named the summarize command.
    summarize = f"python {SCRIPTS / 'summarize.py'} {sweep}"
    assert proc.stdout.splitlines()[-1] == f"sweep finished; compare its runs with: {summarize}"
    metrics = sorted(sweep.glob("*/metrics.json"))
    assert len(metrics) == 2
    fractions = [json.loads(m.read_text())["transition_fraction"] for m in metrics]
    assert fractions == pytest.approx([0.8, 0.5], abs=0.01)
    # The second point reuses the first one's piece counts and (a prefix of) its stage-1 merges.
    second = (sweep / "1" / "train.log").read_text()
    assert "stage1: 122 merges from cache" in second and "piece counts from cache" in second
    sources = [[stage["from"] for stage in json.loads(m.read_text())["stages"]] for m in metrics]
    assert sources == [["trained", "trained"], ["cache", "trained"]]
    summary = run_script("summarize.py", str(sweep), cwd=tmp_path)
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()[2:]
    rows = [line.split() for line in lines if line and not line.startswith(("plot", "* seconds"))]
    assert "bytes/token" in summary.stdout and [row[1] for row in rows] == ["superbpe", "superbpe"]
    starred = {row[0]: row[6].endswith("*") for row in rows}
    assert starred == {"0": False, "1": True}  # its seconds leave out the stage taken from the cache
    assert all(row[2] == "superbpe-stage1>superbpe" and row[-1] == "-" for row in rows)  # nothing varies
    png = sweep / "summary.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    into_dir = run_script("summarize.py", str(sweep), "--plot", str(tmp_path), cwd=tmp_path)
    assert_one_line_error(into_dir, f"plot path {tmp_path} is a directory")
    pdf = run_script("summarize.py", str(sweep), "--plot", str(tmp_path / "sweep.pdf"), cwd=tmp_path)
    assert pdf.returncode == 0 and (tmp_path / "sweep.pdf").read_bytes()[:5] == b"%PDF-", pdf.stderr
    unknown = run_script("summarize.py", str(sweep), "--plot", str(tmp_path / "sweep.docx"), cwd=tmp_path)
    assert_one_line_error(unknown, "sweep.docx: matplotlib writes", "not docx")
    # Refused before the table is printed: a bad --plot leaves no half-done summary.
    assert into_dir.stdout == unknown.stdout == ""
    assert not list(tmp_path.glob(".*tmp*")) and not (tmp_path / "sweep.docx").exists()


def test_summarize_without_runs_is_a_one_line_error(tmp_path):
    assert_one_line_error(run_script("summarize.py", str(tmp_path), cwd=tmp_path), "no metrics.json")


# -- bad input: one line on stderr, exit 1, nothing left behind ---------------------------------------------


def assert_nothing_left(tmp_path: Path) -> None:
    """No run directory (named or ``outputs/...``), no output directory, nothing in the cache."""
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "out").exists()
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("*"))
    assert not list(tmp_path.rglob(MERGES_FILE)) or all("from" in str(p) for p in tmp_path.rglob(MERGES_FILE))


def test_missing_corpus(tmp_path):
    proc = train(tmp_path, f"data.paths=[{tmp_path / 'nope.txt'}]", default_dir=True)
    assert_one_line_error(proc, "nope.txt", "no such file")
    assert_nothing_left(tmp_path)


def test_a_special_token_given_twice_is_refused_before_anything_is_made(tmp_path, corpus):
    proc = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", 'special_tokens=["<|a|>","<|a|>"]')
    assert_one_line_error(proc, "special token '<|a|>' is given twice in special_tokens")
    assert_nothing_left(tmp_path)


def test_empty_corpus(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    proc = train(tmp_path, f"data.paths=[{empty}]")
    assert_one_line_error(proc, "empty")
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("setting", ["checkpoint.every_merges=0", "checkpoint.every_seconds=-1"])
def test_a_checkpoint_interval_that_is_no_interval_is_refused_before_counting(tmp_path, corpus, setting):
    proc = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", setting, default_dir=True)
    assert_one_line_error(proc, setting.split("=")[0] + " must be")
    assert "counting" not in proc.stdout + proc.stderr and "training" not in proc.stdout
    assert_nothing_left(tmp_path)


def test_an_eval_record_with_a_lone_surrogate_stops_the_run_before_training(tmp_path, corpus):
    held_out = tmp_path / "held.jsonl"
    held_out.write_text('{"text": "ok"}\n{"text": "bad \\ud800 here"}\n', encoding="utf-8")
    proc = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", f"eval={held_out}", default_dir=True)
    assert_one_line_error(proc, "held.jsonl: line 2: unpaired surrogate")
    assert "training" not in proc.stdout
    assert_nothing_left(tmp_path)
    replaced = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", f"eval={held_out}",
                     "data.errors=replace", "output_dir=r")  # fmt: skip
    assert replaced.returncode == 0, replaced.stderr
    assert json.loads((tmp_path / "r" / "metrics.json").read_text())["eval"]["documents"] == 2


def test_an_eval_file_with_bytes_the_corpus_lacks_stops_an_official_run_before_training(tmp_path):
    """compat=official gives tokens only to the corpus's bytes: the evaluation failed after training, and
    the resume it suggested failed the same way."""
    corpus, held_out = tmp_path / "ascii.txt", tmp_path / "held.txt"
    corpus.write_text("plain ascii words for a cafe, and five more words\n" * 300)
    held_out.write_text("café naïve\n")
    proc = train(tmp_path, "compat=official", f"data.paths=[{corpus}]", "vocab_size=300", f"eval={held_out}",
                 "cache_dir=null", default_dir=True)  # fmt: skip
    unseen = "held.txt holds 3 byte(s) the corpus does not (0xa9, 0xaf, 0xc3)"
    assert_one_line_error(proc, unseen, "eval=null")
    assert "merging" not in proc.stdout + proc.stderr
    assert_nothing_left(tmp_path)


def test_vocab_size_of_the_bytes_and_specials_trains_no_merges_as_train_bpe_does(tmp_path, corpus):
    proc = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=257", "engine=native")
    assert proc.returncode == 0, proc.stderr
    tok = Tokenizer.load(tmp_path / "run")
    vocab, merges = superbpe.train_bpe(corpus, 257, ["<|endoftext|>"])
    assert (tok.vocab, tok.merges) == (vocab, merges) and merges == []
    assert tok.encode("ab<|endoftext|>") == [97, 98, 256]
    stage = json.loads((tmp_path / "run" / "metrics.json").read_text())["stages"][0]
    assert stage["merges"] == 0 and stage.get("from") != "cache"  # nothing was trained or found
    below = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=256", run_dir=tmp_path / "below")
    assert_one_line_error(below, "vocab_size 256 is below 256 bytes + 1 special tokens = 257")
    assert not (tmp_path / "below").exists()


def test_vocab_size_beyond_every_engine_is_refused_before_anything_is_made(tmp_path, corpus):
    for engine in ("native", "python"):
        proc = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=700000000000", f"engine={engine}",
                     default_dir=True)
        assert_one_line_error(proc, "vocab_size 700,000,000,000 is above 1,114,112")
        assert_nothing_left(tmp_path)


@pytest.mark.parametrize("content", ["\n\n  \n", '{"text": ""}\n'], ids=["blank lines", "empty records"])
def test_json_lines_without_text_are_refused_as_no_corpus(tmp_path, content):
    """Bytes on disk but no text: it trained a tokenizer of the bytes alone, with only a warning."""
    records = tmp_path / "records.jsonl"
    records.write_text(content)
    proc = train(tmp_path, f"data.paths=[{records}]", "engine=python", "vocab_size=300")
    assert_one_line_error(proc, "records.jsonl: no text to train on")
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("where", ["outputs", "output_dir"])
def test_invalid_utf8_names_the_option_and_leaves_no_directory_or_lock(tmp_path, where):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine text\nthen \xff here\n")
    extra = [f"output_dir={tmp_path / 'out' / 'deeper'}"] if where == "output_dir" else []
    proc = train(tmp_path, f"data.paths=[{bad}]", *extra, default_dir=where == "outputs")
    assert_one_line_error(proc, "bad.txt: invalid UTF-8 at byte 15", "data.errors=replace")
    assert_nothing_left(tmp_path)


def test_transition_at_or_beyond_vocab(tmp_path, corpus):
    proc = train(
        tmp_path,
        f"data.paths=[{corpus}]",
        "vocab_size=500",
        "schedule=superbpe",
        "schedule.transition=243",
        default_dir=True,
    )
    assert_one_line_error(proc, "schedule.transition 243", "243 merges")
    assert_nothing_left(tmp_path)


def test_transition_beyond_the_merges_of_from_run(tmp_path, corpus):
    first = train(
        tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", "cache_dir=null", run_dir=tmp_path / "from"
    )
    assert first.returncode == 0, first.stderr
    before = (tmp_path / "from" / MERGES_FILE).read_bytes()
    proc = train(
        tmp_path,
        f"data.paths=[{corpus}]",
        "vocab_size=600",
        "schedule=superbpe",
        f"schedule.from_run={tmp_path / 'from'}",
        "schedule.transition=100",
    )
    assert_one_line_error(proc, "needs 100 merges", "has only 43", "transition")
    assert_nothing_left(tmp_path)
    assert (tmp_path / "from" / MERGES_FILE).read_bytes() == before


@pytest.mark.parametrize(
    "setting",
    ["pretokenizer=o200k", "pretokenizer.line_units=true", "schedule.stages.0.min_frequency=50",
     "schedule.stages.0.pretokenizer.name=o200k"],
)  # fmt: skip
def test_first_stage_settings_beside_from_run_are_refused(tmp_path, corpus, setting):
    """Its merges stand in for the first stage: a pattern or rule given for that stage changed nothing."""
    proc = train(
        tmp_path, f"data.paths=[{corpus}]", "vocab_size=600", "schedule=superbpe",
        f"schedule.from_run={tmp_path / 'from'}", "schedule.transition=100", setting,
    )  # fmt: skip
    key = setting.split('=')[0]
    assert_one_line_error(proc, f"{key}: the first stage's merges come from schedule.from_run")
    assert_nothing_left(tmp_path)


def test_a_pattern_beside_from_tokenizer_is_taken_only_for_files_that_do_not_say_theirs(tmp_path, corpus):
    bare, stated = tmp_path / "bare", tmp_path / "stated"
    bare.mkdir()
    stated.mkdir()
    (bare / "merges.txt").write_text("#version: 0.2\n")
    (stated / "superbpe.json").write_text("{}")
    for source, refused in ((bare, False), (stated, True)):
        args = [f"schedule.from_tokenizer={source}", "pretokenizer=o200k", "data.paths=[x]"]
        if refused:
            with pytest.raises(ConfigError, match="pretokenizer: the first stage's merges come from"):
                place_run(args)
        else:
            assert place_run(args) == args


def test_from_run_is_refused_on_the_demo_corpus_or_across_compat_presets(tmp_path, corpus):
    """Stage 2 from a finished run without data.paths trained on the built-in demo corpus, and one from a
    run of the other compat preset matched neither recipe: both without a word."""
    first = train(
        tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", "cache_dir=null", "compat=official",
        run_dir=tmp_path / "from",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    source = [f"schedule.from_run={tmp_path / 'from'}", "schedule=superbpe", "schedule.transition=20"]
    demo = train(tmp_path, "vocab_size=400", "compat=official", *source)
    assert_one_line_error(demo, "schedule.from_run continues a tokenizer on data.paths", "demo corpus")
    other = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=400", *source)
    assert_one_line_error(other, "was trained with compat=official, this run has compat=superbpe")
    assert_nothing_left(tmp_path)


def test_unwritable_output_dir(tmp_path, corpus):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    proc = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", f"output_dir={blocker / 'out'}")
    assert_one_line_error(proc, "output directory", "not writable")
    assert_nothing_left(tmp_path)
    assert blocker.read_text() == "not a directory"


def test_unusable_cache_dir(tmp_path, corpus):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    for cache_dir in (blocker, blocker / "cache"):
        proc = run_script(
            "train.py", f"data.paths=[{corpus}]", "vocab_size=300", f"hydra.run.dir={tmp_path / 'run'}",
            cwd=tmp_path, cache_dir=cache_dir,
        )  # fmt: skip
        assert_one_line_error(proc, f"cache_dir {cache_dir} cannot be used", "is a file", "cache_dir=null")
        assert_nothing_left(tmp_path)
    assert blocker.read_text() == "not a directory"


def test_a_directory_holding_a_tokenizer_is_not_trained_over(tmp_path, corpus):
    """Only a checkpoint marked a run: a finished run whose checkpoint files were removed, or a saved
    tokenizer, had its files replaced without a word."""
    out = tmp_path / "out"
    first = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", f"output_dir={out}", default_dir=True)
    assert first.returncode == 0, first.stderr
    for path in out.glob("checkpoint*"):
        path.unlink()
    saved = tmp_path / "saved"
    saved.mkdir()
    for name in (MERGES_FILE, "vocab.json"):
        (saved / name).write_bytes((out / name).read_bytes())
    (saved / "notes.txt").write_text("mine\n", encoding="utf-8")
    for target, held in ((out, "vocab.json, merges.txt, tokenizer.json, superbpe.json"),
                         (saved, "vocab.json, merges.txt")):  # fmt: skip
        before = {path: path.read_bytes() for path in target.rglob("*") if path.is_file()}
        again = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=400", f"output_dir={target}",
                      default_dir=True)  # fmt: skip
        assert_one_line_error(again, f"already holds a tokenizer ({held})", "choose another output_dir")
        assert {path: path.read_bytes() for path in target.rglob("*") if path.is_file()} == before


def test_a_run_directory_that_cannot_be_made_is_one_line(tmp_path, corpus):
    """Where ``outputs/`` cannot be made (a file of that name; a read-only directory), the line was
    OmegaConf's, naming the resolver's exception."""
    (tmp_path / "outputs").write_text("mine\n", encoding="utf-8")
    refused = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", default_dir=True)
    line = assert_one_line_error(refused, "error: cannot make the run directory ", "give output_dir=DIR")
    assert "interpolation" not in line
    assert (tmp_path / "outputs").read_text(encoding="utf-8") == "mine\n"


def test_bad_override_is_reported_by_hydra_without_a_run(tmp_path):
    proc = train(tmp_path, "vocab_sise=300", default_dir=True)
    assert proc.returncode == 1
    assert "vocab_sise" in proc.stderr and "Traceback" not in proc.stderr
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("key", ["output_dir", "hydra.run.dir"])
def test_finished_run_dir_is_not_overwritten_without_resume(tmp_path, corpus, key):
    out = tmp_path / "out"
    first = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", f"{key}={out}", default_dir=True)
    assert first.returncode == 0, first.stderr
    merges = read_merges(out / MERGES_FILE)
    recorded = {path.name: path.read_bytes() for path in (out / ".hydra").iterdir()}
    again = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=400", f"{key}={out}", default_dir=True)
    # Finished: nothing to continue, so the way out is another directory (a resume only evaluates it).
    assert_one_line_error(again, "already holds a finished run; choose another output_dir", "eval=<file>")
    assert again.stderr.count("resume=") == 1  # said once
    assert read_merges(out / MERGES_FILE) == merges
    assert json.loads((out / MANIFEST_FILE).read_text())["vocab_size"] == 300
    # The refused run wrote nothing there: the run is still resumed from what it recorded.
    assert {path.name: path.read_bytes() for path in (out / ".hydra").iterdir()} == recorded
    resumed = train(tmp_path, f"resume={out}", default_dir=True)
    assert resumed.returncode == 0 and "nothing to do" in resumed.stdout + resumed.stderr, resumed.stderr


def test_a_resume_whose_checkpoint_json_is_gone_but_its_merges_log_is_not_is_refused(tmp_path, corpus):
    """The resume said "no checkpoint yet" and trained from the beginning, writing over the merges log."""
    out = tmp_path / "out"
    proc = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", f"output_dir={out}")
    assert proc.returncode == 0, proc.stderr
    (out / "checkpoint.json").unlink()
    (out / "metrics.json").unlink()  # else the run counts as finished with every file in place

    def files() -> dict[str, bytes]:  # all but the log, which the refused resume appends to
        kept = [path for path in out.rglob("*") if path.is_file() and path.name != "train.log"]
        return {path.name: path.read_bytes() for path in kept}

    before = files()
    resumed = train(tmp_path, f"resume={out}", default_dir=True)
    assert_one_line_error(
        resumed, "checkpoint.json is missing but checkpoint.merges holds 43 merges", "into a new directory",
        f"remove {out / 'checkpoint.merges'}",
    )
    assert files() == before and not (out / "checkpoint.json").exists()
    anew = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", f"output_dir={out}")  # not resumed
    assert_one_line_error(anew, "merges log (checkpoint.merges, 43 merges) without its checkpoint.json")
    assert files() == before
    lone = tmp_path / "lone"  # the log alone, which nothing else there would refuse a new run for
    lone.mkdir()
    (lone / "checkpoint.merges").write_bytes(before["checkpoint.merges"])
    anew = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", f"output_dir={lone}")
    assert_one_line_error(anew, "merges log (checkpoint.merges, 43 merges) without its checkpoint.json")
    assert [path.name for path in lone.iterdir()] == ["checkpoint.merges"]
    assert (lone / "checkpoint.merges").read_bytes() == before["checkpoint.merges"]
    (out / "checkpoint.merges").write_bytes(b"")  # an empty log holds nothing: the run starts over
    again = train(tmp_path, f"resume={out}", default_dir=True)
    assert again.returncode == 0, again.stderr
    assert (out / "checkpoint.json").is_file() and (out / "merges.txt").read_bytes() == before["merges.txt"]


def test_output_dir_is_the_whole_run(tmp_path, corpus):
    """The overrides and log of a run go where its tokenizer goes, so that directory alone resumes it."""
    out = tmp_path / "out"
    proc = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", f"eval={corpus}", f"output_dir={out}")
    assert proc.returncode == 0, proc.stderr
    assert (out / ".hydra" / "overrides.yaml").is_file() and (out / "train.log").is_file()
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "run").exists()
    (out / "metrics.json").unlink()  # the resume has the evaluation to do again, with the run's own eval
    resumed = train(tmp_path, f"resume={out}", default_dir=True)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "metrics.json").read_text())["config"]["vocab_size"] == 300


def test_a_run_started_with_output_dir_resumes_where_it_was_moved(tmp_path, corpus):
    out, moved = tmp_path / "out", tmp_path / "moved"
    proc = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", f"output_dir={out}")
    assert proc.returncode == 0, proc.stderr
    before = (out / "merges.txt").read_bytes()
    out.rename(moved)
    (moved / "merges.txt").unlink()
    resumed = train(tmp_path, f"resume={moved}", default_dir=True)
    assert resumed.returncode == 0, resumed.stderr
    assert (moved / "merges.txt").read_bytes() == before and not out.exists()
    again = train(tmp_path, f"resume={moved}", f"output_dir={moved}", default_dir=True)
    assert again.returncode == 0, again.stderr
    repeated = train(tmp_path, f"resume={moved}", f"output_dir={out}", default_dir=True)  # the run's own
    assert repeated.returncode == 0 and not out.exists(), repeated.stderr
    other = tmp_path / "other"
    elsewhere = train(tmp_path, f"resume={moved}", f"output_dir={other}", default_dir=True)
    assert_one_line_error(elsewhere, f"resume writes into {moved} itself; drop output_dir={other}")
    assert not other.exists()


def test_a_run_whose_output_dir_hydra_resolves_resumes_into_it(tmp_path, corpus):
    """Its recorded output_dir was dropped like a plain one: the resume found no checkpoint in the Hydra
    directory and trained again from scratch, beside the run's tokenizer."""
    inside = "output_dir=${hydra:runtime.output_dir}/tok"
    proc = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", inside, default_dir=True)
    assert proc.returncode == 0, proc.stderr
    (run,) = (tmp_path / "outputs").glob("*/*")
    before = (run / "tok" / MERGES_FILE).read_bytes()
    (run / "tok" / MERGES_FILE).unlink()
    resumed = train(tmp_path, f"resume={run}", default_dir=True)
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, resumed.stdout + resumed.stderr
    assert (run / "tok" / MERGES_FILE).read_bytes() == before and not (run / MERGES_FILE).exists()


def test_an_empty_resume_or_a_sweep_of_resumes_is_refused(tmp_path):
    """``resume=`` started a new run; ``-m resume=a,b`` was taken as one directory named ``a,b``."""
    assert_one_line_error(train(tmp_path, "resume=", default_dir=True), "resume= is empty")
    sweep = train(tmp_path, "-m", f"resume={tmp_path / 'a'},{tmp_path / 'b'}", default_dir=True)
    assert_one_line_error(sweep, "resume continues one run: give resume=<run dir> without -m")
    assert_nothing_left(tmp_path)
    assert not (tmp_path / "multirun").exists()


def test_output_dir_conflicts_are_refused_before_anything_is_made(tmp_path, corpus):
    out = f"output_dir={tmp_path / 'out'}"
    sweep = train(tmp_path, "-m", f"data.paths=[{corpus}]", "vocab_size=300,400", out)
    assert_one_line_error(sweep, "a sweep writes each job into its own directory", "hydra.sweep.dir")
    both = run_script(
        "train.py", f"data.paths=[{corpus}]", out, f"hydra.run.dir={tmp_path / 'h'}",
        cwd=tmp_path, cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert_one_line_error(both, "output_dir and hydra.run.dir name different directories")
    assert_nothing_left(tmp_path)
    assert not (tmp_path / "multirun").exists() and not (tmp_path / "h").exists()


def test_the_cache_keeps_the_merges_of_each_text_field_apart(tmp_path, corpus):
    """The merges cached for one field of JSON lines were taken for another: the run trained on the wrong
    text, silently."""
    lines = corpus.read_text(encoding="utf-8").splitlines()[:300]
    records = tmp_path / "two.jsonl"
    rows = [json.dumps({"text": line, "body": line.upper()[::-1]}) for line in lines]
    records.write_text("\n".join(rows) + "\n")
    data = [f"data.paths=[{records}]", "vocab_size=300"]
    assert train(tmp_path, *data, "data.text_field=text", "output_dir=a").returncode == 0
    cached = train(tmp_path, *data, "data.text_field=body", "output_dir=b")
    alone = run_script("train.py", *data, "data.text_field=body", "engine=python", "output_dir=c",
                       cwd=tmp_path, cache_dir=None)  # fmt: skip
    assert cached.returncode == 0 and alone.returncode == 0, cached.stderr + alone.stderr
    merges = {name: (tmp_path / name / MERGES_FILE).read_bytes() for name in "abc"}
    assert merges["b"] == merges["c"] != merges["a"]


def test_the_summary_says_what_else_differs_between_runs(tmp_path, corpus, sample_texts):
    """Runs that differed in their corpus (or a stage's sample share, rules, a custom pattern) showed as
    identical rows, and the plot drew them as one line."""
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text(encoding="utf-8")[: 40_000], encoding="utf-8")
    sweep = tmp_path / "sweep"
    proc = run_script(
        "train.py", "-m", f"hydra.sweep.dir={sweep}", "engine=python", f"data.paths=[{corpus}],[{other}]",
        "vocab_size=300", f"eval={sample_texts / 'tinystories_sample.txt'}", cwd=tmp_path, cache_dir=None,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = run_script("summarize.py", str(sweep), "--no-plot", cwd=tmp_path)
    lines = [line for line in summary.stdout.splitlines() if not line.startswith("* ")]  # the timing note
    assert lines[0].split()[-1] == "differs"
    assert sorted(line.split()[-1] for line in lines[2:]) == [f'data=["{corpus.name}"]', 'data=["other.txt"]']
    # One run evaluated again on another text: its bytes/token is not comparable, and the table says so.
    again = run_script("train.py", f"resume={sweep / '1'}", f"eval={other}", cwd=tmp_path, cache_dir=None)
    assert again.returncode == 0 and "in place of the one on" in again.stdout, again.stdout + again.stderr
    rows = run_script("summarize.py", str(sweep), "--no-plot", cwd=tmp_path).stdout.splitlines()[2:]
    rows = [row for row in rows if not row.startswith("* ")]
    evals = sorted(row.split("eval=")[1].split(",")[0] for row in rows)
    assert evals == ['["other.txt"', '["tinystories_sample.txt"']


def test_a_failing_job_of_a_sweep_is_named_and_the_others_run(tmp_path, corpus):
    """A job's error ended the process, so the jobs after it never ran and nothing said so."""
    sweep = tmp_path / "sweep"
    proc = run_script(
        "train.py", "-m", f"hydra.sweep.dir={sweep}", "engine=python", f"data.paths=[{corpus}]",
        "vocab_size=300,100,350,50", cwd=tmp_path, cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3, proc.stderr
    assert "sweep job 1 (" in errors[0] and "vocab_size=100): vocab_size 100 is below" in errors[0]
    assert "sweep job 3 (" in errors[1] and "vocab_size=50): vocab_size 50 is below" in errors[1]
    summarize = f"python {SCRIPTS / 'summarize.py'} {sweep}"  # the runs it has are compared so
    finished = "error: sweep: job 1, job 3 failed (said above); its other jobs finished"
    assert errors[2] == f"{finished}; compare its runs with: {summarize}"
    assert "Error executing job" not in proc.stderr  # Hydra's own line beside ours
    assert (sweep / "0" / "merges.txt").is_file() and (sweep / "2" / "merges.txt").is_file()
    assert not (sweep / "1").exists() and not (sweep / "3").exists()
    record = (sweep / "multirun.yaml").read_bytes()
    again = run_script(
        "train.py", "-m", f"hydra.sweep.dir={sweep}", "engine=python", f"data.paths=[{corpus}]",
        "vocab_size=400,450", cwd=tmp_path, cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert_one_line_error(again, f"hydra.sweep.dir {sweep} already holds a sweep")
    assert (sweep / "multirun.yaml").read_bytes() == record  # Hydra wrote its record over it before


def test_runs_and_sweeps_refused_at_their_settings_leave_nothing(tmp_path, corpus):
    """An output_dir whose interpolation fails left the run's directory and Hydra's "Error executing job"
    line; a sweep refused before its first job, or whose every job failed, left its multirun.yaml."""
    made = run_script("train.py", f"data.paths=[{corpus}]", "vocab_size=300", "output_dir=${nope}",
                      cwd=tmp_path, cache_dir=None)  # fmt: skip
    assert_one_line_error(made, "Interpolation key 'nope' not found")
    sweep = run_script("train.py", "-m", f"data.paths=[{corpus}]", "vocab_size=300,abc", cwd=tmp_path,
                       cache_dir=None)  # fmt: skip
    assert_one_line_error(sweep, "vocab_size=abc")
    failed = run_script("train.py", "-m", f"data.paths=[{corpus}]", "vocab_size=100,50", cwd=tmp_path,
                        cache_dir=None)  # fmt: skip
    assert failed.returncode == 1 and "job 0, job 1 failed" in failed.stderr, failed.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()
    # Its last line said the other jobs finished and named the removed directory to summarize.
    last = failed.stderr.splitlines()[-1]
    assert last.endswith("no job made a run, so the sweep left nothing to compare"), last
    assert "other jobs finished" not in last and "summarize" not in last


def test_a_failed_run_leaves_a_directory_it_did_not_make(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    proc = train(tmp_path, f"data.paths=[{tmp_path / 'nope.txt'}]", f"output_dir={mine}")
    assert_one_line_error(proc, "nope.txt", "no such file")
    assert mine.is_dir() and not list(mine.iterdir())


@pytest.mark.parametrize("output_dir", ["out", "./out", "{cwd}/out"])
def test_a_failed_run_leaves_the_empty_directory_it_was_started_in(tmp_path, corpus, output_dir):
    """The run made ``out`` but not its parent: an empty working directory is the user's, not the run's."""
    cwd = tmp_path / "empty"
    cwd.mkdir()
    proc = run_script("train.py", f"data.paths=[{corpus}]", "vocab_size=5",
                      f"output_dir={output_dir.format(cwd=cwd)}", cwd=cwd, cache_dir=None)  # fmt: skip
    assert_one_line_error(proc, "vocab_size 5")
    assert cwd.is_dir() and not list(cwd.iterdir())


def test_a_vocabulary_smaller_than_asked_is_a_warning(tmp_path, sample_texts):
    proc = train(tmp_path, f"data.paths=[{sample_texts / 'tinystories_sample.txt'}]", "vocab_size=5000")
    assert proc.returncode == 0, proc.stderr
    size = len(json.loads((tmp_path / "run" / "vocab.json").read_text()))
    assert f"WARNING] - the vocabulary is {size} tokens, {5000 - size} fewer than vocab_size=5000" in (
        proc.stdout + proc.stderr
    )
