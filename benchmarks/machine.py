"""What machine a benchmark ran on, for its results: the host under this VM changes between boots (the
same figures differ by CPU), so every result names the CPU it was measured on."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name as ``/proc/cpuinfo`` gives it (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average() -> float:
    """The 1-minute load average: what else kept the CPUs busy while a figure was taken."""
    return os.getloadavg()[0]


def describe() -> str:
    """The CPU model and how many vCPUs the machine has, as results name the machine."""
    return f"{cpu_model()}, {os.cpu_count()} vCPUs"
