"""Running the Hydra scripts as real subprocesses, the way users run them."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
#: The cache of scripts run without one of their own: the test session's, not the user's
#: ``~/.cache/superbpe``, which kept an entry for every test corpus (gone with its temporary directory)
#: and handed the tests whatever earlier runs had left there.
SESSION_CACHE = Path(tempfile.mkdtemp(prefix="superbpe-test-cache-"))
atexit.register(shutil.rmtree, SESSION_CACHE, ignore_errors=True)


def script_env(cache_dir: Path | None = None) -> dict[str, str]:
    """The environment for a script run: the repo importable, a private cache, no terminal bars."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["SUPERBPE_CACHE_DIR"] = str(SESSION_CACHE if cache_dir is None else cache_dir)
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


def start_captured_script(
    name: str, *args: str, cwd: Path, own_group: bool = False, preexec_fn: Callable[[], None] | None = None
) -> subprocess.Popen[str]:
    """Start a script with its output captured (for checking what a signal makes it print); with
    ``own_group`` in a process group of its own, so that the group can be signalled as a scheduler does."""
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / name), *args],
        cwd=cwd,
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=own_group,
        preexec_fn=preexec_fn,
    )


def signal_group_when(
    proc: subprocess.Popen[str], ready: Callable[[], bool], signum: int, what: str, settle: float = 0.3
) -> None:
    """Send ``signum`` to the process group of ``proc`` (started with ``own_group``) once ``ready()`` and
    ``settle`` seconds later, with ``what`` still under way."""
    deadline = time.monotonic() + 120
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, f"{what} never began"
        time.sleep(0.01)
    time.sleep(settle)
    assert proc.poll() is None, f"{what} ended before the signal"
    os.killpg(proc.pid, signum)


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


def process_running(pid: int) -> bool:
    """Whether process ``pid`` still runs (an orphan's zombie waiting for a reaper does not), from Linux's
    ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def workers_left_when_killed(script: str, timeout: float = 10) -> tuple[list[int], list[int]]:
    """Run the Python ``script`` until it prints the pids of its workers on a line, kill it outright
    (SIGKILL), and give those pids with the ones still running once they all ended or ``timeout`` seconds
    went by (those are killed then: no test leaves processes behind)."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    workers = [int(pid) for pid in proc.stdout.readline().split()]
    proc.kill()
    proc.wait()
    proc.stdout.close()
    deadline = time.monotonic() + timeout
    while (left := [pid for pid in workers if process_running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return workers, left
