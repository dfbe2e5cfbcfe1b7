"""The package as a user gets it: build the wheel once, install it into a fresh venv, run the commands
from a directory that has nothing of the checkout in it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EOT = "<|endoftext|>"


def run(cmd: list[str], cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["SUPERBPE_CACHE_DIR"] = str(cwd / "cache")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)], cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = out.glob("superbpe-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel and its declared dependencies only; returns its bin directory."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    proc = run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=env_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return bin_dir


@pytest.mark.slow
def test_wheel_ships_the_configs_and_no_benchmarks(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {name.removeprefix("superbpe/conf/") for name in names if name.startswith("superbpe/conf/")}
    expected = {str(path.relative_to(ROOT / "conf")) for path in (ROOT / "conf").rglob("*.yaml")}
    assert shipped == expected
    assert not any("bench" in name for name in names)
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode().replace(" ", "")
    for command in ("superbpe-train", "superbpe-encode", "superbpe-evaluate", "superbpe-summarize",
                    "superbpe-cache"):
        assert f"{command}=superbpe.commands:" in scripts


@pytest.mark.slow
def test_installed_commands_train_encode_evaluate_from_anywhere(
    installed: Path, tmp_path: Path, sample_texts: Path
) -> None:
    work = tmp_path / "elsewhere"
    work.mkdir()
    corpus = work / "corpus.txt"
    corpus.write_text((sample_texts / "corpus.en").read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    where = run([str(installed / "python"), "-c", "import superbpe; print(superbpe.__file__)"], cwd=work)
    assert str(installed.parent) in where.stdout and str(ROOT) not in where.stdout  # not the checkout

    overrides = [f"data.paths=[{corpus}]", "vocab_size=400", "schedule=superbpe", "schedule.transition=0.5",
                 f"eval={corpus}", "output_dir=tok"]
    train = run([str(installed / "superbpe-train"), *overrides], cwd=work)
    assert train.returncode == 0, train.stderr[-3000:]
    assert json.loads((work / "tok" / "superbpe.json").read_text())["vocab_size"] == 400

    encode = run([str(installed / "superbpe-encode"), "tokenizer=tok", f"input={corpus}", "output=ids.bin"],
                 cwd=work)
    assert encode.returncode == 0, encode.stderr[-3000:]
    assert (work / "ids.bin").stat().st_size > 0 and (work / "ids.bin.json").is_file()

    evaluate = run([str(installed / "superbpe-evaluate"), "tokenizer=tok", f"input={corpus}"], cwd=work)
    assert evaluate.returncode == 0 and "bytes/token" in evaluate.stdout, evaluate.stderr[-3000:]

    sweep = run([str(installed / "superbpe-train"), "-m", f"data.paths=[{corpus}]", "vocab_size=300,320",
                 f"eval={corpus}"], cwd=work)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    (sweep_dir,) = (work / "multirun").glob("*/*")
    table = run([str(installed / "superbpe-summarize"), str(sweep_dir), "--no-plot"], cwd=work)
    assert table.returncode == 0 and "300" in table.stdout and "320" in table.stdout, table.stderr
    # matplotlib is an extra: without it the table is printed and the last line says how to get the plot
    plot = run([str(installed / "superbpe-summarize"), str(sweep_dir)], cwd=work)
    assert plot.returncode == 0 and "300" in plot.stdout and not plot.stderr, plot.stderr
    assert plot.stdout.strip().splitlines()[-1] == (
        'plot: none (needs matplotlib: pip install "superbpe[plot]"; --no-plot skips it)'
    )

    listing = run([str(installed / "superbpe-cache"), "list"], cwd=work)
    assert listing.returncode == 0 and re.search(r"^\d+ entr(y|ies), ", listing.stdout, re.M), listing.stderr
