"""Multi-stage schedules (SuperBPE and user-written ones) as plain data and functions.

A schedule is a list of stages. Each stage has its own pre-tokenizer and merge rules and ends at an
absolute merge count; a later stage re-counts the corpus with its own pattern, *replays* every merge
learned so far (so ids and ranks are kept) and keeps choosing under its own rules. SuperBPE is the
two-stage case: word-bounded BPE up to the transition, then superword merges up to ``vocab_size``.

The first stage may also come from an existing tokenizer (a finished run, GPT-2 files or a
``tokenizer.json``): its first ``until`` merges are taken as they are instead of being trained.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from superbpe.core.compat import (
    CompatConfig,
    get_compat,
    recorded_compat,
    training_pretokenizer,
    training_rules,
)
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.pretokenize import Pretokenizer, get_pretokenizer
from superbpe.core.rules import MergeRules, make_rules
from superbpe.core.types import Merge
from superbpe.core.util import counted, user_path
from superbpe.formats.checkpoints import checkpoint_path
from superbpe.formats.gpt2 import MERGES_FILE, VOCAB_FILE, read_merges, read_vocab
from superbpe.formats.hf import HF_FILE, pretokenizer_from_hf, read_hf_tokenizer
from superbpe.formats.manifest import MANIFEST_FILE, read_manifest
from superbpe.formats.tokenizer_dir import states_its_pattern
from superbpe.training.config import PretokenizerConfig, ScheduleConfig, StageConfig, same_knob

log = logging.getLogger("superbpe")


@dataclass(frozen=True)
class StagePlan:
    """One stage with everything resolved: the pattern object, absolute end, validated rules."""

    index: int
    name: str
    pretokenizer: Pretokenizer
    end: int  # number of merges in the tokenizer when this stage is over
    rules: MergeRules
    approx_sample: float | None = None  # None: the exact count of the whole corpus

    def spec(self) -> dict[str, Any]:
        """JSON form for manifests, checkpoints and metrics (what must match on resume); the sample only
        when there is one, so the specs of exact stages stay what they were."""
        spec = {
            "name": self.name,
            "pretokenizer": self.pretokenizer.spec(),
            "end": self.end,
            "rules": rules_spec(self.rules),
        }
        if self.approx_sample is not None:
            spec["approx_sample"] = self.approx_sample
        return spec


def rules_spec(rules: MergeRules) -> dict[str, Any]:
    """JSON form of the rules; the compat choices only when they differ from ours (older specs stay valid)."""
    spec: dict[str, Any] = {
        "min_frequency": rules.min_frequency,
        "max_token_bytes": rules.max_token_bytes,
        "max_words_per_token": rules.max_words_per_token,
        "forbidden_substrings": [s.decode("utf-8", "replace") for s in rules.forbidden_substrings],
    }
    for name in ("tie_break", "duplicates", "absent_inherited"):
        if getattr(rules, name) != getattr(_DEFAULT_RULES, name):
            spec[name] = getattr(rules, name)
    return spec


_DEFAULT_RULES = MergeRules()


def resolve_pretokenizer(cfg: PretokenizerConfig) -> Pretokenizer:
    """A pre-tokenizer config (built-in name, or custom with a pattern) as the object that splits text."""
    if cfg.name == "custom" and not cfg.pattern:
        raise ConfigError("pretokenizer=custom needs its pattern: pretokenizer.pattern='<regex>'")
    return get_pretokenizer(cfg.name, line_units=cfg.line_units, pattern=cfg.pattern)


def resolve_until(until: Any, total: int, stage: StageConfig, last: bool, schedule: ScheduleConfig) -> int:
    """A stage end as a merge count: int = merges, float in (0, 1) = fraction of ``total``, None = all."""
    what = _until_name(stage, schedule)
    if until is None:
        if not last:
            raise ConfigError(f"{what} is not set; only the last stage may run up to vocab_size")
        return total
    if isinstance(until, bool) or not isinstance(until, (int, float)):
        raise ConfigError(f"{what} must be a merge count (int) or a fraction in (0, 1), not {until!r}")
    if isinstance(until, float):
        if not 0.0 < until < 1.0:
            raise ConfigError(
                f"{what} {until} is a fraction and must be in (0, 1); use an int for a merge count"
            )
        end = round(until * total)
    else:
        end = until
    if end < 1:
        raise ConfigError(f"{what} {until} gives {end} merges; it must be at least 1")
    if end > total or (end == total and not last):
        # A fraction is named with the merge count it gives: "0.9 must be below the 1 merges" reads as
        # a comparison of the fraction itself.
        gives = f" gives {counted(end, 'merge')}, which" if isinstance(until, float) else ""
        given = f"{what} {until}{gives}"
        leaves = "the merge" if total == 1 else f"the {total} merges"
        raise ConfigError(
            f"{given} must be below {leaves} that vocab_size leaves (it is at or beyond "
            "it; a larger vocab_size leaves more)"
        )
    if not isinstance(until, float):
        _warn_if_one_merge(until, what, last)
    return end


def _warn_if_one_merge(until: int, what: str, last: bool) -> None:
    """An end of 1 is a merge count, as every int is, but read as "all of them" (1.0, the summary plot's
    plain BPE) it gives a stage 1 of one merge and a tokenizer of superwords: said, since it trains."""
    if until == 1 and not last:
        log.warning(
            "%s 1 is a merge count: the stage makes 1 merge and the next stage all the rest (a fraction "
            "of all merges is a float in (0, 1); plain BPE is schedule=bpe)",
            what,
        )


def _approx_sample(stage: StageConfig) -> float | None:
    """The stage's sampled fraction of the corpus, or None for all of it (a fraction of 1 is all of it)."""
    value = stage.approx_sample
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(
            f"stage {stage.name!r} approx_sample {value!r}: give a fraction in (0, 1], or null to count "
            "the whole corpus"
        )
    return None if value == 1 else float(value)


def _until_name(stage: StageConfig, schedule: ScheduleConfig) -> str:
    """Name the knob the user set: ``schedule.transition`` when the stage takes it, else the stage's until."""
    takes_it = schedule.transition is not None or schedule.name == "superbpe"  # its first stage ends there
    if takes_it and same_knob(stage.until, schedule.transition):
        return "schedule.transition"
    return f"stage {stage.name!r} until"


def _check_stage_pattern(stage: StageConfig, schedule: ScheduleConfig) -> None:
    """A stage's own ``custom`` pre-tokenizer without its pattern, named where the user sets it (the top
    ``pretokenizer.pattern`` a message about it would point to is refused for a stage)."""
    own = stage.pretokenizer
    if own is None or own.name != "custom" or own.pattern:
        return
    if schedule.stage2_pattern == "custom":
        knob = "schedule.stage2_pattern"
        raise ConfigError(f"{knob}=custom needs its pattern: {knob}='custom:<regex>'")
    raise ConfigError(f"stage {stage.name!r}: pretokenizer custom needs its pattern (pretokenizer.pattern)")


def plan_stages(
    schedule: ScheduleConfig,
    top_pretokenizer: PretokenizerConfig,
    total_merges: int,
    compat: CompatConfig | None = None,
) -> list[StagePlan]:
    """Validate a schedule and resolve every stage (ends strictly increasing, last one at most ``total``).

    ``compat`` (default: ours) sets the training units and the trainer's choices of every stage.
    """
    chosen = get_compat(compat)
    if not schedule.stages:
        raise ConfigError("schedule.stages is empty; a schedule needs at least one stage")
    plans: list[StagePlan] = []
    previous_end = 0
    for index, stage in enumerate(schedule.stages):
        last = index == len(schedule.stages) - 1
        if chosen.alphabet == "seen" and isinstance(stage.until, float) and 0.0 < stage.until < 1.0:
            raise ConfigError(
                f"{_until_name(stage, schedule)} {stage.until} is a fraction, but with compat.alphabet=seen "
                "the number of merges is known only once the text is counted; give a merge count"
            )
        end = resolve_until(stage.until, total_merges, stage, last, schedule)
        if end <= previous_end and (index > 0 or end < 0):  # a lone stage of 0 merges: alphabet only
            raise ConfigError(
                f"stage {stage.name!r} ends at {end} merges, not after the previous stage's {previous_end}"
            )
        _check_stage_pattern(stage, schedule)
        pre = training_pretokenizer(resolve_pretokenizer(stage.pretokenizer or top_pretokenizer), chosen)
        rules = make_rules(
            stage.min_frequency, stage.max_token_bytes, stage.max_words_per_token, stage.forbidden_substrings
        )
        rules = training_rules(rules, chosen)
        plans.append(StagePlan(index, stage.name, pre, end, rules, _approx_sample(stage)))
        previous_end = end
    return plans


# ---------------------------------------------------------------------------------------------------------
# Starting from an existing tokenizer


@dataclass(frozen=True)
class SourceMerges:
    """Merges of an existing tokenizer that can stand in for the first stage."""

    description: str
    merges: tuple[Merge, ...]
    pretokenizer: Pretokenizer | None  # None: the files do not say (GPT-2 vocab.json + merges.txt)
    compat: CompatConfig | None = None  # the preset a run of ours recorded (None: the files do not say)
    # The engine that trained the merges, as the source run's metrics.json names it for its first stage
    # (None: bare tokenizer files, or a run whose metrics.json is gone). Not part of the spec: it does not
    # change the merges.
    engine: str | None = None

    def spec(self) -> dict[str, Any]:
        return {
            "source": self.description,
            "merges": len(self.merges),
            "pretokenizer": None if self.pretokenizer is None else self.pretokenizer.spec(),
        }


def load_source(schedule: ScheduleConfig) -> SourceMerges | None:
    """The tokenizer named by ``from_run`` / ``from_tokenizer``, or None when training from scratch."""
    if schedule.from_run and schedule.from_tokenizer:
        raise ConfigError("give schedule.from_run or schedule.from_tokenizer, not both")
    if schedule.from_run:
        return _load_run(user_path(schedule.from_run))
    if schedule.from_tokenizer:
        return _load_tokenizer_files(user_path(schedule.from_tokenizer))
    return None


def _load_run(run_dir: Path) -> SourceMerges:
    """A finished run: its merges, cut to its first stage (later stages used other patterns)."""
    manifest_path = run_dir / MANIFEST_FILE
    if run_dir.exists() and not run_dir.is_dir():  # one of a run's files (its merges.txt, say)
        raise InputError(
            f"schedule.from_run {run_dir}: a file; give the run's directory ({run_dir.parent}), or the "
            "files with schedule.from_tokenizer"
        )
    if not run_dir.is_dir():
        raise InputError(f"schedule.from_run {run_dir}: no such directory")
    if not manifest_path.is_file():
        if checkpoint_path(run_dir).is_file():  # killed or stopped: its merges are there, unfinished
            raise InputError(
                f"schedule.from_run {run_dir}: a run that has not finished; finish it first "
                f"(superbpe-train resume={run_dir})"
            )
        raise InputError(
            f"schedule.from_run {run_dir}: no {MANIFEST_FILE} (not a finished training run)"
        )
    manifest = read_manifest(manifest_path)
    merges = read_merges(run_dir / MERGES_FILE)
    first = manifest.stages[0] if manifest.stages else {}
    pre_spec = first.get("pretokenizer", manifest.pretokenizer)
    try:
        pre = Pretokenizer.from_spec(pre_spec)
    except Exception as exc:  # a hand-edited or foreign manifest
        raise InputError(f"{manifest_path}: bad stage pretokenizer: {exc}") from None
    usable = int(first.get("end", len(merges))) if first else len(merges)
    compat = recorded_compat(manifest.training)
    return SourceMerges(f"run {run_dir}", tuple(merges[:usable]), pre, compat, _first_stage_engine(run_dir))


def _first_stage_engine(run_dir: Path) -> str | None:
    """The engine a finished run's ``metrics.json`` names for its first stage, None when it names none."""
    try:
        engine = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))["stages"][0]["engine"]
    except (OSError, ValueError, LookupError, TypeError):  # gone, hand-edited, or from before stages had one
        return None
    return engine if isinstance(engine, str) else None


def check_source_compat(source: SourceMerges, compat: CompatConfig) -> None:
    """A run of ours trained under one compat preset cannot stand in for a stage trained under another:
    their merges break ties, lay out ids and keep duplicates otherwise, so the result would match neither."""
    if source.compat is not None and source.compat.name != compat.name:
        raise ConfigError(
            f"the {source.description} was trained with compat={source.compat.name}, this run has "
            f"compat={compat.name}: give compat={source.compat.name}"
        )


def _load_tokenizer_files(path: Path) -> SourceMerges:
    """GPT-2 ``vocab.json`` + ``merges.txt`` (a directory), or an HF ``tokenizer.json`` (file or dir)."""
    if path.is_dir() and (path / MANIFEST_FILE).is_file():
        return _load_run(path)
    if path.is_dir() and not states_its_pattern(path):  # bare vocab.json + merges.txt
        vocab_path = path / VOCAB_FILE
        vocab = read_vocab(vocab_path) if vocab_path.is_file() else None
        merges = read_merges(path / MERGES_FILE, vocab)
        return SourceMerges(f"merges {path / MERGES_FILE}", tuple(merges), None)
    if path.is_file() and path.name in (VOCAB_FILE, MERGES_FILE, MANIFEST_FILE):  # one file of a directory
        raise InputError(
            f"schedule.from_tokenizer {path}: a file of a tokenizer directory; give the directory "
            f"({path.parent}) or a tokenizer.json"
        )
    hf_path = path / HF_FILE if path.is_dir() else path
    if not hf_path.is_file():
        raise InputError(f"schedule.from_tokenizer {path}: no merges.txt or tokenizer.json there")
    data = read_hf_tokenizer(hf_path)
    return SourceMerges(f"tokenizer.json {hf_path}", tuple(data.merges), pretokenizer_from_hf(data))


def apply_source(plans: list[StagePlan], source: SourceMerges) -> tuple[list[StagePlan], tuple[Merge, ...]]:
    """Let ``source`` replace the first stage: check it has enough merges and take its pattern."""
    first = plans[0]
    if first.end > len(source.merges):
        raise ConfigError(
            f"the first stage needs {first.end} merges but {source.description} has only {len(source.merges)}"
            + (" (schedule.transition is beyond them)" if len(plans) > 1 else "")
        )
    pre = source.pretokenizer or first.pretokenizer
    if source.pretokenizer is None:  # bare files do not say which pattern made their merges
        log.info(
            "stage %s: %s says no pattern; recorded as %s (pretokenizer= names the one that made them)",
            first.name, source.description, pre.name,
        )  # fmt: skip
    plans = [replace(first, pretokenizer=pre), *plans[1:]]
    return plans, source.merges[: first.end]


def merges_fingerprint(merges: Sequence[Merge]) -> str:
    """A short digest of a merge list (for cache keys and resume checks)."""
    digest = hashlib.sha256()
    for left, right in merges:
        digest.update(len(left).to_bytes(4, "little") + left + len(right).to_bytes(4, "little") + right)
    return digest.hexdigest()[:32]


def describe(plans: Sequence[StagePlan]) -> str:
    """One line per plan, for the log."""
    return "; ".join(
        f"{p.name}: {p.pretokenizer.name} to {p.end} merges"
        + (f", {json.dumps(rules_spec(p.rules))}" if p.rules.restricts_tokens else "")
        for p in plans
    )
