"""executor=local vs executor=ray, side by side in rounds: counting and encoding, identical results checked.

Run it inside a private network namespace so Ray binds loopback only:

    unshare --net sh -c 'ip link set lo up && exec python benchmarks/executor_bench.py \\
        --count CORPUS --encode CORPUS [--tokenizer DIR] --rounds 3'

The Ray runtime is started once (``address=local``, all CPUs) before the rounds, and its start-up
is reported separately: on a cluster it is already running. Each round runs local then Ray.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import superbpe
from superbpe.core.pretokenize import get_pretokenizer
from superbpe.engines.interface import get_engine
from superbpe.formats.token_files import open_shards
from superbpe.jobs.count import count_on_executor
from superbpe.jobs.encode import encode_corpus
from superbpe.jobs.executors import ExecutorSpec, RayExecutor

EOT = "<|endoftext|>"


def _timed(fn):  # noqa: ANN001, ANN202 - tiny helper
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _report(
    job: str, number: int, local_s: float, ray_s: float, same: bool, size: str
) -> tuple[float, float]:
    """Print one round; different results stop the benchmark (its timings would not count)."""
    print(
        f"{job} round {number + 1}: local {local_s:6.2f} s  ray {ray_s:6.2f} s  "
        f"ratio {ray_s / local_s:.3f}  identical={same}  {size}",
        flush=True,
    )
    if not same:
        raise SystemExit("ray and local results differ: the timings above do not count")
    return local_s, ray_s


def bench_count(corpus: str, spec: ExecutorSpec, rounds: int, work: Path) -> list[tuple[float, float]]:
    pre = get_pretokenizer("gpt2")
    results = []
    for number in range(rounds):
        local_s, local = _timed(lambda: get_engine("native").count([corpus], pre, [EOT]))
        ray_s, ray = _timed(lambda: count_on_executor([corpus], pre, [EOT], executor=spec, engine="native"))
        local.save(work / "local.counts")
        ray.save(work / "ray.counts")
        same = filecmp.cmp(work / "local.counts", work / "ray.counts", shallow=False)
        results.append(_report("count ", number, local_s, ray_s, same, f"pieces={len(local)}"))
        del local, ray
    return results


def bench_encode(
    corpus: str, tokenizer: Path, spec: ExecutorSpec, rounds: int, work: Path
) -> list[tuple[float, float]]:
    results = []
    flat, out = work / "flat.bin", work / "shards"
    for number in range(rounds):
        shutil.rmtree(out, ignore_errors=True)
        local_s, local = _timed(lambda: encode_corpus(tokenizer, [corpus], flat))
        ray_s, _ = _timed(lambda: encode_corpus(tokenizer, [corpus], out, executor=spec))
        ids = np.fromfile(flat, dtype=local.dtype)
        same = bool(np.array_equal(np.concatenate(open_shards(out)), ids))
        results.append(_report("encode", number, local_s, ray_s, same, f"tokens={local.tokens}"))
    return results


def summary(name: str, results: list[tuple[float, float]]) -> None:
    ratios = [ray / local for local, ray in results]
    local_s = statistics.median(local for local, _ in results)
    ray_s = statistics.median(ray for _, ray in results)
    listed = ", ".join(f"{x:.3f}" for x in ratios)
    print(f"{name}: median local {local_s:.2f} s, median ray {ray_s:.2f} s, ratios {listed}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", help="corpus to count (gpt2 pattern, native engine)")
    parser.add_argument("--encode", help="corpus to encode")
    parser.add_argument(
        "--tokenizer", type=Path, help="tokenizer dir (default: 32K BPE trained on --encode's first 20 MB)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shard-bytes", type=int, default=128 << 20)
    args = parser.parse_args()
    spec = ExecutorSpec("ray", "local", 1, args.shard_bytes)
    work = Path(tempfile.mkdtemp(prefix="sbpe-exec-bench"))
    try:
        startup, runner = _timed(lambda: RayExecutor(spec))  # stays up for the rounds (ray.init once)
        print(f"ray runtime start-up {startup:.2f} s, task slots {runner.parallelism}", flush=True)
        if args.count:
            summary("count", bench_count(args.count, spec, args.rounds, work))
        if args.encode:
            tokenizer = args.tokenizer or _train_tokenizer(args.encode, work)
            summary("encode", bench_encode(args.encode, tokenizer, spec, args.rounds, work))
        runner.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _train_tokenizer(corpus: str, work: Path) -> Path:
    sample = work / "sample.txt"
    with open(corpus, "rb") as source:
        data = source.read(20 << 20)
    sample.write_bytes(data[: data.rfind(b"\n") + 1])
    vocab, merges = superbpe.train_bpe(sample, 32000, [EOT], engine="native")
    out = work / "tokenizer"
    superbpe.Tokenizer(vocab, merges, special_tokens=[EOT]).save(out)
    return out


if __name__ == "__main__":
    main()
