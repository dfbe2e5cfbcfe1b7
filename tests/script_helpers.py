"""Running the Hydra scripts as real subprocesses, the way users run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


def script_env(cache_dir: Path | None = None) -> dict[str, str]:
    """The environment for a script run: the repo importable, a private cache, no terminal bars."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("SUPERBPE_CACHE_DIR", None)
    if cache_dir is not None:
        env["SUPERBPE_CACHE_DIR"] = str(cache_dir)
    env["HYDRA_FULL_ERROR"] = "0"
    return env


def run_script(
    name: str, *args: str, cwd: Path, cache_dir: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python scripts/<name> args...`` in ``cwd``; returns the finished process (never raises on rc)."""
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args],
        cwd=cwd,
        env=script_env(cache_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_script(name: str, *args: str, cwd: Path, cache_dir: Path | None = None) -> subprocess.Popen[str]:
    """Start a script without waiting (for kill tests)."""
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / name), *args],
        cwd=cwd,
        env=script_env(cache_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit code 1, a single ``error: ...`` line on stderr naming ``fragments``, no traceback."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


def train_small_tokenizer(out: Path, corpus: Path, vocab_size: int = 700) -> Path:
    """A small BPE tokenizer (python engine, no cache) trained on ``corpus`` into ``out``."""
    from superbpe.training.config import DataConfig, EngineConfig, TrainConfig
    from superbpe.training.run import run_training

    cfg = TrainConfig(
        data=DataConfig(paths=[str(corpus)]),
        engine=EngineConfig("python"),
        vocab_size=vocab_size,
        output_dir=str(out),
        cache_dir=None,
    )
    run_training(cfg)
    return out
