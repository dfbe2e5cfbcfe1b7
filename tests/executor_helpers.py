"""A small mixed corpus (text with separators, JSON lines, gzip, multilingual) for executor tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

EOT = "<|endoftext|>"


def make_corpus(directory: Path, sample_texts: Path, multilingual: str) -> list[str]:
    """Files whose shards cut inside documents, between JSON lines and before separators."""
    directory.mkdir(parents=True, exist_ok=True)
    stories = (sample_texts / "tinystories_sample.txt").read_text(encoding="utf-8")[:400_000]
    stories = _with_separators(stories)
    german = (sample_texts / "german.txt").read_text(encoding="utf-8")[:150_000]
    fortunes = _with_separators(multilingual[:200_000])
    (directory / "a.txt").write_text(stories, encoding="utf-8")
    lines = [json.dumps({"text": german[i : i + 2500]}) for i in range(0, len(german), 2500)]
    (directory / "b.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (directory / "c.txt.gz").write_bytes(gzip.compress(fortunes.encode("utf-8")))
    (directory / "d.txt").write_text(fortunes + "\nno newline at the end", encoding="utf-8")
    return [str(directory / name) for name in ("a.txt", "b.jsonl", "c.txt.gz", "d.txt")]


def _with_separators(text: str, every: int = 3000) -> str:
    """``text`` as documents separated by EOT (the shared sample has them; a generated stand-in may
    not), so that patterns without safe line cuts can still be cut into shards."""
    if EOT in text:
        return text
    lines, docs, size = text.splitlines(keepends=True), [[]], 0
    for line in lines:
        docs[-1].append(line)
        size += len(line)
        if size >= every:
            docs.append([])
            size = 0
    return f"{EOT}\n".join("".join(doc) for doc in docs if doc)


def concatenated_shards(directory: Path) -> np.ndarray:
    from superbpe.formats.token_files import open_shards

    arrays = open_shards(directory)
    return np.concatenate(arrays) if arrays else np.zeros(0, np.uint16)
