"""scripts/encode.py and scripts/evaluate.py: flat token files equal Tokenizer.encode per document."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from script_helpers import (
    assert_one_line_error,
    run_script,
    train_small_tokenizer,
    workers_left_when_killed,
)

import superbpe
import superbpe.core.sources as sources_module
import superbpe.jobs.encode as encode_module
import superbpe.jobs.evaluate as evaluate_module
from superbpe.api.tokenizer import Tokenizer
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.sources import Chunk
from superbpe.core.util import handled_stop_signals, human_size, stop_signals_held
from superbpe.engines.interface import native_available
from superbpe.formats.token_files import tokenizer_hash
from superbpe.jobs.encode import encode_corpus
from superbpe.jobs.evaluate import _cuts_as_special, chunk_counts, evaluate, evaluate_sharded
from superbpe.jobs.executors import ExecutorSpec
from superbpe.training.config import DataConfig, EngineConfig, TrainConfig
from superbpe.training.run import run_training

EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, sample_texts) -> Path:
    return train_small_tokenizer(tmp_path_factory.mktemp("tok"), sample_texts / "corpus.en")


@pytest.fixture(scope="module")
def documents(sample_texts) -> list[str]:
    text = (sample_texts / "tinystories_sample.txt").read_text(encoding="utf-8")
    german = (sample_texts / "german.txt").read_text(encoding="utf-8")
    docs = [d.strip("\n") for d in text.split(EOT) if d.strip()]
    return [*docs, german, "  leading spaces\n\n\n", "x"]


def expected_ids(tok: Tokenizer, docs: list[str]) -> list[int]:
    eot = tok.token_to_id(EOT)
    return [i for doc in docs for i in [*tok.encode(doc), eot]]


def test_text_and_jsonl_inputs_equal_encode_per_document(tokenizer_dir, documents, tmp_path):
    text_file = tmp_path / "docs.txt"
    text_file.write_text(EOT.join(documents[:4]), encoding="utf-8")
    jsonl_file = tmp_path / "docs.jsonl"
    jsonl_file.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents[4:]), encoding="utf-8")
    out = tmp_path / "out" / "train.bin"
    proc = run_script(
        "encode.py",
        f"tokenizer={tokenizer_dir}",
        f"input=[{text_file},{jsonl_file}]",
        f"output={out}",
        "chunk_bytes=512",
        "workers=2",
        "engine=python",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    tok = Tokenizer.load(tokenizer_dir)
    ids = np.memmap(out, dtype=np.uint16, mode="r")
    assert ids.tolist() == expected_ids(tok, documents)
    sidecar = json.loads((out.parent / "train.bin.json").read_text())
    assert sidecar["dtype"] == "uint16" and sidecar["tokens"] == len(ids)
    assert sidecar["documents"] == len(documents) and sidecar["separator_id"] == tok.token_to_id(EOT)
    assert len(sidecar["tokenizer_hash"]) == 64
    assert f"{len(ids)} tokens" in proc.stdout


def test_serial_and_parallel_give_the_same_file(tokenizer_dir, sample_texts, tmp_path):
    corpus = sample_texts / "corpus.en"
    serial = encode_corpus(tokenizer_dir, corpus, tmp_path / "a.bin", workers=1, engine="python")
    parallel = encode_corpus(
        tokenizer_dir, corpus, tmp_path / "b.bin", workers=2, chunk_bytes=8192, engine="python"
    )
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()
    assert serial.tokens == parallel.tokens
    tok = Tokenizer.load(tokenizer_dir)
    whole = tok.encode(corpus.read_text(encoding="utf-8"))
    assert np.fromfile(tmp_path / "a.bin", dtype=np.uint16).tolist() == [*whole, tok.token_to_id(EOT)]


def test_superbpe_tokenizer_encodes_with_its_stage2_pattern(tmp_path, sample_texts):
    out = tmp_path / "tok"
    cfg = TrainConfig(
        data=DataConfig(paths=[str(sample_texts / "corpus.en")]),
        engine=EngineConfig("python"),
        vocab_size=600,
        output_dir=str(out),
        cache_dir=None,
    )
    cfg.schedule.name = "superbpe"
    cfg.schedule.stages[0].until = 200
    from superbpe.training.config import PretokenizerConfig, StageConfig

    cfg.schedule.stages.append(
        StageConfig(
            name="stage2",
            pretokenizer=PretokenizerConfig("superbpe"),
            max_words_per_token=4,
            forbidden_substrings=[": "],
        )
    )
    run_training(cfg)
    tok = Tokenizer.load(out)
    assert tok.pretokenizer.name == "superbpe"
    text = (sample_texts / "corpus.en").read_text(encoding="utf-8")[:20_000]
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    encode_corpus(out, tmp_path / "in.txt", tmp_path / "x.bin", separator=None, engine="python")
    ids = np.fromfile(tmp_path / "x.bin", dtype=np.uint16).tolist()
    assert ids == tok.encode(text)
    assert any(b" " in tok.vocab[i].strip() for i in ids)  # superword tokens are used


def test_uint32_above_65536_ids(tokenizer_dir, documents, tmp_path):
    tok = Tokenizer.load(tokenizer_dir)
    vocab = {i: t for i, t in tok.vocab.items() if i != tok.token_to_id(EOT)}
    vocab[70_000] = EOT.encode()
    big = Tokenizer(vocab, tok.merges, [EOT], tok.pretokenizer, engine="python")
    big.save(tmp_path / "big")
    source = tmp_path / "docs.txt"
    source.write_text(EOT.join(documents), encoding="utf-8")
    out = tmp_path / "big.bin"
    proc = run_script(
        "encode.py", f"tokenizer={tmp_path / 'big'}", f"input={source}", f"output={out}", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "big.bin.json").read_text())["dtype"] == "uint32"
    ids = np.memmap(out, dtype=np.uint32, mode="r").tolist()
    assert ids == expected_ids(big, documents)
    assert ids.count(70_000) == len(documents)
    narrow = run_script(
        "encode.py", f"tokenizer={tmp_path / 'big'}", f"input={source}", f"output={tmp_path / 'n.bin'}",
        "dtype=uint16", cwd=tmp_path,
    )  # fmt: skip
    assert_one_line_error(narrow, "dtype=uint16 cannot hold token id 70000", "use uint32")
    assert not (tmp_path / "n.bin").exists() and not (tmp_path / "n.bin.json").exists()


def test_open_tokens_maps_a_token_file_with_its_sidecars_dtype(
    tokenizer_dir, documents, tmp_path, monkeypatch
):
    source = tmp_path / "docs.txt"
    source.write_text(EOT.join(documents), encoding="utf-8")
    for dtype in ("uint16", "uint32"):
        encode_corpus(tokenizer_dir, source, tmp_path / f"{dtype}.bin", dtype=dtype, progress=False)
        ids = superbpe.open_tokens(tmp_path / f"{dtype}.bin")
        assert ids.dtype == np.dtype(dtype)
        assert ids.tolist() == expected_ids(Tokenizer.load(tokenizer_dir), documents)
    cut = tmp_path / "cut.bin"
    cut.write_bytes((tmp_path / "uint16.bin").read_bytes()[:-2])
    (tmp_path / "cut.bin.json").write_bytes((tmp_path / "uint16.bin.json").read_bytes())
    with pytest.raises(InputError, match=r"cut.bin: \d+ bytes, but its record says \d+ uint16 ids"):
        superbpe.open_tokens(cut)
    (tmp_path / "bare.bin").write_bytes(b"\0\0")
    with pytest.raises(InputError, match=r"bare.bin.json: no such file"):
        superbpe.open_tokens(tmp_path / "bare.bin")
    with pytest.raises(InputError, match=r"is a directory of shards: open_shards"):
        superbpe.open_tokens(tmp_path)
    with pytest.raises(InputError, match=r"uint16.bin.json is the sidecar of .*uint16.bin: open_tokens\("):
        superbpe.open_tokens(tmp_path / "uint16.bin.json")  # it said uint16.bin.json.json: no such file
    with pytest.raises(InputError, match=r"uint16.bin is a flat token file: open_tokens\("):
        superbpe.open_shards(tmp_path / "uint16.bin")  # it said uint16.bin/index.json: Not a directory
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    encode_corpus(tokenizer_dir, empty, tmp_path / "none.bin", separator=None, progress=False)
    assert superbpe.open_tokens(tmp_path / "none.bin").tolist() == []
    monkeypatch.setenv("HOME", str(tmp_path))  # "~" is the home directory, as for a corpus path
    expected = expected_ids(Tokenizer.load(tokenizer_dir), documents)
    assert superbpe.open_tokens("~/uint16.bin").tolist() == expected


@pytest.mark.parametrize("sharded", [False, True])
def test_dtype_uint32_for_a_small_vocabulary(tokenizer_dir, documents, tmp_path, sharded, monkeypatch):
    source = tmp_path / "docs.txt"
    source.write_text(EOT.join(documents), encoding="utf-8")
    out = tmp_path / ("shards" if sharded else "wide.bin")
    target = f"{out}/" if sharded else out
    result = encode_corpus(tokenizer_dir, source, target, dtype="uint32", progress=False)
    assert result.dtype == "uint32"
    file = out / "shard-000000.bin" if sharded else out
    assert np.fromfile(file, dtype="<u4").tolist() == expected_ids(Tokenizer.load(tokenizer_dir), documents)
    if sharded:
        assert [len(shard) for shard in superbpe.open_shards(out)] == [result.tokens]
        monkeypatch.setenv("HOME", str(tmp_path))
        assert [len(shard) for shard in superbpe.open_shards("~/shards")] == [result.tokens]
        file.write_bytes(file.read_bytes()[:-4])  # a shard cut short
        with pytest.raises(InputError, match=r"shard-000000.bin: \d+ bytes, but its record says"):
            superbpe.open_shards(out)
    with pytest.raises(ConfigError, match=r"dtype 'int32' must be one of uint16, uint32"):
        encode_corpus(tokenizer_dir, source, tmp_path / "x.bin", dtype="int32", progress=False)
    assert not (tmp_path / "x.bin").exists()


def test_bad_inputs_are_one_line_errors_and_leave_no_file(tokenizer_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("hello world")
    out = tmp_path / "out.bin"
    missing = run_script(
        "encode.py",
        f"tokenizer={tokenizer_dir}",
        f"input={tmp_path / 'nope.txt'}",
        f"output={out}",
        cwd=tmp_path,
    )
    assert_one_line_error(missing, "nope.txt")
    bad_sep = run_script(
        "encode.py",
        f"tokenizer={tokenizer_dir}",
        f"input={source}",
        f"output={out}",
        "separator='<|eos|>'",
        cwd=tmp_path,
    )
    assert_one_line_error(bad_sep, "separator '<|eos|>' is not a special token", "(it has: '<|endoftext|>')")
    bad_utf8 = tmp_path / "bad.txt"
    bad_utf8.write_bytes(b"fine text\n" * 50 + b"\xff\xfe broken")
    broken = run_script(
        "encode.py", f"tokenizer={tokenizer_dir}", f"input={bad_utf8}", f"output={out}", cwd=tmp_path
    )
    assert_one_line_error(broken, "invalid UTF-8 at byte 500")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "in.txt"]


def test_a_token_file_given_as_input_is_refused(tokenizer_dir, tmp_path):
    """Raw ids are no text: read as text they failed on a byte that is not UTF-8 with a hint to
    ``errors=replace`` (which encodes the ids' bytes), or, every byte below 0x80, encoded without a word."""
    source = tmp_path / "docs.txt"
    source.write_text("1;2;3", encoding="utf-8")  # single bytes, whose ids are below 0x80
    encode_corpus(tokenizer_dir, source, tmp_path / "flat.bin", separator=None, progress=False)
    encode_corpus(tokenizer_dir, source, f"{tmp_path / 'shards'}/", progress=False)
    tok = Tokenizer.load(tokenizer_dir)
    flat, shard = tmp_path / "flat.bin", tmp_path / "shards" / "shard-000000.bin"
    assert max(superbpe.open_tokens(flat)) < 0x80  # its bytes are valid UTF-8
    for ids_file, said in [(flat, "is a token file an encoding wrote"), (shard, "is a shard of a sharded")]:
        with pytest.raises(InputError, match=f"{ids_file.name} {said}"):
            encode_corpus(tokenizer_dir, ids_file, tmp_path / "again.bin", progress=False)
        with pytest.raises(InputError, match=f"{ids_file.name} {said}"):
            evaluate(tok, ids_file)
        with pytest.raises(InputError, match=f"{ids_file.name} {said}"):
            evaluate_sharded(tokenizer_dir, ids_file)
    assert not (tmp_path / "again.bin").exists()


def test_an_input_or_a_tokenizer_file_is_never_overwritten(tokenizer_dir, tmp_path):
    """The token file or its sidecar at the path of an input, or of a file of the tokenizer directory,
    would replace it once encoded: refused before anything is written, the files left as they were."""
    source, sidecar_input = tmp_path / "in.txt", tmp_path / "tokens.json"
    source.write_text("hello world\n")
    sidecar_input.write_text("hello again\n")  # an input where output=tokens puts its sidecar
    vocab = tokenizer_dir / "vocab.json"
    before = vocab.read_bytes()
    cases = [
        (source, [source], "in.txt is one of the inputs"),
        (tmp_path / "tokens", [source, sidecar_input], "tokens.json is one of the inputs"),
        (vocab, [source], "vocab.json is a file of the tokenizer directory"),
    ]
    for output, inputs, named in cases:
        with pytest.raises(ConfigError, match=named):
            encode_corpus(tokenizer_dir, inputs, output)
    assert source.read_text() == "hello world\n" and sidecar_input.read_text() == "hello again\n"
    assert vocab.read_bytes() == before and not (tmp_path / "tokens").exists()


def test_evaluate_refuses_a_report_path_before_the_work(tokenizer_dir, tmp_path):
    """The report is written after the evaluation: a path that would replace an input or a tokenizer
    file, or that is a directory, is refused first, with the files left as they were."""
    source = tmp_path / "held.txt"
    source.write_text("hello world\n")
    vocab = tokenizer_dir / "vocab.json"
    before = vocab.read_bytes()
    notes = tmp_path / "notes.txt"  # replaced by the report without a word
    notes.write_text("my notes\n")
    cases = [
        (source, "held.txt is one of the inputs"),
        (vocab, "vocab.json is a file of the tokenizer directory"),
        (tmp_path, "is a directory; name the report's file"),
        (notes, "notes.txt exists and is not a report superbpe-evaluate wrote"),
    ]
    for output, named in cases:
        proc = run_script(
            "evaluate.py", f"tokenizer={tokenizer_dir}", f"input={source}", f"output={output}", cwd=tmp_path
        )
        assert_one_line_error(proc, named)
        assert "bytes/token" not in proc.stdout
    assert source.read_text() == "hello world\n" and vocab.read_bytes() == before
    assert notes.read_text() == "my notes\n"


def test_evaluate_script_reports_bytes_per_token(tokenizer_dir, documents, tmp_path):
    source = tmp_path / "held_out.txt"
    source.write_text(EOT.join(documents), encoding="utf-8")
    proc = run_script(
        "evaluate.py",
        f"tokenizer={tokenizer_dir}",
        "input=held_out.txt",
        f"output={tmp_path / 'eval.json'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    tok = Tokenizer.load(tokenizer_dir)
    n_bytes = sum(len(d.encode()) for d in documents)
    n_tokens = sum(len(tok.encode(d)) for d in documents)
    result = json.loads((tmp_path / "eval.json").read_text())
    assert (result["bytes"], result["tokens"], result["documents"]) == (n_bytes, n_tokens, len(documents))
    assert result["bytes_per_token"] == pytest.approx(n_bytes / n_tokens, abs=1e-4)
    # Reports of several tokenizers say which is which (the digest is the one an encoding's sidecar gives).
    assert result["tokenizer"] == str(Path(tokenizer_dir).absolute()) and result["separator"] == EOT
    assert result["tokenizer_hash"] == tokenizer_hash(Path(tokenizer_dir))
    assert result["files"] == [str(source.absolute())]  # read from elsewhere, as the tokenizer's path is
    assert f"bytes/token {n_bytes / n_tokens:.4f}" in proc.stdout
    assert evaluate(tok, source).tokens_per_document == pytest.approx(n_tokens / len(documents))
    again = run_script("evaluate.py", f"tokenizer={tokenizer_dir}", f"input={source}",
                       f"output={tmp_path / 'eval.json'}", cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr  # a report replaces the report before it


@pytest.mark.parametrize("sharded", [False, True])
def test_evaluate_shows_its_progress(tokenizer_dir, documents, tmp_path, caplog, sharded):
    """An evaluation of gigabytes ran for minutes without a word, where an encoding of them shows a bar:
    ``progress=true`` gives one, ``progress=false`` log lines and their summary, the numbers unchanged."""
    source = tmp_path / "held_out.txt"
    source.write_text(EOT.join(documents), encoding="utf-8")
    proc = run_script("evaluate.py", f"tokenizer={tokenizer_dir}", f"input={source}", "progress=true",
                      cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "evaluating: 100%" in proc.stderr, proc.stderr
    shards = ExecutorSpec(shard_bytes=1024)  # as executor=ray evaluates, here in a local pool
    with caplog.at_level(logging.INFO, logger="superbpe"):
        if sharded:
            result = evaluate_sharded(tokenizer_dir, source, executor=shards, progress=False)
        else:
            result = evaluate_module.evaluate_dir(tokenizer_dir, source, progress=False)
    lines = [r.getMessage() for r in caplog.records]
    size = human_size(source.stat().st_size)
    assert any(line.startswith(f"evaluating: {size}/{size} B (100.0%)") for line in lines), lines
    assert result == evaluate(Tokenizer.load(tokenizer_dir), source)


def test_evaluate_script_reads_invalid_utf8_with_errors_replace(tokenizer_dir, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nthen \xff here\n")
    args = ("evaluate.py", f"tokenizer={tokenizer_dir}", f"input={bad}")
    strict = run_script(*args, cwd=tmp_path)
    assert_one_line_error(strict, "bad.txt: invalid UTF-8 at byte 10", "superbpe-evaluate")
    replaced = run_script(*args, "errors=replace", cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr
    size = len("fine\nthen \ufffd here\n".encode())
    assert f"({size} bytes," in replaced.stdout


@pytest.mark.parametrize("engine", ["python", "native"] if native_available() else ["python"])
def test_a_byte_the_vocabulary_lacks_is_named_by_file_and_place(tmp_path, engine):
    kept = [byte for byte in range(256) if byte != 0x62]
    without_b = Tokenizer({i: bytes([byte]) for i, byte in enumerate(kept)}, [], [EOT])
    without_b.save(tmp_path / "tok")
    text = tmp_path / "t.txt"
    text.write_bytes(b"fine\nthen abc\n")
    records = tmp_path / "r.jsonl"
    records.write_text('{"text": "fine"}\n\n{"text": "abc"}\n')
    cases = ((text, "t.txt: byte 11: text needs byte 0x62"), (records, "r.jsonl: line 3: text needs byte"))
    for path, message in cases:
        with pytest.raises(InputError, match=message):
            encode_corpus(tmp_path / "tok", path, tmp_path / "ids.bin", engine=engine, separator=None)
        with pytest.raises(InputError, match=message):
            evaluate(Tokenizer.load(tmp_path / "tok", engine=engine), path, separator=None)
    assert not (tmp_path / "ids.bin").exists()


@pytest.mark.parametrize("separator", [EOT, None])
@pytest.mark.parametrize("engine", ["python", "native"] if native_available() else ["python"])
def test_evaluate_never_cuts_a_file_inside_a_special_token(tmp_path, monkeypatch, engine, separator):
    """Chunks and shards were cut around the separator alone: a line cut inside ``"\\n<n>"``, or a
    pre-tokenizer's cut after the digit of ``"<|reserved_0|>"``, left their halves to be counted as text."""
    specials = [EOT, "\n<n>", "<|reserved_0|>"]
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], specials, "gpt2", engine)
    tok.save(tmp_path / "tok")
    text = ("ab\n<n>cd x<|reserved_0|>y " + EOT) * 3 + "z\n<n>w"
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    documents = text.split(EOT) if separator else [text]
    expected = sum(len(tok.encode(document)) for document in documents)
    monkeypatch.setattr(evaluate_module, "EVAL_CHUNK_BYTES", 3)
    monkeypatch.setattr(sources_module, "LOCAL_CUT_WINDOW", 2)
    assert evaluate(tok, path, separator=separator).tokens == expected
    shards = ExecutorSpec(shard_bytes=3)  # planned here, so the patched cut window holds for them
    sharded = evaluate_sharded(tmp_path / "tok", path, separator=separator, engine=engine, executor=shards)
    assert sharded.tokens == expected


# -- workers ---------------------------------------------------------------------------------------------

ENGINES = ["python", "native"] if native_available() else ["python"]


@pytest.fixture(scope="module")
def mixed_inputs(tmp_path_factory, documents, wikitext_text) -> list[Path]:
    """A text file with separators, WikiText lines (which end in " \\n"), and JSON lines: many chunks."""
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "a.txt").write_text(EOT.join(documents) + EOT + wikitext_text[:150_000], encoding="utf-8")
    lines = wikitext_text[150_000:250_000].splitlines(keepends=True)
    records = "".join(json.dumps({"text": line}) + "\n" for line in [*documents, *lines])
    (folder / "b.jsonl").write_text(records, encoding="utf-8")
    return [folder / "a.txt", folder / "b.jsonl"]


@pytest.mark.parametrize("engine", ENGINES)
def test_any_worker_count_writes_the_same_file(tokenizer_dir, mixed_inputs, tmp_path, engine):
    tok = Tokenizer.load(tokenizer_dir, engine=engine)
    text, records = (path.read_text(encoding="utf-8") for path in mixed_inputs)
    docs = [*text.split(EOT), *(json.loads(line)["text"] for line in records.splitlines())]
    files = []
    for workers in (1, 2, 3):
        out = tmp_path / f"w{workers}.bin"
        result = encode_corpus(
            tokenizer_dir, mixed_inputs, out, workers=workers, chunk_bytes=4096, engine=engine
        )
        assert result.documents == len(docs)
        files.append(out.read_bytes())
    assert files[0] == files[1] == files[2]
    assert np.frombuffer(files[0], dtype="<u2").tolist() == expected_ids(tok, docs)
    counts = {workers: evaluate(tok, mixed_inputs, workers=workers) for workers in (1, 2, 3)}
    assert counts[1] == counts[2] == counts[3]
    assert counts[1].tokens == sum(len(tok.encode(doc)) for doc in docs)
    assert counts[1].documents == len(docs)


@pytest.mark.skipif(not native_available(), reason="superbpe._native is not built")
def test_native_workers_are_threads_of_this_process(tokenizer_dir, mixed_inputs, tmp_path, monkeypatch):
    """The native engine encodes with the GIL released, so its workers need no process of their own."""
    def no_processes(*args, **kwargs):
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(encode_module, "ProcessPoolExecutor", no_processes)
    seen: set[str] = set()
    original = encode_module.ChunkEncoder.encode

    def encode(self, chunk):
        seen.add(threading.current_thread().name)
        return original(self, chunk)

    monkeypatch.setattr(encode_module.ChunkEncoder, "encode", encode)
    out = tmp_path / "t.bin"
    encode_corpus(tokenizer_dir, mixed_inputs, out, workers=2, chunk_bytes=4096, engine="native")
    assert len(seen) == 2 and all(name.startswith("superbpe-encode") for name in seen)


def test_a_temp_file_left_by_an_encoding_killed_outright_is_removed_by_the_next(
    tokenizer_dir, documents, tmp_path, monkeypatch
):
    """SIGKILL leaves the hidden temp file a token file was being written into, as large as what was
    written: the next encoding of that output removes it. One that another encoding is writing is held
    (the encoding locks its own as it writes) and kept, and so are other outputs' temp files."""
    fcntl = pytest.importorskip("fcntl")
    source = tmp_path / "docs.txt"
    source.write_text(EOT.join(documents), encoding="utf-8")
    stale, held, other = (tmp_path / name for name in (".t.bin.k1lled_0.tmp", ".t.bin.wr1ting0.tmp",
                                                      ".u.bin.k1lled_0.tmp"))  # fmt: skip
    for temp in (stale, held, other):
        temp.write_bytes(b"\0" * 64)
    locked_while_encoding = []
    original = encode_module.ChunkEncoder.encode

    def encode(self, chunk):
        own = [p for p in tmp_path.glob(".t.bin.*.tmp") if p not in (stale, held)]
        with open(own[0], "rb") as probe:
            try:
                fcntl.flock(probe.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                locked_while_encoding.append(True)
        return original(self, chunk)

    monkeypatch.setattr(encode_module.ChunkEncoder, "encode", encode)
    with open(held, "rb") as holder:  # another open file: the remover's own lock attempt fails
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        encode_corpus(tokenizer_dir, source, tmp_path / "t.bin", workers=1)
    assert locked_while_encoding and all(locked_while_encoding)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["docs.txt", "t.bin", "t.bin.json", held.name, other.name]
    )


def test_an_error_on_a_worker_leaves_no_output(tokenizer_dir, tmp_path):
    """A chunk that fails on a worker thread (bad UTF-8 far into the file) fails the whole job in one line,
    with nothing written."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine text\n" * 5000 + b"\xff broken\n" + b"more text\n" * 5000)
    out = tmp_path / "out" / "x.bin"
    for engine in ENGINES:
        with pytest.raises(InputError, match=r"bad.txt: invalid UTF-8 at byte 50000"):
            encode_corpus(tokenizer_dir, bad, out, workers=3, chunk_bytes=1024, engine=engine)
        with pytest.raises(InputError, match=r"bad.txt: invalid UTF-8 at byte 50000"):
            evaluate(Tokenizer.load(tokenizer_dir, engine=engine), bad, workers=3)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("output", ["new/deeper/x.bin", "new/deeper/shards/"])
def test_a_failed_encoding_removes_the_directories_it_made_for_its_output(tokenizer_dir, tmp_path, output):
    """The flat file's parents, or the shard directory and its parents: made for the output, and gone
    again when the encoding fails, so the tree is as it was."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine text\n" * 50 + b"\xff broken\n")
    with pytest.raises(InputError, match=r"bad.txt: invalid UTF-8 at byte 500"):
        encode_corpus(tokenizer_dir, bad, str(tmp_path / output), workers=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt"]


def test_invalid_utf8_replaced_as_decoding_replaces_it(tokenizer_dir, documents, tmp_path):
    """``errors=replace``: text with bad bytes (split across chunks too) encodes as its text decoded with
    U+FFFD, on both engines and any worker count; strict names the first bad byte."""
    data = "\n".join(documents).encode("utf-8")
    for at, bad in [(10, b"\xff"), (3000, b"\xe2\x82"), (7000, b"\xed\xa0\x80"), (len(data), b"\xc3")]:
        data = data[:at] + bad + data[at:]
    corpus = tmp_path / "bad.txt"
    corpus.write_bytes(data)
    tok = Tokenizer.load(tokenizer_dir)
    expected = [*tok.encode(data.decode("utf-8", "replace")), tok.token_to_id(EOT)]
    for engine in ENGINES:
        for workers in (1, 3):
            out = tmp_path / f"{engine}{workers}.bin"
            encode_corpus(tokenizer_dir, corpus, out, workers=workers, chunk_bytes=1024, engine=engine,
                          errors="replace")  # fmt: skip
            assert np.fromfile(out, dtype=np.uint16).tolist() == expected, (engine, workers)
        with pytest.raises(InputError, match=r"bad.txt: invalid UTF-8 at byte 10; "):
            encode_corpus(tokenizer_dir, corpus, tmp_path / "s.bin", workers=2, engine=engine)


def test_a_lone_surrogate_under_errors_replace_is_three_replacement_characters(tokenizer_dir, tmp_path):
    """As the README says: ``"\\ud800"`` escaped in a JSON-lines record (or in a stream of documents) reads
    as the three bytes of its ``surrogatepass`` form decoded with ``errors="replace"``, so it encodes as a
    file holding those bytes does, not as one U+FFFD."""
    records = tmp_path / "records.jsonl"
    records.write_text('{"text": "bad \\ud800 text"}\n', encoding="utf-8")
    raw = tmp_path / "raw.txt"
    raw.write_bytes(b"bad \xed\xa0\x80 text")
    tok = Tokenizer.load(tokenizer_dir)
    expected = [*tok.encode("bad \ufffd\ufffd\ufffd text"), tok.token_to_id(EOT)]
    assert expected != [*tok.encode("bad \ufffd text"), tok.token_to_id(EOT)]
    for engine in ENGINES:
        for source in (records, raw):
            out = tmp_path / f"{engine}-{source.stem}.bin"
            encode_corpus(tokenizer_dir, source, out, engine=engine, errors="replace", progress=False)
            assert superbpe.open_tokens(out).tolist() == expected, (engine, source.name)


@pytest.mark.parametrize("output", ["x.bin", "shards/"])
@pytest.mark.parametrize("errors", ["ignore", "surrogateescape", "bogus"])
def test_an_errors_mode_other_than_strict_or_replace_is_refused_for_json_lines(
    tokenizer_dir, tmp_path, errors, output
):
    """JSON lines are decoded by Python's codecs, which take any handler (``ignore`` would drop a bad byte
    without a word, an unknown name fail with a traceback): refused before any output, as for text."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_bytes(b'{"text": "ok"}\n{"text": "bad \xff byte"}\n')
    with pytest.raises(ConfigError, match=rf"^errors must be 'strict' or 'replace', not '{errors}'$"):
        encode_corpus(tokenizer_dir, corpus, str(tmp_path / output), workers=1, errors=errors)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]


@pytest.mark.parametrize("workers", [0, -2, True])
def test_bad_worker_counts_are_refused_before_any_output(tokenizer_dir, sample_texts, tmp_path, workers):
    out = tmp_path / "x.bin"
    with pytest.raises(ConfigError, match=r"^workers must be an integer >= 1, not "):
        encode_corpus(tokenizer_dir, sample_texts / "corpus.en", out, workers=workers)
    with pytest.raises(ConfigError, match=r"^workers must be an integer >= 1, not "):
        evaluate(Tokenizer.load(tokenizer_dir), sample_texts / "corpus.en", workers=workers)
    assert not out.exists()


@pytest.mark.parametrize("chunk_bytes", [0, -1, True, 1.5])
def test_bad_chunk_sizes_are_refused_before_any_output(tokenizer_dir, sample_texts, tmp_path, chunk_bytes):
    out = tmp_path / "x.bin"
    with pytest.raises(ConfigError, match=r"^chunk_bytes must be a whole number of bytes >= 1, not "):
        encode_corpus(tokenizer_dir, sample_texts / "corpus.en", out, chunk_bytes=chunk_bytes)
    assert not out.exists()


def test_an_output_under_a_file_is_refused_before_any_work(tokenizer_dir, sample_texts, tmp_path):
    """It said "File exists" once the encoding had begun."""
    (tmp_path / "small.txt").write_text("mine\n", encoding="utf-8")
    refused = r"^output .*small.txt/x.bin: cannot write in .*small.txt: it is a file$"
    with pytest.raises(ConfigError, match=refused):
        encode_corpus(tokenizer_dir, sample_texts / "corpus.en", tmp_path / "small.txt" / "x.bin")
    assert (tmp_path / "small.txt").read_text(encoding="utf-8") == "mine\n"


def test_evaluate_script_takes_workers(tokenizer_dir, documents, tmp_path):
    source = tmp_path / "held_out.txt"
    source.write_text(EOT.join(documents), encoding="utf-8")
    proc = run_script(
        "evaluate.py", f"tokenizer={tokenizer_dir}", f"input={source}", "workers=2", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert f"{len(documents)} documents" in proc.stdout
    refused = run_script("evaluate.py", f"tokenizer={tokenizer_dir}", f"input={source}", "workers=0",
                         cwd=tmp_path)
    assert_one_line_error(refused, "workers must be an integer >= 1, not 0")


_STRETCH_PARTS = st.sampled_from([EOT, "<|s|>", "<|", "|>", "a", " the", "\n", "\u00e9", "\u65e5", "  ", "1"])


_SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


@settings(max_examples=120, deadline=None, suppress_health_check=_SLOW_OK)
@given(text=st.lists(_STRETCH_PARTS, max_size=60).map("".join))
def test_text_chunks_count_as_their_decoded_text(tokenizer_dir, text):
    """A text chunk's stretches counted from its bytes (encoded whole, cut at the separator's id) equal
    those of its decoded text split at the separator, on both engines, for separators that another
    special token may or may not overlap (then the decoded path is taken)."""
    base = Tokenizer.load(tokenizer_dir)
    chunk = Chunk("t.txt", 0, text.encode("utf-8"), False)
    for specials in ([EOT, "<|s|>"], [EOT, "<|s|>", "|><|s"], [EOT, "t|><"]):
        for engine in ENGINES:
            tok = Tokenizer(base.vocab, base.merges, specials, base.pretokenizer.name, engine)
            for separator in (EOT, "<|s|>", None, "the"):
                fast = chunk_counts(tok, chunk, separator, "strict", "text")
                decoded = chunk_counts(tok, chunk, separator, "replace", "text")  # the str path
                assert fast == decoded, (specials, engine, separator)


def test_only_a_special_nothing_overlaps_cuts_whole_chunks():
    assert _cuts_as_special((EOT, "<|s|>"), EOT) and _cuts_as_special((EOT,), None)
    assert not _cuts_as_special((EOT,), "the")  # not a special token: split as text
    for other in ["x<|endoftext|>", "<|end", "text|>x", "t|><", "x<|"]:
        assert not _cuts_as_special((EOT, other), EOT), other


CTRL_C_CHILD = """
import sys
import superbpe.cli as cli
import superbpe.jobs.encode as encode

calls = []
def write_then_ctrl_c(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:  # some ids are in the temporary file by now
        raise KeyboardInterrupt
    return write_ids(*args, **kwargs)

def evaluate_ctrl_c(*args, **kwargs):
    raise KeyboardInterrupt

write_ids, encode.write_ids, cli.evaluate_dir = encode.write_ids, write_then_ctrl_c, evaluate_ctrl_c
command = sys.argv[1]
sys.argv = [command, *sys.argv[2:]]
cli.encode() if command == "superbpe-encode" else cli.evaluate()
"""


def test_ctrl_c_of_encode_and_evaluate_is_one_line_and_leaves_nothing(tokenizer_dir, documents, tmp_path):
    source = tmp_path / "docs.txt"
    source.write_text(EOT.join(documents * 4), encoding="utf-8")
    common = [f"tokenizer={tokenizer_dir}", f"input={source}"]
    runs = {
        "superbpe-encode": [*common, f"output={tmp_path / 'out.bin'}", "chunk_bytes=4096", "workers=1"],
        "superbpe-evaluate": [*common, f"output={tmp_path / 'numbers.json'}"],
    }
    for command, args in runs.items():
        proc = subprocess.run(
            [sys.executable, "-c", CTRL_C_CHILD, command, *args], capture_output=True, text=True, cwd=tmp_path
        )
        assert proc.returncode == 130, proc.stderr
        assert proc.stdout.strip().startswith("interrupted: nothing written"), proc.stdout
        assert "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.txt"]


CTRL_C_SHARDED_CHILD = """
import sys
import superbpe.cli as cli
import superbpe.jobs.encode as encode

def ctrl_c(*args, **kwargs):  # every shard is written by now, index.json not yet
    raise KeyboardInterrupt

encode._remove_attempts = ctrl_c
sys.argv = ["superbpe-encode", *sys.argv[1:]]
cli.encode()
"""


@pytest.mark.parametrize("output", ["new/", "empty"])
def test_ctrl_c_of_a_sharded_encode_speaks_of_its_shards(tokenizer_dir, documents, tmp_path, output):
    """A stopped encoding into a directory of shards said "the token file appears only when it is complete"
    of a token file it was never to write."""
    source = tmp_path / "docs.txt"
    source.write_text(EOT.join(documents * 4), encoding="utf-8")
    (tmp_path / "empty").mkdir()
    args = [f"tokenizer={tokenizer_dir}", f"input={source}", f"output={tmp_path}/{output}", "workers=1"]
    proc = subprocess.run([sys.executable, "-c", CTRL_C_SHARDED_CHILD, *args], capture_output=True, text=True)
    assert proc.returncode == 130, proc.stderr
    assert proc.stdout == (
        "interrupted: nothing written: the shards encoded so far were removed (a directory of shards appears "
        "only when every shard and its index.json are complete)\n"
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.txt", "empty"]
    assert not list((tmp_path / "empty").iterdir())


STOP_AT_THE_SIDECAR_CHILD = """
import os, signal, sys
import superbpe.cli as cli
import superbpe.jobs.encode as encode

stop = getattr(signal, sys.argv[1])
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job ignores it)
def stop_then_write(*args, **kwargs):  # the token file is in place, its sidecar not yet
    os.kill(os.getpid(), stop)
    return write(*args, **kwargs)

write, encode.atomic_write_text = encode.atomic_write_text, stop_then_write
sys.argv = ["superbpe-encode", *sys.argv[2:]]
cli.encode()
"""


@pytest.mark.parametrize(("stop", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_stop_as_the_token_file_goes_into_place_leaves_it_with_its_sidecar(
    tokenizer_dir, documents, tmp_path, stop, status
):
    """The token file is renamed into place before its sidecar is written: a stop in between left the file
    without a sidecar (or beside the one of the file it replaced) under a line saying nothing was written."""
    source = tmp_path / "docs.txt"
    source.write_text(EOT.join(documents), encoding="utf-8")
    out = tmp_path / "out.bin"
    earlier = tmp_path / "earlier.txt"
    earlier.write_text(documents[0], encoding="utf-8")
    encode_corpus(tokenizer_dir, earlier, out, progress=False)  # an earlier output, replaced
    args = [f"tokenizer={tokenizer_dir}", f"input={source}", f"output={out}", "workers=1", "progress=false"]
    proc = subprocess.run(
        [sys.executable, "-c", STOP_AT_THE_SIDECAR_CHILD, stop, *args], capture_output=True, text=True
    )
    assert proc.returncode == status, proc.stderr
    word = "interrupted" if stop == "SIGINT" else "terminated"
    result, said = proc.stdout.strip().splitlines()
    assert result.startswith(f"{out}: ") and said.startswith(f"{word}: once the token file"), proc.stdout
    assert superbpe.open_tokens(out).tolist() == expected_ids(Tokenizer.load(tokenizer_dir), documents)
    assert json.loads((tmp_path / "out.bin.json").read_text())["inputs"] == [str(source.resolve())]


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` sent to process ``pid`` waits there, not yet taken by any thread (Linux)."""
    status = Path(f"/proc/{pid}/status").read_text()
    shared = next(line for line in status.splitlines() if line.startswith("ShdPnd:"))
    return bool(int(shared.split()[1], 16) >> (signum - 1) & 1)


@pytest.mark.skipif(
    not (hasattr(signal, "sigwaitinfo") and Path("/proc/self/status").is_file()),
    reason="a worker tells SIGTERM's sender with sigwaitinfo; its pending signals are read from /proc",
)
def test_encode_workers_leave_stop_signals_to_the_command_but_end_when_their_pool_terminates_them(
    tokenizer_dir,
):
    """A scheduler's SIGTERM and a terminal's Ctrl-C reach the workers of a python-engine encode too: a
    worker that dies of one (or raises KeyboardInterrupt) halfway through sending its ids hangs the command
    at its pool's shutdown. They are the command's to handle; a SIGTERM from the pool's own process (which
    terminates its workers when one of them died) still ends a worker."""
    previous = signal.signal(signal.SIGTERM, _interrupt)  # as the commands set it
    try:
        context = multiprocessing.get_context("fork")
        handled = handled_stop_signals()
        assert set(handled) == {signal.SIGINT, signal.SIGTERM}
        args = (str(tokenizer_dir), "python", None, None, "text", "strict", "uint32", os.getpid(), handled)
        with ProcessPoolExecutor(1, context, encode_module._init_worker, args) as pool:
            worker = pool.submit(os.getpid).result(timeout=60)
            send = f"import os, signal; os.kill({worker}, signal.SIGTERM); os.kill({worker}, signal.SIGINT)"
            subprocess.run([sys.executable, "-c", send], check=True)  # from another process
            assert pool.submit(os.getpid).result(timeout=60) == worker
            deadline = time.monotonic() + 60
            while _pending(worker, signal.SIGTERM):  # taken, so that the next one is not merged into it
                assert time.monotonic() < deadline, "the worker never took the SIGTERM"
                time.sleep(0.01)
            assert pool.submit(os.getpid).result(timeout=60) == worker
            os.kill(worker, signal.SIGTERM)  # from the pool's process
            with pytest.raises(BrokenProcessPool):
                pool.submit(time.sleep, 5).result(timeout=60)
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_stop_signals_held_take_effect_at_the_end_of_the_block():
    """Submitting to the encode pool (which starts its workers) is not interrupted halfway."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        reached = False
        with pytest.raises(KeyboardInterrupt), stop_signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            reached = True
        assert reached
        assert signal.getsignal(signal.SIGTERM) is _interrupt
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_only_a_token_file_an_encoding_wrote_is_replaced(tokenizer_dir, documents, tmp_path):
    """Another file at the token file's path or at its sidecar's is refused before any work; an earlier
    encoding's output is replaced (a re-run)."""
    source = tmp_path / "docs.txt"
    source.write_text(EOT.join(documents), encoding="utf-8")
    (tmp_path / "notes.txt").write_text("precious")
    (tmp_path / "config.json").write_text('{"my": "settings"}')
    for output, kept in [("notes.txt", "notes.txt"), ("config", "config.json")]:
        with pytest.raises(ConfigError, match=f"output .*{kept} exists and is not a token file an encoding"):
            encode_corpus(tokenizer_dir, source, tmp_path / output, workers=1)
    assert (tmp_path / "notes.txt").read_text() == "precious"
    assert (tmp_path / "config.json").read_text() == '{"my": "settings"}'
    assert not (tmp_path / "config").exists()
    first = encode_corpus(tokenizer_dir, source, tmp_path / "t.bin", workers=1)
    again = encode_corpus(tokenizer_dir, source, tmp_path / "t.bin", workers=1)
    assert again == first
    for name in ("t.npy", "t.json"):  # numpy.load of raw ids fails with a misleading message
        with pytest.raises(ConfigError, match=f"output .*{name}: a token file holds raw ids"):
            encode_corpus(tokenizer_dir, source, tmp_path / name, workers=1)


def _sweep_of_two_jobs(tokenizer_dir, documents, tmp_path, output: str):
    """``superbpe-encode -m`` of the documents (written to docs.txt) by two jobs into ``output``."""
    source = tmp_path / "docs.txt"
    source.write_text(EOT.join(documents), encoding="utf-8")
    return run_script(
        "encode.py", "-m", f"tokenizer={tokenizer_dir},{tokenizer_dir}", f"input={source}", output,
        "workers=1", cwd=tmp_path,
    )  # fmt: skip


def test_a_sweep_whose_jobs_write_one_token_file_stops_at_the_second(tokenizer_dir, documents, tmp_path):
    """Each job would replace the one before it: the second is refused, naming the way out, and the
    first job's file stays."""
    proc = _sweep_of_two_jobs(tokenizer_dir, documents, tmp_path, "output=m.bin")
    assert proc.returncode == 1, proc.stderr
    assert "m.bin was written by an earlier job of this sweep" in proc.stderr, proc.stderr
    assert "output=tokens_${hydra:job.num}.bin" in proc.stderr
    assert json.loads((tmp_path / "m.bin.json").read_text())["tokens"] > 0
    proc = _sweep_of_two_jobs(tokenizer_dir, documents, tmp_path, "output=m_${hydra:job.num}.bin")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "m_0.bin").read_bytes() == (tmp_path / "m_1.bin").read_bytes()
    # Hydra's record of each sweep (multirun/DATE/TIME/multirun.yaml, empty job directories) is removed.
    assert not (tmp_path / "multirun").exists()


def test_a_sweep_whose_jobs_write_one_shard_directory_stops_at_the_second(tokenizer_dir, documents, tmp_path):
    """A sharded output is refused as a flat one is, with the way out for a directory: the refusal of a
    non-empty directory would tell the user to remove the first job's shards."""
    proc = _sweep_of_two_jobs(tokenizer_dir, documents, tmp_path, "output=m/")
    assert proc.returncode == 1, proc.stderr
    assert "output m was written by an earlier job of this sweep" in proc.stderr, proc.stderr
    assert "output=tokens_${hydra:job.num}/" in proc.stderr
    assert json.loads((tmp_path / "m" / "index.json").read_text())["tokens"] > 0


def test_an_evaluate_sweep_leaves_no_sweep_directory(tokenizer_dir, documents, tmp_path):
    """Its jobs write nothing into Hydra's sweep directory, which would stand, empty but for Hydra's
    record, beside the training sweeps in multirun/."""
    source = tmp_path / "docs.txt"
    source.write_text(EOT.join(documents), encoding="utf-8")
    proc = run_script(
        "evaluate.py", "-m", f"tokenizer={tokenizer_dir},{tokenizer_dir}", f"input={source}",
        "output=e_${hydra:job.num}.json", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("bytes/token") == 2 and (tmp_path / "e_1.json").is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["docs.txt", "e_0.json", "e_1.json"]
    # Each line says which job, and so which tokenizer, it measures: they read alike.
    lines = proc.stdout.splitlines()
    assert [line.split(": bytes/token")[0] for line in lines] == [
        f"job {number} (tokenizer={tokenizer_dir})" for number in (0, 1)
    ], lines


def test_an_evaluate_sweep_whose_jobs_write_one_report_stops_at_the_second(
    tokenizer_dir, documents, tmp_path
):
    """As for encode: the second job would replace the first one's report (of another tokenizer, say)
    without a word; it is refused before its work, and the first report stays."""
    source = tmp_path / "docs.txt"
    source.write_text(EOT.join(documents), encoding="utf-8")
    (tmp_path / "e.json").write_text("{}")  # written before the sweep: not a report, refused
    args = ["-m", f"tokenizer={tokenizer_dir},{tokenizer_dir}", f"input={source}", "output=e.json"]
    proc = run_script("evaluate.py", *args, cwd=tmp_path)
    assert proc.returncode == 1 and "e.json exists and is not a report" in proc.stderr, proc.stderr
    (tmp_path / "e.json").unlink()
    proc = run_script("evaluate.py", *args, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.count("bytes/token") == 1, proc.stdout
    assert "e.json was written by an earlier job of this sweep" in proc.stderr, proc.stderr
    assert "output=eval_${hydra:job.num}.json" in proc.stderr
    assert json.loads((tmp_path / "e.json").read_text())["tokens"] > 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["docs.txt", "e.json"]


def test_an_output_that_names_the_current_directory_is_a_one_line_error(tokenizer_dir, tmp_path):
    """``output=.`` is a directory with no name of its own: a sharded output, refused as not empty, in a
    sweep too (whose check of the file an earlier job wrote has no sidecar to name there)."""
    source = tmp_path / "in.txt"
    source.write_text("hello world\n")
    for sweep in ([], ["-m"]):
        proc = run_script(
            "encode.py", *sweep, f"tokenizer={tokenizer_dir}", f"input={source}", "output=.", cwd=tmp_path
        )
        assert_one_line_error(proc, "output directory . is not empty")
        assert not list(tmp_path.glob("shard-*")) and not (tmp_path / "index.json").exists()


def test_a_sharded_outputs_line_says_it_is_a_directory_of_shards(tokenizer_dir, tmp_path):
    """A sharded output is a directory (``executor=ray`` makes one of ``output=tokens.bin`` too), which
    ``open_tokens`` refuses: the result line says so, where it read as the line of one token file."""
    source = tmp_path / "in.txt"
    source.write_text("hello world\n")
    args = [f"tokenizer={tokenizer_dir}", f"input={source}", "output=toks/"]
    proc = run_script("encode.py", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith(f"toks{os.sep}: ") and line.endswith(
        " in 1 shard file and index.json (read with superbpe.open_shards)"
    ), line
    assert [len(shard) for shard in superbpe.open_shards(tmp_path / "toks")] == [int(line.split()[1])]


def test_a_quoted_tilde_in_a_path_is_the_home_directory(tokenizer_dir, tmp_path, monkeypatch):
    """As in the inputs (a shell leaves ``~`` alone inside quotes, which Hydra values often need): the
    tokenizer, a flat or sharded output and the evaluation report go under the home directory, not into
    a folder named ``~`` where the command runs."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "in.txt").write_text("hello world\n")
    shutil.copytree(tokenizer_dir, home / "tok")
    monkeypatch.setenv("HOME", str(home))
    for output in ("'~/out/x.bin'", "'~/shards/'"):
        proc = run_script("encode.py", "tokenizer='~/tok'", "input='~/in.txt'", f"output={output}", cwd=work)
        assert proc.returncode == 0, proc.stderr
    proc = run_script("evaluate.py", "tokenizer='~/tok'", "input='~/in.txt'", "output='~/r.json'", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert (home / "out" / "x.bin.json").is_file() and (home / "shards" / "index.json").is_file()
    assert (home / "r.json").is_file() and not any(work.iterdir())


def test_a_separator_opening_a_file_ends_no_document_for_encode_or_evaluate(tokenizer_dir, tmp_path):
    """As one closing it opens none: both commands count the two texts, whether the separator is before or
    after each, and a chunk that starts with one inside the file still ends a document."""
    tok = Tokenizer.load(tokenizer_dir)
    texts = [("lead", f"{EOT}one{EOT}two"), ("trail", f"one{EOT}two{EOT}"), ("both", f"{EOT}one{EOT}")]
    for name, text in texts:
        path = tmp_path / f"{name}.txt"
        path.write_text(text, encoding="utf-8")
        expected = 1 if name == "both" else 2
        assert evaluate(tok, path).documents == expected
        assert evaluate_sharded(tokenizer_dir, path).documents == expected
        for output in (tmp_path / f"{name}.bin", f"{tmp_path / name}/"):
            result = encode_corpus(tokenizer_dir, path, output, workers=1, chunk_bytes=4)
            assert result.documents == expected, (name, output)
    proc = run_script("encode.py", f"tokenizer={tokenizer_dir}", f"input={tmp_path / 'lead.txt'}",
                      f"output={tmp_path / 'cli.bin'}", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0 and "2 documents" in proc.stdout, proc.stderr
    ids = np.fromfile(tmp_path / "cli.bin", dtype=np.uint16).tolist()
    assert ids == tok.encode(f"{EOT}one{EOT}two{EOT}")  # the opening separator's id is kept


def test_a_separator_inside_a_records_text_is_warned_about(tokenizer_dir, tmp_path, caplog):
    """It is written as the separator's id (as ``Tokenizer.encode`` of the text gives it), so splitting the
    token file at it gives more documents than the sidecar's records: said, flat and sharded."""
    records = tmp_path / "r.jsonl"
    records.write_text(
        "\n".join(json.dumps({"text": t}) for t in [f"one {EOT} two", "plain", f"{EOT}{EOT}"]) + "\n"
    )
    clean = tmp_path / "clean.jsonl"
    clean.write_text(json.dumps({"text": "plain"}) + "\n")
    for output in (tmp_path / "flat.bin", f"{tmp_path / 'shards'}/"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="superbpe"):
            result = encode_corpus(tokenizer_dir, records, output, workers=1)
        assert result.documents == 3
        assert f"r.jsonl: the texts of its records hold the separator '{EOT}' 3 time(s)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="superbpe"):
        encode_corpus(tokenizer_dir, clean, tmp_path / "clean.bin", workers=1)
    assert "hold the separator" not in caplog.text


def test_a_wrong_separator_lists_the_specials_quoted() -> None:
    """Specials of blanks or with a leading space were shown bare (``it has: , of``); many are counted."""
    vocab = {i: bytes([i]) for i in range(256)}
    few = Tokenizer(vocab, [], ["<|endoftext|>", "\n\n", " of"])
    with pytest.raises(ConfigError, match=r"\(it has: '<\|endoftext\|>', '\\n\\n', ' of'\); separator=null"):
        encode_module.separator_id_of(few, "<|eos|>")
    many = Tokenizer(vocab, [], [f"<|r{i}|>" for i in range(20)])
    with pytest.raises(ConfigError, match=r"'<\|r3\|>', \.\.\. \(20 in all\)\)"):
        encode_module.separator_id_of(many, "<|eos|>")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_encode_pool_workers_end_when_their_command_is_killed_outright():
    """Workers of a pool whose process a SIGKILL ended lived on for ever, orphans waiting on their queue."""
    script = (
        "import os, time\nfrom concurrent.futures import ProcessPoolExecutor\n"
        "import superbpe.core.util as util\nutil.PARENT_CHECK_SECONDS = 0.05\n"
        "pool = ProcessPoolExecutor(2, initializer=util.as_pool_worker, initargs=(os.getpid(), ()))\n"
        "pool.submit(os.getpid).result()\n"
        "print(*pool._processes, flush=True)\ntime.sleep(60)\n"
    )
    workers, left = workers_left_when_killed(script)
    assert workers
    assert not left
