"""Reading and writing the JSON and text files of a tokenizer directory, with one-line errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from superbpe.core.errors import InputError


def json_text(document: Any, indent: int) -> str:
    """UTF-8 JSON (not ``\\u`` escapes: byte-table tokens stay readable), newline-terminated."""
    return json.dumps(document, ensure_ascii=False, indent=indent) + "\n"


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a file") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: invalid UTF-8 at byte {exc.start}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def _no_duplicate_keys(path: Path) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """A json ``object_pairs_hook``: JSON allows repeated keys, but a repeated token is an error here."""
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result = dict(pairs)
        if len(result) != len(pairs):  # one pass at C speed; the loop only names the repeated key
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise InputError(f"{path}: duplicate key {key!r}")
                seen.add(key)
        return result

    return hook


def read_json(path: Path) -> Any:
    return parse_json(path, read_text(path))


def parse_json(path: Path, text: str) -> Any:
    """The JSON document ``text`` read from ``path`` (named in errors); a repeated key is an error."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys(path))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: malformed JSON line {exc.lineno} col {exc.colno}: {exc.msg}") from None

