"""Table and plot of a sweep: python scripts/summarize.py multirun/DATE/TIME [--plot out.png]"""

from __future__ import annotations

import argparse
from pathlib import Path

from _common import USER_ERRORS, fail

from superbpe.summary import collect, plot, table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep_dir", type=Path, help="a multirun directory (or any directory of runs)")
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (default: <sweep_dir>/summary.png)")
    args = parser.parse_args(argv)
    try:
        rows = collect(args.sweep_dir)
        print(table(rows))
        written = plot(rows, args.plot or args.sweep_dir / "summary.png")
    except USER_ERRORS as exc:
        fail(exc)
    print(f"plot: {written}" if written else "plot: none (no run has eval results; set eval=<file>)")


if __name__ == "__main__":
    main()
