"""``benchmarks/make_crates_corpus.py`` without the network: crates are built here and served by a stand-in
for the download, so the checks are on what the corpus holds, in which order, and what is refused."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import time
import urllib.error
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import make_crates_corpus  # noqa: E402  (benchmarks/ holds scripts, not a package)
from code_files import MAX_FILE, SEPARATOR  # noqa: E402
from make_crates_corpus import crate_text, index_path  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "make_crates_corpus.py"


def crate(files: dict[str, bytes]) -> bytes:
    """A ``.crate``: a gzipped tar of ``files``, added in the order given."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_index_paths_follow_the_sparse_index_layout() -> None:
    assert index_path("a") == "1/a" and index_path("ab") == "2/ab"
    assert index_path("syn") == "3/s/syn"
    assert index_path("Serde") == "se/rd/serde" and index_path("tokio-util") == "to/ki/tokio-util"


def test_a_crate_gives_its_text_files_in_path_order_and_leaves_out_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = crate({
        "demo-1.0.0/src/lib.rs": b"pub fn a() {}\n",
        "demo-1.0.0/Cargo.toml": b"[package]\nname = \"demo\"\n",
        "demo-1.0.0/empty.txt": b"",
        "demo-1.0.0/logo.png": b"\x89PNG\0\0",
        "demo-1.0.0/latin1.txt": "caf\xe9".encode("latin-1"),
        "demo-1.0.0/special.md": b"a <|endoftext|> b",
        "demo-1.0.0/big.rs": b"x" * (MAX_FILE + 1),
    })  # fmt: skip
    monkeypatch.setattr(make_crates_corpus, "fetch", lambda url: data)
    text = crate_text(("demo", "1.0.0", hashlib.sha256(data).hexdigest()))
    assert text == b'[package]\nname = "demo"\n' + SEPARATOR + b"pub fn a() {}\n" + SEPARATOR


def test_a_download_that_does_not_match_its_checksum_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(make_crates_corpus, "fetch", lambda url: crate({"x/a.rs": b"fn a() {}"}))
    with pytest.raises(SystemExit, match="demo 1.0.0: the download does not match its checksum"):
        crate_text(("demo", "1.0.0", "0" * 64))


@pytest.mark.parametrize(
    ("list_text", "message"),
    [
        (None, "no such file"),
        ("serde 1.0.0\n", "every line is 'name version sha256'"),
    ],
)
def test_a_missing_or_malformed_list_is_refused_in_one_line_and_writes_nothing(
    tmp_path: Path, list_text: str | None, message: str
) -> None:
    pinned = tmp_path / "crates.txt"
    if list_text is not None:
        pinned.write_text(list_text)
    out = tmp_path / "corpus.txt"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--list", str(pinned)], capture_output=True, text=True
    )
    assert proc.returncode != 0 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == ([pinned] if list_text is not None else [])


def test_discovering_into_a_list_that_exists_is_refused_before_any_download(tmp_path: Path) -> None:
    pinned = tmp_path / "crates.txt"
    pinned.write_text("serde 1.0.0 " + "0" * 64 + "\n")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "corpus.txt"), "--list", str(pinned), "--discover"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode != 0 and "exists; --discover writes a new list" in proc.stderr
    assert pinned.read_text() == "serde 1.0.0 " + "0" * 64 + "\n" and not (tmp_path / "corpus.txt").exists()


def test_a_failed_download_stops_the_build_in_one_line_and_leaves_no_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = crate({"a/lib.rs": b"fn a() {}\n"})
    pinned = tmp_path / "crates.txt"
    pinned.write_text("".join(f"c{k} 1.0.0 {hashlib.sha256(good).hexdigest()}\n" for k in range(50)))

    def fetch(url: str) -> bytes:
        if "/c30/" in url:
            raise urllib.error.URLError("connection reset")
        return good

    monkeypatch.setattr(make_crates_corpus, "fetch", fetch)
    out = tmp_path / "corpus.txt"
    argv = ["make_crates_corpus.py", str(out), "--list", str(pinned), "--jobs", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match=r"^error: c30 1.0.0: download failed \(.*connection reset"):
        make_crates_corpus.main()
    assert sorted(tmp_path.iterdir()) == [pinned]


def test_the_corpus_keeps_the_lists_order_whatever_the_downloads_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crates = {f"c{k}": crate({f"c{k}/lib.rs": f"fn f{k}() {{}}\n".encode()}) for k in range(40)}
    pinned = tmp_path / "crates.txt"
    pinned.write_text("".join(f"{n} 1.0.0 {hashlib.sha256(d).hexdigest()}\n" for n, d in crates.items()))

    def fetch(url: str) -> bytes:
        name = url.split("/")[-2]
        time.sleep(0.002 * (40 - int(name[1:])))  # the first crates arrive last
        return crates[name]

    monkeypatch.setattr(make_crates_corpus, "fetch", fetch)
    out = tmp_path / "corpus.txt"
    argv = ["make_crates_corpus.py", str(out), "--list", str(pinned), "--jobs", "4"]
    monkeypatch.setattr(sys, "argv", argv)
    make_crates_corpus.main()
    assert out.read_bytes() == b"".join(f"fn f{k}() {{}}\n".encode() + SEPARATOR for k in range(40))


def test_a_package_tree_gives_the_files_the_corpus_takes_in_path_order(tmp_path: Path) -> None:
    """``code_files.py DIR OUT``, as ``make_large_corpus.sh`` runs it on an unpacked package."""
    tree = tmp_path / "src"
    (tree / "b").mkdir(parents=True)
    (tree / "a").mkdir()
    (tree / "b" / "x.c").write_bytes(b"int x;\n")
    (tree / "a" / "z.h").write_bytes(b"#define Z\n")
    (tree / "a" / "blob").write_bytes(b"\0\1")
    (tree / "a" / "huge.c").write_bytes(b"y" * (MAX_FILE + 1))
    (tree / "a" / "link.h").symlink_to(tree / "a" / "z.h")
    (tree / "top.txt").write_bytes("naïve\n".encode())
    out = tmp_path / "part.txt"
    script = ROOT / "benchmarks" / "code_files.py"
    subprocess.run([sys.executable, str(script), str(tree), str(out)], check=True)
    # A folder's own files come before its subfolders', each in name order.
    expected = ["naïve\n".encode(), b"#define Z\n", b"int x;\n"]
    assert out.read_bytes() == b"".join(text + SEPARATOR for text in expected)


def test_a_bad_size_to_discover_is_refused_in_one_line_before_any_download(tmp_path: Path) -> None:
    pinned = tmp_path / "crates.txt"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "corpus.txt"), "--list", str(pinned), "--discover",
         "--size", "lots"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode != 0 and "--size 'lots': expected bytes such as 500M or 1.2G" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_a_failed_download_cancels_the_downloads_not_yet_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = crate({"a/lib.rs": b"fn a() {}\n"})
    entries = [(f"c{k}", "1.0.0", hashlib.sha256(good).hexdigest()) for k in range(8)]
    fetched = []

    def fetch(url: str) -> bytes:
        fetched.append(url)
        if "/c0/" in url:
            raise urllib.error.URLError("connection reset")
        time.sleep(1)  # c1, if the one thread takes it before the cancel, is still running then
        return good

    monkeypatch.setattr(make_crates_corpus, "fetch", fetch)
    with pytest.raises(SystemExit, match="c0 1.0.0: download failed"):
        make_crates_corpus.write_corpus(entries, tmp_path / "corpus.tmp", jobs=1)
    # Four were queued (c0 to c3); c2 and c3 never start.
    assert [url.split("/")[-2] for url in fetched] in (["c0"], ["c0", "c1"])
