"""Executors without Ray: shards, counting by shard, sharded encoding/evaluation, errors, the missing extra.

Ray itself runs in tests/test_ray.py (inside a private network namespace).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from executor_helpers import EOT, concatenated_shards, make_corpus
from script_helpers import (
    assert_one_line_error,
    run_script,
    start_captured_script,
    train_small_tokenizer,
)

from superbpe.api.tokenizer import Tokenizer
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.pretokenize import get_pretokenizer
from superbpe.core.sources import ChunkCutter, iter_chunks, resolve_inputs
from superbpe.engines.interface import get_engine, native_available
from superbpe.formats.token_files import read_index
from superbpe.jobs.count import count_on_executor
from superbpe.jobs.encode import encode_corpus, encode_sharded
from superbpe.jobs.evaluate import evaluate, evaluate_dir, evaluate_sharded
from superbpe.jobs.executors import RAY_MISSING, ExecutorSpec, check_executor
from superbpe.jobs.shards import plan_shards, shard_chunks

ENGINES = ["python", "native"] if native_available() else ["python"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, sample_texts, multilingual_text) -> list[str]:
    return make_corpus(tmp_path_factory.mktemp("corpus"), sample_texts, multilingual_text)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, sample_texts) -> Path:
    return train_small_tokenizer(tmp_path_factory.mktemp("tok"), sample_texts / "corpus.en")


@pytest.mark.parametrize("pattern", ["gpt2", "superbpe", "custom:\\w+| ?[^\\w\\s]+"])
def test_shards_cover_the_files_and_cut_where_chunks_may(corpus, pattern) -> None:
    pre = get_pretokenizer(pattern)
    paths = resolve_inputs(corpus)
    shards = plan_shards(paths, [EOT], 30_000, line_cuts=pre.safe_cuts_hold)
    for path in paths:
        mine = [s for s in shards if s.path == str(path)]
        data = b"".join(
            c.data for s in mine for c in shard_chunks(s, [EOT], 7_000, line_cuts=pre.safe_cuts_hold)
        )
        whole = b"".join(c.data for c in iter_chunks(path, [EOT], 1 << 30, line_cuts=pre.safe_cuts_hold))
        assert data == whole
        assert mine[-1].last_of_file and not any(s.last_of_file for s in mine[:-1])
    assert len(shards) > len(paths)  # really cut
    for shard in shards:
        if shard.start and not shard.jsonl:  # every inner cut is one the chunk cutter would choose
            cutter = ChunkCutter([EOT], pre.safe_cuts_hold)
            assert cutter.find(Path(shard.path).read_bytes(), shard.start) == shard.start


@pytest.mark.parametrize("pattern", ["gpt2", "superbpe"])
def test_lines_ending_in_a_space_are_cut_into_shards_by_the_rules(
    sample_texts, tokenizer_dir, tmp_path, pattern
) -> None:
    """WikiText's lines end in " \n", where no line cut is safe: a file was one shard (and one sampled
    block). With the pre-tokenizer, its local rules cut it; the shards still count and encode as a whole."""
    text = (sample_texts / "corpus.en").read_text(encoding="utf-8").replace(EOT, " ")  # no cut before one
    path = tmp_path / "wiki_style.txt"
    path.write_text("".join(f" {line.strip()} \n" for line in text.splitlines() if line.strip()))
    pre = get_pretokenizer(pattern)
    assert len(plan_shards([path], [EOT], 20_000, line_cuts=pre.safe_cuts_hold)) == 1
    shards = plan_shards([path], [EOT], 20_000, line_cuts=pre.safe_cuts_hold, pretokenizer=pre)
    assert len(shards) > 3
    executor = ExecutorSpec("local", shard_bytes=20_000)
    local = get_engine("python").count([path], pre, [EOT])
    assert dict(count_on_executor([path], pattern, [EOT], executor=executor, engine="python").counts) == dict(
        local.counts
    )
    flat = encode_corpus(tokenizer_dir, [path], tmp_path / "flat.bin")
    encode_corpus(tokenizer_dir, [path], str(tmp_path / "shards") + "/", executor=executor)
    ids = np.fromfile(tmp_path / "flat.bin", dtype=flat.dtype)
    assert np.array_equal(concatenated_shards(tmp_path / "shards"), ids)
    assert len(read_index(tmp_path / "shards")["shards"]) > 3


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pattern", ["gpt2", "superbpe", "custom:\\w+| ?[^\\w\\s]+"])
def test_counting_by_shard_equals_local_counting_byte_for_byte(corpus, tmp_path, engine, pattern) -> None:
    executor = ExecutorSpec("local", shard_bytes=25_000)
    if engine == "native" and pattern.startswith("custom:"):  # no exact native splitter: refused alike
        with pytest.raises(ConfigError, match="built-in patterns"):
            count_on_executor(corpus, pattern, [EOT], executor=executor, engine=engine, workers=2)
        return
    local = get_engine(engine).count(corpus, get_pretokenizer(pattern), [EOT])
    sharded = count_on_executor(corpus, pattern, [EOT], executor=executor, engine=engine, workers=2)
    local.save(tmp_path / "local.counts")
    sharded.save(tmp_path / "sharded.counts")
    assert (tmp_path / "local.counts").read_bytes() == (tmp_path / "sharded.counts").read_bytes()


@pytest.mark.parametrize("separator", [EOT, None])
def test_sharded_encoding_concatenates_to_the_flat_file(corpus, tokenizer_dir, tmp_path, separator) -> None:
    flat = encode_corpus(tokenizer_dir, corpus, tmp_path / "flat.bin", separator=separator)
    result = encode_corpus(
        tokenizer_dir, corpus, str(tmp_path / "shards") + "/", separator=separator,
        executor=ExecutorSpec("local", shard_bytes=40_000), workers=2,
    )  # fmt: skip
    ids = np.fromfile(tmp_path / "flat.bin", dtype=flat.dtype)
    assert np.array_equal(concatenated_shards(tmp_path / "shards"), ids)
    index = read_index(tmp_path / "shards")
    assert (index["tokens"], index["documents"], index["dtype"]) == (flat.tokens, flat.documents, flat.dtype)
    assert index["tokenizer_hash"] == flat.tokenizer_hash
    assert len(index["shards"]) == len(result.shards) > len(corpus)
    assert [e["file"] for e in index["shards"]] == sorted(p.name for p in (tmp_path / "shards").glob("*.bin"))
    assert any(e["continues_document"] for e in index["shards"])  # a document split over two shards


@pytest.mark.parametrize("separator", [EOT, None])
def test_sharded_evaluation_equals_local(corpus, tokenizer_dir, separator) -> None:
    local = evaluate_dir(tokenizer_dir, corpus, separator=separator)
    sharded = evaluate_sharded(
        tokenizer_dir, corpus, separator=separator, executor=ExecutorSpec("local", shard_bytes=30_000)
    )
    assert sharded == local


def _with_bad_byte(tmp_path: Path, corpus: list[str]) -> tuple[list[str], int]:
    data = bytearray(Path(corpus[0]).read_bytes())
    offset = len(data) * 3 // 4
    data[offset] = 0xFF
    bad = tmp_path / "bad.txt"
    bad.write_bytes(bytes(data))
    return [corpus[1], str(bad)], offset


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_input_in_a_shard_names_file_and_offset(corpus, tmp_path, engine) -> None:
    inputs, offset = _with_bad_byte(tmp_path, corpus)
    with pytest.raises(InputError, match=rf"bad\.txt: invalid UTF-8 at byte {offset}; data.errors=replace"):
        count_on_executor(inputs, "gpt2", [EOT], executor=ExecutorSpec(shard_bytes=20_000), engine=engine)


def test_failed_sharded_encoding_leaves_nothing(corpus, tokenizer_dir, tmp_path) -> None:
    inputs, offset = _with_bad_byte(tmp_path, corpus)
    out = tmp_path / "out"
    with pytest.raises(InputError, match=rf"bad\.txt: invalid UTF-8 at byte {offset}; data.errors=replace"):
        encode_sharded(tokenizer_dir, inputs, out, executor=ExecutorSpec(shard_bytes=20_000), workers=2)
    assert not out.exists()
    out.mkdir()
    with pytest.raises(InputError):
        encode_sharded(tokenizer_dir, inputs, out, executor=ExecutorSpec(shard_bytes=20_000))
    assert list(out.iterdir()) == []


def test_bad_json_line_in_a_later_shard_names_its_true_line(tmp_path, tokenizer_dir) -> None:
    lines = [json.dumps({"text": f"document {i} " * 20}) for i in range(2000)]
    lines[1500] = "{not json"
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec = ExecutorSpec(shard_bytes=50_000)
    with pytest.raises(InputError, match=r"docs\.jsonl: line 1501: invalid JSON"):
        count_on_executor([path], "gpt2", [EOT], executor=spec)
    with pytest.raises(InputError, match=r"docs\.jsonl: line 1501: invalid JSON"):
        encode_sharded(tokenizer_dir, [path], tmp_path / "out", executor=spec)


def test_sharded_output_must_be_new_or_empty(corpus, tokenizer_dir, tmp_path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        encode_sharded(tokenizer_dir, corpus, tmp_path / "out")
    assert (tmp_path / "out" / "keep.txt").exists()


def test_a_sharded_output_left_by_an_encoding_is_named_in_the_refusal(corpus, tokenizer_dir, tmp_path):
    """An encoding killed outright leaves only hidden attempt files, which ``ls`` does not show: the
    refusal says what the directory holds, as it does for a finished encoding."""
    out = tmp_path / "out"
    encode_sharded(tokenizer_dir, corpus, out)
    finished = r"not empty \(it holds a sharded encoding, index\.json and its shards"
    with pytest.raises(ConfigError, match=finished):
        encode_sharded(tokenizer_dir, corpus, out)
    for item in out.iterdir():
        item.unlink()
    attempt = out / f".shard-000003.bin.{'0' * 32}.tmp"
    attempt.write_bytes(b"\0\0")
    stopped = rf"stopped before its index\.json, such as {re.escape(attempt.name)}: remove them\); give a new"
    with pytest.raises(ConfigError, match=stopped):
        encode_sharded(tokenizer_dir, corpus, out)
    assert [item.name for item in out.iterdir()] == [attempt.name]


def test_executor_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="unknown executor 'dask'"):
        check_executor(ExecutorSpec("dask"))
    with pytest.raises(ConfigError, match="shard_bytes"):
        check_executor(ExecutorSpec(shard_bytes=0))


@pytest.fixture
def no_ray(tmp_path, monkeypatch) -> Path:
    """A path entry that makes `import ray` fail, as on an install without the extra."""
    blocker = tmp_path / "blocker"
    (blocker / "ray").mkdir(parents=True)
    (blocker / "ray" / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    monkeypatch.syspath_prepend(str(blocker))
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    return blocker


def test_missing_ray_is_a_one_line_error(no_ray) -> None:
    with pytest.raises(ConfigError) as info:
        check_executor("ray")
    assert str(info.value) == RAY_MISSING and "\n" not in RAY_MISSING


def test_missing_ray_from_the_scripts(no_ray, corpus, tokenizer_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(no_ray))
    encode = run_script(
        "encode.py", f"tokenizer={tokenizer_dir}", f"input={corpus[0]}", f"output={tmp_path / 'out'}",
        "executor=ray", cwd=tmp_path,
    )  # fmt: skip
    assert_one_line_error(encode, 'pip install "superbpe[ray]"')
    assert not (tmp_path / "out").exists()
    train = run_script(
        "train.py", f"data.paths=[{corpus[0]}]", "executor=ray", "cache_dir=null", cwd=tmp_path
    )
    assert_one_line_error(train, 'pip install "superbpe[ray]"')
    assert not [p for p in tmp_path.glob("outputs/**/*") if p.is_file()]


def test_encode_script_writes_shards_to_a_directory(corpus, tokenizer_dir, tmp_path) -> None:
    flat = run_script(
        "encode.py", f"tokenizer={tokenizer_dir}", f"input=[{','.join(corpus)}]",
        f"output={tmp_path / 'f.bin'}",
        cwd=tmp_path,
    )  # fmt: skip
    assert flat.returncode == 0, flat.stderr
    out = tmp_path / "shards"
    out.mkdir()
    sharded = run_script(
        "encode.py", f"tokenizer={tokenizer_dir}", f"input=[{','.join(corpus)}]", f"output={out}",
        "executor.shard_bytes=50000", cwd=tmp_path,
    )  # fmt: skip
    assert sharded.returncode == 0, sharded.stderr
    dtype = json.loads((tmp_path / "f.bin.json").read_text())["dtype"]
    assert np.array_equal(concatenated_shards(out), np.fromfile(tmp_path / "f.bin", dtype=dtype))


def test_executor_keeps_at_most_a_window_of_results_waiting() -> None:
    """The driver consumes results one by one; tasks beyond the window start only as results are taken."""
    from concurrent.futures import Future

    from superbpe.jobs.executors import _bounded

    submitted: list[int] = []

    def submit(args: tuple[int]) -> Future[int]:
        submitted.append(args[0])
        future: Future[int] = Future()
        future.set_result(args[0] * 2)
        return future

    results = _bounded(submit, [(i,) for i in range(10)], 3)
    seen = []
    for index, value in results:
        assert len(submitted) <= len(seen) + 3
        seen.append((index, value))
    assert sorted(seen) == [(i, 2 * i) for i in range(10)]


@pytest.mark.parametrize("job", ["encode", "evaluate"])
def test_a_file_appended_to_while_it_is_encoded_is_refused(tokenizer_dir, tmp_path, monkeypatch, job) -> None:
    text = tmp_path / "growing.txt"
    text.write_text("hello world\n" * 500)

    def chunks_then_append(*args, **kwargs):  # another process appending while the file is read
        yield from iter_chunks(*args, **kwargs)
        with text.open("a") as stream:
            stream.write("appended\n")

    monkeypatch.setattr(f"superbpe.jobs.{job}.iter_chunks", chunks_then_append)
    out = tmp_path / "out.bin"
    with pytest.raises(InputError, match=rf"growing\.txt: changed while it was {job}d \(6000 bytes then"):
        if job == "encode":
            encode_corpus(tokenizer_dir, [str(text)], out)
        else:
            evaluate(Tokenizer.load(tokenizer_dir), [str(text)])
    assert list(tmp_path.iterdir()) == [text]


@pytest.mark.parametrize("job", ["encode", "evaluate"])
def test_a_file_cut_while_it_is_encoded_in_shards_is_refused(tokenizer_dir, tmp_path, monkeypatch, job):
    text = tmp_path / "cut.txt"
    text.write_text("hello world\n" * 5000)

    def plan_then_cut(*args, **kwargs):  # another process cutting the file once its shards are planned
        shards = plan_shards(*args, **kwargs)
        with text.open("r+") as stream:
            stream.truncate(1200)
        return shards

    monkeypatch.setattr(f"superbpe.jobs.{job}.plan_shards", plan_then_cut)
    out = tmp_path / "out"
    with pytest.raises(InputError, match=rf"cut\.txt: changed while it was {job}d \(60000 bytes then"):
        if job == "encode":
            encode_sharded(tokenizer_dir, [str(text)], out, executor=ExecutorSpec(shard_bytes=20_000))
        else:
            evaluate_sharded(tokenizer_dir, [str(text)], executor=ExecutorSpec(shard_bytes=20_000))
    assert list(tmp_path.iterdir()) == [text]


@pytest.fixture(scope="module")
def one_quick_and_one_long_shard(tmp_path_factory, sample_texts) -> list[Path]:
    """Inputs for a sharded encoding on two workers (engine=python): one shard done at once, which leaves
    its worker waiting for a task, and one that takes tens of seconds (a gzip file is one shard; 200 MB
    of text, as 25 gzip members of 8 MB)."""
    directory = tmp_path_factory.mktemp("long_shard")
    text = (sample_texts / "tinystories_sample.txt").read_text(encoding="utf-8")
    (directory / "quick.txt").write_text("hello world\n", encoding="utf-8")
    member = gzip.compress((text * (8_000_000 // len(text))).encode("utf-8"), compresslevel=1)
    (directory / "long.txt.gz").write_bytes(member * 25)
    return [directory / "quick.txt", directory / "long.txt.gz"]


def _start_sharded_encode(tokenizer_dir: Path, inputs: list[Path], out: Path) -> subprocess.Popen[str]:
    """``superbpe-encode`` of ``inputs`` into ``out/`` on two local workers, in a process group of its own
    (every process it starts stays in it), with Ctrl-C delivered as in a terminal."""
    args = [
        f"tokenizer={tokenizer_dir}", f"input=[{','.join(map(str, inputs))}]", f"output={out}/", "workers=2",
        "engine=python", "progress=false",
    ]  # fmt: skip
    return start_captured_script(
        "encode.py", *args, cwd=out.parent, own_group=True, preexec_fn=_default_sigint
    )


def _default_sigint() -> None:
    """In the child: a launcher that ignores SIGINT (a background job) passes that on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _long_shard_under_way(out: Path) -> Callable[[], bool]:
    """Whether the quick shard is written (its worker waits for a task) and the long one begun."""
    return lambda: (out / "shard-000000.bin").is_file() and any(out.glob(".shard-000001.*.tmp"))


def _wait_for(proc: subprocess.Popen[str], ready: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the long shard never began"
        time.sleep(0.01)
    time.sleep(0.2)  # well into it
    assert proc.poll() is None, proc.communicate()[1]


def _group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` still running (a zombie waiting for its reaper is not)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:  # ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 3 and int(fields[3]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _assert_group_ends(pgid: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while (left := _group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in left]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the processes in /proc")
def test_a_sharded_encode_killed_outright_leaves_no_process(
    one_quick_and_one_long_shard, tokenizer_dir, tmp_path
) -> None:
    """Its workers are children of multiprocessing's fork server, which lives as long as they do: killed
    with SIGKILL, the command left them (and the fork server, and the resource tracker) running for ever."""
    out = tmp_path / "shards"
    proc = _start_sharded_encode(tokenizer_dir, one_quick_and_one_long_shard, out)
    try:
        _wait_for(proc, _long_shard_under_way(out))
        proc.kill()  # the command alone
        proc.wait(timeout=60)
        _assert_group_ends(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the processes in /proc")
def test_ctrl_c_of_a_sharded_encode_is_prompt_quiet_and_leaves_nothing(
    one_quick_and_one_long_shard, tokenizer_dir, tmp_path
) -> None:
    """Ctrl-C reaches every process of the command: a worker waiting for a task died of it with a
    traceback. The workers leave it to the command, which stops the shard that runs at once (not after
    its tens of seconds), removes what was written and exits 130."""
    out = tmp_path / "shards"
    proc = _start_sharded_encode(tokenizer_dir, one_quick_and_one_long_shard, out)
    try:
        _wait_for(proc, _long_shard_under_way(out))
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C
        sent = time.monotonic()
        stdout, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - sent
        assert proc.returncode == 130, stderr
        assert "Traceback" not in stderr, stderr
        assert stdout.strip().startswith("interrupted: "), stdout
        assert took < 5, f"{took:.1f} s from Ctrl-C to the exit"
        assert not out.exists()
        _assert_group_ends(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
