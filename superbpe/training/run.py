"""``run_training``: one training run from a :class:`~superbpe.training.config.TrainConfig`, no Hydra needed.

Order matters for the "nothing partial left behind" promise: everything that can be checked (config,
schedule, source tokenizer, corpus paths, output directory) is checked before the first byte is
written. Then each stage counts (or reuses cached counts), replays the merges so far and trains,
checkpointing as it goes; the tokenizer files and ``metrics.json`` are written last, each atomically.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from superbpe.core.compat import DEFAULT as DEFAULT_COMPAT
from superbpe.core.compat import CompatConfig, check_compat, encoding_pretokenizer
from superbpe.core.counts import PieceCounts, check_errors_mode
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.memory import (
    CountCeiling,
    MemoryLimitError,
    StageMemory,
    check_fits,
    parse_size,
    refused_stage,
)
from superbpe.core.pretokenize import SpecialSplitter, special_token_list
from superbpe.core.progress import StageStats, build_reporter, current_rss_bytes, measure, task
from superbpe.core.rules import MergeRules
from superbpe.core.sources import (
    check_not_empty,
    chunk_documents,
    corpus_size,
    fingerprint_of_files,
    input_files_state,
    is_gzipped,
    is_jsonl,
    is_table,
    iter_chunks,
    resolve_inputs,
)
from superbpe.core.types import Merge
from superbpe.core.util import (
    counted,
    missing_dirs,
    peak_rss_bytes,
    release_freed_memory,
    remove_empty_dirs,
    remove_stale_temps,
    user_path,
)
from superbpe.core.vocab import (
    alphabet_order,
    build_vocab,
    check_special_tokens,
    hf_vocab,
    merge_budget,
    most_seen_merges,
    reserved_tokens,
)
from superbpe.engines.interface import Engine, get_engine
from superbpe.formats.checkpoints import (
    Checkpoint,
    Checkpointer,
    check_checkpoint_intervals,
    check_compatible,
    checkpoint_path,
    load_checkpoint,
    recorded_cwd,
)
from superbpe.formats.gpt2 import MERGES_FILE, VOCAB_FILE
from superbpe.formats.hf import HF_CONFIG_FILE, HF_FILE, HF_SPECIAL_MAP_FILE, hf_split_problem, resolve_roles
from superbpe.formats.manifest import MANIFEST_FILE
from superbpe.formats.tiktoken_files import (
    TIKTOKEN_FILE,
    TIKTOKEN_META_FILE,
    check_compat_for_tiktoken,
    check_specials_for_tiktoken,
    tiktoken_pattern,
    tiktoken_split_problem,
)
from superbpe.formats.token_files import check_not_token_files
from superbpe.formats.tokenizer_dir import save_tokenizer_dir, tokenizer_file_digests
from superbpe.jobs.count import count_corpus, sampled_share
from superbpe.jobs.evaluate import SEPARATOR, evaluate_dir
from superbpe.jobs.executors import check_executor
from superbpe.jobs.shards import check_sampleable
from superbpe.training.cache import (
    CachedMerges,
    RunCache,
    cache_key,
    counts_not_worth_caching,
    token_prefix,
    tokens_made,
)
from superbpe.training.config import TrainConfig, check_schedule_knobs, check_shape
from superbpe.training.directories import NOT_A_COMMAND_RUN, check_nothing_to_overwrite, run_dir_lock
from superbpe.training.metrics import build_metrics, write_metrics
from superbpe.training.stages import (
    SourceMerges,
    StagePlan,
    apply_source,
    check_source_compat,
    describe,
    load_source,
    merges_fingerprint,
    plan_stages,
    resolve_pretokenizer,
    rules_spec,
)

log = logging.getLogger("superbpe")
METRICS_FILE = "metrics.json"


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run, after its merges so far were checkpointed; ``output_dir`` resumes it."""

    def __init__(self, output_dir: Path, merges: int) -> None:
        super().__init__(f"checkpoint of {merges} merges saved in {output_dir}")
        self.output_dir = output_dir
        self.merges = merges


@dataclass
class RunResult:
    output_dir: Path
    merges: list[Merge]
    stage_ends: list[int]
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class _Job:
    """A validated run: everything resolved, nothing written yet."""

    cfg: TrainConfig
    specials: list[str]
    total_merges: int
    plans: list[StagePlan]
    source: SourceMerges | None
    source_merges: tuple[Merge, ...]
    paths: list[Path]
    files: list[list[Any]]  # each corpus file's [path, size, mtime_ns] (sources.input_files_state)
    fingerprint: str
    engine: Engine
    output_dir: Path
    eval_path: Path | None
    cache: RunCache
    eval_bytes: frozenset[int] = frozenset()  # with compat.alphabet "seen": the bytes the eval file holds
    compat: CompatConfig = field(default_factory=CompatConfig)
    # compat.alphabet "seen": each trained stage's alphabet (bytes in HF's order), by stage index.
    alphabets: dict[int, bytes] = field(default_factory=dict)

    def compat_config(self) -> dict[str, Any]:
        """The settings that decide the merges; a resume must match them exactly."""
        extra = {} if self.compat == DEFAULT_COMPAT else {"compat": asdict(self.compat)}
        return {
            **extra,
            "vocab_size": self.cfg.vocab_size,
            "special_tokens": self.specials,
            "stages": [plan.spec() for plan in self.plans],
            "source": None if self.source is None else merges_fingerprint(self.source_merges),
            "data": {
                "paths": [str(p.resolve()) for p in self.paths],
                "text_field": self.cfg.data.text_field,
                "errors": self.cfg.data.errors,
            },
        }


def run_training(cfg: TrainConfig, *, run_dir: str | os.PathLike[str] | None = None) -> RunResult:
    """Train the configured schedule into ``cfg.output_dir`` (or ``run_dir``); resume when ``cfg.resume``.

    A run that fails before its first checkpoint removes the output directory it created; one that
    fails later keeps its checkpoint, to resume from.
    """
    check_shape(cfg)
    check_schedule_knobs(cfg.schedule)
    release_freed_memory()
    job = prepare(cfg, run_dir)
    try:
        with run_dir_lock(job.output_dir):
            if cfg.resume:  # only now: a temp file may be another run's, being written
                for stale in remove_stale_temps(job.output_dir):
                    log.info("removed %s, left by a run killed while writing", stale.name)
            return _run(job)
    except BaseException:
        _remove_if_unused(job.output_dir)
        raise
    finally:
        _made_dirs.pop(job.output_dir, None)


def _run(job: _Job) -> RunResult:
    cfg = job.cfg
    log.info(
        "training %s%d merges (vocab %d) on %d file(s): %s",
        "at most " if job.compat.alphabet == "seen" else "",  # the seen bytes, not all 256, take ids
        job.total_merges,
        cfg.vocab_size,
        len(job.paths),
        describe(job.plans),
    )
    checkpoint = _initial_checkpoint(job)
    finished = _finished_result(job, checkpoint)
    if finished is not None:
        return finished
    checkpointer = Checkpointer(
        job.output_dir, checkpoint, cfg.checkpoint.every_merges, cfg.checkpoint.every_seconds, job.engine.name
    )
    start = time.monotonic()
    try:
        with _CountAhead(job) as ahead:
            try:
                for plan in job.plans[checkpoint.stage :] if not checkpoint.done else []:
                    _run_stage(job, plan, checkpointer, ahead)
            except KeyboardInterrupt:  # saved before waiting for a count running ahead
                raise TrainingInterrupted(job.output_dir, checkpointer.save_latest()) from None
        merges = list(checkpoint.merges)
        metrics = _write_outputs(job, checkpoint, time.monotonic() - start)
        job.cache.trim()
    except TrainingInterrupted:
        raise
    except KeyboardInterrupt:  # all merges are checkpointed already; the outputs are rewritten on resume
        raise TrainingInterrupted(job.output_dir, len(checkpoint.merges)) from None
    if not checkpoint.done:
        checkpointer.finish_run()
    log.info("tokenizer written to %s", job.output_dir)
    _log_eval(metrics.get("eval"))
    return RunResult(job.output_dir, merges, list(checkpoint.stage_ends), metrics)


def _log_eval(evaluation: dict[str, Any] | None) -> None:
    """The run's result on held-out text, last in the log (where a user looks when the run ends)."""
    if evaluation:
        counts = ", ".join(counted(evaluation[key], key[:-1]) for key in ("bytes", "tokens", "documents"))
        log.info("eval: %.4f bytes/token (%s)", evaluation["bytes_per_token"], counts)


def prepare(cfg: TrainConfig, run_dir: str | os.PathLike[str] | None = None) -> _Job:
    """Check everything that can be checked before any output exists."""
    check_checkpoint_intervals(cfg.checkpoint.every_merges, cfg.checkpoint.every_seconds)
    specials = special_token_list(cfg.special_tokens)
    SpecialSplitter(specials)
    check_special_tokens(specials)
    compat = check_compat(cfg.compat)
    if compat.name == "official" and specials:  # the command's preset sets none; a library config may not
        log.warning(
            "compat=official with special tokens %s: the official recipe has none (special_tokens=[]), so "
            "vocab.json and the ids will differ from its files",
            specials,
        )
    if compat.alphabet == "seen":  # only the bytes seen take ids: the budget is known once counted
        total = most_seen_merges(cfg.vocab_size, specials)
    else:
        total = merge_budget(cfg.vocab_size, specials)
    check_errors_mode(cfg.data.errors)
    if cfg.memory_limit is not None:
        parse_size(cfg.memory_limit)
    if cfg.workers is not None and cfg.workers < 1:
        raise ConfigError(f"workers must be >= 1, not {cfg.workers}")
    reserved_tokens(0, cfg.pad_vocab_to_multiple_of)  # a bad multiple or role fails before any output
    resolve_roles(cfg.export.roles(), specials)
    top = cfg.pretokenizer
    resolve_pretokenizer(top)
    plans = plan_stages(cfg.schedule, top, total, compat)
    encoding = encoding_pretokenizer(plans[-1].pretokenizer, compat)
    if cfg.export.tiktoken:
        check_compat_for_tiktoken(compat)
        check_specials_for_tiktoken(specials)
        tiktoken_pattern(encoding)
        if problem := tiktoken_split_problem(encoding):
            raise ConfigError(f"export.tiktoken=true cannot give the same ids: {problem}")
    if problem := hf_split_problem(encoding):  # the tokenizer is still ours to use: said, not refused
        log.warning("tokenizer.json will not encode as this tokenizer does (HF, transformers): %s", problem)
    try:
        source = load_source(cfg.schedule)
    except InputError as exc:  # moved or removed since the run began: its checkpoint alone is not enough
        if not cfg.resume:
            raise
        raise InputError(
            f"cannot resume {cfg.resume}: {exc} (its first stage's merges come from there: restore it, "
            "and the run continues)"
        ) from None
    source_merges: tuple[Merge, ...] = ()
    if source is not None and len(plans) == 1 and compat.alphabet == "seen":
        raise ConfigError(
            f"compat={compat.name} takes its byte tokens from the text a stage counts, and a run whose only "
            f"stage is {source.description} counts none: load that tokenizer as it is "
            f"(Tokenizer.load(..., compat={compat.name!r})), or train a stage after it (schedule=superbpe)"
        )
    if source is not None:
        check_source_compat(source, compat)
        plans, source_merges = apply_source(plans, source)
        build_vocab(source_merges, specials)  # a special with the bytes of a source token is refused now
    if not cfg.data.paths:
        resumed = f"resume {cfg.resume}: {NOT_A_COMMAND_RUN}" if cfg.resume else ""
        raise InputError(resumed or "no corpus given: set data.paths")
    empty = [number for number, path in enumerate(cfg.data.paths) if not str(path).strip()]
    if empty:  # else "inputs[N]", which names no option
        raise InputError(f"data.paths[{empty[0]}] is empty: give the path of a corpus file or directory")
    try:
        paths = resolve_inputs(list(cfg.data.paths))
    except InputError as exc:
        started_in = recorded_cwd(user_path(cfg.resume)) if cfg.resume else ""
        note = _relative_paths_note(cfg.data.paths, started_in) if started_in else ""
        raise InputError(f"{exc}: {note}" if note else str(exc)) from None
    check_not_token_files(paths)
    check_not_empty(paths)
    files = input_files_state(paths)
    eval_path, eval_bytes = _check_eval(
        cfg.eval, cfg.data.errors, cfg.data.text_field, _eval_separator(specials),
        bytes_held=compat.alphabet == "seen",
    )  # fmt: skip
    counted = plans[1:] if source is not None else plans
    if any(plan.approx_sample is not None for plan in counted):
        check_sampleable(paths)  # now, not when stage 1 has trained
    engine = get_engine(cfg.engine.name, [plan.pretokenizer for plan in counted])
    check_executor(cfg.executor)
    output_dir = _output_dir(cfg, run_dir)
    return _Job(
        cfg=cfg,
        specials=specials,
        total_merges=total,
        plans=plans,
        source=source,
        source_merges=source_merges,
        paths=paths,
        files=files,
        fingerprint=fingerprint_of_files(files),
        engine=engine,
        output_dir=output_dir,
        eval_path=eval_path,
        eval_bytes=eval_bytes,
        cache=RunCache(cfg.cache_dir, max_gib=cfg.cache_max_gib),
        compat=compat,
    )


def _eval_separator(specials: Sequence[str]) -> str | None:
    """Where a run's evaluation cuts documents: at ``<|endoftext|>`` where it is one of the run's special
    tokens, else nowhere (each file or record one document), as the tokenizer encodes that text."""
    return SEPARATOR if SEPARATOR in specials else None


def _check_eval(
    eval_file: str | None, errors: str, text_field: str, separator: str | None, *, bytes_held: bool = False
) -> tuple[Path | None, frozenset[int]]:
    """The held-out file, read through once as the evaluation after training will read it (with the
    corpus's ``data.errors`` and ``data.text_field``), so that a bad byte or record in it stops the run
    before training rather than after it, when no resume could change it; with ``bytes_held``, also the
    bytes its texts hold (an alphabet of the bytes seen must have them all, :func:`_with_alphabet`)."""
    if eval_file is None:
        return None, frozenset()
    if not str(eval_file).strip():  # eval=$EVAL with it unset: a run without its bytes/token, unsaid
        raise InputError("eval is empty: give eval=PATH, or leave it out for no evaluation")
    path = user_path(eval_file)
    if path.is_dir():
        raise InputError(f"eval file {path}: a directory; eval takes one file")
    if not path.is_file():
        raise InputError(f"eval file {path}: no such file")
    check_not_token_files([path])
    held: set[int] = set()
    measured = False  # any text besides separators, which the evaluation leaves out
    for chunk in iter_chunks(path, [], line_cuts=True):
        for text in chunk_documents(chunk, errors, text_field):
            measured = measured or bool(text.replace(separator, "") if separator else text)
            if bytes_held:
                held.update(text.encode("utf-8"))
    if not measured:
        but = f" but {separator!r}" if separator else ""
        raise InputError(f"eval file {path}: empty (no text{but}), so no bytes/token to measure")
    return path, frozenset(held)


def _output_dir(cfg: TrainConfig, run_dir: str | os.PathLike[str] | None) -> Path:
    """Where the tokenizer goes: the resumed run, ``output_dir`` or the Hydra run dir; must be writable."""
    if cfg.resume:
        resumed = user_path(cfg.resume)
        if not resumed.is_dir():
            raise InputError(f"resume {resumed}: no such run directory")
        target = resumed
        if cfg.output_dir and user_path(cfg.output_dir).resolve() != resumed.resolve():
            # A command's resume keeps only an output_dir Hydra resolves (``${hydra:runtime.output_dir}/x``):
            # the run's files are there, its overrides in the directory resumed. It must hold the run.
            target = user_path(cfg.output_dir)
            if not checkpoint_path(target).is_file():
                raise ConfigError(
                    f"resume {resumed}: its output_dir {target} holds no checkpoint; give only resume"
                )
    elif cfg.output_dir or run_dir is not None:
        target = user_path(cfg.output_dir or run_dir)  # type: ignore[arg-type]
        check_nothing_to_overwrite(target)
    else:
        raise ConfigError("no output directory: set output_dir")
    _check_writable(target)
    return target


def _check_writable(directory: Path) -> None:
    """Create the directory if needed and prove a file can be written there (then remove the proof)."""
    try:
        _made_dirs[directory] = missing_dirs(directory)
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(f"output directory {directory} is not writable ({exc.strerror or exc})") from None


#: The directories ``_check_writable`` created for an output directory, innermost first.
_made_dirs: dict[Path, list[Path]] = {}


def _remove_if_unused(directory: Path) -> None:
    """After a failed run: remove the output directory and the parents made for it while they are empty
    (a run that failed before its first checkpoint leaves nothing behind)."""
    remove_empty_dirs(_made_dirs.pop(directory, []))  # one not empty (a checkpoint, other files) stays


def _initial_checkpoint(job: _Job) -> Checkpoint:
    config = job.compat_config()
    if job.cfg.resume:
        found = load_checkpoint(job.output_dir)
        if found is not None:
            note = _relative_paths_note(job.cfg.data.paths, found.cwd)
            check_compatible(found, config, job.fingerprint, job.output_dir, job.files, note)
            found.files = found.files or job.files  # one written before the files were kept gets them
            _check_done(found, job)
            merges = len(found.merges)
            log.info("resuming %s: %s, %d merges so far", job.output_dir, _where(found, job), merges)
            return found
        log.info("resume %s: no checkpoint yet, starting from the beginning", job.output_dir)
    return Checkpoint(config=config, fingerprint=job.fingerprint, files=job.files, cwd=_working_dir())


def _working_dir() -> str:
    """This process's working directory, where relative data.paths resolve ("" once it was removed)."""
    try:
        return os.getcwd()
    except OSError:
        return ""


def _relative_paths_note(given: Sequence[Any], started_in: str) -> str:
    """Why a resume's data.paths may name other files than the run's although none moved: some are
    relative, and this working directory is not the one the run was started in (``started_in``, "" when
    its checkpoint does not record it); and what to do. "" when none is relative or the directory is the
    same (then the files themselves differ)."""
    relative = [str(path) for path in given if not user_path(str(path)).is_absolute()]
    here = _working_dir()
    if not relative or (started_in and Path(started_in).resolve() == Path(here).resolve()):
        return ""
    shown = ", ".join(relative[:3]) + (", ..." if len(relative) > 3 else "")
    verb = "is" if len(relative) == 1 else "are"
    where = f"{shown} in data.paths {verb} relative to the working directory ({here})"
    if not started_in:
        return f"{where}; if the run was started in another directory, resume from that one"
    if not Path(started_in).is_dir():
        return (
            f"{where}, but the run was started in {started_in}, which no longer exists: a resume trains on "
            "the files the checkpoint names, so put them back there (or start a new run)"
        )
    return (
        f"{where}, but the run was started in {started_in}: resume from there (cd {started_in}), or give "
        "data.paths as absolute paths"
    )


def _where(checkpoint: Checkpoint, job: _Job) -> str:
    """How far a resumed run got, in words (a run whose stages are all trained only lacks its files)."""
    if checkpoint.done:
        return "already finished"
    if checkpoint.stage >= len(job.plans):
        return f"all {len(job.plans)} stage(s) trained, writing the tokenizer"
    return f"stage {checkpoint.stage + 1} of {len(job.plans)}"


def _finished_result(job: _Job, checkpoint: Checkpoint) -> RunResult | None:
    """The result of a run that is already finished with its files in place (a resume has nothing to
    do and rewrites nothing), else None."""
    if not checkpoint.done:
        return None
    metrics_path = job.output_dir / METRICS_FILE
    # Every file the run writes: one removed since (the transformers files, say) is written again.
    names = [VOCAB_FILE, MERGES_FILE, HF_FILE, MANIFEST_FILE, HF_CONFIG_FILE, HF_SPECIAL_MAP_FILE]
    names += [TIKTOKEN_FILE, TIKTOKEN_META_FILE] if job.cfg.export.tiktoken else []
    present = all((job.output_dir / name).is_file() for name in names)
    if not present or not metrics_path.is_file():
        return None
    try:
        metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
    except ValueError:
        return None
    written = metrics.get("tokenizer_files")
    if isinstance(written, dict) and (now := tokenizer_file_digests(job.output_dir)) != written:
        changed = sorted(name for name in {*written, *now} if written.get(name) != now.get(name))
        log.info("%s changed since the run wrote them: writing the tokenizer again", ", ".join(changed))
        return None
    evaluated = (metrics.get("eval") or {}).get("files")
    if job.eval_path is not None and evaluated != [str(job.eval_path)]:  # an eval= given to a finished run
        metrics = {**metrics, "config": {**metrics.get("config", {}), "eval": job.cfg.eval},
                   "eval": _evaluation(job)}  # fmt: skip
        write_metrics(metrics_path, metrics)
        replaced = f", in place of the one on {', '.join(evaluated)}" if evaluated else ""
        log.info("the run was finished: evaluated on %s into its metrics%s", job.eval_path, replaced)
        return RunResult(job.output_dir, list(checkpoint.merges), list(checkpoint.stage_ends), metrics)
    log.info("nothing to do: the tokenizer and metrics of %s are in place", job.output_dir)
    return RunResult(job.output_dir, list(checkpoint.merges), list(checkpoint.stage_ends), metrics)


def _evaluation(job: _Job) -> dict[str, Any]:
    """The run's tokenizer evaluated on its ``eval`` file, read as the corpus is."""
    assert job.eval_path is not None
    data, engine = job.cfg.data, job.engine.name
    result = evaluate_dir(job.output_dir, [job.eval_path], separator=_eval_separator(job.specials),
                          text_field=data.text_field, errors=data.errors, engine=engine,
                          progress=job.cfg.progress)  # fmt: skip
    return result.to_json()


def _check_done(checkpoint: Checkpoint, job: _Job) -> None:
    """Trust ``done: true`` only when the checkpoint holds every stage, ending where the plans say.

    A stage may end before its planned end only when no pair was left, which is also final. Anything
    else (a hand-edited flag, say) continues the run instead of writing a tokenizer from part of it.
    """
    if not checkpoint.done:
        return
    ends = checkpoint.stage_ends
    if len(ends) > len(job.plans):
        raise InputError(f"{job.output_dir}: checkpoint holds {len(ends)} stages, the run {len(job.plans)}")
    complete = (
        len(ends) == len(job.plans)
        and ends == sorted(ends)
        and ends[-1] == len(checkpoint.merges)
        and all(end <= plan.end for end, plan in zip(ends, job.plans, strict=True))
    )
    if not complete:
        log.warning(
            "%s: checkpoint says done but holds %d of %d stage(s) and %d merges; continuing the run",
            job.output_dir,
            len(ends),
            len(job.plans),
            len(checkpoint.merges),
        )
        checkpoint.done = False


class _CountAhead:
    """Counts the next stage's corpus on a helper thread while this stage trains.

    Why: a SuperBPE stage 2 re-counts the whole corpus with its own pattern, which needs nothing
    from stage 1, so with the native engine (whose counting and training both release the GIL) that
    count can use the core the single-threaded trainer leaves idle. It runs with all the configured
    workers, not one: stage 1 trains for a few seconds, the count for much longer, and a count held
    to one worker left the other core idle for the rest of it. The python engine holds the GIL, so
    it counts in order as before. Results are the same either way; only the waiting goes.
    """

    def __init__(self, job: _Job) -> None:
        self.job = job
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[int, Future[PieceCounts]] = {}

    def __enter__(self) -> _CountAhead:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc_info: object) -> None:
        """Never leave a count running behind the run (an error in this stage still waits for it);
        on Ctrl-C the count is stopped first, so the run ends within a moment, not when it is done."""
        if self._pool is None:
            return
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            self.job.engine.stop_counts()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def start_after(self, plan: StagePlan) -> None:
        """Start counting for the stage after ``plan``, if it counts and the engine allows overlap."""
        if not self.job.engine.counts_beside_training or plan.index + 1 >= len(self.job.plans):
            return
        following = self.job.plans[plan.index + 1]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="superbpe-count-ahead")
        self._pending[following.index] = self._pool.submit(
            _load_or_count, self.job, following, progress=False, workers=self.job.cfg.workers
        )

    def take(self, plan: StagePlan) -> PieceCounts | None:
        """The counts started for ``plan`` (waiting for them; their error, if any, is raised here). A wait
        is logged: on a large corpus the count can end well after the previous stage, and the log would
        otherwise say nothing meanwhile."""
        pending = self._pending.pop(plan.index, None)
        if pending is None:
            return None
        if not pending.done():
            log.info("stage %s: waiting for its count of the corpus, begun while the previous stage trained",
                     plan.name)  # fmt: skip
        return pending.result()


def _run_stage(job: _Job, plan: StagePlan, checkpointer: Checkpointer, ahead: _CountAhead) -> None:
    state = checkpointer.state
    start_len = state.stage_ends[-1] if state.stage_ends else 0
    checkpointer.begin_stage()
    with measure(plan.name) as stats:
        if plan.index == 0 and job.source is not None:
            merges = list(job.source_merges)
            log.info("stage %s: %d merges taken from %s", plan.name, len(merges), job.source.description)
        else:
            counts = _counts(job, plan, stats, ahead)
            ahead.start_after(plan)
            plan = _with_alphabet(job, plan, counts)
            merges = _train(
                job, plan, counts, state.merges[:start_len], state.merges[start_len:], checkpointer, stats
            )
    kept = _inherited_kept(plan, state.merges[:start_len], merges)
    metrics = _stage_metrics(plan, stats, len(merges) - kept, job, checkpointer.earlier_stage_seconds,
                             checkpointer.stage_engines(),
                             checkpointer.earlier_stage_peak_rss_bytes)  # fmt: skip
    checkpointer.finish_stage(merges, metrics)
    if len(merges) < plan.end:
        log.info(
            "stage %s ended early at %d merges: no pair left that the rules allow", plan.name, len(merges)
        )


def _with_alphabet(job: _Job, plan: StagePlan, counts: PieceCounts) -> StagePlan:
    """With ``compat.alphabet="seen"``, only the bytes the text has take ids: the merges ``vocab_size``
    leaves are known now (every stage's text has the same bytes). The schedule's fixed ends must fit
    in them, and a last stage that runs up to ``vocab_size`` gets them all (as many as HF's trainer
    makes, none when the alphabet fills the vocabulary)."""
    if job.compat.alphabet != "seen":
        return plan
    alphabet = alphabet_order(counts.bytes_seen())
    job.alphabets[plan.index] = alphabet
    unseen = sorted(job.eval_bytes - set(alphabet))
    if unseen:  # the evaluation after training could not encode them
        shown = ", ".join(f"0x{byte:02x}" for byte in unseen[:5]) + (", ..." if len(unseen) > 5 else "")
        raise InputError(
            f"eval file {job.eval_path} holds {len(unseen)} byte(s) the corpus does not ({shown}): with "
            "compat=official only the corpus's bytes take tokens, so it could not be encoded; give a "
            "held-out text of the same kind, or eval=null"
        )
    last = job.plans[-1]
    open_end = last.end == job.total_merges  # the last stage runs up to vocab_size
    fixed = [p.end for p in job.plans if not (p is last and open_end)]
    at_least = max(fixed, default=0) + (1 if open_end and fixed else 0)
    budget = merge_budget(job.cfg.vocab_size, job.specials, alphabet, at_least)
    if plan.index != last.index or not open_end:
        return plan
    return replace(plan, end=budget)


def _counts(job: _Job, plan: StagePlan, stats: StageStats, ahead: _CountAhead) -> PieceCounts:
    """Piece counts for this stage's pattern: counted ahead, from the cache, or counted now."""
    with stats.part("count_seconds"):
        counts = ahead.take(plan)
        if counts is not None:
            log.info("stage %s: corpus counted while the previous stage trained", plan.name)
            return counts
        return _load_or_count(job, plan, progress=job.cfg.progress, workers=job.cfg.workers)


def _with_text(job: _Job, counts: PieceCounts) -> PieceCounts:
    """Counts that hold a piece: bytes on disk with no text in them (blank JSON lines, empty records, only
    special tokens) are refused as an empty corpus is, not trained into a vocabulary of the bytes alone."""
    if not len(counts):
        where = str(job.paths[0]) if len(job.paths) == 1 else f"the {len(job.paths)} input files"
        raise InputError(f"{where}: no text to train on (empty records or lines, or only special tokens)")
    return counts


#: Share of a stage's merges chosen before its progress lines give an ETA (see ``progress.task``).
_MERGES_BEFORE_ETA = 0.1


def _sampled(plan: StagePlan) -> dict[str, float]:
    """The part of a cache key that tells a sampled stage's counts and merges from the exact ones (none
    for an exact stage, so its keys stay what they were)."""
    return {} if plan.approx_sample is None else {"approx_sample": plan.approx_sample}


def _load_or_count(job: _Job, plan: StagePlan, *, progress: bool | None, workers: int | None) -> PieceCounts:
    """Counts from the cache, or counted (and cached) now."""
    key = cache_key(
        kind="counts",
        fingerprint=job.fingerprint,
        pretokenizer=plan.pretokenizer.spec(),
        specials=job.specials,
        errors=job.cfg.data.errors,
        text_field=job.cfg.data.text_field,
        **_sampled(plan),
    )
    with job.cache.entry("counts", key, ".counts") as path:
        counts = job.cache.load_counts(path, native=job.engine.name == "native")
        if counts is not None:
            return _with_text(job, counts)
        if plan.approx_sample is not None:
            log.info(
                "stage %s: counting an evenly spread %.4g%% of the corpus (approximation: approx_sample)",
                plan.name,
                100 * plan.approx_sample,
            )
        total = corpus_size(job.paths)  # on disk: a gzip file's progress counts its compressed bytes
        with task(f"counting ({plan.pretokenizer.name})", total, "B", enabled=progress) as update:
            try:
                counts = count_corpus(
                    job.engine,
                    job.cfg.executor,
                    job.paths,
                    plan.pretokenizer,
                    job.specials,
                    sample=plan.approx_sample,
                    workers=workers,
                    errors=job.cfg.data.errors,
                    text_field=job.cfg.data.text_field,
                    progress=update,
                    borrow_files=True,  # the trainer takes the counts over; the engine decides what to leave
                    ceiling=CountCeiling.for_run(job.cfg.memory_limit),
                )
            except MemoryLimitError as exc:
                raise refused_stage(plan.name, exc) from None
        _with_text(job, counts)
        if path is not None:
            plain = not any(is_gzipped(p) or is_jsonl(p) or is_table(p) for p in job.paths)
            if (reason := counts_not_worth_caching(counts, total, plain)) is None:
                counts.save(path)
            else:
                log.info("stage %s: piece counts not cached: %s", plan.name, reason)
        return counts


def _train(
    job: _Job,
    plan: StagePlan,
    counts: PieceCounts,
    prior: Sequence[Merge],
    partial: Sequence[Merge],
    checkpointer: Checkpointer,
    stats: StageStats,
) -> list[Merge]:
    """Replay ``prior`` + what is known of this stage, choose the rest, keep the cache up to date.

    The cache entry is what follows ``prior``, or the whole list for a stage that drops absent
    inherited merges (it may lack some of ``prior``); ``plan.end`` counts tokens, not merges.
    """
    whole = plan.rules.absent_inherited == "drop"
    if whole and partial:
        # Resumed inside such a stage: its merges so far need not start with ``prior``, so the
        # checkpoint cannot be matched against an entry; it continues without the cache.
        with stats.part("train_seconds"):
            return _choose(job, plan, counts, [*prior, *partial], checkpointer, stats)
    key = cache_key(
        kind="merges",
        counts=counts.meta,  # the pattern and specials; a sampled count says so only in the plan
        fingerprint=job.fingerprint,
        errors=job.cfg.data.errors,  # the files alone do not say what text was read from them
        text_field=job.cfg.data.text_field,
        rules=rules_spec(plan.rules),
        prior=merges_fingerprint(prior),
        **_sampled(plan),
    )
    base = [] if whole else list(prior)
    with job.cache.entry("merges", key, ".json") as path, stats.part("train_seconds"):
        cached = job.cache.load_merges(path)
        known = list(partial)
        if cached is not None and len(cached.merges) > len(known):
            known = list(cached.merges)
        candidate = [*base, *known] if known else list(prior)
        found = token_prefix(candidate, plan.end)
        if found is None and cached is not None and cached.exhausted and known == cached.merges:
            found = candidate
        if found is not None:
            if cached is not None:  # else the stage had nothing left to train (vocab_size leaves 0 merges)
                log.info("stage %s: %d merges from cache", plan.name, len(found) - len(base))
                stats.from_cache, stats.from_engine = True, cached.engine
            return found
        if tokens_made(candidate) < len(candidate):  # a duplicate merge cannot be replayed
            candidate = [*prior, *partial]
        merges = _choose(
            job, plan, counts, candidate, checkpointer, stats, replay=_replayed(job, plan, prior, candidate)
        )
        started = cached if cached is not None and known == cached.merges else None
        about = {"stage": plan.name, "pretokenizer": plan.pretokenizer.name,
                 "data": [str(p) for p in job.paths[:3]], "files": len(job.paths),
                 "engine": _list_engine(started, checkpointer.stage_engines())}  # fmt: skip
        exhausted = tokens_made(merges) < plan.end
        job.cache.store_merges(path, merges[len(base) :], exhausted=exhausted, about=about)
        return merges


def _list_engine(started: CachedMerges | None, engines: Sequence[str]) -> str | None:
    """The engines that chose a stage's merges list the cache keeps: this stage's, after those of the
    cached list it ``started`` from; None when that list does not say (the metrics of a run taking it
    then name no engine rather than a wrong one)."""
    if started is not None and started.engine is None:
        return None
    names = [*(started.engine.split("+") if started is not None and started.engine else []), *engines]
    return "+".join(name for i, name in enumerate(names) if i == 0 or names[i - 1] != name) or None


def _replayed(job: _Job, plan: StagePlan, prior: Sequence[Merge], known: Sequence[Merge]) -> list[Merge]:
    """What the trainer replays of ``known`` (the merges so far, ``prior`` + this stage's own): all of them,
    or only ``prior`` when choosing this stage's own merges again is cheaper than replaying them.

    Why: the native engine replays per piece, cutting each piece where no replayed merge can join two
    bytes. A later stage's own merges join across the word boundaries the earlier stages never join,
    so replaying even a few of them leaves its long pieces uncut, and the replay took about four times
    as long (kernel_docs: 2.0-2.5 s against 0.54 s), more than choosing the whole stage takes. Choosing
    them again gives the same merges (training is deterministic; ``_choose`` checks). The official
    rules replay merge by merge anyway, and the python engine does not cut pieces.
    """
    own = len(known) - len(prior)
    if own <= 0 or not prior or job.engine.name != "native" or _replays_one_by_one(plan.rules):
        return list(known)
    log.info("stage %s: choosing its %d merges so far again (faster than replaying them)", plan.name, own)
    return list(prior)


def _replays_one_by_one(rules: MergeRules) -> bool:
    """Whether the native trainer replays merge by merge (the official rules: HF's bookkeeping)."""
    return rules.tie_break != "bytes" or rules.duplicates != "skip" or rules.absent_inherited != "keep"


def _choose(
    job: _Job,
    plan: StagePlan,
    counts: PieceCounts,
    known: list[Merge],
    checkpointer: Checkpointer,
    stats: StageStats,
    *,
    replay: list[Merge] | None = None,
) -> list[Merge]:
    """Train the stage to ``plan.end`` from ``known`` (the merges so far), replaying ``replay`` (a prefix
    of ``known``; all of it by default) and choosing the rest; merges chosen again are not checkpointed
    until they go beyond ``known``, so a kill meanwhile loses nothing that was saved."""
    replay = list(known) if replay is None else replay
    every = max(1, min(100, job.cfg.checkpoint.every_merges))
    with task(
        f"merging ({plan.name})",
        plan.end,
        "merges",
        enabled=job.cfg.progress,
        initial=len(replay),
        eta_after=_MERGES_BEFORE_ETA,
    ) as update:
        seen = [len(replay)]
        built = [False]

        def on_built() -> None:
            built[0] = True
            update.restart_clock()

        def callback(merges: Sequence[Merge]) -> None:
            if not built[0]:  # an engine that reports no build (python): its replay ended before this
                on_built()
            update(len(merges) - seen[0])
            seen[0] = len(merges)
            if len(merges) > len(known):
                checkpointer.progress(merges)

        result = job.engine.train(
            counts,
            plan.end,
            rules=plan.rules,
            replay=replay,
            callback=callback,
            callback_every=every,
            # The build is not merging: the merge rate (and so the ETA) is measured from its end.
            build_progress=build_reporter(f"building ({plan.name})", on_built),
            check_memory=lambda need: _check_memory(job, plan, stats, need),
            # Nothing reads this stage's counts after training (the cache has its own copy).
            consume_counts=True,
        )
        update(len(result.merges) - seen[0])
    merges = list(result.merges)
    _check_chosen_again(plan, known, merges)
    return merges


def _inherited_kept(plan: StagePlan, inherited: Sequence[Merge], merges: Sequence[Merge]) -> int:
    """How many of the ``inherited`` merges a stage's ``merges`` still hold: all of them, unless its rules
    drop those its corpus never makes (``absent_inherited: drop``), when the stage's own merges are
    what follows the ones kept (counting from the inherited end gave a stage fewer than none)."""
    if plan.rules.absent_inherited != "drop":
        return len(inherited)
    present = set(merges)
    return sum(merge in present for merge in inherited)


def _check_chosen_again(plan: StagePlan, known: Sequence[Merge], merges: Sequence[Merge]) -> None:
    """Merges chosen again must be the ones known; say so loudly if not (the new ones are kept: they
    are what this engine and corpus give now). Under rules that drop inherited merges the stage's
    corpus never makes (``absent_inherited: drop``, HF's way in ``compat=official``), those are
    expected to be missing, and are logged as dropped."""
    if plan.rules.absent_inherited == "drop":
        present = set(merges)
        dropped = [merge for merge in known if merge not in present]
        if dropped:
            log.info(
                "stage %s: %d inherited merge(s) never occur in its corpus and are dropped, as the rules "
                "say (absent_inherited: drop), the first %s",
                plan.name,
                len(dropped),
                dropped[0],
            )
            known = [merge for merge in known if merge in present]
    again = list(merges[: len(known)])
    if again == list(known):
        return
    first = next(i for i in range(len(known)) if i >= len(again) or again[i] != known[i])
    log.warning(
        "stage %s: merge %d chosen again is %s, not %s as known before (checkpoint or inherited merges); "
        "continuing with the new merges",
        plan.name,
        first,
        again[first] if first < len(again) else "none",
        known[first],
    )


def _check_memory(job: _Job, plan: StagePlan, stats: StageStats, need: StageMemory) -> None:
    """Log and record what building this stage's trainer needs; refuse it if it does not fit."""
    build_peak = current_rss_bytes() + need.build_bytes
    peak_so_far = peak_rss_bytes()  # since the stage began (``measure`` starts a new window)
    stats.sizes.update(
        distinct_pieces=need.pieces,
        distinct_bytes=need.piece_bytes,
        estimated_symbols=need.symbols,
        estimated_build_bytes=need.build_bytes,
        # What the process will hold at the build's peak: what it holds now plus the build.
        estimated_build_peak_bytes=build_peak,
        # This stage's peak: the build's, unless the stage peaked before it (a count whose worker
        # tables are drained, as on code, where many lines repeat).
        estimated_peak_bytes=max(build_peak, peak_so_far),
    )
    log.info(
        "stage %s: building needs about %.0f MB for %.1fM symbols (%.2fM pieces, %.0f MB)",
        plan.name,
        need.build_bytes / 2**20,
        need.symbols / 1e6,
        need.pieces / 1e6,
        need.piece_bytes / 2**20,
    )
    check_fits(plan.name, need, job.cfg.memory_limit)


def _stage_metrics(
    plan: StagePlan,
    stats: StageStats,
    merges: int,
    job: _Job,
    earlier_seconds: float = 0.0,
    engines: Sequence[str] = (),
    earlier_peak_rss_bytes: int = 0,
) -> dict[str, Any]:
    """``earlier_seconds``: what the processes before this one spent on the stage (it was resumed inside):
    ``seconds`` is the stage's time across all of them, ``seconds_before_resume`` their part. ``engines``:
    those that ran the stage, in order (a resume may change engines, also inside a stage); ``engine``
    names them joined by ``+`` (``python+native``), so it stays one string and says only what ran. A stage
    taken from the source run (``from`` names it) was trained by no engine of this run: ``engine`` is the
    one the source run recorded for it, null when that is not known (tokenizer files, say).
    ``earlier_peak_rss_bytes``: the highest peak those earlier processes saved; ``peak_rss_bytes`` is the
    highest of any process, as a python process killed inside a stage may have held far more than the
    native one that finished it."""
    alphabet = job.alphabets.get(plan.index)
    counted = {}
    if plan.approx_sample is not None:  # a sample takes whole blocks: a small corpus's share differs
        share = sampled_share(job.paths, plan.pretokenizer, job.specials, plan.approx_sample)
        counted = {"approx_sample_counted": round(share, 4)}
    return {
        **({} if alphabet is None else {"alphabet": alphabet.hex()}),
        **plan.spec(),
        **counted,
        "merges": merges,
        "seconds": round(earlier_seconds + stats.seconds, 3),
        **({"seconds_before_resume": round(earlier_seconds, 3)} if earlier_seconds else {}),
        **{name: round(value, 3) for name, value in stats.parts.items()},
        **stats.sizes,
        "peak_rss_bytes": max(stats.peak_rss_bytes, earlier_peak_rss_bytes),
        "from": _stage_source(plan, stats, job),
        "engine": _stage_engine(plan, job, engines, stats),
    }


def _stage_engine(plan: StagePlan, job: _Job, engines: Sequence[str], stats: StageStats) -> str | None:
    """The engine(s) that trained a stage (see :func:`_stage_metrics`): for merges taken from the cache,
    those its entry names (no engine of this run chose them), None when the entry does not say."""
    if plan.index == 0 and job.source is not None:
        return job.source.engine
    if stats.from_cache:
        return stats.from_engine
    return "+".join(engines or [job.engine.name])


def _stage_source(plan: StagePlan, stats: StageStats, job: _Job) -> str:
    """Where a stage's merges came from: the run's source (``from_run``/``from_tokenizer``), the cache (its
    seconds are then a lookup's, not training's), or training."""
    if plan.index == 0 and job.source is not None:
        return job.source.description
    return "cache" if stats.from_cache else "trained"


def _warn_if_smaller(size: int, vocab_size: int) -> None:
    """A vocabulary smaller than asked is worth a warning (an embedding table is sized by it), as the
    library's ``train_bpe`` gives; the stage's own log line only says that it ended early."""
    if size < vocab_size:
        log.warning(
            "the vocabulary is %d tokens, %d fewer than vocab_size=%d: the corpus ran out of pairs the "
            "rules allow; give more text or a smaller vocab_size",
            size,
            vocab_size - size,
            vocab_size,
        )


def _write_outputs(job: _Job, checkpoint: Checkpoint, seconds: float) -> dict[str, Any]:
    """Tokenizer files, then metrics.json (with bytes/token on the eval file)."""
    merges = checkpoint.merges
    final = encoding_pretokenizer(job.plans[-1].pretokenizer, job.compat)
    if job.compat.alphabet == "seen":
        # The last stage's text (a stage taken whole from a source tokenizer has none: its merges' bytes).
        last = checkpoint.stage_stats[-1] if checkpoint.stage_stats else {}
        used = {byte for left, right in merges for byte in left + right}
        alphabet = bytes.fromhex(last["alphabet"]) if "alphabet" in last else alphabet_order(used)
        vocab = hf_vocab(alphabet, merges, job.specials)
        # Padding tokens go last (HF numbers only its own specials first).
        reserved = reserved_tokens(len(vocab), job.cfg.pad_vocab_to_multiple_of, job.specials)
        first = len(vocab)  # read once: the dict grows as the ids are added
        vocab.update((first + i, name.encode("utf-8")) for i, name in enumerate(reserved))
        specials = job.specials + reserved
    else:
        specials = job.specials + reserved_tokens(256 + len(merges) + len(job.specials),
                                                  job.cfg.pad_vocab_to_multiple_of, job.specials)
        vocab = build_vocab(merges, specials)
    _warn_if_smaller(len(vocab) - (len(specials) - len(job.specials)), job.cfg.vocab_size)
    stages = []
    start = 0
    for plan, end in zip(job.plans, checkpoint.stage_ends, strict=False):
        stages.append({**plan.spec(), "num_merges": end - start, "end": end})
        start = end
    save_tokenizer_dir(
        job.output_dir,
        vocab,
        merges,
        specials,
        final,
        roles=job.cfg.export.roles(),
        tiktoken=job.cfg.export.tiktoken,
        stages=stages,
        training={
            "schedule": job.cfg.schedule.name,
            "vocab_size": job.cfg.vocab_size,
            "source": None if job.source is None else job.source.spec(),
            "compat": asdict(job.compat),
        },
        whole_pieces=job.compat.whole_pieces,
        vocab_style=job.compat.vocab_style,
    )
    evaluation = None if job.eval_path is None else _evaluation(job)
    metrics = build_metrics(
        job.cfg, job.compat_config(), checkpoint, seconds, evaluation, len(vocab), engine=job.engine.name
    )
    metrics["tokenizer_files"] = tokenizer_file_digests(job.output_dir)  # a resume checks them
    write_metrics(job.output_dir / METRICS_FILE, metrics)
    return metrics
