"""The console commands: ``superbpe-train``, ``-encode``, ``-evaluate``, ``-summarize``, ``-cache``.

Each command composes the configs shipped inside the package (``superbpe/conf``, which is the
repository's top-level ``conf/`` — a symlink in a checkout, real files in a wheel), so an installed
package behaves the same from any directory: same overrides, same ``-m`` sweeps, and every config
group that is added to ``conf/`` is picked up without a change here. Each command only turns the
composed config into arguments of a plain library function and reports user errors as one line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import functools
import inspect
import itertools
import json
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException, ValidationError

from superbpe import __version__
from superbpe.core.errors import ConfigError, InputError, SuperBPEError
from superbpe.core.util import atomic_write_text, counted, human_size, user_path
from superbpe.formats.checkpoints import checkpoint_path
from superbpe.formats.token_files import INDEX_NAME, EncodeResult, ShardedEncodeResult, sidecar_path
from superbpe.jobs.encode import StoppedOnceWritten, encode_corpus, writes_shards
from superbpe.jobs.evaluate import check_report_path, evaluate_dir, report
from superbpe.training.cache import (
    clear_cache,
    clear_leftovers,
    describe_cache,
    parse_age,
    resolve_cache_dir,
    verify_cache,
)
from superbpe.training.config import (
    SCHEDULE_KNOBS,
    EncodeConfig,
    EvaluateConfig,
    TrainConfig,
    dotted_keys,
    register_configs,
    to_dataclass,
)
from superbpe.training.directories import (
    claimed_dirs,
    existed_before,
    made_parents,
    place_run,
    quote_override,
    resume_args,
    resume_command,
    run_cwd,
)
from superbpe.training.run import TrainingInterrupted, run_training
from superbpe.training.summary import (
    check_plot_path,
    collect,
    missing_jobs,
    planned_jobs,
    plot,
    summarized_dir,
    table,
    timing_note,
    unfinished,
)

#: Errors a user can cause: reported as one line on stderr, exit code 1, no traceback.
USER_ERRORS = (SuperBPEError, OmegaConfBaseException, OSError)
CONFIG_DIR = Path(__file__).resolve().parent / "conf"

register_configs()


def config_dir() -> Path:
    """The directory of the shipped Hydra configs (``train.yaml``, ``encode.yaml``, groups)."""
    return CONFIG_DIR


def fail(exc: BaseException | str, where: str = "") -> None:
    """Print ``exc`` as one line (after ``where``, e.g. which job of a sweep) and exit 1."""
    print(f"error: {where}{_one_line(exc)}", file=sys.stderr)
    raise SystemExit(1)


def _one_line(exc: BaseException | str) -> str:
    message = _config_message(exc) if isinstance(exc, OmegaConfBaseException) else None
    message = message or " ".join(str(exc).split()) or type(exc).__name__
    # One of ours raised by a resolver (the run directory's): OmegaConf keeps only its text, behind this.
    return _OURS_IN_A_RESOLVER.sub("", message)


_OURS_IN_A_RESOLVER = re.compile(
    rf"^(?:{'|'.join(cls.__name__ for cls in (SuperBPEError, ConfigError, InputError))}) raised while "
    "resolving interpolation: "
)


def interrupted(outcome: str, terminated: bool = False) -> None:
    """Ctrl-C (or SIGTERM) of a command: one line saying what it left, and exit 130 (143 for SIGTERM),
    as a shell reports the signal, not a traceback from wherever the signal landed. ``terminated``: a
    SIGTERM the caller took before this module's handler was in place."""
    terminated = terminated or _terminated
    print(f"{'terminated' if terminated else 'interrupted'}: {outcome}")
    raise SystemExit(143 if terminated else 130) from None


_terminated = False


def _on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (a job scheduler's preemption, ``kill``) stops a command as Ctrl-C does: a run saves its
    merges and says how to resume, encode and evaluate leave no output. The default action killed the
    process on the spot, with neither."""
    global _terminated
    _terminated = True
    raise KeyboardInterrupt


def run_hydra(main: Callable[[], None], schema: type) -> None:
    """Call a ``@hydra.main`` function; Hydra's own errors (bad override, unknown group) as one line.

    Hydra prints those as several lines plus a hint about HYDRA_FULL_ERROR, and its suggestion for a
    misspelt key (``+key=...``) is itself refused here. With HYDRA_FULL_ERROR=1 set by the user,
    the full traceback is shown as Hydra would. SIGTERM is taken as Ctrl-C (:func:`_on_sigterm`).
    """
    signal.signal(signal.SIGTERM, _on_sigterm)
    warnings.showwarning = _warning_line
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        main()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra raise instead of printing, so it is caught below
    try:
        main()
        if _failed_jobs:  # each failed job said why; the sweep ran its other jobs first
            raise SweepJobFailed()
    except SweepJobFailed:  # raised here, or by a launcher whose jobs ran elsewhere (their logs say why)
        _remove_unused_claims()
        failed = "a job failed (its log says why)"
        if _failed_jobs:
            failed = f"{', '.join(_failed_jobs)} failed (said above)"
        if _sweeps and not any(_holds_a_job(Path(sweep)) for sweep in _sweeps):
            fail(f"sweep: {failed}; no job made a run, so the sweep left nothing to compare")
        fail(f"sweep: {failed}; its other jobs finished{_summarize_hint()}")
    except (HydraException, OmegaConfBaseException) as exc:
        _remove_unused_claims()  # a sweep refused before its first job had written its multirun.yaml
        fail(_hydra_message(exc, schema))
    except KeyboardInterrupt:  # in Hydra's own code, before or after the command's work (which says its own)
        interrupted("while Hydra set the command up")
    except ValueError as exc:  # Hydra's own checks that raise a plain ValueError: a line, no traceback
        if str(exc).startswith(_ONE_MODE):  # of its flags (-m with --cfg)
            fail(f"{exc}: --cfg job shows one run's config (drop -m and give one value per key)")
        if str(exc).startswith(_GROUP_NOT_NULL):  # of a group set to null (compat=null)
            _remove_unused_claims()
            given = [arg for arg in sys.argv[1:] if "=" in arg and not arg.startswith("-")
                     and arg.split("=", 1)[1].strip() == "null" and (CONFIG_DIR / _key_of(arg)).is_dir()]
            if given:
                fail(f"{', '.join(given)}: a config group takes one of its options (--help lists them); "
                     "leave it out for the default")  # fmt: skip
            fail(exc)
        raise


#: How Hydra's refusal of two of its modes at once (``-m --cfg job``) begins.
_ONE_MODE = "Only one of --run, --multirun, --cfg"
#: How Hydra's refusal of a config group given as null (``schedule=null``) begins.
_GROUP_NOT_NULL = "Config group override must be a string or a list"


def _key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _warning_line(message: Warning | str, category: type[Warning], *_: object, **__: object) -> None:
    """A library warning as one line of the command's output: Python's own form names the file and line
    of whatever frame called (Hydra's, for a command), which says nothing to a user."""
    print(f"warning: {message}", file=sys.stderr)


class SweepJobFailed(Exception):
    """A job of a ``-m`` sweep failed (its error is printed): the job's function returns (``_one_job``),
    so that Hydra's launcher runs the sweep's other jobs, where a ``SystemExit`` would end the process and
    silently drop the jobs after it, and a job that raised would print Hydra's own line beside ours."""


def _one_job(task: Callable[[DictConfig], None]) -> Callable[[DictConfig], None]:
    """``task`` as a job of a sweep: a failure it said (:func:`fail_job`) ends the job, not the sweep;
    :func:`run_hydra` fails the command once the sweep's jobs have run. Under a launcher that runs jobs
    in processes of their own (submitit), the failure is raised: it is the job's status there.

    ``hydra.job.chdir=true`` is undone for the job: every file a command writes is named by its config
    (the run directory, ``output``), so changing directory only made the relative paths it was given
    (``data.paths``, ``eval``, ``input``) name files that do not exist."""

    @functools.wraps(task)
    def job(cfg: DictConfig) -> None:
        hydra_cfg = HydraConfig.get()
        if hydra_cfg.job.chdir:  # paths on the command line name files where it was typed (Hydra chdirs back)
            os.chdir(hydra_cfg.runtime.cwd)
        try:
            task(cfg)
        except SweepJobFailed:
            if HydraConfig.get().launcher.get("_target_") != _IN_PROCESS_LAUNCHER:
                raise
        except BrokenPipeError:  # the result line's reader went away: Hydra would call that a failed job
            _reader_gone()

    return job


#: Hydra's default launcher, which runs a sweep's jobs one after another in this process.
_IN_PROCESS_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


_failed_jobs: list[str] = []

#: The directories of the training sweeps this process ran (one, unless a launcher splits it).
_sweeps: set[str] = set()


def _holds_a_job(sweep: Path) -> bool:
    """Whether a sweep's directory kept a job's run: one whose every job failed early is taken out, and
    then neither "its other jobs finished" nor a summary of it would be true."""
    return sweep.is_dir() and any(item.is_dir() for item in sweep.iterdir())


def _summarize_hint() -> str:
    """How to compare a training sweep's runs: nothing else said that ``superbpe-summarize`` exists."""
    if not _sweeps:
        return ""
    command = sys.argv[0]  # the script beside this one when run as one (``python scripts/train.py``)
    summarize = ["superbpe-summarize"]
    if command.endswith(".py"):
        summarize = ["python", str(Path(command).with_name("summarize.py"))]
    commands = [shlex.join([*summarize, sweep]) for sweep in sorted(_sweeps)]
    return f"; compare its runs with: {' ; '.join(commands)}"


def fail_job(exc: BaseException | str, job: str) -> None:
    """:func:`fail` for one run, or for a job of a sweep: print its error and let the sweep go on."""
    if not job:
        fail(exc)
    print(f"error: {job}{_one_line(exc)}", file=sys.stderr)
    _failed_jobs.append(f"job {HydraConfig.get().job.num}")  # its line above has the rest
    raise SweepJobFailed(job)


def _hydra_message(exc: BaseException, schema: type) -> str:
    """The first line of Hydra's message, and of its cause (OmegaConf says which key is wrong); for a
    key the command's ``schema`` lacks, the key it most likely meant."""
    message = _hydra_text(exc)
    unknown = _UNKNOWN_KEY.match(message)
    if not unknown:
        return message
    given = unknown.group(1)
    indices = re.findall(r"\.(\d+)(?=\.)", given)  # a list item's: matched as "*", shown with its index
    close = difflib.get_close_matches(re.sub(r"\.\d+(?=\.)", ".*", given), dotted_keys(schema), n=1)
    if not close:
        return message
    meant = re.sub(r"\.\*(?=\.)", lambda _: f".{indices.pop(0)}" if indices else ".0", close[0])
    return message + (f"; did you mean {meant}?" if meant != given else "")


def _hydra_text(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    override = getattr(exc, "override", None)  # an override Hydra's grammar cannot parse
    if isinstance(override, str):
        key, _, value = override.partition("=")
        quoted = f"\"{key}=['a','b']\"" if value.lstrip().startswith("[") else f"\"{key}='value'\""
        return f"cannot parse override {override!r} ({first}); quote the value: {quoted}"
    several = _SEVERAL_VALUES.match(first)
    if several:  # Hydra's hints for it (-m, a list, a quoted string) are on the lines dropped here
        key, _, value = several.group(1).partition("=")
        return (
            f"{key}={value} gives several values: add -m to run one job per value "
            f"(or write a list {key}=[{value}], or a string \"{key}='{value}'\")"
        )
    lines = str(exc).splitlines()
    if any(line.startswith("Available options") for line in lines):  # an unknown group option
        start = next(i for i, line in enumerate(lines) if line.startswith("Available options"))
        options = list(itertools.takewhile(lambda line: line.startswith("\t"), lines[start + 1 :]))
        return f"{first} (choose one of: {', '.join(option.strip() for option in options)})"
    cause = exc.__cause__
    prefix = "Error merging override "
    given = first.removeprefix(prefix).partition("=")[2] if first.startswith(prefix) else None
    beyond = _BEYOND_THE_LIST.match(first)
    if beyond and "Invalid type assigned: dict is not a subclass" in str(cause):  # OmegaConf made an item {}
        key, index = beyond.group(1), int(beyond.group(2))
        stages = " (schedule=bpe has one stage, schedule=superbpe two)" if key == "schedule.stages" else ""
        return f"{key}.{index} does not exist: {key} has fewer than {index + 1} items, counted from 0{stages}"
    if isinstance(cause, OmegaConfBaseException) and (message := _config_message(cause, given)):
        return message
    if cause is not None and str(cause).strip():
        first = f"{first.rstrip('.')}: {str(cause).strip().splitlines()[0]}"
    return first


_BEYOND_THE_LIST = re.compile(r"Error merging override ([\w.]+?)\.(\d+)\.[\w.]+=")
_SEVERAL_VALUES = re.compile(r"Ambiguous value for argument '(.*)'$")
_UNKNOWN_KEY = re.compile(r"Could not override '([\w.]+)': Key '[\w.]+' not in")


def _config_message(exc: OmegaConfBaseException, given: str | None = None) -> str | None:
    """What to write instead, for the config errors OmegaConf words for its own developers: a required
    key left out (``superbpe-encode`` without ``output=``), one value where a list goes
    (``data.paths=a.txt``, the value ``given``) and a list where one value goes (``eval=[a,b]``). None
    for the others, whose first line says it already."""
    key = getattr(exc, "full_key", None)
    if not key:
        return None
    if isinstance(exc, MissingMandatoryValue):
        return f"{key} is required: add {key}=..."
    if isinstance(exc, ValidationError) and "is not a ListConfig" in str(exc):
        return f"{key} takes a list: {key}=[{given or 'a'}] (several: {key}=[a,b])"
    if isinstance(exc, ValidationError) and str(exc).startswith("Cannot convert 'list'"):
        return f"{key} takes one value, not a list ({key}={given or '[...]'})"
    return None


#: What Hydra writes into a run directory (``.hydra``) or a sweep's (``multirun.yaml``) before any job.
_HYDRA_FILES = (".hydra", "multirun.yaml")


def _remove_unused_claims() -> None:
    """Take out the run and sweep directories this process claimed that hold only Hydra's files."""
    for directory in claimed_dirs():
        remove_if_only_logs(directory)


def remove_if_only_logs(run_dir: Path) -> None:
    """Delete a Hydra run directory that holds nothing but Hydra's own files (a job that failed early),
    and the directories made to hold it (``outputs/DATE``) once they are empty."""
    if not run_dir.is_dir():
        return
    items = list(run_dir.iterdir())
    if any(item.name not in _HYDRA_FILES and not item.name.endswith(".log") for item in items):
        return
    if existed_before(run_dir):  # the user's own directory: only what Hydra put there goes
        for item in items:
            if item.is_dir():
                shutil.rmtree(item, ignore_errors=True)
            else:
                item.unlink(missing_ok=True)
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    parents = made_parents(run_dir)
    for parent in [run_dir.parent] if parents is None else parents:
        if parent.is_dir() and not any(parent.iterdir()):
            with contextlib.suppress(OSError):  # another run just put something there
                parent.rmdir()


def setup_logging() -> None:
    """Log lines on stderr (the encode/evaluate configs turn Hydra's logging off)."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s", stream=sys.stderr)


def _version() -> str:
    return f"superbpe {__version__}"


def _answered_at_once(args: list[str]) -> bool:
    """``--version`` (Hydra would print its own version instead of ours)."""
    if "--version" in args:
        print(_version())
        return True
    return False


def _stdout_may_close(command: Callable[..., None]) -> Callable[..., None]:
    """A command whose reader goes away (``superbpe-train --help | head -1``) ends quietly, as a
    shell tool does, not with a BrokenPipeError traceback."""

    @functools.wraps(command)
    def run(*args: object, **kwargs: object) -> None:
        try:
            command(*args, **kwargs)
            sys.stdout.flush()
        except BrokenPipeError:
            _reader_gone()

    return run


def _reader_gone() -> NoReturn:
    """End quietly (exit 1) once stdout's reader has gone."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not fail
    raise SystemExit(1) from None


@_stdout_may_close
def train() -> None:
    """``superbpe-train``: one training run (or a sweep with ``-m``); see the package's ``conf/train.yaml``.

    ``resume=<run dir>`` alone continues a run: its own overrides are read back first.
    """
    if _answered_at_once(sys.argv[1:]):
        return
    if _wants_help(sys.argv[1:]):
        footer = ("-m key=a,b ...: a sweep (one run per combination, under multirun/; superbpe-summarize "
                  "<its dir> compares them); "
                  "--hydra-help: Hydra's own flags")
        try:  # a resume's config is the run's: its overrides and config directory
            args = resume_args(sys.argv[1:])
        except USER_ERRORS as exc:
            fail(exc)
        print_help("train", TrainConfig, train.__doc__ or "", args, footer)
        return
    _check_one_option_per_group(sys.argv[1:])
    _check_bpe_beside_schedule_knobs(sys.argv[1:])
    try:
        started_in = run_cwd(sys.argv[1:])
        sys.argv[1:] = place_run(resume_args(sys.argv[1:]))
    except USER_ERRORS as exc:
        fail(exc)
    if started_in is not None:  # relative paths among the run's overrides mean what they meant there
        print(f"resuming in {started_in}, where the run was started", file=sys.stderr)
        os.chdir(started_in)
    run_hydra(_train, TrainConfig)
    if hint := _summarize_hint():
        print(f"sweep finished{hint}")


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
@_one_job
def _train(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if HydraConfig.get().mode == RunMode.MULTIRUN:  # named when the sweep ends, with how to compare its runs
        _sweeps.add(str(Path(HydraConfig.get().sweep.dir).absolute()))
    try:  # an interpolation that cannot be resolved (output_dir=${nope}) fails here, as any setting
        output_dir = Path(cfg.get("output_dir") or run_dir)
    except USER_ERRORS as exc:
        remove_if_only_logs(run_dir)
        fail_job(exc, _sweep_job())
    # A checkpoint there before the run is another run's (refused, naming how to resume it), not this one's.
    checkpointed_before = checkpoint_path(user_path(output_dir)).is_file()
    try:
        result = run_training(to_dataclass(cfg, TrainConfig), run_dir=run_dir)
    except USER_ERRORS as exc:
        job = _sweep_job()
        if cfg.get("resume"):  # the user has the resume command; what failed may be the resume itself
            fail_job(exc, job)
        remove_if_only_logs(run_dir)
        fail_job(exc if checkpointed_before else _with_resume_hint(exc, output_dir), job)
    except TrainingInterrupted as stop:
        resume = resume_command(stop.output_dir, _entry_point())
        outcome = f"{_sweep_job()}{stop}; continue with: {resume}{_jobs_not_run()}"
        _into_run_log(outcome)
        interrupted(outcome)
    except KeyboardInterrupt:  # before training started: nothing to keep
        if not cfg.get("resume"):
            remove_if_only_logs(run_dir)
        interrupted(f"{_sweep_job()}before training started, nothing kept{_jobs_not_run()}")
    print(f"tokenizer: {Path(result.output_dir).resolve()}")


def _sweep_job() -> str:
    """Which job of a ``-m`` sweep failed (``sweep job 1 (vocab_size=100): ``), or nothing for one run:
    the jobs before it ran, so the error must say which combination it was."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return ""
    return f"sweep job {hydra_cfg.job.num} ({' '.join(hydra_cfg.overrides.task)}): "


def _into_run_log(outcome: str) -> None:
    """An interrupted run's outcome in its ``train.log`` as well (the terminal gets it from
    :func:`interrupted`): the log is the run's record, and ended mid-stage without a word."""
    word = "terminated" if _terminated else "interrupted"
    record = logging.LogRecord("superbpe", logging.WARNING, __file__, 0, f"{word}: {outcome}", None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _check_not_written_by_this_sweep(output: Path, written: Callable[[Path], Path], example: str) -> None:
    """In a ``-m`` sweep, an output an earlier job of it wrote (the file ``written`` names: a token file's
    sidecar, a report) is refused: every job would write the same file (it is named the same for all),
    and only the last one's would be left. ``example``: a name with the job's number, for the message."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return
    started = Path(hydra_cfg.sweep.dir) / "multirun.yaml"  # written as the sweep starts
    if not (started.is_file() and written(output).is_file()):
        return
    if written(output).stat().st_mtime >= started.stat().st_mtime:
        raise ConfigError(
            f"output {output} was written by an earlier job of this sweep; give each job its own, e.g. "
            f"'output={example}'"
        )


def _jobs_not_run() -> str:
    """For a sweep stopped by Ctrl-C: that the jobs after this one did not run (not lost silently)."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return ""
    return jobs_not_run_note(Path(hydra_cfg.sweep.dir), hydra_cfg.job.num)


def jobs_not_run_note(sweep_dir: Path, job_num: int) -> str:
    """What a sweep stopped in job ``job_num`` leaves unrun: the jobs its record plans after it, or
    nothing when it is the last (a note of jobs that do not exist would send the user looking for
    them); when the record does not say how many there are, the jobs after it, unnumbered."""
    planned = planned_jobs(sweep_dir)
    if planned is not None and job_num + 1 >= planned:
        return ""
    first, last = job_num + 1, (planned or 0) - 1
    which = f"jobs after job {job_num}" if planned is None else (
        f"job {first}" if first == last else f"jobs {first} to {last}"
    )  # fmt: skip
    return (
        f"; the sweep's {which} did not run (a sweep is not resumed: continue this job with "
        "resume=<its directory>, and give the combinations left to a new -m with another hydra.sweep.dir)"
    )


def _with_resume_hint(exc: BaseException, output_dir: Path) -> str:
    """The error, and how to continue when the failed run left a checkpoint (its merges are kept)."""
    message = _one_line(exc)
    if not checkpoint_path(user_path(output_dir)).is_file():
        return message
    command = resume_command(output_dir, _entry_point())
    return f"{message} (the merges so far are kept; continue with: {command})"


def _entry_point() -> list[str]:
    """How this command was started: ``python scripts/train.py`` or ``superbpe-train``."""
    command = sys.argv[0]
    return ["python", command] if command.endswith(".py") else [Path(command).name]


@_stdout_may_close
def encode() -> None:
    """``superbpe-encode``: a corpus into a flat uint16/uint32 token file (+ JSON sidecar)."""
    if _answered_at_once(sys.argv[1:]):
        return
    if _wants_help(sys.argv[1:]):
        print_help("encode", EncodeConfig, encode.__doc__ or "", sys.argv[1:])
        return
    _check_compat_overrides(sys.argv[1:])
    _check_one_option_per_group(sys.argv[1:])
    try:
        run_hydra(_encode, EncodeConfig)
    finally:
        _remove_unused_claims()  # a sweep's directory, which holds only Hydra's record of it


@_stdout_may_close
def evaluate() -> None:
    """``superbpe-evaluate``: bytes per token (and tokens per document) on held-out text."""
    if _answered_at_once(sys.argv[1:]):
        return
    if _wants_help(sys.argv[1:]):
        print_help("evaluate", EvaluateConfig, evaluate.__doc__ or "", sys.argv[1:])
        return
    _check_compat_overrides(sys.argv[1:])
    _check_one_option_per_group(sys.argv[1:])
    try:
        run_hydra(_evaluate, EvaluateConfig)
    finally:
        _remove_unused_claims()  # a sweep's directory, which holds only Hydra's record of it


def _wants_help(args: list[str]) -> bool:
    return "--help" in args or "-h" in args


def print_help(config_name: str, schema: type, summary: str, args: list[str], footer: str = "") -> None:
    """``--help``: the config groups this command reads (with their options) and its composed config.

    Why not Hydra's own help: it lists every group in the shared config directory, so the encode and
    evaluate commands offered the training groups (schedule, pretokenizer, data) that they never read,
    and training offered the group its ``compat`` preset selects by itself (``compat_train``). The
    groups shown here are the command's schema fields that have a directory in ``conf/``.
    """
    flags, overrides = _hydra_flags(args)
    user_dir = flags.get("--config-dir")
    config_name = flags.get("--config-name", config_name)
    # Composed as Hydra does for the command, the user's directory searched too. The compose API looks
    # for the primary config in its own directory only: the one that holds it is that directory.
    primary, searched = CONFIG_DIR, []
    if user_dir:
        own = user_path(user_dir).absolute()
        primary, other = (own, CONFIG_DIR) if (own / f"{config_name}.yaml").is_file() else (CONFIG_DIR, own)
        searched = [f"hydra.searchpath=[{quote_override(f'file://{other}')}]"]
    try:
        with initialize_config_dir(config_dir=str(primary), version_base="1.3"):
            cfg = compose(config_name, overrides=[*searched, *overrides])
    except Exception as exc:  # a bad override: say so, as a run would
        fail(_hydra_message(exc, schema))
    dirs = [CONFIG_DIR, *([user_path(user_dir)] if user_dir else [])]
    groups = [f.name for f in dataclasses.fields(schema) if any((d / f.name).is_dir() for d in dirs)]
    lines = [inspect.cleandoc(summary).replace("``", ""), "", "== Configuration groups ==",
             "Compose your configuration from those groups (group=option)", ""]
    for group in groups:
        options = sorted({path.stem for d in dirs for path in (d / group).glob("*.yaml")})
        lines.append(f"{group}: {', '.join(options)}")
    lines += ["", "== Config ==", "Override anything in the config (foo.bar=value)", "",
              OmegaConf.to_yaml(cfg, resolve=False).rstrip()]
    if footer:
        lines += ["", footer]
    print("\n".join(lines))


#: Hydra's flags that take a value (``--config-dir DIR`` or ``--config-dir=DIR``), by their long names.
_VALUE_FLAGS = {
    "--config-dir": "--config-dir", "-cd": "--config-dir", "--config-name": "--config-name",
    "-cn": "--config-name", "--config-path": "--config-path", "-cp": "--config-path", "--cfg": "--cfg",
    "-c": "--cfg", "--package": "--package", "-p": "--package",
}  # fmt: skip


def _hydra_flags(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """The values of Hydra's flags among ``args`` (by long name), and the overrides: a flag's value is no
    override (``--config-dir DIR`` read as the override ``DIR`` was refused as one that cannot be parsed)."""
    flags: dict[str, str] = {}
    overrides: list[str] = []
    pending: str | None = None
    for arg in args:
        if pending is not None:
            flags[pending], pending = arg, None
        elif arg.startswith("-"):
            name, has_value, value = arg.partition("=")
            if name in _VALUE_FLAGS:
                if has_value:
                    flags[_VALUE_FLAGS[name]] = value
                else:
                    pending = _VALUE_FLAGS[name]
        else:
            overrides.append(arg)
    return flags, overrides


def _check_one_option_per_group(args: list[str]) -> None:
    """Refuse a list given for a config group (``schedule=[bpe,superbpe]``): Hydra merges every option
    listed into one config, so a run composed of both schedules' keys started without a word. A group
    is a directory of the shipped configs, or of the user's ``--config-dir``."""
    flags, overrides = _hydra_flags(args)
    dirs = [CONFIG_DIR, *([user_path(flags["--config-dir"])] if "--config-dir" in flags else [])]
    for override in overrides:
        key, _, value = override.partition("=")
        group = key.lstrip("+~").split("@", 1)[0]
        if value.strip().startswith("[") and group and any((d / group).is_dir() for d in dirs):
            options = value.strip().strip("[]")
            fail(f"{override}: a config group takes one option ({group}=<option>); "
                 f"-m {group}={options} sweeps them, one run each")  # fmt: skip


def _check_bpe_beside_schedule_knobs(args: list[str]) -> None:
    """Refuse a sweep over ``schedule=bpe`` and another schedule that sets a knob only SuperBPE reads
    (``-m schedule=bpe,superbpe schedule.transition=0.5,0.8``), before any job runs: each bpe job would
    fail on the knob after the others ran. Letting bpe jobs drop it would train the same baseline once per
    value, as rows the summary cannot tell apart; two sweeps into one directory compare them instead."""
    if "-m" not in args and "--multirun" not in args:
        return
    from hydra.core.override_parser.overrides_parser import OverridesParser  # reason: Hydra's grammar

    _, given = _hydra_flags(args)
    try:
        overrides = OverridesParser.create().parse_overrides(given)
    except HydraException:  # Hydra refuses it when the command runs, in its own words
        return
    schedules: list[str] = []
    knobs: list[str] = []
    for override, text in zip(overrides, given, strict=True):
        key = override.get_key_element().lstrip("+~")
        if key == "schedule":
            schedules = list(override.sweep_string_iterator()) if override.is_sweep_override() else []
        elif key.startswith("schedule.") and key.removeprefix("schedule.") in SCHEDULE_KNOBS:
            knobs.append(text)
    if "bpe" not in schedules or len(schedules) < 2 or not knobs:
        return
    rest = [arg for arg in args if arg not in ("-m", "--multirun", *knobs)
            and _key_of(arg) not in ("schedule", _SWEEP_DIR)]  # fmt: skip
    given_dirs = [arg.partition("=")[2] for arg in args if _key_of(arg) == _SWEEP_DIR]
    base = given_dirs[-1] if given_dirs and given_dirs[-1].strip() else "DIR"
    train, superbpe = _entry_point(), ",".join(name for name in schedules if name != "bpe")
    summarize = ["superbpe-summarize"]
    if sys.argv[0].endswith(".py"):  # the script beside this one, as the sweep's own hint names it
        summarize = ["python", str(Path(sys.argv[0]).with_name("summarize.py"))]
    sweep = shlex.join([*train, "-m", f"schedule={superbpe}", *knobs, *rest, f"{_SWEEP_DIR}={base}"])
    baseline = shlex.join([*train, "-m", "schedule=bpe", *rest, f"{_SWEEP_DIR}={base}/bpe"])
    fail(
        f"schedule=bpe takes no {', '.join(_key_of(knob) for knob in knobs)}, so the sweep's bpe jobs "
        f"would fail: sweep the BPE baseline apart into the same directory ({sweep}; {baseline}), then "
        f"{shlex.join([*summarize, base])} compares them all"
    )


#: The key of a sweep's directory: the hint of :func:`_check_bpe_beside_schedule_knobs` reuses the one given.
_SWEEP_DIR = "hydra.sweep.dir"


def _check_compat_overrides(args: list[str]) -> None:
    """``compat.KEY=...`` needs a preset: encode/evaluate have none by default (the directory decides),
    and OmegaConf fails on setting a key of a group that is not selected with an assertion, not a message."""
    keys = [arg.split("=", 1)[0].lstrip("+~") for arg in args if "=" in arg]
    if any(key.startswith("compat.") for key in keys) and "compat" not in keys:
        fail("compat.<key> changes a preset: choose it first (compat=official or compat=superbpe)")


def _check_given(args: object, *keys: str) -> None:
    """Refuse a required path left empty (``output=``, an unset ``$OUT``): it would name the working
    directory, whose files would then be read, or written beside."""
    for key in keys:
        value = getattr(args, key)
        values = [value] if isinstance(value, str) else list(value or [])
        if not values or any(not str(v).strip() for v in values):
            raise ConfigError(f"{key} is empty: give {key}=PATH")


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="encode")
@_one_job
def _encode(cfg: DictConfig) -> None:
    setup_logging()
    sharded = False
    try:
        args = to_dataclass(cfg, EncodeConfig)
        _check_given(args, "tokenizer", "input", "output")
        sharded = writes_shards(args.output, args.executor)
        output = user_path(args.output)
        if sharded:  # a directory of shards: its index is written last
            _check_not_written_by_this_sweep(output, _index_path, "tokens_${hydra:job.num}/")
        else:
            _check_not_written_by_this_sweep(output, sidecar_path, "tokens_${hydra:job.num}.bin")
        result = encode_corpus(
            args.tokenizer,
            args.input,
            args.output,
            separator=args.separator,
            workers=args.workers,
            chunk_bytes=args.chunk_bytes,
            text_field=args.text_field,
            errors=args.errors,
            engine=args.engine.name,
            progress=args.progress,
            executor=args.executor,
            compat=args.compat,
            dtype=args.dtype,
        )
    except USER_ERRORS as exc:
        fail(exc)
    except StoppedOnceWritten as stop:  # as the files went into place: they are complete
        _encoded_line(stop.result)
        interrupted("once the token file and its sidecar were complete")
    except KeyboardInterrupt:
        interrupted(_NOTHING_SHARDED if sharded else _NOTHING_FLAT)
    _encoded_line(result)


#: What a stopped encoding leaves: nothing (a token file is written aside and renamed into place; the
#: shards of a sharded one written so far are removed).
_NOTHING_FLAT = "nothing written: the token file appears only when it is complete"
_NOTHING_SHARDED = (
    "nothing written: the shards encoded so far were removed (a directory of shards appears only when every "
    "shard and its index.json are complete)"
)


def _index_path(directory: Path) -> Path:
    """The file a sharded encoding writes last into ``directory``: an earlier job of a sweep finished it."""
    return directory / INDEX_NAME


def _encoded_line(result: EncodeResult) -> None:
    """The result line: a sharded output says it is a directory of shard files (``executor=ray`` makes
    one of ``output=tokens.bin`` too), which ``open_tokens`` refuses, not one token file."""
    where, files = result.output, ""
    if isinstance(result, ShardedEncodeResult):
        where = f"{result.output}{os.sep}"
        shards = counted(len(result.shards), "shard file")
        files = f" in {shards} and {INDEX_NAME} (read with superbpe.open_shards)"
    documents = counted(result.documents, "document")
    print(f"{where}: {counted(result.tokens, 'token')} ({result.dtype}), {documents}{files}")


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="evaluate")
@_one_job
def _evaluate(cfg: DictConfig) -> None:
    setup_logging()
    try:
        args = to_dataclass(cfg, EvaluateConfig)
        _check_given(args, "tokenizer", "input")
        if args.output is not None:
            _check_given(args, "output")
            check_report_path(args.output, args.input, args.tokenizer)
            output = user_path(args.output)
            _check_not_written_by_this_sweep(output, Path, "eval_${hydra:job.num}.json")
        result = evaluate_dir(
            args.tokenizer,
            args.input,
            separator=args.separator,
            text_field=args.text_field,
            errors=args.errors,
            engine=args.engine.name,
            executor=args.executor,
            compat=args.compat,
            workers=args.workers,
            progress=args.progress,
        )
        if args.output:
            written = report(result, args.tokenizer, args.separator)  # at the path check_report_path checked
            atomic_write_text(user_path(args.output), json.dumps(written, indent=2) + "\n")
    except USER_ERRORS as exc:
        fail(exc)
    except KeyboardInterrupt:
        interrupted("nothing written")
    print(
        f"{_job_label()}bytes/token {result.bytes_per_token:.4f}  "
        f"tokens/document {result.tokens_per_document:.2f}  "
        f"({counted(result.bytes, 'byte')}, {counted(result.tokens, 'token')}, "
        f"{counted(result.documents, 'document')})"
    )


def _job_label() -> str:
    """In a ``-m`` sweep, which job a result line is of: its number and the values it was given for the
    keys the command line sweeps. The lines of a sweep over tokenizers otherwise read alike, in an order
    only Hydra's log on stderr gave."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # reason: Hydra's grammar

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return ""
    try:
        parsed = OverridesParser.create().parse_overrides(_hydra_flags(sys.argv[1:])[1])
    except HydraException:  # not this process's command line (a launcher's job): the number alone
        parsed = []
    keys = {override.get_key_element() for override in parsed if override.is_sweep_override()}
    swept = [override for override in hydra_cfg.overrides.task if override.split("=", 1)[0] in keys]
    values = f" ({' '.join(swept)})" if swept else ""
    return f"job {hydra_cfg.job.num}{values}: "


@_stdout_may_close
def summarize(argv: list[str] | None = None) -> None:
    """``superbpe-summarize SWEEP_DIR``: a table of a sweep's runs and a bytes/token plot."""
    parser = argparse.ArgumentParser(prog="superbpe-summarize", description=summarize.__doc__)
    parser.add_argument("sweep_dir", type=_given_path,
                        help="a multirun directory (or any directory of runs; a file of a run names the run)")
    parser.add_argument("--plot", type=Path, default=None,
                        help="the plot's path, its type by suffix: .png, .pdf, .svg, ... "
                        "(default: <sweep_dir>/summary.png)")
    parser.add_argument("--no-plot", action="store_true", help="the table only (no matplotlib needed)")
    parser.add_argument("--version", action="version", version=_version())
    args = parser.parse_args(argv)
    try:
        args.sweep_dir = summarized_dir(args.sweep_dir)
        rows = collect(args.sweep_dir)
        plot_path = args.plot or args.sweep_dir / "summary.png"
        drawn = not args.no_plot and _has_matplotlib()
        if drawn:
            check_plot_path(plot_path)
        print(table(rows))
        if note := timing_note(rows):
            print(note)
        left = unfinished(args.sweep_dir)
        if left:
            print(f"not finished (no metrics.json, no row): {', '.join(left)}")
        if missing := missing_jobs(args.sweep_dir):
            print(f"no run directory (failed before a checkpoint, or never started): {', '.join(missing)}")
        if args.no_plot:
            return
        if not drawn:  # the table is the result; the plot is an extra
            print('plot: none (needs matplotlib: pip install "superbpe[plot]"; --no-plot skips it)')
            return
        written = plot(rows, plot_path)
    except BrokenPipeError:  # the reader of the table went away: ends quietly (`_stdout_may_close`)
        raise
    except USER_ERRORS as exc:
        fail(exc)
    except KeyboardInterrupt:  # commands.py would say it came before the command started
        interrupted("the summary stopped before its end (a plot is written whole or not at all)")
    print(f"plot: {written}" if written else "plot: none (no run has eval results; set eval=<file>)")


def _given_path(text: str) -> Path:
    """A path argument, refused when empty (an unset ``$SWEEP``): ``Path("")`` is the working directory,
    whose runs, anywhere below it, would be summarized instead."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path: give the directory of a sweep or of a run")
    return Path(text)


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@_stdout_may_close
def cache(argv: list[str] | None = None) -> None:
    """``superbpe-cache list|verify|clear``: what the run cache holds, checking its entries, and removing
    (old) entries."""
    parser = argparse.ArgumentParser(prog="superbpe-cache", description=cache.__doc__)
    parser.add_argument("--cache-dir", default=None,
                        help="the cache directory (default: $SUPERBPE_CACHE_DIR, else ~/.cache/superbpe)")
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="entries with size and age, newest first, and the total")
    verify = commands.add_parser(
        "verify", help="check every entry's checksum and name the bad ones (exit status 1 when one is kept)"
    )
    clear = commands.add_parser("clear", help="remove entries (all, or those not used for a while)")
    for command in (listing, verify, clear):  # also after the command: `superbpe-cache list --cache-dir DIR`
        command.add_argument("--cache-dir", default=argparse.SUPPRESS, help="as before the command")
    verify.add_argument("--remove", action="store_true", help="remove the bad entries (runs would)")
    clear.add_argument("--older-than", default=None, metavar="AGE",
                       help="only entries unused for longer than AGE, unit required: e.g. 30m, 12h, 7d")
    args = parser.parse_args(argv)
    try:
        if args.cache_dir is not None and not args.cache_dir.strip():  # an unset $VAR: not the default cache
            raise ConfigError("--cache-dir is empty: give a directory, or leave it out for the default "
                              "($SUPERBPE_CACHE_DIR, else ~/.cache/superbpe)")  # fmt: skip
        directory = resolve_cache_dir(args.cache_dir)
        if directory.exists() and not directory.is_dir():
            raise InputError(f"cache directory {directory} is a file")
        # A mistyped --cache-dir reads as an empty cache: said, beside the count of nothing.
        absent = "" if directory.exists() else " (no such directory)"
        if args.command == "list":
            print(describe_cache(directory) + absent)
        elif args.command == "verify":
            checked, bad = verify_cache(directory, remove=args.remove)
            for found in bad:
                gone = " (removed)" if found.removed else ""
                print(f"bad {found.entry.kind} entry {found.entry.path}: {found.problem}{gone}")
            kept = sum(not found.removed for found in bad)
            also = ""
            if kept:
                also = f", {kept} kept (a job holds them)" if args.remove else "; --remove removes them"
            entries = counted(checked, "entry", "entries")
            print(f"{entries} checked in {directory}{absent}: {len(bad)} bad{also}")
            if kept:
                raise SystemExit(1)
        else:
            older = parse_age(args.older_than) if args.older_than else None
            removed, freed = clear_cache(directory, older_than_seconds=older)
            files, left = clear_leftovers(directory)
            also = ""
            if files:
                also = f" and {counted(files, 'file')} left by killed jobs ({human_size(left, 'B')})"
            entries = counted(removed, "entry", "entries")
            print(f"removed {entries} ({human_size(freed, 'B')}){also} from {directory}{absent}")
    except BrokenPipeError:  # an OSError, but no user error: the reader went (`_stdout_may_close`)
        raise
    except USER_ERRORS as exc:
        fail(exc)
    except KeyboardInterrupt:  # commands.py would say it came before the command started
        removing = args.command == "clear" or getattr(args, "remove", False)
        kept = " (the entries removed so far are gone, the others kept)" if removing else ""
        interrupted(f"{args.command} stopped before its end{kept}")
