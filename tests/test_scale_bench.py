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
from machine import describe  # noqa: E402  (benchmarks/ holds scripts, not a package)
from make_english_corpus import Chain, write_corpus  # noqa: E402
from scale import Measure, load_results, measured_on  # noqa: E402


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
    machine = describe()
    assert {row["machine"] for row in rows} == {machine} and all(row["load"] >= 0 for row in rows)
    starts = [row["started"] for row in rows]
    assert starts == sorted(starts) and len(starts[0]) == len("2026-11-30 18:00:00")
    table = out.with_suffix(".md").read_text()
    assert table.startswith(f"Measured on {machine}: runs started {starts[0]}–{starts[-1]} UTC at a 1-minute")
    assert table.count("| superbpe |") == 2 and table.count("| superbpe@0.5 |") == 2


def test_rows_that_name_no_machine_still_load_and_are_left_out_of_the_machine_line(tmp_path: Path) -> None:
    older = tmp_path / "older.json"  # an OUT.json written before rows named their machine
    older.write_text(json.dumps([{"size": "x 1G, 64K", "corpus_bytes": 10**9, "schedule": "bpe", "round": 1,
                                  "seconds": 5.0, "peak_rss": 2**30, "stage2": {}}]))
    (old,) = load_results(older)
    assert old.machine is None and measured_on([[old]]) == ""
    new = Measure("x 1G, 64K", 10**9, "superbpe", 1, 12.0, 2**31, {}, machine="CPU A, 2 vCPUs",
                  started="2026-11-30 18:00:00", load=0.5)
    later = Measure("x 1G, 64K", 10**9, "bpe", 2, 5.0, 2**30, {}, machine="CPU A, 2 vCPUs",
                    started="2026-11-30 18:05:00", load=1.25)
    assert measured_on([[new, later], [old]]) == (
        "Measured on CPU A, 2 vCPUs: runs started 2026-11-30 18:00:00–2026-11-30 18:05:00 UTC at a "
        "1-minute load of 0.50–1.25."
    )
