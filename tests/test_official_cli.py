"""compat=official on the using side: superbpe-encode / superbpe-evaluate read official tokenizer
directories as their encoder does, and a compat that contradicts a directory is refused.

Stock HF ``tokenizers`` stands in for the official encoder (their ``train_or_extend_tokenizer`` builds a
BPE model from ``vocab.json`` + ``merges.txt`` with the stage-2 Split + ByteLevel pre-tokenizer).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from script_helpers import assert_one_line_error, script_env, train_small_tokenizer

from superbpe import Tokenizer
from superbpe.core.compat import OFFICIAL
from superbpe.core.errors import ConfigError
from superbpe.core.pretokenize import PATTERNS
from superbpe.formats.gpt2 import MERGES_FILE, VOCAB_FILE
from superbpe.formats.token_files import open_shards
from superbpe.jobs.evaluate import evaluate_sharded
from superbpe.jobs.executors import ExecutorSpec

tokenizers = pytest.importorskip("tokenizers")


def _command(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed console command (beside this Python), run as a user runs it."""
    command = Path(sys.executable).with_name(name)
    if not command.is_file():
        pytest.skip(f"needs the installed {name} command beside {sys.executable} (pip install -e .)")
    return subprocess.run(
        [str(command), *args], cwd=cwd, env=script_env(), capture_output=True, text=True, timeout=300
    )


def _their_encoder(directory: Path) -> tokenizers.Tokenizer:
    """Their encoder: HF BPE over vocab.json + merges.txt, the stage-2 regex over the whole text."""
    hf = tokenizers.Tokenizer(
        tokenizers.models.BPE.from_file(str(directory / VOCAB_FILE), str(directory / MERGES_FILE))
    )
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Split(tokenizers.Regex(PATTERNS["superbpe"]), "isolated"),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return hf


@pytest.fixture
def official_dirs(tmp_path, official_data) -> dict[str, Path]:
    """Their stage-2 directory as their scripts wrote it, and bare (vocab.json + merges.txt only)."""
    theirs = official_data / "corpus_en" / "superbpe"
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in (VOCAB_FILE, MERGES_FILE):
        shutil.copy(theirs / name, bare / name)
    return {"theirs": theirs, "bare": bare}


@pytest.fixture
def split_corpus(tmp_path, shared_data) -> list[Path]:
    """corpus.en as three files (so the sharded encoding has several shards), cut at line ends."""
    lines = (shared_data / "corpus.en").read_text(encoding="utf-8").splitlines(keepends=True)
    third = len(lines) // 3
    paths = []
    for index, part in enumerate([lines[:third], lines[third : 2 * third], lines[2 * third :]]):
        path = tmp_path / f"part{index}.txt"
        path.write_text("".join(part), encoding="utf-8")
        paths.append(path)
    return paths


def _expected_ids(directory: Path, paths: list[Path]) -> list[int]:
    hf = _their_encoder(directory)
    return [i for path in paths for i in hf.encode(path.read_text(encoding="utf-8")).ids]


@pytest.mark.parametrize("kind", ["bare", "theirs"])
def test_encode_command_compat_official_gives_their_ids(tmp_path, official_dirs, split_corpus, kind):
    directory = official_dirs[kind]
    expected = _expected_ids(official_dirs["theirs"], split_corpus)
    inputs = f"input=[{','.join(str(p) for p in split_corpus)}]"
    common = [f"tokenizer={directory}", inputs, "separator=null", "compat=official"]
    flat = _command("superbpe-encode", *common, f"output={tmp_path / 'ids.bin'}", cwd=tmp_path)
    assert flat.returncode == 0, flat.stderr
    dtype = json.loads((tmp_path / "ids.bin.json").read_text())["dtype"]
    assert np.fromfile(tmp_path / "ids.bin", dtype=dtype).tolist() == expected
    sharded = _command(
        "superbpe-encode", *common, f"output={tmp_path / 'shards'}/", "executor=local", "workers=2",
        "executor.shard_bytes=20000", cwd=tmp_path,
    )  # fmt: skip
    assert sharded.returncode == 0, sharded.stderr
    shards = open_shards(tmp_path / "shards")
    assert len(shards) > 3  # each file cut where the pre-tokenizer's rules allow, not only between files
    assert np.concatenate(shards).tolist() == expected


def test_bare_official_files_without_compat_encode_our_way(tmp_path, official_dirs, split_corpus):
    """Without compat, bare files are GPT-2 style (our default): other ids than theirs, so compat matters."""
    expected = _expected_ids(official_dirs["theirs"], split_corpus[:1])
    proc = _command(
        "superbpe-encode", f"tokenizer={official_dirs['bare']}", f"input={split_corpus[0]}", "separator=null",
        f"output={tmp_path / 'ids.bin'}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    dtype = json.loads((tmp_path / "ids.bin.json").read_text())["dtype"]
    assert np.fromfile(tmp_path / "ids.bin", dtype=dtype).tolist() != expected
    # Said in one line of the command's own, naming its option (Python's form named a frame of Hydra's).
    warned = [line for line in proc.stderr.splitlines() if "makes a token that pretokenizer" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: merge "), proc.stderr
    assert warned[0].endswith("load them with compat=official)") and ".py:" not in proc.stderr


@pytest.mark.parametrize("kind", ["bare", "theirs"])
def test_evaluate_command_compat_official_counts_their_tokens(tmp_path, official_dirs, split_corpus, kind):
    directory = official_dirs[kind]
    expected = _expected_ids(official_dirs["theirs"], split_corpus)
    n_bytes = sum(p.stat().st_size for p in split_corpus)
    inputs = f"input=[{','.join(str(p) for p in split_corpus)}]"
    proc = _command(
        "superbpe-evaluate", f"tokenizer={directory}", inputs, "compat=official",
        f"output={tmp_path / 'eval.json'}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "eval.json").read_text())
    assert (result["bytes"], result["tokens"], result["documents"]) == (n_bytes, len(expected), 3)
    sharded = evaluate_sharded(
        directory, split_corpus, executor=ExecutorSpec(shard_bytes=20_000), workers=2, compat="official"
    )
    assert (sharded.bytes, sharded.tokens, sharded.documents) == (n_bytes, len(expected), 3)


def test_compat_contradicting_a_directory_is_a_one_line_error(tmp_path, official_dirs, shared_data):
    ours = train_small_tokenizer(tmp_path / "ours", shared_data / "corpus.en", vocab_size=300)
    text = tmp_path / "in.txt"
    text.write_text("the cat sat\n", encoding="utf-8")
    cases = [
        ("superbpe-encode", ours, "compat=official", "trained with compat=superbpe, not compat=official"),
        ("superbpe-evaluate", ours, "compat=official", "trained with compat=superbpe"),
        ("superbpe-encode", official_dirs["theirs"], "compat=superbpe", "whole_pieces=false"),
    ]
    for command, directory, compat, message in cases:
        output = [f"output={tmp_path / 'ids.bin'}"] if command == "superbpe-encode" else []
        proc = _command(command, f"tokenizer={directory}", f"input={text}", compat, *output, cwd=tmp_path)
        assert_one_line_error(proc, message)
        assert not (tmp_path / "ids.bin").exists()
    preset_key = _command(
        "superbpe-evaluate", f"tokenizer={ours}", f"input={text}", "compat.whole_pieces=false", cwd=tmp_path
    )
    assert_one_line_error(preset_key, "choose it first")


def test_recorded_compat_is_used_and_an_explicit_equal_one_is_accepted(tmp_path, shared_data):
    """A directory we trained records its compat: loading it with or without the same compat is equal."""
    from run_helpers import official_run, superbpe_schedule

    ours = train_small_tokenizer(tmp_path / "ours", shared_data / "corpus.en", vocab_size=300)
    official = official_run(tmp_path, shared_data / "corpus.en", "native", superbpe_schedule(1000), "sb")
    text = "the cat sat on the mat\n\nand more"
    assert Tokenizer.load(ours, compat="superbpe").encode(text) == Tokenizer.load(ours).encode(text)
    assert Tokenizer.load(official, compat=OFFICIAL).encode(text) == Tokenizer.load(official).encode(text)
    with pytest.raises(ConfigError, match="compat=superbpe, not compat=official"):
        Tokenizer.load(ours, compat=OFFICIAL)
    with pytest.raises(ConfigError, match="compat=official, not compat=superbpe"):
        Tokenizer.load(official, compat="superbpe")
