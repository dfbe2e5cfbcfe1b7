"""Run directories of the Hydra training entry point: unique per run, and resumable by name alone.

Why a module of its own: these are decisions about *where* a run lives and *how it is continued*,
which the entry point (a thin Hydra wrapper) only calls. Nothing here imports Hydra; the run's
``.hydra/overrides.yaml`` is read with OmegaConf, which Hydra brings along.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from superbpe.core.errors import ConfigError, InputError
from superbpe.core.util import directory_problem, missing_dirs, user_path
from superbpe.formats.checkpoints import checkpoint_path, orphaned_log
from superbpe.formats.tokenizer_dir import states_its_pattern, tokenizer_files_in
from superbpe.training.summary import missing_jobs, unfinished

#: Settings a resume may change: they decide how fast and how visibly a run goes, never its merges
#: (the engines agree byte for byte).
RESUME_MAY_CHANGE = frozenset(
    {
        "engine",
        "workers",
        "progress",
        "cache_dir",
        "eval",
        "checkpoint.every_merges",
        "checkpoint.every_seconds",
        "memory_limit",
    }
)
#: The Hydra settings a resume sets itself: write into the resumed directory, keep its own .hydra files.
_RESUME_HYDRA = ("hydra.run.dir", "hydra.output_subdir")

_claimed: dict[str, str] = {}
_existed: set[Path] = set()
_made_parents: dict[Path, list[Path]] = {}


def claim_unique_dir(base: str) -> str:
    """``base``, or ``base-2``, ``base-3``, ... : the first that did not exist, created here.

    Why: the default run directory is named by the second a run starts, so two runs started in the
    same second would share it (one result silently overwritten, one log interleaved). ``mkdir`` is
    atomic, so of two racing processes exactly one gets each name. The answer is remembered, so
    resolving the same config value again in this process names the same directory.
    """
    if base in _claimed:
        return _claimed[base]
    parents = missing_dirs(Path(base).absolute().parent)
    suffix = 1
    while True:
        candidate = base if suffix == 1 else f"{base}-{suffix}"
        try:
            Path(base).parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(candidate)
        except FileExistsError:
            suffix += 1
            continue
        except FileNotFoundError:  # a parent went away meanwhile (another run's clean-up): again
            continue
        except OSError as exc:  # read-only, not allowed, or under a file
            raise ConfigError(
                f"cannot make the run directory {Path(candidate).absolute()} ({exc.strerror or exc}): "
                "give output_dir=DIR, or run from a directory that can be written"
            ) from None
        _claimed[base] = candidate
        _made_parents[Path(candidate).absolute()] = parents
        return candidate


def claimed_dirs() -> list[Path]:
    """The directories :func:`claim_unique_dir` created in this process (a run's, or a sweep's root)."""
    return [Path(candidate).absolute() for candidate in _claimed.values()]


def made_parents(run_dir: Path) -> list[Path] | None:
    """The directories this process created to hold ``run_dir`` (``outputs/``, ``outputs/DATE``), innermost
    first, so that a run that fails can leave the tree as it found it; None for a directory this process
    did not claim or place (a sweep job's, which Hydra makes). An empty list means every parent was
    there before, the user's working directory among them, and none of them may go."""
    parents = _made_parents.get(Path(run_dir).absolute())
    return None if parents is None else list(parents)


def _key(override: str) -> str:
    """The config key an override sets: ``+a.b=1`` -> ``a.b``."""
    return override.split("=", 1)[0].lstrip("+~")


def _may_change(key: str) -> bool:
    """Whether a resume may give ``key`` another value (the executor, like the engine, only changes speed)."""
    return key in RESUME_MAY_CHANGE or key == "executor" or key.startswith("executor.")


def _is_override(arg: str) -> bool:
    return "=" in arg and not arg.startswith("-")


def _value(args: Sequence[str], key: str) -> str | None:
    """The value the last override of ``key`` gives it (quotes stripped), or None (also for ``null``)."""
    value = None
    for arg in args:
        if _is_override(arg) and _key(arg) == key:
            value = arg.split("=", 1)[1].strip().strip("'\"")
    return None if value in (None, "", "null") else value


def _resume_value(args: Sequence[str]) -> str | None:
    """The run directory ``resume=`` names, None when not resuming (``resume=null``, the default). An
    empty value (``resume=$RUN`` with ``$RUN`` unset) is refused: it would start a new run instead."""
    given = [arg for arg in args if _is_override(arg) and _key(arg) == "resume"]
    if given and not given[-1].split("=", 1)[1].strip().strip("'\""):
        raise ConfigError("resume= is empty; give the directory of the run to continue (resume=<run dir>)")
    return _value(args, "resume")


def check_nothing_to_overwrite(path: Path) -> None:
    """Refuse a new run's directory that holds a run (continued with ``resume=``), a run's merges log
    without its checkpoint.json, or a tokenizer (a saved one, or a run's whose checkpoint was removed): the
    run would write its files over them."""
    if checkpoint_path(path).is_file():
        if (path / "metrics.json").is_file():  # written last: the run finished, there is nothing to continue
            raise ConfigError(
                f"{path} already holds a finished run; choose another output_dir (resume={path} "
                "eval=<file> evaluates it)"
            )
        raise ConfigError(f"{path} already holds a run; continue it with resume={path}")
    if (orphan := orphaned_log(path)) is not None:
        log_path, count = orphan
        raise ConfigError(
            f"{path} holds a run's merges log ({log_path.name}, {count} merges) without its checkpoint.json, "
            f"which this run would write over: choose another output_dir, or remove {log_path}"
        )
    if held := tokenizer_files_in(path):
        raise ConfigError(
            f"{path} already holds a tokenizer ({', '.join(held)}), which this run would replace: "
            "choose another output_dir, or remove those files"
        )


def place_run(args: Sequence[str]) -> list[str]:
    """The command-line overrides of a new run, with ``output_dir=<dir>`` made the Hydra run directory.

    Why: a run is continued by naming one directory (``resume=<dir>``), which must hold the tokenizer,
    the checkpoint, the overrides Hydra records and the log together; with Hydra's run directory
    elsewhere, ``resume=<output_dir>`` found no overrides and composed the defaults. A directory that
    already holds a run is refused here, before Hydra writes its files there (it would overwrite the
    overrides that run is resumed from). A sweep names its jobs' directories itself, so ``output_dir``
    (one directory for every job) is refused with ``-m``. Resumes are placed by :func:`resume_args`.
    """
    if _resume_value(args) is not None:
        return list(args)
    _check_first_stage_not_set_beside_its_source(args)
    # Hydra takes "" as the working directory itself; an empty output_dir fell back to a new directory
    # under outputs/, and the script that gave it found nothing where it looked.
    for key in ("output_dir", "hydra.run.dir", "hydra.sweep.dir"):
        given = [arg for arg in args if _is_override(arg) and _key(arg) == key]
        if given and not given[-1].split("=", 1)[1].strip().strip("'\""):
            where = ("the run would go to a new directory under outputs/ instead" if key == "output_dir"
                     else "the run would write into the working directory")  # fmt: skip
            raise ConfigError(
                f"{key} is empty (an unset variable?): give {key}=DIR, or leave it out for a new directory "
                f"under outputs/ (multirun/ for a sweep); as it is, {where}"
            )
    output, run_dir = _value(args, "output_dir"), _value(args, "hydra.run.dir")
    if "-m" in args or "--multirun" in args:
        if output is not None:
            raise ConfigError(
                f"a sweep writes each job into its own directory under hydra.sweep.dir; drop "
                f"output_dir={output} (or set hydra.sweep.dir={output})"
            )
        sweep = _value(args, "hydra.sweep.dir")
        if sweep is not None and "${" not in sweep and (user_path(sweep) / "multirun.yaml").is_file():
            # Hydra would write its record of this sweep over that one's before any job could refuse.
            raise ConfigError(
                f"hydra.sweep.dir {sweep} already holds a sweep; give another (its runs continue with "
                f"resume={Path(sweep) / '<job number>'})"
            )
        return list(args)
    if output is not None and run_dir is not None and not _same_dir(output, run_dir):
        raise ConfigError(
            "output_dir and hydra.run.dir name different directories; a run keeps its tokenizer, "
            "checkpoint, overrides and log in one: give only output_dir"
        )
    target = output or run_dir
    if target is None or "${" in target:  # an interpolation (``${unique_dir:...}``) is Hydra's to resolve
        return list(args)
    path = user_path(target)
    check_nothing_to_overwrite(path)
    _check_can_make(path)
    if path.is_dir():
        _existed.add(path.absolute())
    else:  # Hydra makes it, and its parents: a run that fails early takes out what was made
        _made_parents[path.absolute()] = missing_dirs(path.absolute().parent)
    if run_dir is not None:
        return list(args)
    return [*args, f"hydra.run.dir={quote_override(str(path))}"]


def _check_can_make(path: Path) -> None:
    """Refuse a run directory that cannot be made or written before Hydra tries (its error is a traceback)."""
    problem = directory_problem(path)
    if problem:
        raise InputError(f"output directory {path} is not writable ({problem})")


def _check_first_stage_not_set_beside_its_source(args: Sequence[str]) -> None:
    """Refuse settings of the first stage given beside the tokenizer that stands in for it: its merges
    were made with their own pattern and rules, so ``pretokenizer=o200k`` (or a stage-1 rule) beside
    ``schedule.from_run`` changed nothing, silently. Bare tokenizer files do not say their pattern, so
    ``schedule.from_tokenizer`` naming them takes ``pretokenizer=`` as the one that made them."""
    sources = ("schedule.from_run", "schedule.from_tokenizer")
    source = next((key for key in sources if _value(args, key)), None)
    if source is None:
        return
    overrides = [arg for arg in args if _is_override(arg)]
    stage_keys = [_key(arg) for arg in overrides if _key(arg).startswith("schedule.stages.0.")
                  and _key(arg) not in ("schedule.stages.0.until", "schedule.stages.0.name")]  # fmt: skip
    if source == "schedule.from_run" or states_its_pattern(user_path(_value(args, source) or "")):
        stage_keys += [_key(arg) for arg in overrides if _key(arg).split(".")[0] == "pretokenizer"]
    if stage_keys:
        raise ConfigError(
            f"{', '.join(stage_keys)}: the first stage's merges come from {source}, made with its own "
            "pattern and rules; drop it"
        )


def _same_dir(a: str, b: str) -> bool:
    return user_path(a).absolute() == user_path(b).absolute()


def existed_before(run_dir: Path) -> bool:
    """Whether ``run_dir`` was there before this process placed a run in it (then a run that fails
    early takes out only the files Hydra put there, not the directory)."""
    return Path(run_dir).absolute() in _existed


def quote_override(value: str) -> str:
    """A path as a Hydra override value (quoted, since paths may hold characters the grammar reserves)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def read_run_overrides(run_dir: Path) -> list[str] | None:
    """The overrides a Hydra run was started with (its ``.hydra/overrides.yaml``), or None without one.

    An empty file counts as none: Hydra creates the file before writing it, so a run killed in
    between leaves it empty, and that records nothing.
    """
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file() or not path.read_text(encoding="utf-8", errors="replace").strip():
        return None
    from omegaconf import OmegaConf  # loaded by the commands only: library runs never need it

    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as exc:  # noqa: BLE001 - any parse failure means the same thing to the user
        raise InputError(f"{path}: cannot read the run's overrides ({' '.join(str(exc).split())})") from None
    if not isinstance(loaded, list) or not all(isinstance(item, str) for item in loaded):
        raise InputError(f"{path}: not a list of overrides")
    latest = {_key(item): item for item in loaded}  # a key given twice: the last one counts, as in Hydra
    return [item for key, item in latest.items() if key != "resume"]


def _same_setting(given: str, recorded: str) -> bool:
    """Whether two overrides of one key give it the same value, however quoted (``data.paths=['a']`` and
    the run's ``data.paths=[a]``)."""
    if given == recorded:
        return True
    from hydra.core.override_parser.overrides_parser import OverridesParser  # the commands' dependency

    try:
        overrides = OverridesParser.create().parse_overrides([given, recorded])
    except Exception:  # noqa: BLE001 - an override Hydra cannot parse is only compared as written
        return False
    return str(overrides[0].value()) == str(overrides[1].value())


NOT_A_COMMAND_RUN = (
    "the run was not started by superbpe-train (it has no .hydra/overrides.yaml), so nothing repeats its "
    "settings: give them again (data.paths and the rest it was started with)"
)
"""Why a run started from Python (``run_training``) cannot be resumed from its directory alone."""


def resume_args(args: Sequence[str]) -> list[str]:
    """The command-line overrides with a ``resume=<run dir>`` completed from that run's own overrides.

    A resume then needs nothing repeated: the run's overrides come first, the ones given now after
    them. Giving a key again with the same value is fine; a different value is refused, naming the
    keys, unless the key only changes speed or reporting (:data:`RESUME_MAY_CHANGE`). The resumed
    directory becomes the Hydra run directory, with ``.hydra`` left as the original run wrote it, so
    no new ``outputs/...`` directory is made and the resume's log goes to the run's own ``train.log``.
    Arguments are returned unchanged when they do not resume.
    """
    value = _resume_value(args)
    if value is None:
        return list(args)
    if "-m" in args or "--multirun" in args:
        raise ConfigError("resume continues one run: give resume=<run dir> without -m (one command per run)")
    run_dir = user_path(value).absolute()  # the resume runs where the run started (`run_cwd`)
    if run_dir.is_file():  # a shell's completion of the run's directory gives one of its files
        parent = run_dir.parent.parent if run_dir.parent.name == ".hydra" else run_dir.parent
        if checkpoint_path(parent).is_file() or (parent / ".hydra").is_dir():
            raise InputError(f"resume {run_dir}: a file; give the run's directory: resume={parent}")
        # Its directory is no run either: naming it would send the user to a second refusal.
        raise InputError(f"resume {run_dir}: a file, and not one of a run; give resume=<run dir>")
    if not run_dir.is_dir():
        raise InputError(f"resume {run_dir}: no such run directory")
    given = [arg for arg in args if _is_override(arg) and _key(arg) != "resume"]
    set_by_hydra = [_key(arg) for arg in given if _key(arg) in _RESUME_HYDRA]
    if set_by_hydra:
        raise ConfigError(
            f"resume writes into {run_dir} itself; drop {', '.join(set_by_hydra)} from the command line"
        )
    recorded = read_run_overrides(run_dir)
    if recorded is None and not checkpoint_path(run_dir).is_file() and not (run_dir / ".hydra").is_dir():
        if (run_dir / "multirun.yaml").is_file():  # a sweep's record: its runs are the job directories
            left = unfinished(run_dir)
            done = sorted((job.name for job in run_dir.iterdir() if (job / "metrics.json").is_file()),
                          key=lambda name: (len(name), name))  # fmt: skip
            which = f"not finished: {', '.join(left)}" if left else "every run it holds has finished"
            # The run named is one that exists: a sweep whose job 0 failed has no directory 0.
            example = f", resume={run_dir / (left or done)[0]}" if left or done else ""
            # A sweep killed outright never made its later jobs' directories: no resume can start them.
            if never := missing_jobs(run_dir):
                jobs = f"job{'s' if len(never) > 1 else ''} {', '.join(never)}"
                which += (
                    f"; {jobs} of its multirun.yaml have no run directory (never started, or failed before "
                    "a checkpoint), which no resume makes: run the sweep again into a new directory for them"
                )
            raise InputError(
                f"resume {run_dir}: a sweep's directory; resume continues one of its runs{example} ({which})"
            )
        raise InputError(f"resume {run_dir}: not a run directory (no .hydra/overrides.yaml, no checkpoint)")
    if recorded is None and not checkpoint_path(run_dir).is_file():
        raise InputError(
            f"resume {run_dir}: the run recorded neither its overrides nor a checkpoint (killed as it "
            "started?), so nothing says what it was; start it again"
        )
    if recorded is None and not given:
        raise InputError(f"resume {run_dir}: {NOT_A_COMMAND_RUN}")
    if problem := directory_problem(run_dir):  # now: Hydra's log file there would fail as a traceback
        raise InputError(f"resume {run_dir}: the run directory is not writable ({problem})")
    # The run's recorded output_dir is where it was started; it continues where it is now (moved or not).
    # One Hydra resolves (``${hydra:runtime.output_dir}/tok``) is not the run directory: it stays.
    original = [old for old in recorded or [] if _key(old) != "output_dir" or "${" in old]
    recorded_dirs = [old for old in recorded or [] if _key(old) == "output_dir"]
    given = _without_output_dir(given, run_dir, recorded_dirs)
    given_by_key = {_key(arg): arg for arg in given}
    conflicts = [
        f"{arg} conflicts with the run's {old}"
        for old in original
        if (arg := given_by_key.get(_key(old))) is not None
        and not _same_setting(arg, old)
        and not _may_change(_key(old))
    ]
    if recorded is not None:  # a run of the command: what it was given is all it was
        keys = {_key(old) for old in original}
        addable = ", ".join(sorted({*RESUME_MAY_CHANGE, "executor"}))
        conflicts += [
            f"{arg} is not one of the run's settings (a resume may add only: {addable})"
            for key, arg in given_by_key.items()
            if key not in keys and not _may_change(key) and not key.startswith("hydra.")
        ]
    if conflicts:
        raise ConfigError(
            f"cannot resume {run_dir}: {'; '.join(conflicts)} (resume=<dir> alone repeats its overrides; "
            "other settings need a new run, which takes what it shares with this one from the cache: the "
            "counts, and the merges of finished stages)"
        )
    kept = [old for old in original if _key(old) not in given_by_key]
    given = [_absolute_path(arg) for arg in given]
    flags = [arg for arg in args if not _is_override(arg)]  # Hydra's parser wants them before overrides
    return [
        *_recorded_flags(run_dir, flags), *flags, *kept, *given, f"resume={quote_override(str(run_dir))}",
        f"hydra.run.dir={quote_override(str(run_dir))}", "hydra.output_subdir=null",
    ]  # fmt: skip


def _without_output_dir(given: Sequence[str], run_dir: Path, recorded: Sequence[str]) -> list[str]:
    """A resume's overrides without ``output_dir``: the run continues in the directory resumed, so an
    ``output_dir`` naming it (or repeating the run's own) adds nothing, and one naming another directory
    is refused. A recorded one Hydra resolves stays the run's, and is compared as any setting."""
    if any("${" in old for old in recorded):
        return list(given)
    for arg in given:
        value = _value([arg], "output_dir")
        if _key(arg) == "output_dir" and arg not in recorded and not _same_dir(value or "", str(run_dir)):
            raise ConfigError(f"resume writes into {run_dir} itself; drop {arg}")
    return [arg for arg in given if _key(arg) != "output_dir"]


#: Settings a resume may give whose values are paths.
_PATH_KEYS = frozenset({"eval", "cache_dir"})


def _absolute_path(arg: str) -> str:
    """A path given now to a resume, made absolute here: the resume runs where the run was started
    (`run_cwd`), where a relative path would name another file."""
    key = _key(arg)
    value = _value([arg], key)
    if key not in _PATH_KEYS or value is None or "${" in value or user_path(value).is_absolute():
        return arg
    if value.startswith("[") and not arg.split("=", 1)[1].lstrip().startswith(("'", '"')):
        return arg  # a list, not a path: Hydra refuses it for this key as for a new run's
    return f"{arg.split('=', 1)[0]}={quote_override(str(Path(value).absolute()))}"


def _run_record(run_dir: Path) -> Any:
    """The run's ``.hydra/hydra.yaml`` (how Hydra was started for it), or None without a readable one."""
    path = run_dir / ".hydra" / "hydra.yaml"
    if not path.is_file():
        return None
    from omegaconf import OmegaConf  # loaded by the commands only: library runs never need it

    try:
        return OmegaConf.load(path).hydra
    except Exception:  # noqa: BLE001 - without it, a resume composes as the command line says
        return None


def _recorded_flags(run_dir: Path, given: Sequence[str]) -> list[str]:
    """``--config-dir`` and ``--config-name`` as the run was started with them, unless given again: a run
    composed from a user's own config directory (or primary config) composes from it when resumed."""
    record = _run_record(run_dir)
    if record is None:
        return []
    flags: list[str] = []
    named = {flag.split("=", 1)[0] for flag in given}
    user_dirs = [source.path for source in record.runtime.config_sources if source.provider == "command-line"]
    if user_dirs and not named & {"--config-dir", "-cd"}:
        flags += ["--config-dir", str(user_dirs[-1])]
    name = record.job.config_name
    if name and name != "train" and not named & {"--config-name", "-cn"}:
        flags += ["--config-name", str(name)]
    return flags


def run_cwd(args: Sequence[str]) -> Path | None:
    """The directory a resumed run was started in, when it is not this one: relative paths in its
    overrides (``data.paths=[corpus.txt]``) mean what they meant there."""
    value = _resume_value(args)
    record = None if value is None else _run_record(user_path(value))
    if record is None:
        return None
    cwd = Path(str(record.runtime.cwd))
    return cwd if cwd.is_dir() and cwd.resolve() != Path.cwd().resolve() else None


def resume_command(run_dir: Path, entry_point: Sequence[str]) -> str:
    """The shell command that continues ``run_dir`` (the rest comes from its own overrides)."""
    return shlex.join([*entry_point, f"resume={run_dir}"])


#: The descriptors of the run directories this process holds (:func:`run_dir_lock`).
_held_dirs: set[int] = set()


def _release_in_child() -> None:
    """Close, in a process forked from a run, its copies of the run directories' locked descriptors.

    An ``flock`` lasts while any descriptor of it is open, and a fork copies them all: a counting
    worker left behind by a run killed outright (SIGKILL, out of memory) would hold the run's
    directory, and every resume would be refused as another process training into it. The parent's
    own descriptor keeps the lock."""
    for fd in _held_dirs:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held_dirs.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_release_in_child)


@contextlib.contextmanager
def run_dir_lock(directory: Path) -> Iterator[None]:
    """Hold ``directory`` for one run: a second process training into it (the same resume started
    twice, or two runs given one ``output_dir``) is refused at once instead of writing the same files.
    The lock is the directory's own ``flock``, which the kernel drops when the process ends however it
    ends (processes forked from it do not keep it: :func:`_release_in_child`), so a killed run never
    leaves a stale lock; where there is no ``fcntl``, nothing is locked."""
    try:
        import fcntl  # reason: POSIX only; elsewhere nothing is locked
    except ImportError:
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    _held_dirs.add(fd)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(
                f"{directory}: another process is training into it; wait for it to end or stop it (its "
                "checkpoint keeps its merges)"
            ) from None
        except OSError:  # a file system without locks (some network mounts): the run goes on unheld
            pass
        yield
    finally:
        _held_dirs.discard(fd)
        os.close(fd)
