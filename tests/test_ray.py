"""executor=ray: identical counts, token files and evaluation; retries after a killed worker; bad input;
a two-node cluster.

Ray resolves 127.0.0.1 to the machine's interface address, and tests may only use loopback, so every
Ray process here runs inside a network namespace this module creates (``unshare --net`` with ``lo``
up). One Ray head is shared by the whole module (start-up costs seconds); jobs join it from the same
namespace with ``nsenter``. Every node and driver gets the same auth setting (``RAY_AUTH_MODE``).
At the end every process in the namespace is killed (all of them are ours: the namespace is new).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from executor_helpers import EOT, concatenated_shards, make_corpus
from script_helpers import ROOT, SCRIPTS, assert_one_line_error, script_env, train_small_tokenizer

from superbpe.core.pretokenize import get_pretokenizer
from superbpe.engines.interface import get_engine, native_available
from superbpe.jobs.encode import encode_corpus
from superbpe.jobs.evaluate import evaluate_dir

pytest.importorskip("ray", reason="Ray not installed (pip install -e '.[ray]')")

ENGINES = ["python", "native"] if native_available() else ["python"]
HEAD = "127.0.0.1:6379"
RAY = str(Path(sys.executable).with_name("ray"))


class Namespace:
    """A private network namespace (only loopback), kept alive by a holder process."""

    def __init__(self) -> None:
        self.holder = subprocess.Popen(
            ["unshare", "--net", "sh", "-c", "ip link set lo up && echo ready && exec sleep 86400"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.holder.stdout is not None
        if self.holder.stdout.readline().strip() != "ready":
            reason = self.holder.stderr.read().strip() if self.holder.stderr else ""
            self.holder.kill()
            raise OSError(reason or "unshare failed")
        self.path = f"/proc/{self.holder.pid}/ns/net"
        self.inode = os.readlink(self.path)
        self.temp = Path(tempfile.mkdtemp(prefix="sbray"))  # short: Ray's socket paths must stay < 108 bytes

    def env(self) -> dict[str, str]:
        env = script_env()
        env.update(
            RAY_AUTH_MODE="disabled",
            RAY_USAGE_STATS_ENABLED="0",
            PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
        )
        env.pop("RAY_ADDRESS", None)
        return env

    def run(self, *argv: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["nsenter", f"--net={self.path}", *argv],
            env=self.env(), capture_output=True, text=True, timeout=timeout, cwd=self.temp,
        )  # fmt: skip
        if check:
            assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    def job(self, kind: str, **args: object) -> dict[str, object]:
        proc = self.run(sys.executable, str(ROOT / "tests" / "ray_job.py"), kind, json.dumps(args))
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def start_node(self, *args: str) -> None:
        self.run(RAY, "start", "--node-ip-address=127.0.0.1", "--disable-usage-stats", *args, timeout=120)

    def close(self) -> None:
        """SIGKILL every process in the namespace, then the holder."""
        for _ in range(3):
            pids = [pid for pid in _all_pids() if pid != self.holder.pid and _netns(pid) == self.inode]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if not pids:
                break
            time.sleep(0.5)
        self.holder.kill()
        self.holder.wait()
        shutil.rmtree(self.temp, ignore_errors=True)


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _namespace_or_skip() -> Namespace:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        pytest.skip("Ray tests need root with unshare/nsenter (a private network namespace)")
    try:
        return Namespace()
    except OSError as exc:
        pytest.skip(f"cannot create a network namespace: {' '.join(str(exc).split())}")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Namespace]:
    """A Ray head with 2 CPUs on 127.0.0.1 inside a private network namespace."""
    ns = _namespace_or_skip()
    try:
        ns.start_node(
            "--head",
            "--port=6379",
            "--num-cpus=2",
            "--include-dashboard=false",
            f"--temp-dir={ns.temp / 'r'}",
        )
        yield ns
    finally:
        ns.close()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, sample_texts, multilingual_text) -> list[str]:
    return make_corpus(tmp_path_factory.mktemp("corpus"), sample_texts, multilingual_text)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, sample_texts) -> Path:
    return train_small_tokenizer(tmp_path_factory.mktemp("tok"), sample_texts / "corpus.en")


def _local_counts(corpus: list[str], engine: str, out: Path) -> bytes:
    get_engine(engine).count(corpus, get_pretokenizer("gpt2"), [EOT]).save(out)
    return out.read_bytes()


def test_counts_on_ray_equal_local_byte_for_byte(cluster, corpus, tmp_path) -> None:
    cluster.job(
        "count", address=HEAD, shard_bytes=60_000, inputs=corpus, pattern="gpt2", specials=[EOT],
        engines=ENGINES, out=str(tmp_path),
    )  # fmt: skip
    for engine in ENGINES:
        assert (tmp_path / f"{engine}.counts").read_bytes() == _local_counts(
            corpus, engine, tmp_path / "l.counts"
        )


def _encode_flat(tokenizer_dir: Path, corpus: list[str], out: Path) -> np.ndarray:
    result = encode_corpus(tokenizer_dir, corpus, out)
    return np.fromfile(out, dtype=result.dtype)


def test_encode_and_evaluate_scripts_on_ray_equal_local(cluster, corpus, tokenizer_dir, tmp_path) -> None:
    flat = _encode_flat(tokenizer_dir, corpus, tmp_path / "flat.bin")
    out = tmp_path / "shards"
    common = [
        f"tokenizer={tokenizer_dir}",
        f"input=[{','.join(corpus)}]",
        "executor=ray",
        f"executor.address={HEAD}",
    ]
    cluster.run(
        sys.executable, str(SCRIPTS / "encode.py"), *common, f"output={out}", "executor.shard_bytes=60000"
    )
    assert np.array_equal(concatenated_shards(out), flat)
    assert len(list(out.glob("shard-*.bin"))) > len(corpus)
    evaluated = cluster.run(
        sys.executable, str(SCRIPTS / "evaluate.py"), *common, "executor.shard_bytes=30000"
    )
    local = evaluate_dir(tokenizer_dir, corpus)
    assert f"({local.bytes} bytes, {local.tokens} tokens, {local.documents} documents)" in evaluated.stdout


def test_train_with_address_local_starts_ray_in_process(cluster, corpus, tmp_path) -> None:
    """executor.address=local: the run starts (and stops) its own runtime; same tokenizer as local."""
    args = [f"data.paths=[{','.join(corpus)}]", "vocab_size=600", "cache_dir=null", "engine=native"]
    local = tmp_path / "local"
    ray_out = tmp_path / "ray"
    run_training_dir = [sys.executable, str(SCRIPTS / "train.py"), *args]
    cluster.run(*run_training_dir, f"output_dir={local}")
    cluster.run(
        *run_training_dir, "executor=ray", "executor.address=local", "executor.shard_bytes=100000",
        f"output_dir={ray_out}",
    )  # fmt: skip
    assert (ray_out / "merges.txt").read_bytes() == (local / "merges.txt").read_bytes()


def test_killed_worker_is_retried_with_the_same_result(cluster, corpus, tokenizer_dir, tmp_path) -> None:
    counted = cluster.job(
        "kill-count", address=HEAD, shard_bytes=150_000, inputs=corpus, specials=[EOT], out=str(tmp_path)
    )
    assert len(counted["killed"]) == 1  # type: ignore[arg-type]
    assert (tmp_path / "killed.counts").read_bytes() == _local_counts(corpus, "python", tmp_path / "l.counts")
    out = tmp_path / "shards"
    encoded = cluster.job(
        "kill-encode",
        address=HEAD,
        shard_bytes=150_000,
        inputs=corpus,
        tokenizer=str(tokenizer_dir),
        out=str(out),
    )
    assert len(encoded["killed"]) == 1  # type: ignore[arg-type]
    assert np.array_equal(
        concatenated_shards(out), _encode_flat(tokenizer_dir, corpus, tmp_path / "flat.bin")
    )
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["index.json", *(p.name for p in out.glob("shard-*.bin"))]
    )  # no attempt's temporary file left


def test_bad_input_on_a_shard_stops_the_job(cluster, corpus, tokenizer_dir, tmp_path) -> None:
    data = bytearray(Path(corpus[0]).read_bytes())
    offset = len(data) * 2 // 3
    data[offset] = 0xFF
    bad = tmp_path / "bad.txt"
    bad.write_bytes(bytes(data))
    out = tmp_path / "out"
    proc = cluster.run(
        sys.executable, str(SCRIPTS / "encode.py"), f"tokenizer={tokenizer_dir}",
        f"input=[{corpus[1]},{bad}]", f"output={out}", "executor=ray", f"executor.address={HEAD}",
        "executor.shard_bytes=50000", check=False,
    )  # fmt: skip
    assert_one_line_error(proc, f"{bad}: invalid UTF-8 at byte {offset}")
    assert not out.exists()


@pytest.mark.slow
def test_two_node_cluster_counts_and_encodes_identically(cluster, corpus, tokenizer_dir, tmp_path) -> None:
    """A second node joins the head (same namespace, same auth setting); results stay identical."""
    cluster.start_node(f"--address={HEAD}", "--num-cpus=1")
    assert cluster.job("nodes", address=HEAD)["alive"] == 2
    cluster.job(
        "count", address=HEAD, shard_bytes=40_000, inputs=corpus, pattern="gpt2", specials=[EOT],
        engines=ENGINES[-1:], out=str(tmp_path),
    )  # fmt: skip
    engine = ENGINES[-1]
    assert (tmp_path / f"{engine}.counts").read_bytes() == _local_counts(
        corpus, engine, tmp_path / "l.counts"
    )
    out = tmp_path / "shards"
    cluster.run(
        sys.executable, str(SCRIPTS / "encode.py"), f"tokenizer={tokenizer_dir}",
        f"input=[{','.join(corpus)}]", f"output={out}", "executor=ray", f"executor.address={HEAD}",
        "executor.shard_bytes=40000",
    )  # fmt: skip
    assert np.array_equal(
        concatenated_shards(out), _encode_flat(tokenizer_dir, corpus, tmp_path / "flat.bin")
    )
