"""Which files a code corpus takes, and a directory tree's text as one corpus part: shared by
``make_large_corpus.sh`` (Debian's source packages) and ``make_crates_corpus.py`` (crates), so that both
parts of the code corpus are made alike.

    python benchmarks/code_files.py DIR OUT   # every file DIR holds that ``takes`` accepts, in path order
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

#: Larger files are generated tables or test blobs, not text anyone writes.
MAX_FILE = 4_000_000
#: What follows every file: each is a document of its own.
SEPARATOR = b"\n<|endoftext|>\n"


def takes(data: bytes) -> bool:
    """Whether a file's bytes go into the corpus: UTF-8 text, not empty, without a NUL byte or the
    separator's special token (which would cut the file where it stands)."""
    if not data or b"\0" in data or b"<|endoftext|>" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def joined(files: Iterable[bytes]) -> Iterable[bytes]:
    """The files the corpus takes, each followed by the separator."""
    return (data + SEPARATOR for data in files if takes(data))


def tree_files(root: str) -> Iterable[bytes]:
    """The regular files under ``root`` of at most ``MAX_FILE`` bytes, in sorted path order (links left
    out), as bytes."""
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > MAX_FILE:
                continue
            yield Path(path).read_bytes()


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: code_files.py DIR OUT")
    with open(sys.argv[2], "wb") as out:
        out.writelines(joined(tree_files(sys.argv[1])))


if __name__ == "__main__":
    main()
