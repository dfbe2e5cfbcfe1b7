"""``python benchmarks/load_bench.py DIR [DIR ...]``: how long loading a tokenizer takes, against the peers.

Each ``DIR`` holds GPT-2 style ``vocab.json`` + ``merges.txt`` (e.g. GPT-2's, or the released SuperBPE
180K->200K files; ``--compat official`` reads the latter as the official encoder does). A tokenizer is
loaded before anything is encoded, so its load is a serial part of every encoding job. Contenders, each
loading in a fresh process (imports done first, not timed), first load and best of ``--repeats`` more:

- ``superbpe``: ``Tokenizer.load(DIR)`` (the vocab and merges files, checked, and the encoder built);
- ``superbpe-json``: ``Tokenizer.load`` of a directory holding only the ``tokenizer.json`` we write;
- ``hf-files``: HF ``tokenizers`` ``BPE.from_file(vocab.json, merges.txt)`` in a ``Tokenizer``;
- ``hf-json``: HF ``tokenizers.Tokenizer.from_file`` of the ``tokenizer.json`` we write for ``DIR``;
- ``tiktoken``: ``load_tiktoken_bpe`` of the ``.tiktoken`` file we write, and the ``Encoding`` built (only
  where tiktoken can express the vocabulary).

Prints one markdown table, seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
kind, directory, compat, export, repeats = sys.argv[1:6]
if kind == "superbpe":
    from superbpe.api.tokenizer import Tokenizer
    load = lambda: Tokenizer.load(directory, compat=compat or None)
elif kind == "superbpe-json":
    from superbpe.api.tokenizer import Tokenizer
    load = lambda: Tokenizer.load(f"{export}/json_only")
elif kind == "hf-files":
    import tokenizers
    from tokenizers.models import BPE
    load = lambda: tokenizers.Tokenizer(BPE.from_file(f"{directory}/vocab.json", f"{directory}/merges.txt"))
elif kind == "hf-json":
    import tokenizers
    load = lambda: tokenizers.Tokenizer.from_file(f"{export}/tokenizer.json")
else:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    meta = json.loads(open(f"{export}/tiktoken.json").read())
    def load():
        ranks = load_tiktoken_bpe(f"{export}/tokenizer.tiktoken")
        return tiktoken.Encoding(name="bench", pat_str=meta["pat_str"], mergeable_ranks=ranks,
                                 special_tokens=meta["special_tokens"])
times = []
for _ in range(1 + int(repeats)):
    start = time.perf_counter()
    load()
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def export(directory: Path, compat: str | None, out: Path) -> bool:
    """Write ``tokenizer.json`` (and the tiktoken files where they can be) for ``directory`` into ``out``;
    whether tiktoken's were written."""
    from superbpe.api.tokenizer import Tokenizer
    from superbpe.core.errors import ConfigError, SuperBPEError

    try:
        tok = Tokenizer.load(directory, compat=compat)
    except SuperBPEError as exc:
        raise SystemExit(f"error: {exc}") from None
    try:
        tok.save(out, tiktoken=True)
        written = True
    except ConfigError:  # tiktoken cannot express every vocabulary (the released SuperBPE one)
        tok.save(out)
        written = False
    (out / "json_only").mkdir()
    shutil.copy(out / "tokenizer.json", out / "json_only" / "tokenizer.json")
    return written


def timed(kind: str, directory: Path, compat: str | None, out: Path, repeats: int) -> list[float]:
    args = [sys.executable, "-c", CHILD, kind, str(directory), compat or "", str(out), str(repeats)]
    # Run from the scratch directory: `-c` puts the working directory first on the path, and a checkout's
    # own `superbpe/` there would shadow the installed package.
    done = subprocess.run(args, capture_output=True, text=True, check=False, cwd=out)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise SystemExit(f"{kind} on {directory} failed: {last[0]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directories", nargs="+", type=Path)
    parser.add_argument("--compat", default=None, help="as Tokenizer.load takes it (e.g. official)")
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    if args.repeats < 1:
        raise SystemExit(f"error: --repeats must be at least 1 (a column is their best), not {args.repeats}")
    for directory in args.directories:
        for name in ("vocab.json", "merges.txt"):
            if not (directory / name).is_file():
                raise SystemExit(f"error: {directory}: no {name} in it")
    print("| tokenizer | contender | first load, s | best of the next, s |")
    print("| --- | --- | --- | --- |")
    for directory in args.directories:
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch)
            has_tiktoken = export(directory, args.compat, out)
            kinds = ["superbpe", "superbpe-json", "hf-files", "hf-json"] + ["tiktoken"] * has_tiktoken
            for kind in kinds:
                times = timed(kind, directory, args.compat, out, args.repeats)
                print(f"| {directory.name} | {kind} | {times[0]:.3f} | {min(times[1:]):.3f} |", flush=True)


if __name__ == "__main__":
    main()
