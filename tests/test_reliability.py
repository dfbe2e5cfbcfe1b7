"""Ways a run could be lost or misread, each pinned by a test."""

from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from script_helpers import assert_one_line_error, run_script, start_script

import superbpe
from superbpe.core.errors import ConfigError, InputError, SuperBPEError
from superbpe.core.util import atomic_write, remove_stale_temps
from superbpe.core.vocab import build_vocab
from superbpe.engines import native as native_engine
from superbpe.formats.checkpoints import CHECKPOINT_FILE, Checkpoint, save_checkpoint
from superbpe.formats.gpt2 import MERGES_FILE
from superbpe.jobs.encode import encode_corpus
from superbpe.jobs.evaluate import evaluate
from superbpe.training.cache import RunCache
from superbpe.training.config import DataConfig, TrainConfig, register_configs, to_dataclass
from superbpe.training.directories import claim_unique_dir, resume_args, run_cwd
from superbpe.training.run import RunResult

CONF = Path(__file__).resolve().parents[1] / "conf"
EOT = "<|endoftext|>"


@pytest.fixture
def corpus(sample_texts: Path) -> Path:
    return sample_texts / "corpus.en"


def train(tmp_path: Path, *overrides: str, run_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_script(
        "train.py",
        f"hydra.run.dir={run_dir or tmp_path / 'run'}",
        "engine=python",
        *overrides,
        cwd=tmp_path,
        cache_dir=tmp_path / "cache",
    )


# -- bug 1: runs started in the same second ---------------------------------------------------------------


def test_default_run_dirs_are_claimed_so_runs_in_the_same_second_differ(tmp_path: Path) -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", return_hydra_config=True)
    dirs = OmegaConf.to_container(cfg.hydra, resolve=False)
    assert dirs["run"]["dir"].startswith("${unique_dir:") and dirs["sweep"]["dir"].startswith("${unique_dir:")
    base = str(tmp_path / "outputs" / "12-00-00")
    first = claim_unique_dir(base)
    assert claim_unique_dir(base) == first  # the same config value resolves to the same dir
    (tmp_path / "outputs" / "12-00-00-2").mkdir()  # claimed by another process meanwhile
    del superbpe.training.directories._claimed[base]
    assert claim_unique_dir(base) == base + "-3"


def test_concurrent_runs_with_one_dir_name_get_one_dir_each(tmp_path: Path, corpus: Path) -> None:
    args = [
        "hydra.run.dir=${unique_dir:runs/same}",
        "engine=python",
        f"data.paths=[{corpus}]",
        "vocab_size=300",
    ]
    procs = [start_script("train.py", *args, cwd=tmp_path) for _ in range(3)]
    assert [proc.wait(timeout=300) for proc in procs] == [0, 0, 0]
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["same", "same-2", "same-3"]
    for run in runs:
        assert (tmp_path / "runs" / run / MERGES_FILE).is_file()
        assert (tmp_path / "runs" / run / "train.log").read_text().count("training 43 merges") == 1


# -- bug 2: one-character special tokens ----------------------------------------------------------------


@pytest.mark.parametrize("special", ["x", "é", "Ġ", "\n"])
def test_a_special_spelled_like_a_byte_token_is_refused(special: str, corpus: Path) -> None:
    """In one line: the spelling suggested for a newline special held the newline."""
    with pytest.raises(ConfigError, match="spelled like a byte token") as refused:
        superbpe.train_bpe(corpus, 300, [special], engine="python")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("special", "text"), [("Ġthe", " the"), ("ĊĊ", "\n\n"), ("<|Ġ|>", "<| |>")])
def test_a_special_spelling_another_text_in_the_byte_table_is_refused_before_training(
    special: str, text: str, corpus: Path
) -> None:
    """tokenizer.json would spell the special like the token of ``text`` once the merges learn it, which
    only the end of training would tell."""
    with pytest.raises(ConfigError, match=f"is how tokenizer.json spells the text {re.escape(repr(text))}"):
        superbpe.train_bpe(corpus, 300, [special], engine="python")


@pytest.mark.parametrize("special", ["<|résumé|>", "naïve"])
def test_a_special_whose_byte_table_reading_is_no_text_is_kept(
    special: str, corpus: Path, tmp_path: Path
) -> None:
    """Its "é" or "ï" reads as a lone byte in the byte table: no merge of UTF-8 text makes that."""
    vocab, merges = superbpe.train_bpe(corpus, 300, [special], engine="python")
    superbpe.Tokenizer(vocab, merges, [special]).save(tmp_path / "tok")
    loaded = superbpe.Tokenizer.load(tmp_path / "tok")
    assert loaded.encode(f"a {special} b").count(loaded.token_to_id(special)) == 1


def test_a_special_with_the_bytes_of_a_learned_token_is_refused() -> None:
    with pytest.raises(ConfigError, match="bytes of a learned token"):
        build_vocab([(b"a", b"b")], ["ab"])
    with pytest.raises(ConfigError, match=r"^special_tokens takes a list of strings: \['<\|endoftext\|>'\]"):
        build_vocab([(b"a", b"b")], "<|endoftext|>")  # not its characters, each a special
    with pytest.raises(ConfigError, match=r"^merge #1 must be two bytes objects, not \('a', 'b'\)"):
        build_vocab([(b"a", b"b"), ("a", "b")])  # type: ignore[list-item]


def test_one_char_special_is_a_one_line_error_with_nothing_left(tmp_path: Path, corpus: Path) -> None:
    proc = train(tmp_path, f"data.paths=[{corpus}]", "vocab_size=300", "special_tokens=[x]")
    assert_one_line_error(proc, "special token 'x'", "byte token")
    assert not (tmp_path / "run").exists()


def test_a_plain_word_special_is_warned_about(corpus: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="superbpe"):
        superbpe.train_bpe(corpus, 300, ["the", EOT], engine="python")
    assert "'the' is a plain word" in caplog.text and EOT not in caplog.text


# -- bug 3: '+key' for a misspelt key -------------------------------------------------------------------


def test_plus_unknown_key_is_refused_not_ignored(tmp_path: Path) -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["+vocab_sise=100", "+checkpoint.evry=3"])
    with pytest.raises(ConfigError, match="checkpoint.evry, vocab_sise"):
        to_dataclass(cfg, TrainConfig)
    proc = train(tmp_path, "+vocab_sise=100")
    assert_one_line_error(proc, "unknown config key", "vocab_sise")


def test_hydra_errors_are_one_line(tmp_path: Path) -> None:
    assert_one_line_error(train(tmp_path, "vocab_sise=100"), "vocab_sise", "did you mean vocab_size?")
    assert_one_line_error(train(tmp_path, "data.pths=[a]"), "did you mean data.paths?")
    assert_one_line_error(train(tmp_path, "engine=turbo"), "engine/turbo", "one of: auto, native, python")
    unquoted = train(tmp_path, r"pretokenizer.name=custom:\p{L}+")
    assert_one_line_error(unquoted, "cannot parse override", "quote the value")
    unquoted_list = train(tmp_path, "special_tokens=[<|a|>]")
    assert_one_line_error(unquoted_list, "quote the value: \"special_tokens=['a','b']\"")
    stage_typo = train(tmp_path, "schedule.stages.0.min_frequncy=2")  # a list item's key, with its index
    assert_one_line_error(stage_typo, "did you mean schedule.stages.0.min_frequency?")
    no_stage = train(tmp_path, "schedule.stages.1.min_frequency=2")  # schedule=bpe has stage 0 only
    assert_one_line_error(no_stage, "schedule.stages.1 does not exist", "counted from 0")
    evaluate_typo = run_script("evaluate.py", "tokenizer=x", "input=y", "separater=z", cwd=tmp_path)
    assert_one_line_error(evaluate_typo, "separater", "did you mean separator?")


def test_several_values_without_m_say_how_to_sweep_or_list_them(tmp_path: Path) -> None:
    """Hydra's hints for ``key=a,b`` in a single run (``-m``, a list, a quoted string) are on the lines
    after its first, which the one-line error would drop."""
    proc = train(tmp_path, "vocab_size=300,400")
    assert_one_line_error(proc, "vocab_size=300,400 gives several values", "add -m", "vocab_size=[300,400]")
    assert not (tmp_path / "run").exists()


def test_a_config_group_set_to_null_is_a_one_line_error(tmp_path: Path) -> None:
    """Hydra refuses ``schedule=null`` (``compat=null``, a default of evaluate's config) with a plain
    ValueError, which was a traceback."""
    assert_one_line_error(train(tmp_path, "schedule=null"), "schedule=null: a config group takes one of")
    proc = run_script("evaluate.py", "compat=null", "tokenizer=x", "input=y", cwd=tmp_path)
    assert_one_line_error(proc, "compat=null: a config group takes one of its options")
    no_key = train(tmp_path, "=5")  # refused by Hydra alike, but names no group
    assert_one_line_error(no_key, "Config group override must be a string or a list")
    assert "null" not in no_key.stderr
    assert not (tmp_path / "run").exists()


def test_an_empty_hydra_run_or_sweep_dir_is_refused_before_writing_into_the_working_directory(
    tmp_path: Path,
) -> None:
    """``hydra.run.dir=$OUT`` with ``$OUT`` unset: Hydra took "" as the working directory, and the run's
    files (checkpoint, tokenizer, .hydra) went there among the user's own."""
    for sweep, key in (([], "hydra.run.dir"), (["-m"], "hydra.sweep.dir")):
        proc = run_script("train.py", *sweep, f"{key}=", "vocab_size=300", cwd=tmp_path)
        assert_one_line_error(proc, f"{key} is empty", "the working directory")
        assert list(tmp_path.iterdir()) == []


def test_an_empty_output_dir_is_refused_before_a_run_goes_elsewhere(tmp_path: Path) -> None:
    """``output_dir=$OUT`` with ``$OUT`` unset fell back to a new ``outputs/DATE/TIME``: the script that
    gave it found no tokenizer where it looked."""
    work = tmp_path / "work"
    work.mkdir()
    for sweep, value in (([], ""), ([], "''"), (["-m"], "")):
        given = (*sweep, f"output_dir={value}", "vocab_size=300")
        proc = run_script("train.py", *given, cwd=work, cache_dir=tmp_path / "cache")
        assert_one_line_error(proc, "output_dir is empty (an unset variable?)", "under outputs/ instead")
        assert list(work.iterdir()) == []


def test_two_hydra_modes_at_once_are_a_one_line_error(tmp_path: Path) -> None:
    """Hydra refuses ``-m`` with ``--cfg job`` by raising a plain ValueError, which was a traceback."""
    proc = run_script("train.py", "-m", "--cfg", "job", "vocab_size=300,400", cwd=tmp_path)
    assert_one_line_error(proc, "Only one of --run, --multirun, --cfg", "drop -m")
    assert not (tmp_path / "multirun").exists()


def test_hydra_job_chdir_leaves_relative_paths_naming_the_files_where_the_command_ran(
    tmp_path: Path, corpus: Path
) -> None:
    """With ``hydra.job.chdir=true`` the job ran in the run directory, where ``data.paths=[corpus.txt]``
    named no file ("no such file or directory" for a file right there)."""
    shutil.copy(corpus, tmp_path / "corpus.txt")
    given = ("data.paths=[corpus.txt]", "eval=corpus.txt", "vocab_size=300", "hydra.job.chdir=true")
    proc = train(tmp_path, *given)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["eval"]["bytes"] > 0


def test_a_list_key_given_one_value_and_a_required_key_left_out_say_what_to_write(tmp_path: Path) -> None:
    one_path = train(tmp_path, "data.paths=a.txt")
    assert_one_line_error(one_path, "data.paths takes a list: data.paths=[a.txt]")
    two_evals = train(tmp_path, "eval=[a.txt,b.txt]")
    assert_one_line_error(two_evals, "eval takes one value, not a list (eval=[a.txt,b.txt])")
    no_output = run_script("encode.py", "tokenizer=x", "input=y", cwd=tmp_path)
    assert_one_line_error(no_output, "output is required: add output=")


def test_a_required_path_left_empty_is_refused(tmp_path: Path) -> None:
    """``output=`` (an unset ``$OUT``) named the working directory: a traceback for encode's output, every
    text file there read for an input."""
    (tmp_path / "a.txt").write_text("hello\n", encoding="utf-8")
    given = {"tokenizer": "tokenizer=x", "input": "input=a.txt", "output": "output=o.bin"}
    for key in given:
        args = [f"{key}=" if k == key else arg for k, arg in given.items()]
        refused = run_script("encode.py", *args, cwd=tmp_path)
        assert_one_line_error(refused, f"{key} is empty: give {key}=PATH")
    empty_in_list = run_script("evaluate.py", "tokenizer=x", "input=[a.txt,'']", cwd=tmp_path)
    assert_one_line_error(empty_in_list, "input is empty: give input=PATH")
    no_eval = train(tmp_path, "data.paths=[a.txt]", "eval=")  # a run without its bytes/token, unsaid
    assert_one_line_error(no_eval, "eval is empty: give eval=PATH, or leave it out for no evaluation")
    # data.paths=[$CORPUS] with $CORPUS unset trained on the working directory (earlier runs' files too).
    empty_path = train(tmp_path, "data.paths=[a.txt,'']")
    assert_one_line_error(empty_path, "data.paths[1] is empty: give the path of a corpus file or directory")
    with pytest.raises(InputError, match=r"^inputs\[0\] is an empty path$"):
        superbpe.count([""])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


# -- bug 4: the engine is chosen once, never switched silently -------------------------------------------


@pytest.mark.skipif(not native_engine.available(), reason="superbpe._native is not built")
def test_auto_with_a_custom_pattern_records_the_engine_that_ran(tmp_path: Path, corpus: Path) -> None:
    proc = run_script(
        "train.py",
        f"hydra.run.dir={tmp_path / 'run'}",
        "engine=auto",
        "pretokenizer=custom",
        r"pretokenizer.pattern='\s?\w+|\s+|[^\w\s]+'",
        f"data.paths=[{corpus}]",
        "vocab_size=300",
        f"eval={corpus}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["config"]["engine"] == "python" and metrics["config"]["engine_requested"] == "auto"
    assert "no exact splitter" in (tmp_path / "run" / "train.log").read_text()
    native = train(tmp_path, "engine=native", "pretokenizer=custom", r"pretokenizer.pattern='\w+'",
                   f"data.paths=[{corpus}]", run_dir=tmp_path / "n")  # fmt: skip
    assert_one_line_error(native, "engine 'native'", "engine=python")


# -- bug 6: reading native counts keeps the Rust table ----------------------------------------------------


@pytest.mark.skipif(not native_engine.available(), reason="superbpe._native is not built")
def test_reading_native_counts_keeps_the_rust_table(corpus: Path) -> None:
    counts = superbpe.count(corpus, [EOT], engine="native")
    assert isinstance(counts, native_engine.NativePieceCounts)
    table = counts.native()
    piece = max(counts, key=counts.__getitem__)
    assert counts[piece] > 0 and piece in list(counts)
    assert counts.native() is table
    with pytest.raises(TypeError):
        counts.counts[piece] = 1  # type: ignore[index]  # read-only: the table stays the truth
    doubled = superbpe.count(corpus, [EOT], engine="native")
    doubled.update(counts)
    assert doubled[piece] == 2 * counts[piece] and doubled.total() == 2 * counts.total()


# -- rough edges -----------------------------------------------------------------------------------------


def test_resume_args_take_the_runs_own_overrides(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- vocab_size=300\n- data.paths=[a.txt]\n- workers=1\n")
    args = resume_args([f"resume={run}", "workers=2"])
    assert args[:2] == ["vocab_size=300", "data.paths=[a.txt]"] and "workers=2" in args
    assert "workers=1" not in args and f"hydra.run.dir='{run}'" in args and "hydra.output_subdir=null" in args
    assert resume_args([f"resume={run}", "vocab_size=300"]).count("vocab_size=300") == 1
    (run / ".hydra" / "overrides.yaml").write_text("- vocab_size=300\n- executor=ray\n- engine=python\n")
    assert "executor=local" in resume_args([f"resume={run}", "executor=local", "engine=native"])
    (run / ".hydra" / "overrides.yaml").write_text("- vocab_size=300\n- data.paths=[a.txt]\n- workers=1\n")
    with pytest.raises(ConfigError, match=r"vocab_size=400 conflicts with the run's vocab_size=300"):
        resume_args([f"resume={run}", "vocab_size=400"])
    # The same value quoted otherwise is the same setting; another value is not.
    requoted = resume_args([f"resume={run}", "data.paths=['a.txt']"])
    assert sum(arg.startswith("data.paths=") for arg in requoted) == 1
    other = r"data.paths=\['b.txt'\] conflicts with the run's data.paths=\[a.txt\]"
    with pytest.raises(ConfigError, match=other):
        resume_args([f"resume={run}", "data.paths=['b.txt']"])
    with pytest.raises(ConfigError, match="drop hydra.run.dir"):
        resume_args([f"resume={run}", "hydra.run.dir=x"])
    with pytest.raises(InputError, match="no such run directory"):
        resume_args([f"resume={tmp_path / 'nope'}"])
    for name in ("train.log", ".hydra/overrides.yaml"):  # one of the run's files: "no such run directory"
        (run / name).touch()
        with pytest.raises(InputError, match=rf"a file; give the run's directory: resume={run}$"):
            resume_args([f"resume={run / name}"])
    (run / "train.log").unlink()
    (tmp_path / "texts").mkdir()
    with pytest.raises(InputError, match="not a run directory"):
        resume_args([f"resume={tmp_path / 'texts'}"])
    (tmp_path / "texts" / "a.txt").touch()  # a file of no run: its directory is no run to name either
    with pytest.raises(InputError, match=r"a.txt: a file, and not one of a run; give resume=<run dir>$"):
        resume_args([f"resume={tmp_path / 'texts' / 'a.txt'}"])
    sweep = tmp_path / "sweep"  # a sweep's record, a finished job 0 and job 1 stopped at a checkpoint
    (sweep / "0" / ".hydra").mkdir(parents=True)
    (sweep / "0" / ".hydra" / "overrides.yaml").write_text("- vocab_size=300\n")
    (sweep / "0" / "metrics.json").write_text("{}")
    (sweep / "1").mkdir()
    (sweep / "1" / CHECKPOINT_FILE).write_text("{}")
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    continue_job_1 = rf"a sweep's directory; .* resume={sweep / '1'} \(not finished: 1\)"
    with pytest.raises(InputError, match=continue_job_1):
        resume_args([f"resume={sweep}"])
    # Killed outright, it never made jobs 2 and 3: once job 1 finishes, "all finished" would hide them.
    (sweep / "1" / "metrics.json").write_text("{}")
    record = ["hydra:", "  sweep:", "    subdir: ${hydra.job.num}", "  overrides:", "    task:"]
    (sweep / "multirun.yaml").write_text("\n".join([*record, "    - vocab_size=300,400,500,600"]) + "\n")
    with pytest.raises(InputError, match=r"every run it holds has finished; jobs 2, 3 of its multirun.yaml"):
        resume_args([f"resume={sweep}"])
    shutil.rmtree(sweep / "0")  # job 0 failed before its first checkpoint: the run named is one that exists
    with pytest.raises(InputError, match=rf"its runs, resume={sweep / '1'} \(every run .*; jobs 0, 2, 3 of"):
        resume_args([f"resume={sweep}"])
    assert resume_args(["vocab_size=3"]) == ["vocab_size=3"]
    (run / ".hydra" / "overrides.yaml").write_text("")  # killed while Hydra wrote it, and no checkpoint
    with pytest.raises(InputError, match="neither its overrides nor a checkpoint"):
        resume_args([f"resume={run}"])
    (run / ".hydra" / "overrides.yaml").unlink()  # killed before Hydra wrote it, and no checkpoint
    with pytest.raises(InputError, match="neither its overrides nor a checkpoint"):
        resume_args([f"resume={run}"])
    (run / CHECKPOINT_FILE).write_text("{}")  # a run made by the library: the overrides are given again
    assert resume_args([f"resume={run}", "vocab_size=3"])[:2] == ["vocab_size=3", f"resume='{run}'"]
    # Given nothing, it resumed with the default corpus and listed every file of it as a difference.
    with pytest.raises(InputError, match="not started by superbpe-train .* give them again"):
        resume_args([f"resume={run}"])


def test_a_resume_into_a_directory_it_cannot_write_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """Refused before Hydra opens the run's train.log there, which failed as a page of traceback (a
    read-only mount of the run's file system, or another user's run)."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- vocab_size=300\n- data.paths=[a.txt]\n")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != run and real_access(path, mode))
    with pytest.raises(InputError, match=r"run: the run directory is not writable \(Permission denied\)"):
        resume_args([f"resume={run}"])


def test_a_read_only_mount_is_named_as_such(tmp_path: Path, monkeypatch) -> None:
    """"Permission denied" would send the user to chmod, which cannot help on a read-only mount."""
    import superbpe.core.util as util

    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert util.directory_problem(tmp_path) == "Permission denied"
    read_only = os.statvfs_result((4096,) * 8 + (os.ST_RDONLY, 255))
    monkeypatch.setattr(os, "statvfs", lambda path: read_only)
    assert util.directory_problem(tmp_path) == "Read-only file system"


def test_a_resume_adds_only_what_changes_speed_or_reporting(tmp_path: Path) -> None:
    """A run of the command recorded all it was given: another setting on its resume would train another
    run (before the first checkpoint nothing else would notice, and its record would then disagree)."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- data.paths=[a.txt]\n- memory_limit=100MB\n")
    refused = r"vocab_size=1000 is not one of the run's settings \(a resume"
    with pytest.raises(ConfigError, match=refused) as info:
        resume_args([f"resume={run}", "vocab_size=1000"])
    assert "executor" in str(info.value)  # it may be added, so the list of what may says so
    assert "executor=local" in resume_args([f"resume={run}", "executor=local"])
    args = resume_args([f"resume={run}", "memory_limit=2GB", "workers=2", "hydra.verbose=true"])
    assert "memory_limit=2GB" in args and "memory_limit=100MB" not in args and "workers=2" in args


def test_a_resume_composes_and_runs_as_the_run_was_started(tmp_path: Path) -> None:
    """From the user's own config directory and primary config, and in the directory it was started in
    (relative paths in its overrides mean what they meant there); flags stay before the overrides, where
    Hydra's parser wants them."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- data.paths=[a.txt]\n")
    (run / ".hydra" / "hydra.yaml").write_text(
        "hydra:\n  job:\n    config_name: mytrain\n  runtime:\n"
        f"    cwd: {tmp_path}\n    config_sources:\n    - path: pkg\n      provider: main\n"
        f"    - path: {tmp_path / 'myconf'}\n      provider: command-line\n"
    )
    args = resume_args([f"resume={run}"])
    assert args[:4] == ["--config-dir", str(tmp_path / "myconf"), "--config-name", "mytrain"]
    assert args[4] == "data.paths=[a.txt]"
    given = resume_args(["-cn", "other", f"resume={run}"])
    assert given[:4] == ["--config-dir", str(tmp_path / "myconf"), "-cn", "other"]
    assert run_cwd([f"resume={run}"]) == (None if Path.cwd() == tmp_path else tmp_path)
    assert run_cwd(["vocab_size=3"]) is None
    # A path given now means a file here, not where the run started: made absolute before the move.
    now = resume_args([f"resume={run}", "eval=held.txt", "cache_dir=null"])
    assert f"eval='{Path.cwd() / 'held.txt'}'" in now and "cache_dir=null" in now
    # A list is no path: left as given, Hydra refuses it as for a new run (made absolute, it read as
    # one file named "<cwd>/[a.txt,b.txt]", which was then not found).
    assert "eval=[a.txt,b.txt]" in resume_args([f"resume={run}", "eval=[a.txt,b.txt]"])


def test_resume_by_dir_alone_rewrites_the_same_files_and_leaves_no_new_dir(
    tmp_path: Path, corpus: Path
) -> None:
    first = run_script("train.py", "engine=python", f"data.paths=[{corpus}]", "vocab_size=300", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (run,) = (tmp_path / "outputs").glob("*/*")
    before = (run / MERGES_FILE).read_bytes()
    (run / MERGES_FILE).unlink()
    stale = run / ".tokenizer.json.abcd1234.tmp"
    stale.write_text("half a file")
    again = run_script("train.py", f"resume={run}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (run / MERGES_FILE).read_bytes() == before and not stale.exists()
    assert list((tmp_path / "outputs").glob("*/*")) == [run]
    log = (run / "train.log").read_text()
    assert "resuming" in log and "finished" in log and "stage 2 of 1" not in log
    # eval= given to a finished run evaluates it into its metrics (it was "nothing to do", eval left null)
    held_out = tmp_path / "held.txt"
    held_out.write_text("A held-out sentence, never trained on.\n")
    evaluated = run_script("train.py", f"resume={run}", f"eval={held_out}", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["eval"]["files"] == [str(held_out)] and metrics["config"]["eval"] == str(held_out)
    assert (run / MERGES_FILE).read_bytes() == before


def test_hand_edited_done_is_verified(tmp_path: Path, corpus: Path) -> None:
    args = [f"data.paths=[{corpus}]", "vocab_size=400", "schedule=superbpe", "schedule.transition=50",
            "cache_dir=null"]  # fmt: skip
    assert train(tmp_path, *args).returncode == 0
    run = tmp_path / "run"
    expected = (run / MERGES_FILE).read_bytes()
    state = json.loads((run / CHECKPOINT_FILE).read_text())
    state["stage_ends"] = state["stage_ends"][:1]  # as if only stage 1 had finished ...
    state["stage_stats"] = state["stage_stats"][:1]
    state["done"] = True  # ... and someone set done by hand
    (run / CHECKPOINT_FILE).write_text(json.dumps(state))
    (run / MERGES_FILE).unlink()
    proc = run_script("train.py", f"resume={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "checkpoint says done but holds 1 of 2 stage(s)" in (run / "train.log").read_text()
    assert (run / MERGES_FILE).read_bytes() == expected


def test_a_full_disk_names_the_file(tmp_path: Path) -> None:
    target = tmp_path / "vocab.json"
    with pytest.raises(OSError, match="vocab.json") as caught, atomic_write(target) as out:
        out.write(b"{")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert caught.value.errno == errno.ENOSPC and not list(tmp_path.iterdir())


def test_a_full_disk_met_as_a_small_file_is_written_out_names_it(tmp_path: Path, monkeypatch) -> None:
    """A small file (checkpoint.json) reaches the disk only as its buffer is flushed; the error then
    still names it, not just "No space left on device"."""
    import superbpe.core.util as util

    def full(self: object, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(util.WritebackFile, "write", full)
    target = tmp_path / "checkpoint.json"
    with pytest.raises(OSError, match="No space left") as caught:
        util.atomic_write_text(target, "{}")
    assert caught.value.filename == str(target) and not list(tmp_path.iterdir())


def test_a_tokenizer_save_that_fills_the_disk_leaves_the_old_files(tmp_path: Path, monkeypatch) -> None:
    """A save that runs out of space part way replaces none of the files: a directory holding the new
    vocab.json and merges.txt beside the old tokenizer.json (or without it) loads as another tokenizer."""
    old = superbpe.Tokenizer(build_vocab([(b"a", b"b")], []), [(b"a", b"b")], [])
    old.save(tmp_path)
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    merges = [(b"a", b"b"), (b"ab", b"c")]
    new = superbpe.Tokenizer(build_vocab(merges, ["<|endoftext|>"]), merges, ["<|endoftext|>"])
    real_fsync, synced = os.fsync, []

    def fill_up(fd: int) -> None:
        synced.append(fd)
        if len(synced) == 3:  # vocab.json and merges.txt went through; the third file finds no space
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fill_up)
    with pytest.raises(InputError, match=r"cannot write the tokenizer there \(No space left on device\)"):
        new.save(tmp_path)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


def test_a_file_that_cannot_be_created_is_named_not_its_temp(tmp_path: Path, monkeypatch) -> None:
    import superbpe.core.util as util

    def refuse(prefix: str, suffix: str, dir: Path) -> tuple[int, str]:
        raise OSError(errno.EROFS, "Read-only file system", str(dir / f"{prefix}abc{suffix}"))

    monkeypatch.setattr(util.tempfile, "mkstemp", refuse)
    target = tmp_path / "corpus.counts"
    with pytest.raises(OSError, match="Read-only") as caught, atomic_write(target):
        pass
    assert caught.value.filename == str(target) and not list(tmp_path.iterdir())


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this OS")
def test_atomic_writes_start_writing_out_as_they_grow(tmp_path: Path, monkeypatch) -> None:
    """Each few megabytes are handed to the OS to write out as they are written, so the closing fsync
    waits for the tail only; a file system that refuses the hint still gets the whole file."""
    import superbpe.core.util as util

    monkeypatch.setattr(util, "WRITEBACK_BYTES", 10_000)
    started: list[tuple[int, int]] = []

    def hint(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_DONTNEED and os.fstat(fd).st_size >= offset + length  # written first
        started.append((offset, length))

    monkeypatch.setattr(os, "posix_fadvise", hint)
    chunks = [bytes([k % 256]) * size for k, size in enumerate([6000, 6000, 25_000, 100, 9990, 10] * 20)]
    target = tmp_path / "tokens.bin"
    with atomic_write(target) as out:
        for chunk in chunks:
            assert out.write(chunk) == len(chunk)
    total = sum(map(len, chunks))
    assert target.read_bytes() == b"".join(chunks)
    # Consecutive ranges from the start, each at least the threshold, the rest shorter than it.
    ends = [offset + length for offset, length in started]
    assert [offset for offset, _ in started] == [0, *ends[:-1]]
    assert all(length >= 10_000 for _, length in started) and 0 <= total - ends[-1] < 10_000 + 8192

    def refuse(*_args: object) -> None:
        started.append((-1, -1))
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "posix_fadvise", refuse)
    started.clear()
    with atomic_write(target) as out:
        for chunk in chunks:
            out.write(chunk)
    assert target.read_bytes() == b"".join(chunks) and started == [(-1, -1)]


def test_a_full_disk_while_appending_merges_names_the_log(tmp_path: Path, monkeypatch) -> None:
    def full(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="checkpoint.merges"):
        save_checkpoint(tmp_path, Checkpoint(config={}, fingerprint="f", merges=[(b"a", b"b")]))


def test_stale_temps_are_found(tmp_path: Path) -> None:
    (tmp_path / ".merges.txt.x1y2z3ab.tmp").write_text("")
    (tmp_path / "merges.txt").write_text("")
    assert [p.name for p in remove_stale_temps(tmp_path)] == [".merges.txt.x1y2z3ab.tmp"]
    assert [p.name for p in tmp_path.iterdir()] == ["merges.txt"]


def test_a_damaged_merges_cache_entry_is_reported_once(tmp_path: Path, caplog) -> None:
    cache = RunCache(tmp_path)
    entry = tmp_path / "merges" / "k.json"
    entry.parent.mkdir()
    entry.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="superbpe"):
        assert cache.load_merges(entry) is None
        cache.store_merges(entry, [(b"a", b"b")], exhausted=False)
    assert caplog.text.count("cache entry discarded, computing it again") == 1
    assert cache.load_merges(entry).merges == [(b"a", b"b")]  # type: ignore[union-attr]


def test_a_separator_that_is_no_special_token_leaves_no_text_out(
    tmp_path: Path, corpus: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """separator=foo cut the text at every "foo" (inside "foobar" too) and left it out of bytes and
    tokens: bytes/token came out wrong without a word."""
    text = tmp_path / "held.txt"
    text.write_text("a foobar here<|endoftext|>and foo there\n", encoding="utf-8")
    tok = superbpe.Tokenizer(*superbpe.train_bpe(corpus, 300, [EOT]), [EOT])
    with caplog.at_level(logging.WARNING, logger="superbpe"):
        result = evaluate(tok, text, separator="foo")
    assert "separator 'foo' is not a special token of the tokenizer" in caplog.text
    assert (result.bytes, result.documents) == (text.stat().st_size, 1)  # as with separator=None
    assert evaluate(tok, text).documents == 2  # the special token cuts as before


def test_evaluating_an_empty_file_is_an_error(tmp_path: Path, corpus: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    tok = superbpe.Tokenizer(build_vocab([]), [], [EOT])
    with pytest.raises(InputError, match="no text to evaluate"):
        evaluate(tok, empty)
    # Files of no text that are not empty were found only after training (and after each resume).
    (tmp_path / "separators.txt").write_text(EOT * 50)
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with gzip.open(tmp_path / "empty.txt.gz", "wb"):
        pass
    for held_out in (empty, *(tmp_path / name for name in ("separators.txt", "blank.jsonl", "empty.txt.gz"))):
        out = str(tmp_path / "out")
        cfg = TrainConfig(data=DataConfig(paths=[str(corpus)]), eval=str(held_out), output_dir=out)
        with pytest.raises(InputError, match="eval file .* empty"):
            superbpe.run_training(cfg)
        assert not (tmp_path / "out").exists()


def test_a_bad_eval_file_stops_the_run_before_training(tmp_path: Path, corpus: Path) -> None:
    """The held-out file is read as the corpus is (``data.errors``, ``data.text_field``), and a byte or
    record it cannot read is an error before training, not after it (when no resume could change it)."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nthen \xff here\n")
    records = tmp_path / "bad.jsonl"
    records.write_text('{"body": "a"}\n{"text": "b"}\n')

    def run(eval_file: Path, **data: str) -> RunResult:
        cfg = TrainConfig(data=DataConfig(paths=[str(corpus)], **data), vocab_size=300, eval=str(eval_file),
                          cache_dir=None, output_dir=str(tmp_path / "out"))  # fmt: skip
        return superbpe.run_training(cfg)

    started = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("superbpe.training.run._run", lambda job: started.append(job))
        with pytest.raises(InputError, match="bad.txt: invalid UTF-8 at byte 10"):
            run(bad)
        with pytest.raises(InputError, match="bad.jsonl: line 1: no string field 'text'"):
            run(records)
        with pytest.raises(InputError, match="a directory; eval takes one file"):
            run(tmp_path)
        # A token file (its raw ids) as the held-out text or the corpus: read as text, it failed on a byte
        # that is not UTF-8 with a hint to data.errors=replace, or, every byte below 0x80, was trained on.
        held_out = tmp_path / "held_out.txt"
        held_out.write_text("1;2;3")
        ids = tmp_path / "ids.bin"
        superbpe.Tokenizer(build_vocab([]), [], [EOT]).save(tmp_path / "tok")
        encode_corpus(tmp_path / "tok", held_out, ids, separator=None, progress=False)
        with pytest.raises(InputError, match="ids.bin is a token file an encoding wrote"):
            run(ids)
        with pytest.raises(InputError, match="ids.bin is a token file an encoding wrote"):
            as_corpus = TrainConfig(data=DataConfig(paths=[str(ids)]), output_dir=str(tmp_path / "out"))
            superbpe.run_training(as_corpus)
    assert not started and not (tmp_path / "out").exists()
    replaced = run(bad, errors="replace")
    assert replaced.metrics["eval"]["bytes"] == len("fine\nthen \ufffd here\n".encode())
    shutil.rmtree(tmp_path / "out")
    records.write_text('{"body": "a"}\n{"body": "bc"}\n')
    assert run(records, text_field="body").metrics["eval"]["bytes"] == 3


def test_tokenizer_misuse_raises_superbpe_errors(tmp_path: Path) -> None:
    tok = superbpe.Tokenizer(build_vocab([]), [], [EOT])
    for bad in (None, b"bytes", 3):
        with pytest.raises(SuperBPEError, match="encode takes a str"):
            tok.encode(bad)  # type: ignore[arg-type]
        with pytest.raises(SuperBPEError, match="encode takes a str"):
            tok.encode_ordinary(bad)  # type: ignore[arg-type]
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SuperBPEError, match="not a directory"):
        tok.save(blocker)
    assert blocker.read_text() == "x"


def test_ctrl_c_while_a_command_loads_ends_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command loads Hydra and most of the package first; Ctrl-C in that second came out of the console
    script's import line as a traceback. The entry points import their command inside the handling."""
    import superbpe.commands as commands  # the entry points are what this test is about

    class InterruptedImport:
        def find_spec(self, name: str, path: object, target: object = None) -> None:
            if name == "superbpe.cli":
                raise KeyboardInterrupt

    monkeypatch.delitem(sys.modules, "superbpe.cli", raising=False)
    monkeypatch.delattr(superbpe, "cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [InterruptedImport(), *sys.meta_path])
    previous = signal.getsignal(signal.SIGTERM)  # the entry point takes SIGTERM while it loads
    try:
        with pytest.raises(SystemExit) as stopped:
            commands.encode()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped.value.code == 130
    assert capsys.readouterr().out == "interrupted: before the command started, nothing done\n"


def test_a_second_ctrl_c_while_an_interrupted_command_exits_ends_it_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once a Ctrl-C had saved the run and said so, the process took a moment to free what it held
    (seconds for the python engine's tables), and a second Ctrl-C meanwhile raised KeyboardInterrupt in
    Python's shutdown: "Exception ignored ... Traceback" after the line. The console script now gives
    both signals their default action as it exits; a command that fails leaves them as they were."""
    import superbpe.cli as cli  # the command, stopped inside
    import superbpe.commands as commands  # the entry point, which exits

    def ctrl_c(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        bad_age = ["superbpe-cache", "--cache-dir", str(tmp_path), "clear", "--older-than", "7"]
        monkeypatch.setattr(sys, "argv", bad_age)
        with pytest.raises(SystemExit) as failed:
            commands.cache()
        assert failed.value.code == 1 and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        monkeypatch.setattr(cli, "clear_cache", ctrl_c)
        monkeypatch.setattr(sys, "argv", ["superbpe-cache", "--cache-dir", str(tmp_path), "clear"])
        with pytest.raises(SystemExit) as stopped:
            commands.cache()
        assert stopped.value.code == 130 and "interrupted: clear stopped" in capsys.readouterr().out
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])


_TERMINATED_WHILE_LOADING = """
import os, signal, sys
class Terminate:  # SIGTERM at the moment the command's slow import begins
    def find_spec(self, name, path, target=None):
        if name == "superbpe.cli":
            os.kill(os.getpid(), signal.SIGTERM)
sys.meta_path.insert(0, Terminate())
from superbpe.commands import {command}
{command}()
"""


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_sigterm_while_a_command_loads_ends_in_one_line(command: str) -> None:
    """Its default action ended the process with no word before the command's handler was in place."""
    code = _TERMINATED_WHILE_LOADING.format(command=command)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 143, (proc.returncode, proc.stderr)
    assert proc.stdout == "terminated: before the command started, nothing done\n" and not proc.stderr


def test_a_stage_counts_worker_peaks_only_when_they_rose_in_it() -> None:
    """The children's peak RSS is the process's whole history: a sweep's later job reported an earlier
    job's worker as its own peak. A window counts a child's peak only when it rose in the window."""
    from superbpe.core.progress import reset_peak_rss  # the measures under test
    from superbpe.core.util import children_peak_rss_bytes, peak_rss_bytes

    big = 1 << 30
    touch = f"b = bytearray({big}); b[::4096] = b'x' * len(b[::4096])"
    subprocess.run([sys.executable, "-c", touch], check=True)
    before = children_peak_rss_bytes()
    assert reset_peak_rss() and before >= big
    assert peak_rss_bytes() < big  # the window's own peak starts at this process's size
    assert peak_rss_bytes(children_above=before) < big  # the child's peak was before the window
    assert peak_rss_bytes(children_above=0) >= big


def test_a_list_of_options_for_a_config_group_is_refused(tmp_path: Path) -> None:
    """Hydra merges every option of ``schedule=[bpe,superbpe]`` into one config: a run of both
    schedules' keys started without a word."""
    for given in ("schedule=[bpe,superbpe]", "pretokenizer=[gpt2,o200k]"):
        group, options = given.split("=")
        for sweep in ([], ["-m"]):
            proc = train(tmp_path, *sweep, given)
            sweeps = f"-m {group}={options[1:-1]} sweeps"
            assert_one_line_error(proc, "a config group takes one option", sweeps)
    proc = run_script("evaluate.py", "engine=[python,native]", "tokenizer=x", "input=y", cwd=tmp_path)
    assert_one_line_error(proc, "engine=[python,native]: a config group takes one option")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_sweep_of_bpe_beside_transitions_is_refused_before_its_jobs_with_how_to_run_both(
    tmp_path: Path,
) -> None:
    """``-m schedule=bpe,superbpe schedule.transition=0.5,0.8`` ran the superbpe jobs and failed each
    bpe job on its transition; the line now says how to sweep the BPE baseline beside them."""
    work = tmp_path / "work"
    work.mkdir()
    sweep = ("-m", "schedule=bpe,superbpe", "schedule.transition=0.5,0.8", "vocab_size=300")
    proc = run_script("train.py", *sweep, cwd=work, cache_dir=tmp_path / "cache")
    assert_one_line_error(
        proc,
        "schedule=bpe takes no schedule.transition, so the sweep's bpe jobs would fail",
        "-m schedule=superbpe schedule.transition=0.5,0.8 vocab_size=300 hydra.sweep.dir=DIR;",
        "-m schedule=bpe vocab_size=300 hydra.sweep.dir=DIR/bpe), then python",
        "summarize.py DIR compares them all",
    )
    assert list(work.iterdir()) == []


def test_the_bpe_beside_transitions_hint_sweeps_into_the_directory_given(tmp_path: Path) -> None:
    """With ``hydra.sweep.dir`` given, the two commands of the hint named it and then ``DIR`` too, so
    pasted as they were they went to a directory called DIR, and the summary line named DIR."""
    work = tmp_path / "work"
    work.mkdir()
    given = tmp_path / "sweep"
    sweep = ("-m", "schedule=bpe,superbpe", "schedule.transition=0.5,0.8", f"hydra.sweep.dir={given}")
    proc = run_script("train.py", *sweep, cwd=work, cache_dir=tmp_path / "cache")
    assert_one_line_error(
        proc,
        f"-m schedule=superbpe schedule.transition=0.5,0.8 hydra.sweep.dir={given};",
        f"-m schedule=bpe hydra.sweep.dir={given}/bpe), then python",
        f"summarize.py {given} compares them all",
    )
    assert "DIR" not in proc.stderr and proc.stderr.count("hydra.sweep.dir=") == 2, proc.stderr
    assert list(work.iterdir()) == [] and not given.exists()
