"""Shared fixtures: the shared reference data (skipped when absent) and small corpora.

The large reference data lives in ``../shared/data`` beside the checkout (present in CI, absent in a
user's fresh clone). Checks that need it exactly (reference merges, GPT-2's files) use ``shared_data``
and skip without it; every other check uses ``sample_texts`` / ``multilingual_text`` / ``wikitext_text``,
which are the shared texts when present and generated stand-ins (``fixture_texts.py``) otherwise.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import fixture_texts
import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SMALL_TEXTS = ("corpus.en", "tinystories_sample.txt", "address.txt", "german.txt")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED.is_dir():
        pytest.skip("needs the shared reference data in ../shared/data (present in CI)")
    return SHARED


@pytest.fixture(scope="session")
def sample_texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding ``corpus.en``, ``tinystories_sample.txt``, ``address.txt``, ``german.txt``:
    copies of the shared files when present, else generated stand-ins under the same names."""
    directory = tmp_path_factory.mktemp("sample_texts")
    if not SHARED.is_dir():
        return fixture_texts.write_small_texts(directory)
    for name in SMALL_TEXTS:
        shutil.copy(SHARED / name, directory / name)
    return directory


@pytest.fixture(scope="session")
def multilingual_text() -> str:
    """The first ~1 MB of the multilingual corpus (Cyrillic, CJK, German, Spanish), else generated."""
    if not SHARED.is_dir():
        return fixture_texts.multilingual(1_000_000)
    with gzip.open(SHARED / "multilingual_fortunes.txt.gz", "rt", encoding="utf-8") as handle:
        return handle.read(1_000_000)


@pytest.fixture(scope="session")
def wikitext_text() -> str:
    """~600 KB of wikitext (English Wikipedia), else generated text in its layout."""
    if not SHARED.is_dir():
        return fixture_texts.wiki_like(600_000)
    with gzip.open(SHARED / "wikitext103_valid_test.txt.gz", "rt", encoding="utf-8") as handle:
        return handle.read(600_000)


@pytest.fixture(scope="session")
def official_data(shared_data: Path) -> Path:
    """Outputs of the official SuperBPE scripts (../shared/official, see its README)."""
    official = shared_data.parent / "official"
    if not official.is_dir():
        pytest.skip("needs the official SuperBPE reference outputs in ../shared/official (present in CI)")
    return official
