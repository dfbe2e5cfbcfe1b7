"""A native count of a large file stops when asked (Ctrl-C, or ``stop_counts`` for one on another thread)
instead of running to the file's end first; a run stops the count it began for its next stage, and a stage
that waits for that count says so.

Each test counts a named pipe that a writer keeps filling: a count that stops closes the pipe, and the
writer's next write fails, long before it has written all it would. A count that ran on would read
everything the writer had to give.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from superbpe.core.pretokenize import PATTERNS
from superbpe.engines import native as native_engine

needs_pipes = pytest.mark.skipif(
    not native_engine.available() or not hasattr(os, "mkfifo"),
    reason="needs the native engine and named pipes",
)

LINE = b"the same line of text, again and again\n"
BLOCK = LINE * 20_000  # about 0.8 MB
BLOCKS = 200  # what the writer has to give after the first block: about 160 MB


def fill(pipe: Path, after_first: object = None) -> str:
    """Write a block into ``pipe`` (once a reader has opened it), call ``after_first``, then write up to
    ``BLOCKS`` more: ``"stopped"`` when the reader closed the pipe before they were all written."""
    try:
        with open(pipe, "wb", buffering=0) as out:
            out.write(BLOCK)
            if callable(after_first):
                after_first()
            for _ in range(BLOCKS):
                out.write(BLOCK)
    except BrokenPipeError:
        return "stopped"
    return "wrote everything"


def counter():
    from superbpe import _native

    return _native.Counter(PATTERNS["gpt2"], False, [], 1 << 16, 1)


@needs_pipes
def test_stop_counts_stops_a_count_on_another_thread(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    outcome: dict[str, str] = {}

    def count() -> None:
        try:
            counter().count_file(str(pipe), False, 1 << 16)
            outcome["count"] = "finished"
        except KeyboardInterrupt as exc:
            outcome["count"] = str(exc)

    thread = threading.Thread(target=count)
    thread.start()
    written = fill(pipe, native_engine.stop_counts)
    thread.join(timeout=60)
    assert (outcome.get("count"), written) == ("count stopped", "stopped")
    later = tmp_path / "later.txt"
    later.write_bytes(LINE)
    fresh = counter()
    fresh.count_file(str(later), False)  # a count made after the stop is not stopped
    words = [b"the", b" same", b" line", b" of", b" text", b",", b" again", b" and", b" again", b"\n"]
    assert fresh.take().to_dict() == {word: words.count(word) for word in words}


CHILD = """
import os, signal, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's Ctrl-C finds it
sys.path.insert(0, sys.argv[2])
from test_count_stop import counter, fill
outcome = {}
ctrl_c = lambda: os.kill(os.getpid(), signal.SIGINT)
writer = threading.Thread(target=lambda: outcome.update(writer=fill(sys.argv[1], ctrl_c)))
writer.start()
try:
    counter().count_file(sys.argv[1], False, 1 << 16)
    print("count finished")
except KeyboardInterrupt:
    print("interrupted")
writer.join()
print(outcome["writer"])
"""


@needs_pipes
def test_ctrl_c_stops_a_count_on_the_main_thread(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(pipe), str(Path(__file__).parent)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.stdout.split() == ["interrupted", "stopped"], proc.stdout + proc.stderr


def test_a_run_interrupted_stops_the_count_it_started_for_its_next_stage(monkeypatch) -> None:
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from superbpe.training import run

    stops: list[str] = []
    job = SimpleNamespace(engine=SimpleNamespace(stop_counts=lambda: stops.append("stop")))
    cases = ((ValueError, []), (KeyboardInterrupt, ["stop"]), (run.TrainingInterrupted, ["stop"]))
    for raised, expected in cases:
        stops.clear()
        ahead = run._CountAhead(job=job)  # type: ignore[arg-type]
        ahead._pool = ThreadPoolExecutor(max_workers=1)
        with pytest.raises(raised), ahead:
            raise raised("/out", 3) if raised is run.TrainingInterrupted else raised()
        assert stops == expected, raised


def test_a_stage_that_waits_for_its_count_says_so(caplog) -> None:
    import logging
    from concurrent.futures import Future
    from types import SimpleNamespace

    from superbpe.training import run

    class CountedWhenAsked(Future):
        """A count still running when its stage takes it: it ends when waited for."""

        def result(self, timeout: float | None = None) -> str:
            if not self.done():
                self.set_result("counts")
            return super().result(timeout)

    plan = SimpleNamespace(index=1, name="stage2")
    for pending, waits in ((CountedWhenAsked(), True), (Future(), False)):
        if not waits:
            pending.set_result("counts")  # ended before the stage took it: nothing to say
        ahead = run._CountAhead(job=None)  # type: ignore[arg-type]
        ahead._pending[1] = pending  # type: ignore[assignment]
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="superbpe"):
            assert ahead.take(plan) == "counts"  # type: ignore[arg-type]
        assert ("stage stage2: waiting for its count of the corpus" in caplog.text) is waits
