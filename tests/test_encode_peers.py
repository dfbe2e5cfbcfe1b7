"""Tests for ``benchmarks/encode_peers.py``: its texts, the rank-table reading, the section it writes,
and one real run on a few documents. No timing is asserted (the machine is shared); the checks are that
every contender that runs agrees with the reference and that the section lands in place."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from encode_peers import (  # noqa: E402  (benchmarks/ is a directory of scripts, not a package)
    SECTION,
    SPECIAL,
    code_documents,
    english_documents,
    main,
    merges_from_ranks,
    replace_section,
)


def test_english_documents_are_short_whole_sentences(tmp_path: Path) -> None:
    source = tmp_path / "wiki.txt.gz"
    paragraph = " ".join(f"Sentence number {i} says something , as @-@ usual ." for i in range(12))
    with gzip.open(source, "wt", encoding="utf-8") as f:
        f.write(f" = Heading = \n\n {paragraph} \n")
    docs = english_documents(source, target_bytes=140)
    assert docs and all("Heading" not in d for d in docs)
    assert "".join(docs).count("Sentence number") == 12
    assert all(d.endswith(".") for d in docs)
    assert all(len(d.encode()) < 2 * 140 for d in docs)
    assert "something, as-usual." in docs[0]


def test_code_documents_end_at_a_separator(tmp_path: Path) -> None:
    path = tmp_path / "code.txt"
    path.write_text(f"int a;\n{SPECIAL}int b;\n{SPECIAL}int c;\n", encoding="utf-8")
    assert code_documents(path, 10_000) == ["int a;\n", "int b;\n", "int c;\n"]
    assert code_documents(path, len(f"int a;\n{SPECIAL}int b;") + 3) == ["int a;\n"]


def test_merges_from_ranks_recovers_gpt2(shared_data: Path) -> None:
    """Reading merges back from a tiktoken rank table (how tiktoken's own vocabularies would be used)."""
    from superbpe import Tokenizer

    tok = Tokenizer.from_files(shared_data / "gpt2_vocab.json", shared_data / "gpt2_merges.txt")
    ranks = {token: i for i, token in tok.vocab.items() if i < 50256}
    assert merges_from_ranks(ranks) == tok.merges


def test_replace_section_keeps_the_rest() -> None:
    doc = f"# Benchmarks\n\n## A\n\na\n\n{SECTION}\n\nold\n\n## B\n\nb\n"
    new = f"{SECTION}\n\nnew\n"
    out = replace_section(doc, new)
    assert out == f"# Benchmarks\n\n## A\n\na\n\n{SECTION}\n\nnew\n\n## B\n\nb\n"
    assert replace_section("# Benchmarks\n", new) == f"# Benchmarks\n\n{new}"
    # Hand-written subsections of the section stay, and so does what follows them.
    doc = f"# Benchmarks\n\n{SECTION}\n\nold\n\n### Threads\n\nt\n\n## B\n\nb\n"
    assert replace_section(doc, new) == f"# Benchmarks\n\n{SECTION}\n\nnew\n\n### Threads\n\nt\n\n## B\n\nb\n"


def test_a_small_run_agrees_with_the_reference(shared_data: Path, tmp_path: Path) -> None:
    """One real run (superbpe and tiktoken, GPT-2, a few documents): every cell has a speed (a
    contender whose ids differed would show that instead), and the section replaces an earlier one."""
    pytest.importorskip("tiktoken")
    code = tmp_path / "code.txt"
    # Enough text that a first pass (which includes seeding the encoder's caches) rounds above 0.0 MB/s.
    code.write_text(SPECIAL.join(["int main(void) {\n\treturn 0;\n}\n"] * 3000), encoding="utf-8")
    output = tmp_path / "BENCHMARKS.md"
    output.write_text(f"# Benchmarks\n\n{SECTION}\n\nstale\n\n## Next\n\nkept\n", encoding="utf-8")
    args = ["--data", str(shared_data), "--code", str(code), "--vocabs", "gpt2", "--contenders",
            "superbpe,tiktoken", "--english-docs", "2000", "--repeats", "1", "--threads", "1",
            "--output", str(output)]
    assert main(args) == 0
    text = output.read_text(encoding="utf-8")
    assert "stale" not in text and text.count(SECTION) == 1 and text.endswith("## Next\n\nkept\n")
    rows = [line for line in text.splitlines() if line.startswith(("| per document", "| batch"))]
    assert len(rows) == 4
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")[1:]]
        assert len(cells) == 2
        for cell in cells:
            english, code_speed = (float(x) for x in cell.split(" / "))
            assert english > 0 and code_speed > 0
    assert "--data $D" in text  # the command, with the data directory as a placeholder
