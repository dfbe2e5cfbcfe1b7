"""-m sweeps through Hydra's submitit launchers: submitit_local runs here, the SLURM example composes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from script_helpers import SCRIPTS, run_script

pytest.importorskip(
    "hydra_plugins.hydra_submitit_launcher", reason='submitit launcher not installed (".[submitit]")'
)


@pytest.fixture
def scripts_importable(monkeypatch) -> None:
    """submitit re-imports the entry point's module in each job; the scripts' own helpers must import."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")]))
    )


def test_submitit_local_sweep_shares_the_cache_across_jobs(scripts_importable, shared_data, tmp_path) -> None:
    sweep = tmp_path / "sweep"
    cache = tmp_path / "cache"
    proc = run_script(
        "train.py", "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
        f"data.paths=[{shared_data / 'corpus.en'}]", "vocab_size=300,330", "engine=python", "progress=false",
        f"cache_dir={cache}", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    short, long = ((sweep / job / "merges.txt").read_text().splitlines() for job in ("0", "1"))
    assert len(long) > len(short) and long[: len(short)] == short
    logs = [(sweep / job / "train.log").read_text() for job in ("0", "1")]
    assert sum("piece counts from cache" in log for log in logs) == 1  # one job counted, the other reused it
    assert len(list((cache / "counts").glob("*.counts"))) == 1
    assert list(sweep.glob(".submitit/*/*_log.out"))  # really ran as submitit jobs


def test_slurm_launcher_example_composes(tmp_path: Path) -> None:
    proc = run_script(
        "train.py", "hydra/launcher=slurm", "hydra.launcher.partition=cpu", "--cfg", "hydra",
        "-p", "hydra.launcher", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "SlurmLauncher" in proc.stdout and "partition: cpu" in proc.stdout
