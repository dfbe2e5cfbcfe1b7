"""A corpus file cut short while the native engine reads it from a memory map ends in the one-line error
of a file that changed while it was read, with nothing left behind, instead of a SIGBUS that ends the
process without a word.

Each case runs in a child process, so that a SIGBUS shows as that child's death rather than pytest's.
The cut is made deterministically: ``SUPERBPE_TEST_CUT_MAPPED`` has the engine cut a file right after
mapping it, before reading it (see ``native/src/memory/pages.rs``); counts that leave long pieces in
the map are made first and the file cut after.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from script_helpers import ROOT, assert_one_line_error, run_script

from superbpe.engines import native as native_engine

pytestmark = pytest.mark.skipif(
    not native_engine.available() or not sys.platform.startswith("linux"),
    reason="needs the native engine on Linux (where maps are watched for truncation)",
)


def distinct_lines(path: Path, lines: int = 20_000) -> Path:
    """About 1.6 MB of distinct lines of letters, each one piece of the superbpe pattern: larger than the
    files counted whole without a map, and the kind of text whose pieces stay in the map."""
    with open(path, "w", encoding="utf-8") as out:
        for i in range(lines):
            word = "".join(chr(97 + int(d)) for d in str(i))
            out.write(f"the line {word} is one of many lines of text that all differ from each other\n")
    return path


def child(code: str, *args: str, cut_to: int | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("SUPERBPE_TEST_CUT_MAPPED", None)
    if cut_to is not None:
        env["SUPERBPE_TEST_CUT_MAPPED"] = str(cut_to)
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code, *args],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


COUNT = """
import sys
import superbpe
from superbpe.core.errors import InputError
try:
    superbpe.count([sys.argv[1]], engine="native")
except InputError as exc:
    print(exc)
    sys.exit(1)
"""


@pytest.mark.parametrize("cut_to", [0, 100_000])
def test_a_count_of_a_file_cut_while_mapped_is_refused(tmp_path: Path, cut_to: int) -> None:
    corpus = distinct_lines(tmp_path / "corpus.txt")
    proc = child(COUNT, str(corpus), cut_to=cut_to)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert proc.stdout.strip().splitlines() == [
        f"{corpus}: changed while it was counted (it shrank while it was mapped): give files that no longer "
        "change (a copy of one still written to)"
    ]
    assert corpus.stat().st_size == cut_to  # the cut did happen


def test_a_run_whose_corpus_is_cut_while_mapped_ends_in_one_line_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = distinct_lines(tmp_path / "corpus.txt")
    monkeypatch.setenv("SUPERBPE_TEST_CUT_MAPPED", "5000")
    proc = run_script(
        "train.py", f"hydra.run.dir={tmp_path / 'run'}", "engine=native", f"data.paths=[{corpus}]",
        "vocab_size=300", cwd=tmp_path, cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert_one_line_error(proc, "corpus.txt: changed while it was counted", "shrank while it was mapped")
    assert not (tmp_path / "run").exists()
    cache = tmp_path / "cache"
    assert not cache.exists() or not [p for p in cache.rglob("*") if p.is_file()]


BORROWED = """
import os
import sys
from superbpe import _native
from superbpe.core.counts import counts_meta
from superbpe.core.errors import InputError
from superbpe.core.pretokenize import get_pretokenizer
from superbpe.engines.native import NativeEngine, NativePieceCounts
corpus, saved = sys.argv[1:3]
pre = get_pretokenizer("superbpe")
counter = _native.Counter(pre.pattern, pre.line_units, [], 1 << 16, 2)
counter.count_file(corpus, False, 1 << 16, True)  # small windows: most of them leave their pieces in the map
os.truncate(corpus, 0)
counts = NativePieceCounts(counter.take(), counts_meta(pre, []))
uses = {
    "save": lambda: counts.save(saved),
    "bytes_seen": counts.bytes_seen,
    "counts": lambda: dict(counts.counts),
    "train": lambda: NativeEngine().train(counts, 20),
}
for name, use in uses.items():
    try:
        use()
        print(name, "read the file cut short")
    except InputError as exc:
        print(name, exc)
"""


def test_counts_whose_pieces_are_left_in_a_file_cut_short_are_refused(tmp_path: Path) -> None:
    corpus = distinct_lines(tmp_path / "corpus.txt")
    saved = tmp_path / "saved.counts"
    proc = child(BORROWED, str(corpus), str(saved))
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    error = f"{corpus}: changed while it was read (it shrank while it was mapped)"
    lines = proc.stdout.strip().splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["save", "bytes_seen", "counts", "train"], proc.stdout
    assert all(error in line for line in lines), proc.stdout
    assert list(tmp_path.iterdir()) == [corpus]  # no counts file, finished or not


FOREIGN = """
import mmap
import os
import sys
import superbpe
corpus, other = sys.argv[1:3]
superbpe.count([corpus], engine="native")  # maps a file: the engine's handler is installed now
with open(other, "rb") as f:
    view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
os.truncate(other, 0)
print("reading", flush=True)
view[100_000]  # a map that is not the engine's: its SIGBUS is not the engine's to serve
print("read it", flush=True)
"""


def test_a_sigbus_outside_the_engines_maps_goes_to_the_handler_before_it(tmp_path: Path) -> None:
    """Python's faulthandler (installed first, by ``-X faulthandler``) still hears a SIGBUS of another map,
    and the process still ends of it: the engine's handler neither keeps it nor loops on it."""
    corpus = distinct_lines(tmp_path / "corpus.txt")
    other = distinct_lines(tmp_path / "other.txt")
    proc = child(FOREIGN, str(corpus), str(other))
    assert proc.returncode == -7, (proc.returncode, proc.stdout, proc.stderr)  # SIGBUS
    assert proc.stdout.splitlines() == ["reading"]
    assert "Fatal Python error: Bus error" in proc.stderr
