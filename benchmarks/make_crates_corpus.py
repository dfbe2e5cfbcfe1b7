"""Mostly distinct source code from crates.io, for the code side of the growth table past what Debian's
source packages hold (``make_large_corpus.sh``: 5.45 GB).

    python benchmarks/make_crates_corpus.py OUT.txt --list benchmarks/crates.txt            # pinned
    python benchmarks/make_crates_corpus.py OUT.txt --list NEW.txt --discover --size 4.6G   # a new list

With a list of ``name version sha256`` lines (``benchmarks/crates.txt``), each crate is downloaded from
static.crates.io, checked against its checksum and its files written in sorted path order, crates in the
list's order: the files ``code_files.py`` takes (UTF-8 text of at most 4 MB without a NUL byte), each
followed by ``"\\n<|endoftext|>\\n"``, as ``make_large_corpus.sh`` writes a package. The same list
gives the same file. ``--discover`` makes a list first: a breadth-first walk of the dependencies (of every
kind) of a few widely used crates in the sparse index (index.crates.io), taking each crate's newest
version that is neither yanked nor a pre-release (a name the index does not answer for is passed over),
until the crates' compressed sizes reach a fifth of ``--size`` (a crate's text is about five times its
download) or the walk runs out of crates; the corpus holds what the list gives, and a growth run takes
prefixes of it. Downloads run on ``--jobs`` threads; the output appears only when complete, and a
download that fails stops the build in one line, leaving nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
import urllib.request
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from code_files import MAX_FILE, joined  # noqa: E402  (benchmarks/ holds scripts, not a package)
from make_english_corpus import CorpusError, parse_size  # noqa: E402

SEEDS = (
    "tokio", "serde", "rand", "regex", "clap", "syn", "hyper", "reqwest", "actix-web", "diesel", "sqlx",
    "bevy", "wgpu", "rayon", "image", "nom", "chrono", "polars", "arrow", "datafusion", "rustls",
    "openssl", "tonic", "prost", "axum", "tracing", "ring", "cranelift-codegen", "wasmtime", "gimli",
    "object", "winit", "egui", "iced", "gtk4", "nalgebra", "ndarray", "tch", "burn", "candle-core",
    "tantivy", "rocket", "warp", "futures", "crossbeam", "parking_lot", "hashbrown", "smallvec", "bytes",
    "http", "aws-config", "ripgrep", "bat", "fd-find", "starship", "alacritty", "zellij", "helix-core",
    "nushell", "deno_core", "swc_ecma_parser", "rustpython", "gix", "cargo", "ra_ap_ide", "typst",
    "wasmer", "vulkano", "ash", "naga", "rapier3d", "fyrox", "slint", "tauri", "dioxus", "leptos", "yew",
    "sea-orm", "surrealdb", "lance", "deltalake", "iroh", "quinn", "s2n-quic", "matrix-sdk", "zbus", "nix",
    "rustix", "libp2p", "ethers", "alloy", "revm", "solana-sdk", "frame-support", "sp-runtime", "near-sdk",
    "fuel-core", "oxc", "biome_js_parser", "gstreamer", "opencv", "rusqlite", "redis", "mongodb", "lapin",
    "rdkafka", "pingora", "hickory-dns", "trust-dns-resolver", "tikv-client", "sled", "rocksdb",
    "wasm-bindgen", "web-sys", "windows", "aws-sdk-s3", "google-cloud-storage", "kube", "azure_core",
    "sentry", "rustc-ap-rustc_ast", "pyo3", "napi", "jni", "cxx", "bindgen", "cc", "embassy-executor",
    "esp-hal", "stm32f4xx-hal", "cortex-m-rt", "defmt", "probe-rs", "ratatui", "crossterm", "cursive",
    "gitui", "broot", "lapce-core", "zed",
)  # fmt: skip


def index_path(name: str) -> str:
    """The sparse index's path of a crate (its name's length and first letters pick the folder)."""
    name = name.lower()
    if len(name) <= 2:
        return f"{len(name)}/{name}"
    if len(name) == 3:
        return f"3/{name[0]}/{name}"
    return f"{name[:2]}/{name[2:4]}/{name}"


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def newest(name: str) -> tuple[str, str, list[str], int] | None:
    """A crate's newest version that is neither yanked nor a pre-release: (version, sha256, dependencies,
    download size)."""
    try:
        lines = fetch(f"https://index.crates.io/{index_path(name)}").decode().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        entry = json.loads(line)
        if not entry["yanked"] and "-" not in entry["vers"]:
            deps = [dep.get("package") or dep["name"] for dep in entry["deps"]]
            return entry["vers"], entry["cksum"], deps, crate_size(name, entry["vers"])
    return None


def discover(size: int, jobs: int) -> list[tuple[str, str, str]]:
    """Crates met walking dependencies breadth first from ``SEEDS`` until their text likely exceeds ``size``
    (a crate's download is about a fifth of its text), or until no crate is left to visit."""
    seen, queue, found, total = set(SEEDS), deque(SEEDS), [], 0
    with ThreadPoolExecutor(jobs) as pool:
        while queue and total < size / 5:
            batch = [queue.popleft() for _ in range(min(len(queue), 4 * jobs))]
            for name, info in zip(batch, pool.map(newest, batch), strict=True):
                if info is None:
                    continue
                version, sha, deps, download = info
                found.append((name, version, sha))
                total += download
                for dep in deps:
                    if dep not in seen:
                        seen.add(dep)
                        queue.append(dep)
            print(f"{len(found)} crates, ~{total / 1e6:.0f} MB compressed", file=sys.stderr, flush=True)
    return found


def crate_size(name: str, version: str) -> int:
    """The compressed size of a crate, asked of the download server without fetching it."""
    request = urllib.request.Request(crate_url(name, version), method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.headers.get("Content-Length", 0))
    except OSError:
        return 0


def crate_url(name: str, version: str) -> str:
    return f"https://static.crates.io/crates/{name}/{name}-{version}.crate"


def crate_text(entry: tuple[str, str, str]) -> bytes:
    """Every file of one crate the corpus takes (``code_files.takes``), in sorted path order, each followed
    by the separator."""
    name, version, sha = entry
    data = fetch(crate_url(name, version))
    if hashlib.sha256(data).hexdigest() != sha:
        raise SystemExit(f"error: {name} {version}: the download does not match its checksum")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        members = sorted(
            (m for m in archive.getmembers() if m.isfile() and m.size <= MAX_FILE), key=lambda m: m.name
        )
        return b"".join(joined(member_bytes(archive, members)))


def member_bytes(archive: tarfile.TarFile, members: list[tarfile.TarInfo]) -> Iterator[bytes]:
    for member in members:
        handle = archive.extractfile(member)
        yield handle.read() if handle else b""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--list", type=Path, required=True, help="name version sha256 per line")
    parser.add_argument("--discover", action="store_true", help="make the list first (it must not exist)")
    parser.add_argument("--size", default="4.6G", help="with --discover: text to reach")
    parser.add_argument("--jobs", type=int, default=16)
    args = parser.parse_args()
    if not args.out.parent.is_dir():
        raise SystemExit(f"error: {args.out.parent}: no such directory")
    if args.discover:
        if args.list.exists():
            raise SystemExit(f"error: --list {args.list} exists; --discover writes a new list")
        try:
            size = parse_size(args.size)
        except CorpusError as exc:
            raise SystemExit(f"error: {exc}") from None
        found = discover(size, args.jobs)
        args.list.write_text("".join(f"{n} {v} {s}\n" for n, v, s in found))
    elif not args.list.is_file():
        raise SystemExit(f"error: --list {args.list}: no such file")
    entries = [tuple(line.split()) for line in args.list.read_text().splitlines() if line.strip()]
    if any(len(entry) != 3 for entry in entries):
        raise SystemExit(f"error: --list {args.list}: every line is 'name version sha256'")
    temp = args.out.with_name(args.out.name + ".tmp")
    try:
        written = write_corpus(entries, temp, args.jobs)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    temp.replace(args.out)
    print(f"{args.out}: {len(entries)} crates, {written:,} bytes", file=sys.stderr)


def write_corpus(entries: list[tuple[str, str, str]], path: Path, jobs: int) -> int:
    """The crates' text into ``path`` in the list's order, at most ``4 * jobs`` downloads ahead of the
    writer (so that one slow download does not leave the rest of the corpus waiting in memory). A failed
    download cancels those not yet started."""
    written = 0
    with open(path, "wb") as out, ThreadPoolExecutor(jobs) as pool:
        pending: deque[Future[bytes]] = deque()
        try:
            for entry in entries:
                pending.append(pool.submit(crate_text_or_exit, entry))
                if len(pending) >= 4 * jobs:
                    written += out.write(pending.popleft().result())
            while pending:
                written += out.write(pending.popleft().result())
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
    return written


def crate_text_or_exit(entry: tuple[str, str, str]) -> bytes:
    """``crate_text``, a failed download given as a one-line error naming the crate."""
    try:
        return crate_text(entry)
    except OSError as exc:
        raise SystemExit(f"error: {entry[0]} {entry[1]}: download failed ({exc})") from None


if __name__ == "__main__":
    main()
