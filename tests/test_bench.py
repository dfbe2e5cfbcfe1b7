"""Tests for ``benchmarks/bench.py``: real subprocess runs on a tiny corpus plus its helpers.

No timing is asserted (the machine is shared); the checks are on which contenders ran, that the
numbers are present and plausible, and that the cross-checks (ids, merges) hold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "bench.py"
sys.path.insert(0, str(BENCH.parent))
pytest.importorskip("psutil", reason='the benchmark needs the bench extra: pip install ".[bench]"')

from bench import (  # noqa: E402  (benchmarks/ is a directory of scripts, not a package)
    SPECIAL,
    BenchError,
    WorkerSpec,
    _gpt2_encoder,
    iter_documents,
    leading_agreement,
    load_gpt2,
    prefix_at_document_boundary,
)


@pytest.fixture(scope="module")
def tiny(sample_texts: Path) -> Path:
    return sample_texts / "tinystories_sample.txt"


def run_bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env)


def by_name(report: dict, task: str) -> dict[str, dict]:
    return {r["name"]: r for r in report["results"] if r["task"] == task}


def test_full_run_has_every_contender_and_sane_numbers(tmp_path: Path, shared_data: Path) -> None:
    tiny = shared_data / "tinystories_sample.txt"
    out = tmp_path / "bench.json"
    proc = run_bench(str(tiny), "--vocab", "300", "--engines", "python", "--json", str(out), "--quiet",
                     "--gpt2-dir", str(shared_data))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["ok"] is True
    assert report["corpus"]["bytes"] == tiny.stat().st_size
    train, encode, runs = by_name(report, "train"), by_name(report, "encode"), by_name(report, "runs")
    assert set(train) == {"superbpe[python]", "hf-tokenizers"}
    assert set(encode) == {"superbpe[python]", "hf-tokenizers", "tiktoken"}
    assert set(runs) == {"superbpe[python] bpe", "superbpe[python] superbpe"}
    for row in [*train.values(), *encode.values(), *runs.values()]:
        assert row["error"] is None
        assert row["wall_s"] > 0 and row["mb_s"] > 0 and row["cpu_s"] >= 0
        # a Python process holds at least a few MiB; the tree peak includes the main process
        assert 5 < row["self_peak_rss_mib"] <= row["peak_rss_mib"] < 4096
    ours = train["superbpe[python]"]["extra"]
    assert ours["num_merges"] == train["hf-tokenizers"]["extra"]["num_merges"] == 300 - 257
    phases = ours["phases"]
    assert phases["count_s"] + phases["train_s"] == pytest.approx(train["superbpe[python]"]["wall_s"])
    assert 0 <= ours["merges_leading_equal_hf"] <= ours["merges_shared_with_hf"] <= 43
    tokens = {row["extra"]["tokens"] for row in encode.values()}
    assert len(tokens) == 1 and tokens.pop() > 500
    assert all(row["extra"]["ids_identical"] for row in encode.values())
    assert {(r["task"], r["ours"], r["vs"]) for r in report["ratios"]} == {
        ("train", "superbpe[python]", "hf-tokenizers"),
        ("encode", "superbpe[python]", "hf-tokenizers"),
        ("encode", "superbpe[python]", "tiktoken"),
    }
    superbpe_stages = runs["superbpe[python] superbpe"]["extra"]["stages"]
    assert [s["merges"] for s in superbpe_stages] == [34, 43 - 34]  # transition 0.8 of 43 merges
    assert [s["pattern"] for s in superbpe_stages] == ["superbpe-stage1", "superbpe"]
    assert runs["superbpe[python] bpe"]["extra"]["num_merges"] == 43
    (ratio,) = report["schedule_ratios"]
    assert ratio["engine"] == "python" and ratio["superbpe_over_bpe_wall"] == pytest.approx(
        runs["superbpe[python] superbpe"]["wall_s"] / runs["superbpe[python] bpe"]["wall_s"])
    for header in ("TRAIN", "ENCODE", "WHOLE RUNS", "RATIOS", "SUPERBPE vs BPE", "superbpe[python]",
                   "hf-tokenizers", "tiktoken"):
        assert header in proc.stdout


def test_only_train_on_a_prefix(tmp_path: Path, tiny: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_bench(str(tiny), "--vocab", "270", "--only", "train", "--skip-hf", "--engines", "python",
                     "--max-bytes", "2000", "--repeat", "2", "--json", str(out), "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert [(r["task"], r["name"]) for r in report["results"]] == [("train", "superbpe[python]")]
    expected = prefix_at_document_boundary(tiny.read_bytes(), 2000)
    assert report["corpus"]["bytes"] == len(expected) <= 2000
    assert "ENCODE" not in proc.stdout and report["ratios"] == []
    runs = report["results"][0]["extra"]["runs_wall_s"]
    assert len(runs) == 2 and report["results"][0]["wall_s"] == min(runs)


def test_repeats_run_in_rounds(tmp_path: Path, tiny: Path) -> None:
    """Each contender once, then again: ratios compare runs from the same stretch of time."""
    proc = run_bench(str(tiny), "--vocab", "270", "--only", "runs", "--engines", "python",
                     "--max-bytes", "2000", "--repeat", "2", "--json", str(tmp_path / "bench.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    order = [line.split("running runs ")[1].split(" ...")[0]
             for line in (proc.stdout + proc.stderr).splitlines() if "running runs " in line]
    assert order == ["superbpe[python] bpe (run 1/2)", "superbpe[python] superbpe (run 1/2)",
                     "superbpe[python] bpe (run 2/2)", "superbpe[python] superbpe (run 2/2)"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/no/such/corpus.txt"], "corpus not found: /no/such/corpus.txt"),
        (["TINY", "--vocab", "100"], "--vocab must be at least 258"),
        (["TINY", "--only", "train", "--engines", "rust"], "unknown engine 'rust'"),
        (["TINY", "--only", "train", "--repeat", "0"], "--repeat must be positive"),
        (["TINY", "--gpt2-dir", "/no/such/dir"], "gpt2_vocab.json not found"),
        (["TINY"], "the encode comparison needs GPT-2's files: pass --gpt2-dir"),
        (["TINY", "--pattern", "nosuchpattern", "--only", "train"], "nosuchpattern"),
        (["TINY", "--only", "runs", "--transition", "1.5"], "--transition must be a fraction"),
        (["TINY", "--only", "train", "--json", "/no/such/dir/bench.json"], "--json /no/such/dir/bench.json"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], message: str, tiny: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "SUPERBPE_GPT2_DIR"}
    proc = run_bench(*[str(tiny) if arg == "TINY" else arg for arg in args], env=env)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench: error:") and message in lines[0]


def test_local_gpt2_files_give_the_known_gpt2_ids(shared_data: Path) -> None:
    vocab, merges = load_gpt2(shared_data)
    assert vocab[50256] == SPECIAL.encode() and merges[0] == (b" ", b"t") and len(merges) == 50000
    tiny = shared_data / "tinystories_sample.txt"
    spec = WorkerSpec("encode", "tiktoken", None, str(tiny), 0, "gpt2", None, str(shared_data), "")
    assert _gpt2_encoder(spec)("Hello world") == [15496, 995]
    spec.kind = "hf"
    assert _gpt2_encoder(spec)("Hello world") == [15496, 995]


def test_prefix_cuts_after_a_special_else_after_a_newline() -> None:
    data = b"one\n" + SPECIAL.encode() + b"\ntwo two\n" + SPECIAL.encode() + b"\nthree"
    second_end = data.rindex(SPECIAL.encode()) + len(SPECIAL)
    assert prefix_at_document_boundary(data, len(data)) == data
    assert prefix_at_document_boundary(data, second_end + 3) == data[:second_end]
    assert prefix_at_document_boundary(b"ab\ncd\nef", 7) == b"ab\ncd\n"
    with pytest.raises(BenchError, match="no document boundary"):
        prefix_at_document_boundary(b"abcdefgh", 4)


def test_documents_split_at_specials_and_long_ones_at_safe_cuts(tmp_path: Path) -> None:
    text = "a b\nc d" + SPECIAL + SPECIAL + "x\ny\nz  \n w\n" * 50 + SPECIAL + "tail"
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8", newline="")
    docs = list(iter_documents(path, block_chars=16))
    assert "".join(docs) == text.replace(SPECIAL, "")
    assert docs[0] == "a b\nc d" and docs[-1].endswith("tail")
    assert len(docs) > 3 and all(doc for doc in docs)
    # cuts inside a document fall only between a non-space + newline and a non-space
    for doc in docs[1:-1]:
        assert doc.endswith("\n") and not doc[-2].isspace()


def test_leading_agreement() -> None:
    assert leading_agreement([1, 2, 3], [1, 2, 4]) == 2
    assert leading_agreement([1, 2], [1, 2, 3]) == 2
    assert leading_agreement([], [1]) == 0


def _native_available() -> bool:
    from superbpe.engines.interface import native_available

    return native_available()


@pytest.mark.skipif(not _native_available(), reason="native engine not built")
def test_native_and_python_agree_in_the_bench(tmp_path: Path, shared_data: Path) -> None:
    out = tmp_path / "bench.json"
    tiny = shared_data / "tinystories_sample.txt"
    proc = run_bench(str(tiny), "--vocab", "300", "--engines", "python,native", "--skip-hf",
                     "--json", str(out), "--quiet", "--gpt2-dir", str(shared_data))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    train, encode = by_name(report, "train"), by_name(report, "encode")
    assert set(train) == {"superbpe[python]", "superbpe[native]"}
    assert train["superbpe[native]"]["extra"]["merges_identical"] is True
    assert set(encode) == {"superbpe[python]", "superbpe[native]", "tiktoken"}
    assert all(row["extra"]["ids_identical"] for row in encode.values())
    assert {(r["task"], r["ours"], r["vs"]) for r in report["ratios"]} == {
        ("encode", "superbpe[python]", "tiktoken"),
        ("encode", "superbpe[native]", "tiktoken"),
    }


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_peak_rss_is_the_childs_own_not_the_parents() -> None:
    """ru_maxrss survives fork+exec; a bench worker must not report the driver's peak as its own."""
    from superbpe.core.util import peak_rss_bytes

    big = bytearray(600 << 20)  # touched: bytearray zero-fills, so the pages become resident
    del big
    assert peak_rss_bytes() >= 600 << 20
    code = "from superbpe.core.util import peak_rss_bytes; print(peak_rss_bytes())"
    child = int(subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout)
    assert 1 << 20 < child < 300 << 20
