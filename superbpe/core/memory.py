"""Memory budget of a training stage: estimate before building, refuse in one line instead of an OOM kill.

A SuperBPE stage 2 holds every distinct line of the corpus as symbols; on gigabytes of text that can
exceed the machine. The kernel's OOM killer would end the run with nothing said, so before the native
trainer builds its state the run estimates what the build adds (``_native.train_memory``: a sample of
the pieces is replayed to learn symbols per byte) and compares it with ``memory_limit``. The checkpoints
of earlier stages are already on disk then, so a refused run resumes once it fits.

Counting comes before any build and grows with the distinct text it meets, so a count is watched too:
its :class:`CountCeiling` is checked after each window of text (in Rust for the native counter, here
for shard tables added up in this process), and a count past it stops with the same error.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from superbpe.core.errors import ConfigError, SuperBPEError
from superbpe.core.progress import current_rss_bytes
from superbpe.core.util import human_size

_MEMINFO = Path("/proc/meminfo")
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


class MemoryLimitError(SuperBPEError):
    """A stage would need more memory than ``memory_limit`` allows."""


def parse_size(value: str | int | float) -> int:
    """Bytes from ``8GB``, ``1.5GiB``, ``512M``, ``800000000`` (decimal units; ``i`` for binary ones)."""
    if isinstance(value, bool):
        raise ConfigError(f"memory_limit {value!r}: give a size such as 8GB")
    if isinstance(value, int | float):
        size = int(value)
    else:
        match = _SIZE.match(str(value))
        if match is None:
            raise ConfigError(f"memory_limit {value!r}: give a size such as 8GB, 1.5GiB or 512MB")
        number, unit, binary = match.groups()
        unit = unit.lower()
        scale = 1024 ** "kmgt".index(unit) * 1024 if binary and unit else _UNITS[unit]
        size = int(float(number) * scale)
    if size <= 0:
        raise ConfigError(f"memory_limit {value!r} must be positive")
    return size


def available_bytes() -> int | None:
    """Memory the kernel can still give (MemAvailable), or None where /proc is missing."""
    return _meminfo("MemAvailable:")


def _meminfo(field: str) -> int | None:
    """A ``/proc/meminfo`` field in bytes, or None where /proc is missing."""
    with contextlib.suppress(OSError):
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return None


@dataclass(frozen=True)
class StageMemory:
    """What building a stage's trainer adds at its peak, and what it is made of."""

    build_bytes: int
    symbols: int
    pieces: int
    piece_bytes: int


def _advice(stage: str) -> str:
    """What a refusal of ``stage`` advises (every earlier stage is checkpointed when a stage is refused);
    the sampling knob is named only for the superbpe schedule's stage 2, the one that has it."""
    example = ", e.g. schedule.stage2_approx_sample=0.25" if stage == "stage2" else ""
    return (
        f"start a run that counts this stage on a share of the corpus (its approx_sample{example}: an "
        "approximation) or trains on a smaller corpus, or raise memory_limit or use a machine with more "
        "RAM: earlier stages are checkpointed, and resume continues with memory_limit=<more>"
    )

#: Without a memory_limit, a count stops once the machine has less than this share of its memory
#: available: room for a window's growth (a table doubling) before the kernel would kill the run.
RESERVE_SHARE = 1 / 16

#: Counts reported from Python (shards, sampled blocks, the python engine's chunks) are checked once
#: per this many bytes, as often as the native counter checks its windows.
CHECK_EVERY_BYTES = 256 << 20


@dataclass(frozen=True)
class CountCeiling:
    """When a count must stop: this process holding more than ``limit`` bytes, or the machine having
    less than ``reserve`` bytes available (None: not checked)."""

    limit: int | None = None
    reserve: int | None = None

    @classmethod
    def for_run(cls, memory_limit: str | int | None) -> CountCeiling:
        """A run's: its ``memory_limit``, else a reserve of :data:`RESERVE_SHARE` of the machine's memory
        (none where /proc is missing)."""
        if memory_limit is not None:
            return cls(limit=parse_size(memory_limit))
        total = _meminfo("MemTotal:")
        return cls(reserve=None if total is None else int(total * RESERVE_SHARE))

    @staticmethod
    def watching(
        ceiling: CountCeiling | None, progress: Callable[[int], None] | None
    ) -> Callable[[int], None] | None:
        """A count's ``progress`` that checks ``ceiling`` at its first report and then once per
        :data:`CHECK_EVERY_BYTES` reported (unchanged without a ceiling): a check reads ``/proc`` twice,
        which on the 1 MB blocks of a sampled count cost a few percent of the counting."""
        if ceiling is None:
            return progress
        unchecked = CHECK_EVERY_BYTES  # bytes reported since the last check (so the first report checks)

        def report(done: int) -> None:
            nonlocal unchecked
            unchecked += done
            if unchecked >= CHECK_EVERY_BYTES:
                ceiling.check()
                unchecked = 0
            if progress:
                progress(done)

        return report

    def check(self) -> None:
        """Raise :class:`MemoryLimitError` once past the ceiling (as the native counter does)."""
        held = current_rss_bytes()
        if self.limit is not None and held > self.limit:
            raise count_over_memory(held, self.limit, None, None)
        available = None if self.reserve is None else available_bytes()
        if self.reserve is not None and available is not None and available < self.reserve:
            raise count_over_memory(held, None, available, self.reserve)


def count_over_memory(
    held: int, limit: int | None, available: int | None, reserve: int | None
) -> MemoryLimitError:
    """The error of a count past its ceiling (the native counter's ``OverMemory`` arguments). Sizes are
    in whole megabytes: a count stops just past its limit, which would round to the same gigabytes;
    one under a megabyte in bytes or kilobytes, which whole megabytes would show as 0."""
    if limit is not None:
        return MemoryLimitError(
            f"counting took the process to {_megabytes(held)}, more than memory_limit {_megabytes(limit)}"
        )
    return MemoryLimitError(
        f"counting took the process to {_megabytes(held)} and left {_megabytes(available or 0)} of RAM "
        f"available, less than the {_megabytes(reserve or 0)} a count keeps free"
    )


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.0f} MB" if size >= 999_500 else human_size(size, "B")


def refused_stage(stage: str, error: MemoryLimitError) -> MemoryLimitError:
    """``error`` (a count's) as the refusal of ``stage``, with what to do about it."""
    return MemoryLimitError(f"stage {stage}: {error}: {_advice(stage)}")


def check_fits(stage: str, need: StageMemory, memory_limit: str | int | None) -> None:
    """Raise :class:`MemoryLimitError` when the build would not fit; ``memory_limit`` None = available RAM.

    With a limit, the process's memory now plus the build must fit in it; without one, the build must
    fit in what the kernel reports available.
    """
    held = current_rss_bytes()
    if memory_limit is None:
        available = available_bytes()
        if available is None:
            return
        room, what = available, f"the {_size(available)} of RAM available"
    else:
        limit = parse_size(memory_limit)
        room, what = limit - held, f"memory_limit {_size(limit)}"
    if need.build_bytes <= room:
        return
    raise MemoryLimitError(
        f"stage {stage} needs about {_size(held + need.build_bytes)} ({_size(held)} held now + "
        f"{_size(need.build_bytes)} for {need.symbols / 1e6:.1f}M symbols of {need.pieces / 1e6:.2f}M "
        f"distinct pieces, {_size(need.piece_bytes)}), more than {what}: {_advice(stage)}"
    )


def _size(size: float) -> str:
    return human_size(size, "B")
