"""Jobs the Ray tests run inside their network namespace: python tests/ray_job.py KIND ARGS_JSON.

Each prints one JSON line on stdout. Run only by tests/test_ray.py (never on the host network).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from superbpe.jobs.count import count_on_executor
from superbpe.jobs.encode import encode_sharded
from superbpe.jobs.executors import ExecutorSpec


def _same_netns_workers(title: str) -> list[int]:
    """Pids of Ray workers running task ``title`` in this network namespace (never anyone else's)."""
    mine = os.readlink("/proc/self/ns/net")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "net") != mine:
                continue
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(f"ray::{title}".encode()):
            found.append(int(entry.name))
    return found


def _kill_one_running(title: str, done: threading.Event, killed: list[int]) -> None:
    """SIGKILL the first worker seen running ``title`` (mid-shard), once."""
    while not done.is_set():
        pids = _same_netns_workers(title)
        if pids:
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])
            return
        time.sleep(0.005)


def _with_a_killed_worker(title: str, job: Any) -> tuple[Any, list[int]]:
    done = threading.Event()
    killed: list[int] = []
    killer = threading.Thread(target=_kill_one_running, args=(title, done, killed))
    killer.start()
    try:
        return job(), killed
    finally:
        done.set()
        killer.join()


def main() -> None:
    kind, raw = sys.argv[1], sys.argv[2]
    args = json.loads(raw)
    spec = ExecutorSpec("ray", args["address"], 1, args.get("shard_bytes", 1 << 27))
    result: dict[str, Any] = {}
    if kind == "count":
        for engine in args["engines"]:
            counts = count_on_executor(
                args["inputs"], args["pattern"], args["specials"], executor=spec, engine=engine
            )
            counts.save(Path(args["out"]) / f"{engine}.counts")
    elif kind == "kill-count":

        def job() -> Any:
            return count_on_executor(args["inputs"], "gpt2", args["specials"], executor=spec, engine="python")

        counts, result["killed"] = _with_a_killed_worker("count_task", job)
        counts.save(Path(args["out"]) / "killed.counts")
    elif kind == "kill-encode":

        def job() -> Any:
            return encode_sharded(
                args["tokenizer"], args["inputs"], args["out"], executor=spec, engine="python"
            )

        _, result["killed"] = _with_a_killed_worker("encode_shard", job)
    elif kind == "nodes":
        import ray

        ray.init(address=args["address"], log_to_driver=False)
        result["alive"] = sum(1 for node in ray.nodes() if node["Alive"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
