"""Where shard tasks run: in local worker processes, or as tasks on a Ray cluster.

Counting and encoding a large corpus are map-reduce shaped: the corpus is cut into shards
(:mod:`superbpe.jobs.shards`), each shard is one task, and the driver consumes the results as they finish
(streaming add for counts, an index for token files). An executor only runs tasks; what a task does
and how results are combined lives with the data (:mod:`superbpe.jobs.count`), so the same code runs on
one machine or many.

Ray is an optional dependency (``pip install "superbpe[ray]"``). It is imported only when
``executor=ray`` is chosen, so the library and every other executor work without it.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from superbpe.core.errors import ConfigError
from superbpe.core.util import (
    STOP_TASKS_SIGNAL,
    as_task_worker,
    handled_stop_signals,
    run_stoppable,
    stop_signals_held,
    usable_cpus,
)

EXECUTOR_NAMES = ("local", "ray")
DEFAULT_SHARD_BYTES = 128 << 20
T = TypeVar("T")
R = TypeVar("R")
RAY_MISSING = 'executor=ray needs Ray: install it with `pip install "superbpe[ray]"` (or `pip install ray`)'


@dataclass
class ExecutorSpec:
    """Which executor, plus its knobs: what ``conf/executor/*.yaml`` holds (the run's config schema
    takes this plain dataclass as its ``executor`` group, so there is one definition of the fields).

    ``address`` (Ray only): ``local`` starts a Ray runtime in this process, ``auto`` joins the cluster
    this machine belongs to, ``ray://host:port`` (or ``host:port``) joins that cluster.
    """

    name: str = "local"
    address: str = "local"
    num_cpus_per_task: int = 1
    shard_bytes: int = DEFAULT_SHARD_BYTES

    def check(self) -> ExecutorSpec:
        if self.name not in EXECUTOR_NAMES:
            raise ConfigError(f"unknown executor {self.name!r}; choose one of {', '.join(EXECUTOR_NAMES)}")
        if not isinstance(self.num_cpus_per_task, int) or self.num_cpus_per_task < 1:
            raise ConfigError(
                f"executor.num_cpus_per_task must be an integer >= 1, not {self.num_cpus_per_task!r}"
            )
        if not isinstance(self.shard_bytes, int) or self.shard_bytes < 1:
            raise ConfigError(f"executor.shard_bytes must be an integer >= 1, not {self.shard_bytes!r}")
        return self


class Executor(Protocol):
    """Runs ``fn(*args)`` for every argument tuple and yields ``(index, result)`` as tasks finish.

    At most ``window`` results are waiting at any time, so a driver that consumes them one by one
    never holds more than that many shard results. A task's exception is raised in the driver.
    """

    name: str
    parallelism: int

    def run(
        self, fn: Callable[..., Any], tasks: Sequence[tuple[Any, ...]], window: int | None = None
    ) -> Iterator[tuple[int, Any]]: ...

    def close(self) -> None: ...


def spec_from(config: ExecutorSpec | str | None) -> ExecutorSpec:
    """A checked :class:`ExecutorSpec` from a spec, ``None`` (local) or a name."""
    if config is None:
        return ExecutorSpec()
    if isinstance(config, str):
        return ExecutorSpec(name=config).check()
    return config.check()


def check_executor(config: ExecutorSpec | str | None) -> ExecutorSpec:
    """Validate an executor config before any work starts (for Ray: that Ray is installed)."""
    spec = spec_from(config)
    if spec.name == "ray":
        import_ray()
    return spec


def get_executor(config: ExecutorSpec | str | None, workers: int | None = None) -> Executor:
    """The executor a config names; ``workers`` caps local processes (None: one per usable core)."""
    spec = spec_from(config)
    if spec.name == "ray":
        return RayExecutor(spec)
    return LocalExecutor(workers)



class LocalExecutor:
    """Tasks in a pool of worker processes (or in this process when one worker is enough)."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise ConfigError(f"workers must be >= 1, not {workers}")
        self.parallelism = workers or usable_cpus()

    def run(
        self, fn: Callable[..., Any], tasks: Sequence[tuple[Any, ...]], window: int | None = None
    ) -> Iterator[tuple[int, Any]]:
        n_workers = min(self.parallelism, len(tasks))
        if n_workers <= 1:
            for index, args in enumerate(tasks):
                yield index, fn(*args)
            return
        limit = window or 2 * n_workers
        # Not fork: the parent may run native thread pools, and a child forked while another thread
        # holds a lock would wait on it forever.
        methods = mp.get_all_start_methods()
        context = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
        initargs = (os.getpid(), handled_stop_signals())
        pool = ProcessPoolExecutor(n_workers, context, initializer=as_task_worker, initargs=initargs)

        def submit(args: tuple[Any, ...]) -> Future[Any]:
            with stop_signals_held():  # a submit may start a worker
                return pool.submit(run_stoppable, fn, *args)

        finished = False
        try:
            yield from _bounded(submit, tasks, limit)
            finished = True
        finally:
            if not finished:  # stopped (Ctrl-C, SIGTERM), a task failed, or the caller stopped reading
                _stop_workers(pool)
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        pass


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Stop the tasks running in the workers of ``pool`` and any they take after (:func:`as_task_worker`),
    so that its shutdown does not wait for whole shards. Only a worker still running is signalled: the
    fork server reaps one that ended, and its pid may be another process's by now."""
    workers = list((pool._processes or {}).values())  # the pool's own record (no public one)
    for worker in workers:
        if worker.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, STOP_TASKS_SIGNAL)


def _bounded(
    submit: Callable[[tuple[Any, ...]], Future[Any]], tasks: Sequence[tuple[Any, ...]], limit: int
) -> Iterator[tuple[int, Any]]:
    pending: dict[Future[Any], int] = {}
    queued = iter(enumerate(tasks))
    for index, args in queued:
        pending[submit(args)] = index
        if len(pending) >= limit:
            break
    while pending:
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        for future in done:
            index = pending.pop(future)
            yield index, future.result()
            nxt = next(queued, None)
            if nxt is not None:
                pending[submit(nxt[1])] = nxt[0]


def threads_in_order(
    fn: Callable[[T], R], items: Iterable[T], threads: int, name: str = "superbpe-work"
) -> Iterator[tuple[T, R]]:
    """``(item, fn(item))`` for every item, in the items' order, computed on ``threads`` threads of this
    process; at most ``2 * threads`` items are taken ahead of the one the caller waits for.

    For work whose heavy part releases the GIL (the native engine's encoding): threads then run in parallel
    and share the loaded tokenizer, where worker processes would each load their own copy and send every
    result through a pipe. An exception in ``fn`` is raised here, for the item it failed on, and the
    items taken ahead of it are dropped (those already running finish first).
    """
    pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
    try:
        yield from in_order(lambda item: pool.submit(fn, item), items, 2 * threads)
    finally:
        pool.shutdown(wait=True)


def in_order(
    submit: Callable[[T], Future[R]], items: Iterable[T], window: int
) -> Iterator[tuple[T, R]]:
    """``(item, result)`` for every item submitted, in the items' order, with at most ``window`` submitted
    ahead of the one the caller waits for; on an exception (or when the caller stops), those not started
    are cancelled."""
    pending: deque[tuple[T, Future[R]]] = deque()
    try:
        for item in items:
            pending.append((item, submit(item)))
            if len(pending) >= window:
                first, future = pending.popleft()
                yield first, future.result()
        while pending:
            first, future = pending.popleft()
            yield first, future.result()
    finally:
        for _, future in pending:
            future.cancel()


class RayExecutor:
    """Tasks on Ray: each shard is one task of ``num_cpus_per_task`` CPUs, retried if its worker dies.

    Ray retries a task whose worker process or node died (``max_retries``); a task that raises is not
    retried (``retry_exceptions=False``), because a bad input fails the same way every time.
    """

    name = "ray"
    MAX_RETRIES = 3

    def __init__(self, spec: ExecutorSpec) -> None:
        self.ray = import_ray()
        self.spec = spec
        if not self.ray.is_initialized():  # a process already connected keeps its connection
            self._connect()
        cpus = int(self.ray.cluster_resources().get("CPU", 1))
        self.parallelism = max(1, cpus // spec.num_cpus_per_task)

    def _connect(self) -> None:
        address = self.spec.address
        kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
        if address == "local":
            # "local" (not None): a new runtime even when RAY_ADDRESS or a cluster started on this
            # machine is around, which ray.init() would otherwise join. It lives as long as the process,
            # so the stages of a run (and a library user's later jobs) pay its start-up once.
            kwargs["include_dashboard"] = False
            self.ray.init(address="local", **kwargs)
            atexit.register(self.ray.shutdown)
        else:
            self.ray.init(address=address, **kwargs)

    def run(
        self, fn: Callable[..., Any], tasks: Sequence[tuple[Any, ...]], window: int | None = None
    ) -> Iterator[tuple[int, Any]]:
        ray = self.ray
        remote = ray.remote(
            num_cpus=self.spec.num_cpus_per_task, max_retries=self.MAX_RETRIES, retry_exceptions=False
        )(fn)
        limit = window or 2 * self.parallelism
        pending: dict[Any, int] = {}
        queued = iter(enumerate(tasks))
        try:
            for index, args in queued:
                pending[remote.remote(*args)] = index
                if len(pending) >= limit:
                    break
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                ref = done[0]
                index = pending.pop(ref)
                yield index, _ray_result(ray, ref)
                del ref, done
                nxt = next(queued, None)
                if nxt is not None:
                    pending[remote.remote(*nxt[1])] = nxt[0]
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def close(self) -> None:
        """Nothing to release per job: the connection (or local runtime) is the process's."""


def _ray_result(ray: Any, ref: Any) -> Any:
    """The task's value; a task's own exception comes back as itself (its one-line message intact)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.as_instanceof_cause()
        original = getattr(exc, "cause", None)
        raise (original if isinstance(original, BaseException) else cause) from None


def import_ray() -> Any:
    """The ``ray`` module, or the one-line error that says how to install it."""
    try:
        import ray  # an optional extra: only executor=ray needs it
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray
