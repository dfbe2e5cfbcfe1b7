"""``python benchmarks/interrupt_bench.py --at TEXT --delay S -- OVERRIDES...``: how long ``superbpe-train``
takes to exit after Ctrl-C.

Starts ``superbpe-train OVERRIDES`` in a scratch output directory, waits until its log shows ``TEXT`` and
then ``S`` seconds more, sends SIGINT as a terminal would, and prints the seconds until the process exited,
its exit code and its last log line. ``--pythonpath DIR`` runs another checkout's package (to compare builds).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def last_line(log_path: Path) -> str:
    lines = log_path.read_text().strip().splitlines()
    return lines[-1] if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--at", required=True, help="log text to wait for")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds after it")
    parser.add_argument("--pythonpath", default=None)
    parser.add_argument("overrides", nargs="+")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="interrupt-bench-"))
    log_path = scratch / "log"
    env = dict(os.environ, **({"PYTHONPATH": args.pythonpath} if args.pythonpath else {}))
    beside = Path(sys.executable).parent / "superbpe-train"  # this interpreter's environment first
    train = str(beside) if beside.exists() else shutil.which("superbpe-train") or "superbpe-train"
    command = [train, *args.overrides, f"output_dir={scratch / 'run'}"]
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(  # Ctrl-C's default handling, whatever the launcher ignores
                command, stdout=log, stderr=subprocess.STDOUT, env=env,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )  # fmt: skip
            # The log is read once more after the exit is seen: the text may come with the last write.
            while args.at not in log_path.read_text():
                if proc.poll() is not None and args.at not in log_path.read_text():
                    raise SystemExit(
                        f"error: the run ended (exit {proc.returncode}) before {args.at!r} appeared in its"
                        f" log; last line: {last_line(log_path)}"
                    )
                time.sleep(0.05)
            time.sleep(args.delay)
            if proc.poll() is not None:  # nothing left to interrupt: no time to exit to measure
                raise SystemExit(
                    f"error: the run ended (exit {proc.returncode}) within --delay {args.delay:g} s of"
                    f" {args.at!r}, before the interrupt; last line: {last_line(log_path)}"
                )
            sent = time.monotonic()
            proc.send_signal(signal.SIGINT)
            code = proc.wait()
            waited = time.monotonic() - sent
        print(f"exit {code} after {waited:.2f} s; last line: {last_line(log_path)}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
