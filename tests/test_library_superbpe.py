"""The library without Hydra: SuperBPE as one call, documents from any iterable, and short vocabularies."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

import superbpe
from superbpe.core.counts import PieceCounts
from superbpe.core.errors import InputError
from superbpe.core.sources import document_blocks
from superbpe.engines.interface import native_available
from superbpe.training.config import TrainConfig, register_configs, to_dataclass
from superbpe.training.run import run_training

ENGINES = ["python", *(["native"] if native_available() else [])]
CONF = Path(__file__).resolve().parents[1] / "conf"
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def documents(sample_texts: Path) -> list[str]:
    """Paragraphs of the English sample, with a special token inside one and a non-ASCII one."""
    text = (sample_texts / "corpus.en").read_text(encoding="utf-8")
    docs = [d for d in text.split("\n\n") if d.strip()]
    return [*docs, f"one{EOT}two", (sample_texts / "german.txt").read_text(encoding="utf-8")]


@pytest.fixture(scope="module")
def jsonl(documents: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same documents written one per line to a JSON-lines file."""
    path = tmp_path_factory.mktemp("docs") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents), encoding="utf-8")
    return path


def hydra_run(tmp_path: Path, corpus: Path, engine: str, *overrides: str) -> TrainConfig:
    """The config ``superbpe-train schedule=superbpe ...`` composes (no cache, into ``tmp_path``)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                "schedule=superbpe",
                f"data.paths=[{corpus}]",
                "vocab_size=900",
                "cache_dir=null",
                f"output_dir={tmp_path / 'run'}",
                f"engine={engine}",
                *overrides,
            ],
        )
    return to_dataclass(cfg, TrainConfig)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("overrides", "options"),
    [([], {}), (["compat=official", "schedule.transition=300"], {"compat": "official", "transition": 300})],
    ids=["ours", "official"],
)
def test_train_superbpe_makes_the_merges_of_the_hydra_run(tmp_path, jsonl, engine, overrides, options):
    cfg = hydra_run(tmp_path, jsonl, engine, *overrides)
    expected = run_training(cfg).merges
    transition, compat = options.get("transition", 0.8), options.get("compat")
    specials = cfg.special_tokens
    vocab, merges = superbpe.train_superbpe(jsonl, 900, transition, specials, engine=engine, compat=compat)
    assert merges == expected
    assert len(vocab) == 900 and len(set(vocab.values())) == len(vocab)


@pytest.mark.parametrize(
    ("overrides", "options"),
    [([], {}), (["compat=official", "schedule.transition=300"], {"compat": "official", "transition": 300})],
    ids=["ours", "official"],
)
def test_tokenizer_train_superbpe_is_the_tokenizer_the_hydra_run_writes(
    tmp_path, jsonl, documents, overrides, options
):
    """``Tokenizer.train_superbpe`` gives what a run's directory loads as: the merges and ids, and the same
    encoding (the stage-2 pattern, the specials and, under compat=official, merges applied even to a
    piece that is a token), with neither the pattern nor the specials named again."""
    engine = ENGINES[-1]
    cfg = hydra_run(tmp_path, jsonl, engine, *overrides)
    run_training(cfg)
    written = superbpe.Tokenizer.load(tmp_path / "run")
    transition, compat = options.get("transition", 0.8), options.get("compat")
    tok = superbpe.Tokenizer.train_superbpe(
        jsonl, 900, transition, cfg.special_tokens, engine=engine, compat=compat
    )
    assert tok.merges == written.merges and tok.vocab == written.vocab
    assert tok.pretokenizer.spec() == written.pretokenizer.spec()
    assert (tok.whole_pieces, tok.special_tokens) == (written.whole_pieces, written.special_tokens)
    text = "\n".join(documents)
    assert tok.encode(text) == written.encode(text)


def test_tokenizer_train_bpe_encodes_with_the_pattern_its_pieces_were_counted_with(documents):
    """Counts were made with a pattern (here o200k): the tokenizer encodes with it, not with the gpt2
    default the constructor would take; documents without a pattern train and encode with gpt2."""
    def counts() -> PieceCounts:
        return superbpe.count(iter(documents), [EOT], pretokenizer="o200k")

    tok = superbpe.Tokenizer.train_bpe(counts(), 600, [EOT])
    vocab, merges = superbpe.train_bpe(counts(), 600, [EOT])
    text = "\n".join(documents)
    assert tok.pretokenizer.name == "o200k" and tok.merges == merges and tok.special_tokens == [EOT]
    assert tok.encode(text) == superbpe.Tokenizer(vocab, merges, [EOT], pretokenizer="o200k").encode(text)
    plain = superbpe.Tokenizer.train_bpe(iter(documents), 600, [EOT], min_frequency=2)
    assert plain.pretokenizer.name == "gpt2"
    assert plain.merges == superbpe.train_bpe(iter(documents), 600, [EOT], min_frequency=2)[1]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("workers", [1, 2])
def test_an_iterable_of_documents_counts_and_trains_as_the_same_documents_in_a_file(
    jsonl, documents, engine, workers
):
    stream = dict(engine=engine, workers=workers, chunk_bytes=3000)  # many blocks
    assert superbpe.count(iter(documents), [EOT], **stream).to_dict() == superbpe.count(
        jsonl, [EOT], engine=engine
    ).to_dict()
    assert superbpe.train_bpe((d for d in documents), 600, [EOT], **stream) == superbpe.train_bpe(
        jsonl, 600, [EOT], engine=engine
    )
    assert superbpe.train_superbpe(iter(documents), 800, 200, [EOT], **stream) == superbpe.train_superbpe(
        jsonl, 800, 200, [EOT], engine=engine
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_rows_of_a_dataset_stream_give_their_text_field(jsonl, documents, engine):
    rows = ({"id": i, "body": d} for i, d in enumerate(documents))
    _, merges = superbpe.train_bpe(rows, 500, [EOT], engine=engine, text_field="body")
    assert merges == superbpe.train_bpe(jsonl, 500, [EOT], engine=engine)[1]


def test_a_stream_is_read_lazily_one_block_at_a_time():
    produced: list[int] = []

    def texts() -> Iterator[str]:
        for number in range(10_000):
            produced.append(number)
            yield f"document {number} has some words in it"

    blocks = document_blocks(texts(), block_chars=1000)
    first = next(blocks)
    assert len(produced) == len(first) < 40  # about 1000 characters read, not the whole stream


@pytest.mark.parametrize("engine", ENGINES)
def test_a_lone_surrogate_escaped_in_json_lines_is_named_or_replaced(engine, tmp_path):
    """``"\\ud800"`` is valid JSON (a cut-off emoji in scraped text); it raised UnicodeEncodeError."""
    records = tmp_path / "records.jsonl"
    records.write_text('{"text": "ok"}\n{"text": "bad \\ud800 text"}\n', encoding="utf-8")
    named = r"records.jsonl: line 2: unpaired surrogate '\\ud800' .*errors='replace'"
    with pytest.raises(InputError, match=named):
        superbpe.count([records], engine=engine)
    replaced = superbpe.count([records], engine=engine, errors="replace")
    written = superbpe.count(iter(["ok", "bad \ufffd\ufffd\ufffd text"]), engine=engine)
    assert replaced.to_dict() == written.to_dict()


@pytest.mark.parametrize("engine", ENGINES)
def test_json_lines_may_start_with_a_byte_order_mark(engine, tmp_path):
    """Windows tools write one; it failed as invalid JSON with advice (utf-8-sig) no option gave."""
    marked, plain = tmp_path / "marked.jsonl", tmp_path / "plain.jsonl"
    plain.write_text('{"text": "hello"}\n{"text": "world"}\n', encoding="utf-8")
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    read = [superbpe.count([path], engine=engine).to_dict() for path in (marked, plain)]
    assert read[0] == read[1]


def test_saved_counts_named_as_a_corpus_are_refused_saying_how_they_are_used(tmp_path, sample_texts):
    """They were read as text: an invalid-UTF-8 error whose advice (errors=replace) trained on the bytes."""
    counts = superbpe.count(sample_texts / "german.txt", [EOT])
    counts.save(tmp_path / "german.counts")
    with pytest.raises(InputError, match=r"holds saved piece counts, not text: PieceCounts.load\("):
        superbpe.count([tmp_path / "german.counts"])
    assert superbpe.train_bpe(PieceCounts.load(tmp_path / "german.counts"), 300, [EOT])[1]


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_documents_are_one_line_errors_naming_the_document(engine):
    with pytest.raises(InputError, match=r"document 1 is a int, not a string"):
        superbpe.count(iter(["fine", 3]), engine=engine)
    with pytest.raises(InputError, match=r"document 0: no string field 'text' \(its fields: 'body';"):
        superbpe.count(iter([{"body": "x"}]), engine=engine)
    named = r"document 1: unpaired surrogate '\\ud800' .*errors='replace'"
    with pytest.raises(InputError, match=named) as info:
        superbpe.count(iter(["ok", "bad \ud800 text"]), engine=engine)
    assert str(info.value).endswith("reads it as three U+FFFD (one per byte of its UTF-8 form)")  # as it does
    replaced = superbpe.count(iter(["bad \ud800 text"]), engine=engine, errors="replace")
    written = superbpe.count(iter(["bad \ufffd\ufffd\ufffd text"]), engine=engine)  # as a file reads it
    assert replaced.to_dict() == written.to_dict()
    with pytest.raises(InputError, match=r"document 0 is a path .*pass paths as a list"):
        superbpe.count(iter([Path(__file__)]), engine=engine)
    with pytest.warns(UserWarning, match="is the name of a file, but an iterator is read as texts"):
        superbpe.count((str(path) for path in [Path(__file__)]), engine=engine)
    with pytest.raises(InputError, match=r"the document stream is empty"):
        superbpe.train_bpe(iter([]), 300, engine=engine)
    tilde = ["~~~ code", "~ 5 km"]  # no user's home: expanduser raised RuntimeError on a first document
    assert superbpe.count(iter(tilde), engine=engine).to_dict() == superbpe.count(iter(tilde[::-1])).to_dict()
    with pytest.raises(InputError, match=r"a list is read as paths: pass texts as an iterator"):
        superbpe.count(["a text, not a path"], engine=engine)
    with pytest.raises(InputError, match=r"^'~~~ code': no such file or directory \(a list is read as paths"):
        superbpe.count(["~~~ code"], engine=engine)
    with pytest.raises(InputError, match=r"^~no-such-user/corpus.txt: no such file or directory$"):
        superbpe.count(["~no-such-user/corpus.txt"], engine=engine)
    # A datasets DatasetDict is a mapping of splits: "a row of text goes in a list" did not fit it.
    splits = {"train": iter(["a text"]), "test": iter(["another"])}
    given = r"^inputs are .* not a mapping of splits \('train', 'test'\): give one, inputs\['train'\]$"
    with pytest.raises(InputError, match=given):
        superbpe.count(splits, engine=engine)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^'a text, not a path': .*\(a str is read as a path: pass"):
        superbpe.train_bpe("a text, not a path", 300, engine=engine)  # one str: no list was given
    for text in ["first\nsecond", "a\x00b"]:  # quoted: the error stays one line, its NUL escaped
        with pytest.raises(InputError, match=r"^'a.*\\(n|x00).*a list is read as paths"):
            superbpe.count([text.replace("first", "a")], engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_train_bpe_warns_when_the_corpus_runs_out_of_pairs(engine, caplog):
    with caplog.at_level(logging.WARNING, logger="superbpe"), pytest.warns(UserWarning) as warned:
        vocab, merges = superbpe.train_bpe(iter(["abcabc", "abd"]), 300, [EOT], engine=engine)
    message = str(warned[0].message)
    made = len(merges)
    assert f"made {made} of the 43 merges" in message and "no pair of adjacent tokens is left" in message
    assert message in caplog.text and len(vocab) == 257 + made


def test_the_short_vocabulary_warning_is_printed_once_where_logging_is_not_set_up():
    code = "import superbpe; superbpe.train_bpe(iter(['abcabc', 'abd']), 300, engine='python')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stderr.count("merges asked for") == 1, proc.stderr


def test_train_superbpe_checks_its_transition_and_options():
    with pytest.raises(superbpe.SuperBPEError, match="transition 1.5 is a fraction"):
        superbpe.train_superbpe(iter(["x y"]), 400, 1.5)
    with pytest.raises(superbpe.SuperBPEError, match="transition 144: stage 1 needs .* of the 144"):
        superbpe.train_superbpe(iter(["x y"]), 400, 144)
    with pytest.raises(superbpe.SuperBPEError, match="transition 144: stage 1 needs .* of the 144"):
        superbpe.train_superbpe(iter(["x y"]), 400, np.int64(144))  # taken as the int it is, as vocab_size
    with pytest.raises(superbpe.SuperBPEError, match="transition 1.5 is a fraction"):
        superbpe.train_superbpe(iter(["x y"]), 400, np.float32(1.5))
    # A fraction too small for the vocab is named as given, with the merge count it rounds to.
    with pytest.raises(superbpe.SuperBPEError, match=r"transition 0\.5 gives 0 merges, but stage 1 needs"):
        superbpe.train_superbpe(iter(["x y"]), 257, 0.5)
    with pytest.raises(superbpe.SuperBPEError, match="with the seen alphabet"):
        superbpe.train_superbpe(iter(["x y"]), 400, 0.5, compat="official")
    # One merge, as every int counts merges, though it reads as "all of them": said, as the run says it.
    with pytest.warns(UserWarning, match="transition 1 is a merge count: stage 1 makes 1 merge"):
        superbpe.train_superbpe(iter(["x y"]), 258, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert superbpe.train_superbpe(iter(["x y"]), 258, 0.5)[1] == [(b" ", b"y"), (b"x", b" y")]
    with pytest.raises(superbpe.SuperBPEError, match="unknown train_superbpe option"):
        superbpe.train_superbpe(iter(["x y"]), 400, 10, min_frequncy=2)
    # Trained plain BPE twice over without a word, as schedule.stage2_pattern=gpt2 is refused.
    with pytest.raises(superbpe.SuperBPEError, match="stage2_pretokenizer='gpt2' splits text into words"):
        superbpe.train_superbpe(iter(["x y"]), 400, 10, stage2_pretokenizer="gpt2")


def test_a_tokenizer_of_superbpe_merges_warns_when_its_pattern_splits_them(documents: list[str]) -> None:
    """``Tokenizer(vocab, merges)`` takes the word-level gpt2 pattern by default, which cuts SuperBPE's
    superwords apart, so encoding would never use them: that warns and names the pattern to give. With it,
    and for BPE merges, nothing warns."""
    vocab, merges = superbpe.train_superbpe(iter(documents), 900, special_tokens=[EOT])
    with pytest.warns(UserWarning, match="pretokenizer 'gpt2' splits.*pretokenizer='superbpe'"):
        word_level = superbpe.Tokenizer(vocab, merges, [EOT])
    bpe_vocab, bpe_merges = superbpe.train_bpe(iter(documents), 900, [EOT])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitting = superbpe.Tokenizer(vocab, merges, [EOT], pretokenizer="superbpe")
        superbpe.Tokenizer(bpe_vocab, bpe_merges, [EOT])
    text = "\n".join(documents)
    assert len(fitting.encode(text)) < len(word_level.encode(text))  # the superwords were what it lost


def test_library_warnings_point_at_the_users_call(documents: list[str], tmp_path: Path) -> None:
    """Each warning names the line that called the library, whatever depth inside it warned from."""
    vocab, merges = superbpe.train_superbpe(iter(documents), 900, special_tokens=[EOT])
    bare = tmp_path / "bare"
    superbpe.Tokenizer(vocab, merges, [EOT], pretokenizer="superbpe").save(bare)
    for name in ("superbpe.json", "tokenizer.json"):
        (bare / name).unlink()  # vocab.json + merges.txt alone: read with the gpt2 pattern
    (tmp_path / "named.txt").write_text("a file", encoding="utf-8")
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        superbpe.Tokenizer(vocab, merges, [EOT])
        superbpe.Tokenizer.load(bare)
        superbpe.train_bpe(iter(["abcabc", "abd"]), 300, engine="python")
        superbpe.count(iter([str(tmp_path / "named.txt")]), engine="python")
    where = [(w.filename, str(w.message)[:40]) for w in warned]
    assert len(warned) == 4 and {w.filename for w in warned} == {__file__}, where
