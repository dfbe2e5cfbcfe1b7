"""Shared fixtures: paths to ../shared/data and small corpora built from it."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"shared test data not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def multilingual_text(shared_data: Path) -> str:
    """The first ~1 MB of the multilingual corpus (Cyrillic, CJK, German, Spanish)."""
    with gzip.open(shared_data / "multilingual_fortunes.txt.gz", "rt", encoding="utf-8") as handle:
        return handle.read(1_000_000)


@pytest.fixture(scope="session")
def wikitext_text(shared_data: Path) -> str:
    with gzip.open(shared_data / "wikitext103_valid_test.txt.gz", "rt", encoding="utf-8") as handle:
        return handle.read(600_000)


@pytest.fixture(scope="session")
def official_data(shared_data: Path) -> Path:
    """Outputs of the official SuperBPE scripts (../shared/official, see its README)."""
    official = shared_data.parent / "official"
    if not official.is_dir():
        pytest.fail(f"official SuperBPE reference outputs not found at {official}")
    return official
