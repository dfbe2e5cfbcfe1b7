"""Progress reporting and per-stage resource measurement.

Long jobs (counting gigabytes, choosing 100K merges) must show that they are alive and when they will
end. On a terminal that is a tqdm bar with rate and ETA; in logs and CI (not a TTY) bars turn into
noise, so the same updates become a plain log line every few seconds instead.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from superbpe.core.util import children_peak_rss_bytes, human_size, peak_rss_bytes

log = logging.getLogger("superbpe")

Update = Callable[[int], None]
_LOG_EVERY_SECONDS = 5.0
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def want_bars(enabled: bool | None) -> bool:
    """Bars when asked for, or by default only when stderr is a terminal."""
    return sys.stderr.isatty() if enabled is None else enabled


BuildProgress = Callable[[str, int, int], None]
"""``(phase, done, total)`` while a trainer builds its state (``replay`` in pieces, ``cut`` in replayed
symbols when a stage's pieces are cut, ``index`` in slots)."""


class Task:
    """``task(...)``'s handle: call it with an increment; ``restart_clock()`` when setup work is over."""

    def __init__(self, update: Update, restart: Callable[[], None]) -> None:
        self._update, self._restart = update, restart

    def __call__(self, increment: int) -> None:
        self._update(increment)

    def restart_clock(self) -> None:
        """Measure rate and ETA from now: what came before (e.g. a trainer's build) was not progress."""
        self._restart()


@contextlib.contextmanager
def task(
    desc: str,
    total: int | None,
    unit: str,
    *,
    enabled: bool | None = None,
    initial: int = 0,
    eta_after: float = 0.0,
) -> Iterator[Task]:
    """Yield a :class:`Task` for one long step; a bar or periodic log lines, then a summary line.

    ``eta_after``: log lines give an ETA only once this share of the work is done. Choosing merges
    speeds up as it goes (each merge touches fewer places than the one before), so its first rate
    says little about the rest; a bar's smoothed rate adapts by itself.
    """
    if want_bars(enabled):
        # Imported here, not at the top: only bars need it, and importing it slows every `import superbpe`.
        from tqdm import tqdm

        with tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit=unit,
            unit_scale=True,
            dynamic_ncols=True,
            file=sys.stderr,
        ) as bar:

            def restart() -> None:
                bar.start_t = bar.last_print_t = bar._time()
                bar.last_print_n = bar.n

            yield Task(bar.update, restart)
        return
    reporter = _LogReporter(desc, total, unit, initial, eta_after)
    yield Task(reporter.update, reporter.restart_clock)
    reporter.finish()


class _LogReporter:
    """Log lines with rate and ETA at most every few seconds.

    A line's rate is the one since the previous line (the first: since the clock started), so the
    ETA follows a rate that changes; the summary line gives the average.
    """

    def __init__(self, desc: str, total: int | None, unit: str, initial: int, eta_after: float) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.done = initial
        self.initial = initial
        self.eta_after = eta_after
        self.start = time.monotonic()
        self.begun = self.start
        self.last = self.start
        self.last_done = initial

    def update(self, increment: int) -> None:
        self.done += increment
        now = time.monotonic()
        if now - self.last >= _LOG_EVERY_SECONDS:
            rate = (self.done - self.last_done) / (now - self.last)
            self.last, self.last_done = now, self.done
            log.info("%s", self.line(rate))

    def restart_clock(self) -> None:
        self.begun = self.last = time.monotonic()
        self.initial = self.last_done = self.done

    def line(self, rate: float, eta: bool = True) -> str:
        text = f"{self.desc}: {human_size(self.done)}"
        if self.total:
            text += f"/{human_size(self.total)} {self.unit} ({100 * self.done / self.total:.1f}%)"
            share = (self.done - self.initial) / max(self.total - self.initial, 1)
            if eta and rate > 0 and self.done < self.total and share >= self.eta_after:
                text += f", ETA {_seconds((self.total - self.done) / rate)}"
        else:
            text += f" {self.unit}"
        return text + f", {human_size(rate)} {self.unit}/s"

    def finish(self) -> None:
        now = time.monotonic()
        rate = (self.done - self.initial) / max(now - self.begun, 1e-9)
        log.info("%s in %s", self.line(rate, eta=False), _seconds(now - self.start))


_BUILD_UNITS = {"replay": "pieces", "cut": "symbols"}


def build_reporter(desc: str, on_done: Callable[[], None]) -> BuildProgress:
    """A :data:`BuildProgress` that logs each phase's progress with this process's RSS (at most every
    few seconds, and when a phase ends), and calls ``on_done`` when the last phase (``index``) ends."""
    last = [0.0]

    def report(phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        finished = done >= total
        if finished or now - last[0] >= _LOG_EVERY_SECONDS:
            last[0] = now
            unit = _BUILD_UNITS.get(phase, "slots")
            share = f" ({100 * done / total:.0f}%)" if total else ""
            log.info(
                "%s: %s %s/%s %s%s, RSS %.0f MB",
                desc,
                phase,
                human_size(done),
                human_size(total),
                unit,
                share,
                current_rss_bytes() / 2**20,
            )
        if phase == "index" and finished:
            on_done()

    return report


def current_rss_bytes() -> int:
    """This process's resident memory now (0 where /proc is missing)."""
    with contextlib.suppress(OSError):
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _seconds(value: float) -> str:
    if value < 60:
        return f"{value:.1f}s"
    minutes, secs = divmod(int(value), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def reset_peak_rss() -> bool:
    """Start a new peak-RSS window (Linux: writing 5 to clear_refs resets VmHWM); False if unsupported."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


@dataclass
class StageStats:
    """Wall time and peak memory of one stage (filled in when the ``measure`` block ends)."""

    name: str
    seconds: float = 0.0
    peak_rss_bytes: int = 0
    parts: dict[str, float] = field(default_factory=dict)  # e.g. count / train seconds
    sizes: dict[str, int] = field(default_factory=dict)  # e.g. the pieces and symbols the trainer held
    from_cache: bool = False  # its merges were found in the cache, not chosen
    from_engine: str | None = None  # with from_cache: the engine(s) the entry says chose them (None: unsaid)

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.parts[name] = self.parts.get(name, 0.0) + time.monotonic() - start


@contextlib.contextmanager
def measure(name: str) -> Iterator[StageStats]:
    """Time a stage and record its peak RSS; logs one summary line at the end."""
    stats = StageStats(name)
    reset_peak_rss()
    children_before = children_peak_rss_bytes()
    start = time.monotonic()
    yield stats
    stats.seconds = time.monotonic() - start
    stats.peak_rss_bytes = peak_rss_bytes(children_above=children_before)
    log.info("stage %s: %s, peak RSS %.0f MB", name, _seconds(stats.seconds), stats.peak_rss_bytes / 2**20)
