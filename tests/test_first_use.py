"""What a new user meets first: the last log lines, help, progress, sidecars and summaries."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from script_helpers import SCRIPTS, run_script, script_env, train_small_tokenizer

from superbpe.cli import cache, summarize
from superbpe.core.sources import iter_chunks
from superbpe.jobs.encode import encode_corpus


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, sample_texts) -> Path:
    return train_small_tokenizer(tmp_path_factory.mktemp("tok"), sample_texts / "corpus.en", vocab_size=400)


@pytest.fixture
def gz_corpus(tmp_path: Path) -> Path:
    import gzip

    path = tmp_path / "lines.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.writelines(f"Line {i} says {i * 7919 % 1000} things.\n" for i in range(40_000))
    return path


def test_the_last_log_lines_of_a_run_with_eval_give_bytes_per_token(tmp_path, sample_texts):
    """Their counts as ``superbpe-evaluate`` says them: one held-out document is not "1 documents"."""
    corpus, heldout = sample_texts / "corpus.en", tmp_path / "heldout.txt"
    heldout.write_text("Once upon a time there was a cat who sat in the sun.\n", encoding="utf-8")
    proc = run_script(
        "train.py",
        f"hydra.run.dir={tmp_path / 'run'}",
        "engine=python",
        "cache_dir=null",
        f"data.paths=[{corpus}]",
        "vocab_size=300",
        f"eval={heldout}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    last = (tmp_path / "run" / "train.log").read_text().splitlines()[-2:]
    assert any(f"{metrics['eval']['bytes_per_token']:.4f} bytes/token" in line for line in last), last
    assert metrics["eval"]["documents"] == 1
    assert any(line.endswith(" tokens, 1 document)") for line in last), last


@pytest.mark.parametrize(
    ("command", "own_groups", "own_key"),
    [
        ("encode.py", {"engine", "executor", "compat"}, "tokenizer: ???"),
        ("evaluate.py", {"engine", "executor", "compat"}, "tokenizer: ???"),
        # Not compat_train, which the compat preset selects by itself.
        ("train.py", {"data", "pretokenizer", "engine", "executor", "schedule", "compat"},
         "vocab_size: 8192"),
    ],
)
def test_help_lists_only_the_commands_own_groups(tmp_path, command, own_groups, own_key):
    proc = run_script(command, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("superbpe-")  # what the command does, in one line
    listed = proc.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0].splitlines()
    groups = {line.split(":")[0] for line in listed if ": " in line}
    assert groups == own_groups
    assert own_key in proc.stdout


@pytest.mark.parametrize("command", ["train.py", "encode.py", "evaluate.py", "summarize.py"])
def test_every_command_gives_its_own_version_and_ends_quietly_when_its_reader_goes(tmp_path, command):
    from superbpe import __version__

    proc = run_script(command, "--version", cwd=tmp_path)
    assert (proc.returncode, proc.stdout.strip()) == (0, f"superbpe {__version__}"), proc.stderr
    reader_gone = subprocess.Popen(
        [sys.executable, str(SCRIPTS / command), "--help"], cwd=tmp_path, env=script_env(None),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    reader_gone.stdout.close()  # as `| head -0` does, before the command writes
    assert "BrokenPipeError" not in reader_gone.stderr.read()
    reader_gone.wait(timeout=60)


def test_the_cache_command_takes_its_directory_after_the_subcommand_too(tmp_path, capsys):
    from superbpe import __version__

    with pytest.raises(SystemExit) as version:
        cache(["--version"])
    assert version.value.code == 0 and capsys.readouterr().out.strip() == f"superbpe {__version__}"
    for args in (["--cache-dir", str(tmp_path / "c"), "list"], ["list", "--cache-dir", str(tmp_path / "c")]):
        cache(args)
        assert "0 entries" in capsys.readouterr().out
    (tmp_path / "f").write_text("x")
    with pytest.raises(SystemExit):
        cache(["list", "--cache-dir", str(tmp_path / "f")])
    assert "is a file" in capsys.readouterr().err


def test_train_help_shows_the_config_its_overrides_compose(tmp_path):
    proc = run_script("train.py", "-m", "--help", "schedule=superbpe", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "transition: 0.8" in proc.stdout and "-m key=a,b" in proc.stdout
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


def test_help_composes_from_the_users_config_dir_and_a_resumed_runs_overrides(tmp_path):
    """``--config-dir DIR`` was read as an override (``DIR``: "cannot parse override") and its groups'
    options were not listed; ``resume=<run>`` showed the defaults, not the run's config."""
    own = tmp_path / "myconf" / "schedule"
    own.mkdir(parents=True)
    (own / "mine.yaml").write_text(
        "name: mine\ntransition: null\nfrom_run: null\nfrom_tokenizer: null\n"
        "stages:\n  - name: only\n    pretokenizer: null\n    until: null\n"
    )
    for flag in (["--config-dir", str(tmp_path / "myconf")], [f"--config-dir={tmp_path / 'myconf'}"]):
        proc = run_script("train.py", *flag, "schedule=mine", "--help", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "schedule: bpe, mine, superbpe" in proc.stdout and "name: mine" in proc.stdout
    (tmp_path / "myconf" / "exp.yaml").write_text("defaults:\n  - train\n  - _self_\nvocab_size: 3000\n")
    named = ["--config-dir", str(tmp_path / "myconf"), "--config-name", "exp", "schedule=mine", "--help"]
    proc = run_script("train.py", *named, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "vocab_size: 3000" in proc.stdout and "name: mine" in proc.stdout
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- vocab_size=300\n- schedule=superbpe\n")
    proc = run_script("train.py", "--help", f"resume={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "vocab_size: 300" in proc.stdout and "transition: 0.8" in proc.stdout


def test_progress_on_gzip_input_counts_compressed_bytes_and_ends_at_100_percent(
    gz_corpus, tokenizer_dir, tmp_path, caplog
):
    size = gz_corpus.stat().st_size
    read = [chunk.read_bytes for chunk in iter_chunks(gz_corpus, [], 1 << 16, line_cuts=True)]
    assert len(read) > 3 and sum(read) == size
    with caplog.at_level(logging.INFO, logger="superbpe"):
        encode_corpus(tokenizer_dir, gz_corpus, tmp_path / "out.bin", chunk_bytes=1 << 16, progress=False)
    shares = [float(share) for share in re.findall(r"encoding: .*?\(([\d.]+)%\)", caplog.text)]
    assert shares and max(shares) <= 100.0 and shares[-1] == 100.0


def test_the_encode_sidecar_names_the_tokenizer_and_inputs_by_absolute_paths(
    tokenizer_dir, sample_texts, tmp_path, monkeypatch
):
    monkeypatch.chdir(tokenizer_dir.parent)
    (tmp_path / "in.txt").write_text((sample_texts / "german.txt").read_text(encoding="utf-8"))
    encode_corpus(Path(tokenizer_dir.name), tmp_path / "in.txt", tmp_path / "out.bin")
    sidecar = json.loads((tmp_path / "out.bin.json").read_text())
    assert sidecar["tokenizer"] == str(tokenizer_dir.resolve())
    assert sidecar["inputs"] == [str((tmp_path / "in.txt").resolve())]


def test_summarize_without_matplotlib_prints_the_table_and_how_to_get_the_plot(tmp_path, monkeypatch, capsys):
    run = tmp_path / "sweep" / "0"
    run.mkdir(parents=True)
    metrics = {
        "config": {"schedule": "bpe"},
        "stages": [{"pretokenizer": {"name": "gpt2"}, "merges": 43}],
        "vocab_size": 300,
        "seconds": 1.0,
        "peak_rss_bytes": 1 << 26,
        "eval": {"bytes_per_token": 3.5},
    }
    (run / "metrics.json").write_text(json.dumps(metrics))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    summarize([str(tmp_path / "sweep")])  # returns: exit status 0
    out = capsys.readouterr().out
    assert "3.5" in out and 'pip install "superbpe[plot]"' in out and "--no-plot" in out


def test_no_test_module_imports_another_so_plain_pytest_collects():
    """``from tests.test_x import ...`` works only under ``python -m pytest`` (the root on sys.path);
    plain ``pytest`` puts only ``tests/`` there. Shared helpers live in helper modules instead."""
    import ast

    tests = Path(__file__).parent
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                assert not name.startswith(("tests", "test_")), f"{path.name} imports {name}"


def test_a_failure_after_the_first_checkpoint_ends_with_the_resume_command(tmp_path):
    from superbpe.cli import _with_resume_hint
    from superbpe.core.memory import MemoryLimitError
    from superbpe.formats.checkpoints import CHECKPOINT_FILE

    error = MemoryLimitError("stage stage2 needs about 9 GB")
    assert _with_resume_hint(error, tmp_path) == "stage stage2 needs about 9 GB"  # nothing kept
    (tmp_path / CHECKPOINT_FILE).write_text("{}")
    hinted = _with_resume_hint(error, tmp_path)
    assert hinted.startswith("stage stage2 needs about 9 GB (the merges so far are kept; continue with: ")
    assert hinted.endswith(f"resume={tmp_path})")



@pytest.mark.parametrize("command", ["encode", "evaluate", "cache"])
def test_commands_whose_reader_goes_before_their_result_line_end_quietly(
    tmp_path, tokenizer_dir, sample_texts, command
):
    heldout = sample_texts / "tinystories_sample.txt"
    args = {
        "encode": [str(SCRIPTS / "encode.py"), f"tokenizer={tokenizer_dir}", f"input={heldout}",
                   f"output={tmp_path / 'tokens.bin'}", "workers=1"],
        "evaluate": [str(SCRIPTS / "evaluate.py"), f"tokenizer={tokenizer_dir}", f"input={heldout}",
                     "workers=1"],
        "cache": ["-c", "import sys; from superbpe.cli import cache; cache(sys.argv[1:])",
                  "--cache-dir", str(tmp_path / "cache"), "list"],
    }[command]  # fmt: skip
    reader_gone = subprocess.Popen(
        [sys.executable, *args], cwd=tmp_path, env=script_env(None),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    reader_gone.stdout.close()  # as `| head -0` does, before the command writes its result line
    stderr = reader_gone.stderr.read()
    reader_gone.wait(timeout=120)
    assert "Broken pipe" not in stderr and "Error executing job" not in stderr, stderr
