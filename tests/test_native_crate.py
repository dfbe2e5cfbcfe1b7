"""The Rust crate's own checks, so CI holds them too: `cargo test` passes and `cargo clippy` is clean.

They compile the crate (a minute or two on this machine), hence `slow`. The crate's unit tests cover
what the Python tests reach only indirectly (segmented replay, the radix-built pair table, chunking).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CRATE = Path(__file__).resolve().parent.parent / "native"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("cargo") is None, reason="cargo is not installed"),
    pytest.mark.skipif(not (CRATE / "Cargo.toml").is_file(), reason="not a source checkout"),
]


def _cargo(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CARGO_TERM_COLOR": "never"}
    return subprocess.run(
        ["cargo", *args], cwd=CRATE, env=env, capture_output=True, text=True, timeout=1800, check=False
    )


def test_cargo_test_passes() -> None:
    done = _cargo("test", "--release", "--quiet")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "test result: ok" in done.stdout


def test_cargo_clippy_is_clean() -> None:
    done = _cargo("clippy", "--all-targets", "--features", "python", "--quiet", "--", "-D", "warnings")
    assert done.returncode == 0, done.stderr[-4000:]
