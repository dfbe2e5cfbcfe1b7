"""Parquet files and HF datasets saved to disk as corpora: same counts as the same text as JSON lines."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from superbpe.core.errors import InputError
from superbpe.core.sources import iter_chunks, resolve_inputs
from superbpe.engines.native import available as native_available
from superbpe.jobs.encode import encode_corpus

pa = pytest.importorskip("pyarrow", reason='needs the parquet extra: pip install ".[parquet]"')
pq = pytest.importorskip("pyarrow.parquet")

EOT = "<|endoftext|>"
ENGINES = ["python", "native"] if native_available() else ["python"]


@pytest.fixture(scope="module")
def documents(sample_texts: Path, multilingual_text: str) -> list[str]:
    text = (sample_texts / "corpus.en").read_text(encoding="utf-8")
    docs = [doc for doc in text.split(EOT) if doc.strip()]
    docs += [multilingual_text[i : i + 3000] for i in range(0, 60_000, 3000)]
    return [*docs, "", "  trailing spaces  \n\n", "x" + EOT + "y"]


@pytest.fixture(scope="module")
def as_jsonl(documents: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("jsonl") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in documents), "utf-8")
    return path


@pytest.fixture(scope="module")
def as_parquet(documents: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("parquet") / "docs.parquet"
    table = pa.table({"id": list(range(len(documents))), "text": documents})
    pq.write_table(table, path, row_group_size=7)  # many row groups: chunks are row groups
    return path


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("workers", "chunk_bytes"), [(1, 1 << 20), (2, 5000)])
def test_parquet_counts_equal_jsonl(engine: str, workers: int, chunk_bytes: int, as_jsonl: Path,
                                    as_parquet: Path) -> None:
    from superbpe.engines.interface import get_engine

    parts = [chunk.table_parts for chunk in iter_chunks(as_parquet, [EOT], chunk_bytes, line_cuts=True)]
    bounds = [0] + [stop for _, stop in parts]
    assert parts == list(zip(bounds, bounds[1:], strict=False))  # consecutive runs of whole row groups
    assert bounds[-1] == pq.ParquetFile(as_parquet).num_row_groups and (len(parts) > 3 or chunk_bytes > 5000)
    count = get_engine(engine).count
    options = {"workers": workers, "chunk_bytes": chunk_bytes}
    for pattern in ("gpt2", "superbpe"):
        expected = count(as_jsonl, pattern, [EOT], **options).to_dict()
        assert count(as_parquet, pattern, [EOT], **options).to_dict() == expected


@pytest.mark.parametrize("engine", ENGINES)
def test_saved_dataset_counts_equal_jsonl(engine: str, documents: list[str], as_jsonl: Path,
                                          tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    from superbpe.engines.interface import get_engine

    saved = tmp_path / "ds"
    datasets.Dataset.from_dict({"body": documents}).save_to_disk(str(saved), max_shard_size="20KB")
    assert len(resolve_inputs(saved)) > 1  # several shards, taken in order
    count = get_engine(engine).count
    expected = count(as_jsonl, "o200k", [EOT]).to_dict()
    assert count(saved, "o200k", [EOT], text_field="body").to_dict() == expected
    splits = tmp_path / "dd"
    half = len(documents) // 2
    parts = {"train": documents[:half], "test": documents[half:]}
    datasets.DatasetDict({name: datasets.Dataset.from_dict({"body": docs}) for name, docs in parts.items()}
                         ).save_to_disk(str(splits))
    assert count(splits, "o200k", [EOT], text_field="body").to_dict() == expected


def test_table_chunks_move_progress_to_the_files_size(as_parquet: Path) -> None:
    """Their chunks hold no bytes, so progress stayed at 0 B of the file until the count ended."""
    chunks = list(iter_chunks(as_parquet, [], 2000, line_cuts=True))
    assert len(chunks) > 2 and all(chunk.read_bytes > 0 for chunk in chunks)
    assert sum(chunk.read_bytes for chunk in chunks) == as_parquet.stat().st_size


def test_what_a_directory_input_leaves_unread_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory is read by suffix: its .md, .zst and .json files were skipped without a word, and a
    DatasetDict's test split was read with its train split."""
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / ".git").mkdir()
    (corpus / ".ipynb_checkpoints").mkdir()
    names = ("a.txt", "sub/b.jsonl", "notes.md", "sub/c.txt.zst", ".git/config", ".DS_Store",
             ".ipynb_checkpoints/a-checkpoint.txt")  # fmt: skip
    for name in names:
        (corpus / name).write_text('{"text": "x"}\n' if name.endswith(".jsonl") else "x\n")
    with caplog.at_level("WARNING", logger="superbpe"):
        assert [p.name for p in resolve_inputs(corpus)] == ["a.txt", "b.jsonl"]
    assert "2 file(s) not read" in caplog.text and "notes.md, sub/c.txt.zst" in caplog.text
    # A notebook's checkpoint copies of its texts were read, and counted them twice.
    assert "1 hidden file(s) not read (name them as inputs to read them): .ipynb_checkpoints" in caplog.text
    splits = tmp_path / "dd"
    for split in ("train", "test"):
        (splits / split).mkdir(parents=True)
        (splits / split / "state.json").write_text(json.dumps({"_data_files": [{"filename": "d.arrow"}]}))
        (splits / split / "dataset_info.json").write_text("{}")
    (splits / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    caplog.clear()
    with caplog.at_level("WARNING", logger="superbpe"):
        assert resolve_inputs(splits) == [splits / "train" / "d.arrow", splits / "test" / "d.arrow"]
    assert "a DatasetDict; reading every split: train, test" in caplog.text


def test_encode_parquet_equals_encode_jsonl(as_jsonl: Path, as_parquet: Path, tmp_path: Path,
                                            sample_texts: Path) -> None:
    import superbpe

    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 600, [EOT])
    superbpe.Tokenizer(vocab, merges, [EOT]).save(tmp_path / "tok")
    a = encode_corpus(tmp_path / "tok", as_jsonl, tmp_path / "a.bin")
    b = encode_corpus(tmp_path / "tok", as_parquet, tmp_path / "b.bin")
    assert (a.tokens, a.documents) == (b.tokens, b.documents)
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()


def test_tables_by_shard_equal_the_same_text_as_json_lines(as_jsonl: Path, as_parquet: Path, tmp_path: Path,
                                                           sample_texts: Path) -> None:
    """Sharded jobs (the path executor=ray takes) cut tables into byte ranges and read them as text."""
    import superbpe  # reason: trains the tokenizer the jobs encode with
    from superbpe.jobs.count import count_on_executor  # reason: the sharded jobs are only this test's
    from superbpe.jobs.evaluate import evaluate_sharded  # reason: as above
    from superbpe.jobs.executors import ExecutorSpec  # reason: as above

    saved = tmp_path / "saved"
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": pq.read_table(as_parquet).column("text").to_pylist()}).save_to_disk(
        str(saved), max_shard_size="20KB"
    )
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 600, [EOT])
    superbpe.Tokenizer(vocab, merges, [EOT]).save(tmp_path / "tok")
    executor = ExecutorSpec("local", shard_bytes=5000)
    reference = count_on_executor([as_jsonl], "gpt2", [EOT], executor=executor)
    flat = encode_corpus(tmp_path / "tok", as_jsonl, tmp_path / "flat.bin")
    jsonl_report = evaluate_sharded(tmp_path / "tok", [as_jsonl], executor=executor)
    for table in (as_parquet, saved):
        assert count_on_executor([table], "gpt2", [EOT], executor=executor).to_dict() == reference.to_dict()
        out = tmp_path / f"{table.name}_shards"
        sharded = encode_corpus(tmp_path / "tok", table, str(out) + "/", executor=executor)
        ids = b"".join(p.read_bytes() for p in sorted(out.glob("*.bin")))
        assert ids == (tmp_path / "flat.bin").read_bytes() and sharded.documents == flat.documents
        report = evaluate_sharded(tmp_path / "tok", [table], executor=executor)
        assert replace(report, files=[]) == replace(jsonl_report, files=[])


def test_a_table_encoded_by_shard_without_separator_counts_its_rows(as_parquet: Path, tmp_path: Path,
                                                                    documents: list[str],
                                                                    sample_texts: Path) -> None:
    """Without a separator a table's last ids are its last row's text, not the open last document of a
    text file: a shard of it ends no document beyond its rows and ends inside none, as the flat file."""
    import superbpe  # reason: trains the tokenizer the jobs encode with

    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 600, [EOT])
    superbpe.Tokenizer(vocab, merges, [EOT]).save(tmp_path / "tok")
    flat = encode_corpus(tmp_path / "tok", as_parquet, tmp_path / "flat.bin", separator=None)
    sharded = encode_corpus(tmp_path / "tok", as_parquet, str(tmp_path / "shards") + "/", separator=None)
    assert flat.documents == sharded.documents == len(documents)
    assert not any(entry.ends_inside_document for entry in sharded.shards)
    assert (tmp_path / "shards" / "shard-000000.bin").read_bytes() == (tmp_path / "flat.bin").read_bytes()


def test_a_dictionary_encoded_text_column_reads_as_its_texts(tmp_path: Path, documents: list[str],
                                                              as_jsonl: Path) -> None:
    """pandas' category dtype is written to Parquet as a dictionary column: it was refused as not strings."""
    from superbpe.engines.python_count import count_pieces  # reason: only this test counts tables directly

    categories = tmp_path / "categories.parquet"
    pq.write_table(pa.table({"text": pa.array(documents).dictionary_encode()}), categories)
    read, reference = (count_pieces(path, "gpt2", [EOT]).to_dict() for path in (categories, as_jsonl))
    assert read == reference


def test_bad_tables_are_one_line_errors(tmp_path: Path) -> None:
    from superbpe.engines.python_count import count_pieces

    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), numbers)
    with pytest.raises(InputError, match="column 'text' holds int64, not strings"):
        count_pieces(numbers, "gpt2", [])
    with pytest.raises(InputError, match=r"no column 'body' \(columns: text\)"):
        count_pieces(numbers, "gpt2", [], text_field="body")
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": ["a", None]}), nulls)
    with pytest.raises(InputError, match="row 2: 'text' is null"):
        count_pieces(nulls, "gpt2", [])
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match="broken.parquet: cannot read table"):
        count_pieces(broken, "gpt2", [])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("stream", [True, False])
def test_arrow_file_with_many_batches_counts_equal_jsonl(engine: str, stream: bool, documents: list[str],
                                                          as_jsonl: Path, tmp_path: Path) -> None:
    from superbpe.engines.interface import get_engine

    path = tmp_path / "docs.arrow"
    table = pa.table({"text": documents})
    new = pa.ipc.new_stream if stream else pa.ipc.new_file  # datasets writes the stream format
    with pa.OSFile(str(path), "wb") as sink, new(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=5):
            writer.write_batch(batch)
    parts = [chunk.table_parts for chunk in iter_chunks(path, [EOT], 4000, line_cuts=True)]
    assert len(parts) > 3
    count = get_engine(engine).count
    expected = count(as_jsonl, "cl100k", [EOT]).to_dict()
    assert count(path, "cl100k", [EOT], workers=2, chunk_bytes=4000).to_dict() == expected
