"""``benchmarks/scale.py`` end to end on a small English-like corpus: its training commands must still
be ones ``scripts/train.py`` accepts, and its table must hold every run it was asked for.

No timing is asserted; the checks are on which runs were made and that their sizes are plausible.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fixture_texts
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from make_english_corpus import Chain, write_corpus  # noqa: E402  (benchmarks/ holds scripts, not a package)


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    paragraphs = [" ".join(doc.split()) for doc in fixture_texts.stdlib_docstrings(200_000)]
    directory = tmp_path_factory.mktemp("scale")
    corpus, heldout = directory / "lines.txt", directory / "heldout.txt"
    write_corpus(Chain(paragraphs), corpus, 120_000, seed=3, workers=1)
    write_corpus(Chain(paragraphs), heldout, 20_000, seed=4, workers=1)
    return corpus, heldout


def test_scale_trains_every_size_and_schedule_and_writes_its_table(
    lines: tuple[Path, Path], tmp_path: Path
) -> None:
    corpus, heldout = lines
    out = tmp_path / "growth"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scale.py"), str(corpus), "--sizes", "40K,all",
         "--vocab", "400", "--samples", "0.5", "--eval", str(heldout), "--workdir", str(tmp_path / "work"),
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.with_suffix(".json").read_text())
    assert [(row["size"].split()[-2], row["schedule"]) for row in rows] == [
        (f"{size},", run) for size in ("40K", "all") for run in ("bpe", "superbpe", "superbpe@0.5")
    ]
    for row in rows:
        assert row["seconds"] > 0 and row["peak_rss"] > 0 and row["bytes_per_token"] > 1
        if row["schedule"] != "bpe":
            assert 0 < row["stage2"]["distinct_bytes"] <= row["corpus_bytes"]
    assert rows[3]["corpus_bytes"] == corpus.stat().st_size > rows[0]["corpus_bytes"]
    table = out.with_suffix(".md").read_text()
    assert table.count("| superbpe |") == 2 and table.count("| superbpe@0.5 |") == 2
