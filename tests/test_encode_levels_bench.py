"""Tests for ``benchmarks/encode_levels_bench.py``: a real run on a small SuperBPE tokenizer, and its helpers.

No timing is asserted (the machine is shared); the checks are that every contender ran and that its ids
equal HF's on every pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import superbpe
from superbpe.engines import native as native_engine
from superbpe.formats.gpt2 import MERGES_FILE, VOCAB_FILE, write_merges, write_vocab

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "encode_levels_bench.py"
sys.path.insert(0, str(BENCH.parent))

from encode_levels_bench import code_documents, english_documents  # noqa: E402  (benchmarks/ holds scripts)

pytestmark = pytest.mark.skipif(
    not native_engine.available(), reason="superbpe._native is not built (run `pip install -e .`)"
)


def test_english_documents_are_sentences_packed_to_the_size() -> None:
    text = "A b . C d . E f g h i j . K\n = Heading = \n\nL m .\n"
    docs = english_documents(text, 8)
    assert docs == ["A b . C d", "E f g h i j", "K\n", " = Heading = \n", "L m .\n"]
    assert english_documents("x . y", 100) == ["x . y"]


def test_code_documents_stop_after_the_size() -> None:
    text = "int a;<|endoftext|>int b;<|endoftext|><|endoftext|>int c;"
    assert code_documents(text, 7) == ["int a;", "int b;"]
    assert code_documents(text, 100) == ["int a;", "int b;", "int c;"]


def test_a_run_reports_every_contender_with_hf_ids(tmp_path: Path, sample_texts: Path) -> None:
    corpus = sample_texts / "corpus.en"
    vocab, merges = superbpe.train_superbpe(corpus, 800, 450, engine="native")  # all 256 bytes
    directory = tmp_path / "tok"
    directory.mkdir()
    write_vocab(directory / VOCAB_FILE, vocab, style="hf")
    write_merges(directory / MERGES_FILE, merges)
    code = tmp_path / "code.txt"
    code.write_text("<|endoftext|>".join(["int main(void) {\n    return 0;\n}\n"] * 5), encoding="utf-8")
    report = tmp_path / "report.json"
    contenders = ["ours-docs", "ours-1level-docs", "ours-batch", "hf-docs", "hf-batch"]
    done = subprocess.run(
        [sys.executable, str(BENCH), str(directory), "--english", str(corpus), "--code", str(code),
         "--code-bytes", "1000", "--passes", "2", "--only", *contenders, "--json", str(report)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(report.read_text(encoding="utf-8"))
    for corpus_name in ("english", "code"):
        rows = {row["name"]: row for row in result["corpora"][corpus_name]}
        assert sorted(rows) == sorted(contenders)
        assert len({row["digest"] for row in rows.values()}) == 1, rows
        assert all(len(row["passes"]) == 2 for row in rows.values())
        assert rows["ours-docs"]["note"] == "levels 2"
        assert rows["ours-1level-docs"]["note"].startswith("levels 1")
    assert "=HF" in done.stdout and "DIFF" not in done.stdout
