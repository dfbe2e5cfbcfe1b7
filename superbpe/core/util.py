"""Small shared helpers: atomic file writes, peak memory, CPUs, sizes for people, optional imports."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import glob
import importlib
import io
import numbers
import os
import resource
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, TypeVar

from superbpe.core.errors import ConfigError, InputError

T = TypeVar("T")


@contextlib.contextmanager
def atomic_write(path: Path) -> Iterator[BinaryIO]:
    """Write to a temp file beside ``path`` and rename it into place only on success.

    A reader (or a resumed run after SIGKILL) therefore sees either the old file or the
    complete new one, never a torn write.
    """
    with _temp_beside(path) as (handle, tmp):
        yield handle
    _replace_or_remove(tmp, path)


@contextlib.contextmanager
def _temp_beside(path: Path) -> Iterator[tuple[BinaryIO, str]]:
    """A temp file beside ``path`` (and its name), on disk when the block ends; removed if the block fails."""
    with naming_file(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    except OSError as exc:  # named after the file asked for, not the temp name nobody chose
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    try:
        # Held while written, so remove_stale_temps tells it from a killed writer's leftover.
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Named outside the buffer: the data a full disk refuses is often written only as it closes.
        with naming_file(path), io.BufferedWriter(WritebackFile(fd)) as handle:
            yield handle, tmp
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs should read like any other file
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _replace_or_remove(tmp: str, path: Path) -> None:
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_texts(texts: Mapping[Path, str]) -> None:
    """Write several files as one: each goes to a temp file, and none is renamed into place until all are
    written. Why: the files of one tokenizer describe it together, and a write that fails part way (a
    full disk) would otherwise leave some files new beside others old or missing, which load as another
    tokenizer; this way the old files stay as they were."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, text in texts.items():
            with _temp_beside(path) as (handle, tmp):
                handle.write(text.encode("utf-8"))
            staged.append((tmp, path))
        while staged:
            _replace_or_remove(*staged.pop(0))
    except BaseException:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise


TEMP_SUFFIX = ".tmp"

WRITEBACK_BYTES = 8 << 20
"""How much :class:`WritebackFile` lets accumulate before it asks the OS to start writing it out."""


class WritebackFile(io.FileIO):
    """A raw file that asks the OS to start writing its data to disk every ``WRITEBACK_BYTES``.

    Why: :func:`atomic_write` ends with an ``fsync``, which otherwise waits for everything the page
    cache still holds, a whole token file of a gigabyte written serially after the encoding. Started as
    the file grows, writing to disk overlaps the work that produces the data, and the ``fsync`` waits
    for the last few megabytes. ``POSIX_FADV_DONTNEED`` starts the write-out of the range's dirty pages
    without waiting for it (pages being written are left in the cache); where the OS lacks it, or the
    file system refuses it, the file is only written as usual. The raw file, under a buffered one, sees
    a write per buffer's worth of small writes, not one per call.
    """

    def __init__(self, fd: int) -> None:
        super().__init__(fd, "wb")
        self._started = 0  # bytes handed to the OS to write out
        self._written = 0
        self._hint = hasattr(os, "posix_fadvise")

    def write(self, data: Any) -> int:
        count = super().write(data) or 0
        self._written += count
        if self._hint and self._written - self._started >= WRITEBACK_BYTES:
            self._start_writeback()
        return count

    def _start_writeback(self) -> None:
        try:
            length = self._written - self._started
            os.posix_fadvise(self.fileno(), self._started, length, os.POSIX_FADV_DONTNEED)
        except OSError:  # only a hint: the fsync at the end still writes everything
            self._hint = False
        self._started = self._written


@contextlib.contextmanager
def naming_file(path: Path) -> Iterator[None]:
    """Give an ``OSError`` raised inside without a file name (a full disk: ENOSPC on write) ``path``.

    Why: "No space left on device" alone does not say which of a run's files failed.
    """
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def user_path(path: str | os.PathLike[str]) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded, as a shell would. A ``~name`` of no user (a typo)
    is a one-line error naming it, where ``Path.expanduser`` raises ``RuntimeError``: left unexpanded it
    would be read, or made, as a directory named ``~name`` in the working directory."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        head = str(path).split("/", 1)[0]
        raise InputError(f"{path}: {head} is no user's home directory (no user {head[1:]!r})") from None


def missing_dirs(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, innermost first: what making it would
    create, and so what a command that fails after making it should take away again."""
    absolute = user_path(path).absolute()
    return [p for p in (absolute, *absolute.parents) if not p.exists()]


def remove_empty_dirs(dirs: Iterable[Path]) -> None:
    """Remove each of ``dirs`` (innermost first) while it is empty; one that is not, or is gone, stays."""
    for made in dirs:
        with contextlib.suppress(OSError):
            made.rmdir()


def directory_problem(path: Path) -> str | None:
    """Why ``path`` cannot be (made into) a directory to write in, or None: checked before a command
    starts, so that the user gets one line naming the option rather than an error from deep inside."""
    absolute = user_path(path).absolute()
    existing = next(p for p in (absolute, *absolute.parents) if p.exists())
    if not existing.is_dir():
        return "it is a file" if existing == absolute else f"{existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return "Read-only file system" if _read_only_mount(existing) else "Permission denied"
    if existing != absolute:  # make it and take it away again: some file systems refuse (/proc, read-only)
        missing = missing_dirs(absolute)
        try:
            absolute.mkdir(parents=True)
        except OSError as exc:
            return exc.strerror or str(exc)
        finally:
            remove_empty_dirs(missing)
    return None


@contextlib.contextmanager
def made_dirs_removed_on_failure(path: Path) -> Iterator[None]:
    """Run the block; if it fails, remove ``path`` and those of its parents that did not exist when it
    began (innermost first, each only while empty): a command that makes the directories of its output
    and then fails leaves the tree as it found it, not an empty folder."""
    missing = missing_dirs(path)
    try:
        yield
    except BaseException:
        remove_empty_dirs(missing)
        raise


def _read_only_mount(path: Path) -> bool:
    """Whether ``path`` lies on a file system mounted read-only (where no permission would help)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def remove_stale_temps(directory: Path, name: str | None = None) -> list[Path]:
    """Delete the temp files :func:`atomic_write` leaves when killed mid-write (``.<name>.XXXX.tmp``; with
    ``name``, only those of that file). One a live process is writing is locked by it (:func:`_temp_beside`)
    and kept; the kernel drops the lock however a writer ends, so one no process holds is a leftover.
    """
    removed = []
    pattern = f".{glob.escape(name)}.*{TEMP_SUFFIX}" if name else f".*{TEMP_SUFFIX}"
    for item in directory.glob(pattern):
        with contextlib.suppress(OSError), open(item, "rb") as probe:
            fcntl.flock(probe.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: being written
            item.unlink()
            removed.append(item)
    return removed


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_write(path) as handle:
        handle.write(text.encode("utf-8"))


def peak_rss_bytes(*, children_above: int | None = None) -> int:
    """Peak resident memory of this process, in bytes: the one definition the package uses.

    Linux's ``VmHWM`` first, which is the peak since the process started or since the window was last
    reset (``progress.reset_peak_rss``); ``ru_maxrss`` is inherited from the parent across fork and
    exec, so a child of a big process would report the parent's peak as its own. ``ru_maxrss``
    elsewhere. With ``children_above`` (:func:`children_peak_rss_bytes` when the window began), also the
    peak of the biggest finished child (counting worker processes) when it rose above that in the window,
    since a stage's memory is the larger of the two: the children's peak is the process's whole history,
    and an earlier run's worker (a sweep's jobs share the process) must not be taken for this one's.
    """
    own = 0
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    own = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if not own:
        own = _maxrss(resource.RUSAGE_SELF)
    children = children_peak_rss_bytes()
    return max(own, children) if children_above is not None and children > children_above else own


def release_freed_memory() -> None:
    """Hand memory that was freed back to the OS (Python's cycles collected, then glibc's ``malloc_trim``):
    a run that follows another in one process (the jobs of a sweep) then starts near its own size, and
    its peak RSS is its own, not what the allocator kept of the run before."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)  # the process's own symbols, the C library's among them


def children_peak_rss_bytes() -> int:
    """The peak resident memory of the biggest child process waited for so far, in bytes."""
    return _maxrss(resource.RUSAGE_CHILDREN)


def _maxrss(who: int) -> int:
    peak = resource.getrusage(who).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


#: The environment variable rayon reads for its thread count; the encoders' thread defaults honour it.
THREADS_ENV = "RAYON_NUM_THREADS"


def default_threads() -> int:
    """Threads for parallel work inside this process: ``RAYON_NUM_THREADS`` when set, else the usable CPUs.

    The native engine's thread pools are rayon's, and rayon reads that variable; reading it here too keeps
    a Python-side default (a batch's ``threads``, the encode command's workers) equal to what a pool of the
    default size would start. ``0`` means "the default", as it does for rayon.
    """
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return usable_cpus()
    try:
        threads = int(value)
    except ValueError:
        raise ConfigError(f"{THREADS_ENV} must be a whole number of threads, not {value!r}") from None
    if threads < 0:
        raise ConfigError(f"{THREADS_ENV} must be a whole number of threads, not {value!r}")
    return threads or usable_cpus()


#: How often a worker process looks whether the process that started it is still there.
PARENT_CHECK_SECONDS = 1.0


def end_when_orphaned(parent: int) -> None:
    """End this worker process, from a thread of its own, once process ``parent`` (the one that started it,
    or started its pool) is gone: killed outright (SIGKILL, out of memory), it can stop none of its workers.

    Left alone a worker would live on as an orphan holding its memory: waiting for ever on its task
    queue, whose writing end it holds itself (a fork copies it), or writing results no one reads.
    A thread, so whatever the worker's main thread waits in.

    A worker forked or spawned by ``parent`` watches its own parent. A worker of a pool started with
    multiprocessing's forkserver method is the child of the fork server, which ``parent`` started and
    which lives on as long as any worker it forked does (each holds the pipe whose closing tells it that
    no process needs it any more); that worker watches the fork server's parent instead, read from
    ``/proc`` (Linux). Either parent changes when ``parent`` dies (its children go to init or a
    subreaper, which was running before, so has another pid) and never changes back: a new process given
    the old pid fools neither. Once the workers have ended, the fork server, and multiprocessing's
    resource tracker, find their pipes closed and end too. Where the fork server's parent cannot be read
    (no ``/proc``), the worker looks whether a process of pid ``parent`` exists: one given that pid after
    ``parent`` ended keeps it until that one ends too."""
    server = os.getppid()

    def with_parent() -> bool:
        return os.getppid() == parent

    def with_server_of_parent() -> bool:
        return os.getppid() == server and _parent_of(server) == parent

    def with_server_and_parent() -> bool:
        return os.getppid() == server and _exists(parent)

    if server == parent:
        running = with_parent
    elif _parent_of(server) == parent:
        running = with_server_of_parent
    else:
        running = with_server_and_parent

    def watch() -> None:
        while running():
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="superbpe-orphan", daemon=True).start()


def _parent_of(pid: int) -> int | None:
    """The parent of process ``pid``, from ``/proc`` (Linux); None when it cannot be read (no such
    process, or no ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat.rsplit(b")", 1)[1].split()[1])  # after the command's name: the state, then the parent


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True


def as_worker_process(*, ignore_interrupt: bool = False) -> None:
    """Signal handling for a worker process forked from a command, which kills its workers when it stops
    and reads nothing they were sending after that: SIGTERM kills it at once.

    A fork keeps the command's SIGTERM handler, which raises KeyboardInterrupt (so that a command stops
    as on Ctrl-C); raised in a worker, at any point, it could leave a queue's lock or pipe half used.
    With ``ignore_interrupt`` Ctrl-C is the parent's to handle too. A worker of a
    :class:`~concurrent.futures.ProcessPoolExecutor` needs :func:`as_pool_worker` instead."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if ignore_interrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


#: The signals that stop a command (Ctrl-C, a scheduler's SIGTERM); the commands handle both.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def handled_stop_signals() -> tuple[int, ...]:
    """Those of :data:`STOP_SIGNALS` that this process does not die of at once: it runs a handler (the
    commands' raise KeyboardInterrupt) or ignores them. Passed to :func:`as_pool_worker`."""
    return tuple(int(sig) for sig in STOP_SIGNALS if signal.getsignal(sig) not in (signal.SIG_DFL, None))


def as_pool_worker(pool_pid: int, handled: tuple[int, ...]) -> None:
    """Signal handling for a worker of a :class:`~concurrent.futures.ProcessPoolExecutor` in process
    ``pool_pid``, as its initializer: the stop signals that process handles (``handled``) are left to it.

    A scheduler's SIGTERM, and a terminal's Ctrl-C, reach every process of the command at once. A worker
    that dies of one, or raises KeyboardInterrupt, while it sends a chunk's ids leaves the pool's result
    reader waiting forever for the rest of them (or the pool's feeder thread writing a chunk to a pipe no
    worker reads), and the command hangs at the pool's shutdown or at its exit. So the command stops its
    pool itself: it cancels what has not started, and each worker ends after the chunks it was given.

    Ctrl-C is ignored. So is SIGTERM, except the one the pool's process sends: it terminates its workers
    when one of them died, and its shutdown then waits on them. A thread tells the sender
    (``sigwaitinfo``); once the process that started the worker is gone, any SIGTERM ends it, as nothing
    else would. Where ``sigwaitinfo`` is missing, SIGTERM kills the worker at once. A stop signal the
    pool's process dies of kills its workers too, and a worker whose parent is gone ends
    (:func:`end_when_orphaned`).
    """
    ignore_interrupt = signal.SIGINT in handled
    signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_interrupt else signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not ignored: an ignored signal is never waited for
    if signal.SIGTERM not in handled or not hasattr(signal, "sigwaitinfo"):
        end_when_orphaned(pool_pid)
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started later inherit it
    end_when_orphaned(pool_pid)  # started after: a SIGTERM must not end the worker through its thread
    threading.Thread(
        target=_end_on_sigterm_from, args=(pool_pid, os.getppid()), name="superbpe-sigterm", daemon=True
    ).start()


def _end_on_sigterm_from(pool_pid: int, parent: int) -> None:
    """Wait for SIGTERM (blocked in every thread of this process); die of the one the pool's process
    sends, or of any once this process's parent is gone."""
    while True:
        info = signal.sigwaitinfo({signal.SIGTERM})
        if info.si_pid == pool_pid or os.getppid() != parent:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # its default action, as sent
            os._exit(128 + signal.SIGTERM)


#: What a command sends the workers of :func:`as_task_worker` to stop their tasks.
STOP_TASKS_SIGNAL = signal.SIGUSR1

#: A task worker's state: whether a task runs (:func:`run_stoppable`), whether its tasks were stopped.
_task_worker = {"running": False, "stopped": False}


def as_task_worker(command: int, handled: tuple[int, ...]) -> None:
    """Signal handling for a worker of a :class:`~concurrent.futures.ProcessPoolExecutor` whose tasks are
    long (a shard each), as its initializer: its tasks run through :func:`run_stoppable`.

    A terminal's Ctrl-C reaches every process of the command at once. It is ignored when the command
    (process ``command``) handles it (``handled``): a worker waiting for a task would die of it with a
    traceback, and one dying as it sends a result would leave the pool waiting forever for the rest.
    The command stops its workers itself, with :data:`STOP_TASKS_SIGNAL`: a task running then raises
    KeyboardInterrupt at once (its own clean-up runs), which goes back to the pool as the task's
    exception; a worker waiting or sending a result is marked stopped and raises it at the start of any
    task it takes after. No worker dies halfway through a message, and no command waits for a whole
    shard (as :func:`as_pool_worker`'s waits for chunks). SIGTERM kills the worker. The worker ends
    once ``command`` is gone (:func:`end_when_orphaned`).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN if signal.SIGINT in handled else signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(STOP_TASKS_SIGNAL, _stop_tasks)
    end_when_orphaned(command)


def _stop_tasks(signum: int, frame: Any) -> None:
    _task_worker["stopped"] = True
    if _task_worker["running"]:
        raise KeyboardInterrupt


def run_stoppable(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` as a task of a worker of :func:`as_task_worker`: KeyboardInterrupt once stopped."""
    _task_worker["running"] = True  # before the look at "stopped": a stop in between raises
    try:
        if _task_worker["stopped"]:
            raise KeyboardInterrupt
        return fn(*args)
    finally:
        _task_worker["running"] = False


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """The handlers of :data:`STOP_SIGNALS` that arrive in the block run at its end (a command's raise
    KeyboardInterrupt there).

    For submitting to a :class:`~concurrent.futures.ProcessPoolExecutor`, which starts its workers then:
    raised in the middle, the exception could leave workers started and no thread to stop them (they
    ignore those signals, :func:`as_pool_worker`, and the exit would wait on them forever), and a worker
    forked before its initializer ran would raise it inside the pool's code. A fork in the block keeps
    the holding handler until its initializer replaces it. Handlers run only in the main thread: in
    another, nothing is held.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    held: list[tuple[int, Any]] = []
    released = False

    def hold(signum: int, frame: Any) -> None:
        if released:  # between the end of the block and its handler's return: as that handler
            previous[signum](signum, frame)
        else:
            held.append((signum, frame))

    try:
        for sig in STOP_SIGNALS:
            handler = signal.getsignal(sig)
            if callable(handler):
                previous[sig] = handler
                signal.signal(sig, hold)
        yield
    finally:
        released = True
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum, frame in held:
            previous[signum](signum, frame)


def whole_number(value: object, name: str, low: int | None = 1) -> int:
    """``value`` as an int when it is a whole number (>= ``low``, unless None): a Python or numpy integer
    (numpy's register as :class:`numbers.Integral`); a bool, a float or a string is an error naming
    ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        bound = "" if low is None else f" >= {low}"
        raise ConfigError(f"{name} must be an integer{bound}, not {value!r}")
    if low is not None and value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, not {value!r}")
    return int(value)


def resolve_threads(threads: int | None, what: str = "threads") -> int:
    """An explicit thread count (an int >= 1, checked), or :func:`default_threads` for None.

    A count far past the machine's CPUs is refused: each thread is made (a pool of a million threads
    took minutes and tens of GB before it did anything), and none of them would run at once."""
    if threads is None:
        return default_threads()
    threads = whole_number(threads, what)
    cpus = os.cpu_count() or 1
    limit = max(64, 4 * cpus)
    if threads > limit:
        raise ConfigError(
            f"{what}={threads} exceeds the limit of {limit} threads (4 per CPU, at least 64; "
            f"this machine has {cpus} CPUs)"
        )
    return threads


def human_size(value: float, unit: str = "") -> str:
    """``value`` with a decimal prefix, for log lines and messages: ``512 B``, ``1.5 GB`` (with a unit),
    ``512``, ``1.5M`` (a plain count)."""
    space = " " if unit else ""
    for prefix in ("", "K", "M", "G"):
        if abs(value) < 1000:
            return f"{value:.0f}{space}{unit}" if not prefix else f"{value:.1f}{space}{prefix}{unit}"
        value /= 1000
    return f"{value:.1f}{space}T{unit}"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 entry``, ``3 entries``: a count and its noun, singular for one, for the lines the commands print
    (``plural`` when it is not ``noun`` + s)."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def import_optional(module: str, extra: str, purpose: str) -> ModuleType:
    """Import a dependency of an optional feature, or say in one line which extra provides it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f'{purpose} needs {module}: pip install "superbpe[{extra}]"') from None


_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent) + os.sep


def caller_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made by the function calling this one that names the
    first caller outside this package: a public call reaches a warning through different depths (a
    tokenizer built directly, or loaded from files), and a fixed level would point into the library."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level
