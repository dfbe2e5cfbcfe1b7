"""The ``superbpe.json`` manifest: how a tokenizer was made, enough to reload it exactly."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superbpe.core.errors import InputError
from superbpe.core.pretokenize import Pretokenizer
from superbpe.formats.json_files import read_json

MANIFEST_FILE = "superbpe.json"
MANIFEST_FORMAT = "superbpe-tokenizer"
MANIFEST_VERSION = 1


@dataclass
class Manifest:
    """How a tokenizer was made: enough to reload it exactly and to explain it later."""

    pretokenizer: dict[str, Any]
    special_tokens: list[str]
    vocab_size: int
    stages: list[dict[str, Any]] = field(default_factory=list)
    training: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = MANIFEST_VERSION
    whole_pieces: bool = True  # encoding: a piece that is a token is that token (HF ignore_merges)
    # sha256 of the tokenizer.json saved beside it: a load from the manifest never reads that file, so one
    # changed since (saved over by transformers with tokens added) would encode otherwise, unnoticed.
    hf_sha256: str | None = None
    # How many merges merges.txt holds: vocab_size alone passes a merges.txt cut short (a copy cut off, an
    # empty file), which loads and encodes with fewer merges, unnoticed. None in manifests that lack it.
    num_merges: int | None = None
    # Those of special_tokens that transformers does not count as special (HF's added tokens with
    # "special": false, e.g. from tok.add_tokens): cut from text like the others, kept by a decode that skips
    # special tokens. Written only when there are some, so other manifests read as before.
    plain_added_tokens: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "format_version": self.format_version,
            "pretokenizer": self.pretokenizer,
            "special_tokens": self.special_tokens,
            "vocab_size": self.vocab_size,
            "whole_pieces": self.whole_pieces,
            "stages": self.stages,
            "training": self.training,
            "extra": self.extra,
            **({} if self.hf_sha256 is None else {"hf_sha256": self.hf_sha256}),
            **({} if self.num_merges is None else {"num_merges": self.num_merges}),
            **({"plain_added_tokens": self.plain_added_tokens} if self.plain_added_tokens else {}),
        }



def read_manifest(path: str | Path) -> Manifest:
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise InputError(f"{path}: not a superbpe manifest (missing \"format\": \"{MANIFEST_FORMAT}\")")
    version = data.get("format_version")
    if version != MANIFEST_VERSION:
        raise InputError(f"{path}: unsupported manifest format_version {version!r} (this version reads 1)")
    pre = data.get("pretokenizer")
    if not isinstance(pre, dict) or not all(isinstance(pre.get(key), str) for key in ("name", "pattern")):
        raise InputError(f"{path}: 'pretokenizer' must be an object with 'name' and 'pattern'")
    specials = data.get("special_tokens", [])
    if not isinstance(specials, list) or not all(isinstance(s, str) and s for s in specials):
        raise InputError(f"{path}: 'special_tokens' must be a list of non-empty strings")
    vocab_size = data.get("vocab_size")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise InputError(f"{path}: 'vocab_size' must be an integer")
    defaults: dict[str, Any] = {"stages": [], "training": {}, "extra": {}}
    parts = {key: data.get(key, default) for key, default in defaults.items()}
    for key, value in parts.items():
        if not isinstance(value, list if key == "stages" else dict):
            raise InputError(f"{path}: '{key}' has the wrong type")
    whole_pieces = data.get("whole_pieces", True)
    if not isinstance(whole_pieces, bool):
        raise InputError(f"{path}: 'whole_pieces' must be true or false")
    hf_sha256 = data.get("hf_sha256")
    if hf_sha256 is not None and not isinstance(hf_sha256, str):
        raise InputError(f"{path}: 'hf_sha256' must be a string")
    num_merges = data.get("num_merges")
    if num_merges is not None and (isinstance(num_merges, bool) or not isinstance(num_merges, int)):
        raise InputError(f"{path}: 'num_merges' must be an integer")
    plain = data.get("plain_added_tokens", [])
    if not isinstance(plain, list) or not all(isinstance(t, str) and t in specials for t in plain):
        raise InputError(f"{path}: 'plain_added_tokens' must be a list of some of its special_tokens")
    return Manifest(
        pre, specials, vocab_size, parts["stages"], parts["training"], parts["extra"], version, whole_pieces,
        hf_sha256, num_merges, plain,
    )  # fmt: skip


def hf_file_changed(manifest: Manifest, hf_path: Path) -> bool:
    """Whether ``tokenizer.json`` is not, byte for byte, the one saved with the manifest (see
    ``hf_sha256``). Line ends are compared as saved: a checkout that turns them into \\r\\n (git's
    autocrlf) changes no JSON value (a \\r inside a JSON string is always escaped)."""
    if manifest.hf_sha256 is None or not hf_path.is_file():
        return False
    return hashlib.sha256(hf_path.read_bytes().replace(b"\r\n", b"\n")).hexdigest() != manifest.hf_sha256


def hf_file_encodes_otherwise(hf_path: Path) -> InputError:
    """The error for a changed ``tokenizer.json`` that does not encode as the manifest's tokenizer: what
    transformers encodes with and what the manifest loads would differ."""
    return InputError(
        f"{hf_path} is not the {hf_path.name} saved with {MANIFEST_FILE} and encodes otherwise (e.g. saved "
        "over by transformers with tokens added); to use the new one, load it from a directory of its own"
    )


def manifest_pretokenizer(path: Path, manifest: Manifest) -> Pretokenizer:
    """The manifest's pre-tokenizer, with a bad pattern reported against the manifest file."""
    try:
        return Pretokenizer.from_spec(manifest.pretokenizer)
    except Exception as exc:  # any failure here means a bad manifest
        raise InputError(f"{path}: bad pretokenizer: {exc}") from None
