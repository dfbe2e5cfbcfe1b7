"""Typed configuration of the commands: plain dataclasses, also used as Hydra schemas.

The same dataclasses serve two callers. Library users build a :class:`TrainConfig` by hand and call
:func:`superbpe.training.run.run_training`; the Hydra commands register them in the ConfigStore so every
key and value in ``conf/`` and on the command line is type-checked (a typo such as ``vocab_sise=...`` is
an error, not silently ignored). The groups the library takes as well (``compat``, ``executor``) are the
library's own plain dataclasses, held here as they are. Nothing here imports Hydra at module level, so
the library keeps working without it.
"""

from __future__ import annotations

import dataclasses
import re
import sysconfig
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superbpe.core.compat import CompatConfig
from superbpe.core.errors import ConfigError
from superbpe.core.pretokenize import PATTERNS, splits_into_words
from superbpe.jobs.executors import ExecutorSpec
from superbpe.training.directories import claim_unique_dir

DEFAULT_SPECIALS = ("<|endoftext|>",)


@dataclass
class DataConfig:
    """The training corpus: files, directories or globs of text (.txt), JSON lines (.jsonl, or .json
    named as a file), either optionally gzipped, Parquet files or saved HF datasets (README, "Counting")."""

    paths: list[str] = field(default_factory=list)
    text_field: str = "text"  # the field (JSON lines) or column (tables) holding each document's text
    errors: str = "strict"  # "strict": invalid UTF-8 is an error; "replace": U+FFFD


@dataclass
class PretokenizerConfig:
    """A built-in pattern by name, or ``name: custom`` with ``pattern``."""

    name: str = "gpt2"
    pattern: str | None = None
    line_units: bool | None = None  # None: the pattern's default (on for the stage-2 patterns)


@dataclass
class EngineConfig:
    """What counts, trains and encodes: ``native`` (Rust), ``python`` (the reference) or ``auto``
    (native when every pattern of the run has an exact native scanner, else python)."""

    name: str = "auto"  # python | native | auto


@dataclass
class StageConfig:
    """One training stage: its own pre-tokenizer and rules, trained on top of the previous stages.

    ``pretokenizer`` None means the run's top-level ``pretokenizer``. ``until`` is where the stage
    ends, counted in merges of the whole tokenizer: an int is a merge count, a float in (0, 1) a
    fraction of all merges, None means up to ``vocab_size``.

    ``approx_sample`` (a fraction in (0, 1]) is an approximation, off (None) by default: the stage
    counts an evenly spread share of the corpus instead of all of it (see
    :func:`superbpe.jobs.shards.sample_evenly`), trading a little compression for a stage that counts,
    holds and replays that much less text.
    """

    name: str = "bpe"
    pretokenizer: PretokenizerConfig | None = None
    until: Any = None
    min_frequency: int = 1
    max_token_bytes: int | None = None
    max_words_per_token: int | None = None
    forbidden_substrings: list[str] = field(default_factory=list)
    approx_sample: float | None = None


@dataclass
class ScheduleConfig:
    """A list of stages, plus the knobs the built-in schedules interpolate into their stages.

    ``from_run`` (a finished run directory) or ``from_tokenizer`` (GPT-2 ``vocab.json`` + ``merges.txt``
    directory, or a ``tokenizer.json``) replaces training of the first stage: its merges are the first
    ``until`` merges of that tokenizer.
    """

    name: str = "bpe"
    transition: Any = None
    stage2_pattern: str = "superbpe"
    stage2_approx_sample: float | None = None
    from_run: str | None = None
    from_tokenizer: str | None = None
    stages: list[StageConfig] = field(default_factory=lambda: [StageConfig()])

    @classmethod
    def superbpe(
        cls,
        transition: int | float = 0.8,
        *,
        stage1_pattern: str | None = "superbpe-stage1",
        stage2_pattern: str = "superbpe",
        stage2_approx_sample: float | None = None,
        from_run: str | None = None,
        from_tokenizer: str | None = None,
    ) -> ScheduleConfig:
        """The schedule ``superbpe-train schedule=superbpe`` composes (``conf/schedule/superbpe.yaml``), for
        library runs: a dataclass does not fill its stages from the knobs as the config's interpolations
        do. ``stage1_pattern`` is stage 1's pre-tokenizer, as the command's default for that schedule;
        None takes the run's top-level ``pretokenizer``."""
        stage1 = StageConfig(
            name="stage1",
            pretokenizer=None if stage1_pattern is None else PretokenizerConfig(name=stage1_pattern),
            until=transition,
        )
        stage2 = StageConfig(
            name="stage2",
            pretokenizer=PretokenizerConfig(name=stage2_pattern),
            max_words_per_token=4,
            forbidden_substrings=[": "],
            approx_sample=stage2_approx_sample,
        )
        return cls(
            name="superbpe", transition=transition, stage2_pattern=stage2_pattern,
            stage2_approx_sample=stage2_approx_sample, from_run=from_run, from_tokenizer=from_tokenizer,
            stages=[stage1, stage2],
        )  # fmt: skip


@dataclass
class CheckpointConfig:
    every_merges: int = 1000
    every_seconds: float = 60.0


@dataclass
class ExportConfig:
    """Extra files of the tokenizer directory: transformers' token roles and the tiktoken export.

    A role is a special token, ``auto`` (``<|endoftext|>`` when it is a special token, else none) or None.
    """

    bos_token: str | None = "auto"
    eos_token: str | None = "auto"
    pad_token: str | None = None
    unk_token: str | None = None
    tiktoken: bool = False  # also write tokenizer.tiktoken + tiktoken.json

    def roles(self) -> dict[str, str | None]:
        return {"bos_token": self.bos_token, "eos_token": self.eos_token, "pad_token": self.pad_token,
                "unk_token": self.unk_token}


@dataclass
class TrainConfig:
    """Everything a training run needs; the user-facing names of ``conf/train.yaml``."""

    data: DataConfig = field(default_factory=DataConfig)
    pretokenizer: PretokenizerConfig = field(default_factory=PretokenizerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    executor: ExecutorSpec = field(default_factory=ExecutorSpec)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    compat: CompatConfig = field(default_factory=CompatConfig)
    vocab_size: int = 8192
    special_tokens: list[str] = field(default_factory=lambda: list(DEFAULT_SPECIALS))
    workers: int | None = None
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: str | None = None  # a run directory to continue
    eval: str | None = None  # a held-out file: bytes/token goes into metrics.json
    output_dir: str | None = None  # where the tokenizer goes; None = the Hydra run directory
    cache_dir: str | None = None  # piece-count and stage-1 cache shared by runs; None = no cache
    cache_max_gib: float | None = None  # after a run, least recently used entries go until it fits
    progress: bool | None = None  # bars (True), log lines (False), or bars only on a terminal (None)
    # Most memory a stage's count and native trainer may grow the process to ("8GB", "1.5GiB"); None =
    # what is available. A stage that would not fit stops with a one-line error: a count as it passes the
    # limit, a trainer before it builds.
    memory_limit: str | None = None
    export: ExportConfig = field(default_factory=ExportConfig)
    pad_vocab_to_multiple_of: int | None = None  # reserved specials <|reserved_N|> round the vocab up


@dataclass
class EncodeConfig:
    """``superbpe-encode``: corpus -> flat token file for LM training."""

    tokenizer: str = "???"
    input: Any = "???"  # a file, directory, glob, or a list of them
    output: str = "???"  # a file, or a directory (new or empty) for one token file per shard + index.json
    separator: str | None = "<|endoftext|>"  # special token appended after every document; None = none
    workers: int | None = None  # threads (engine=python: processes); None = all CPUs or RAYON_NUM_THREADS
    chunk_bytes: int = 1 << 20
    text_field: str = "text"
    errors: str = "strict"
    engine: EngineConfig = field(default_factory=EngineConfig)
    executor: ExecutorSpec = field(default_factory=ExecutorSpec)
    progress: bool | None = None
    # How the tokenizer directory is read (the ``compat`` group, as in training): None = as it says;
    # ``compat=official`` reads bare official vocab.json + merges.txt as their encoder does.
    compat: CompatConfig | None = None
    dtype: str | None = None  # the ids' type, uint16 or uint32; None = the smallest that holds every id


@dataclass
class EvaluateConfig:
    """``superbpe-evaluate``: bytes per token of a tokenizer on held-out text."""

    tokenizer: str = "???"
    input: Any = "???"  # a file, directory, glob, or a list of them
    separator: str | None = "<|endoftext|>"  # documents are split at this special token
    text_field: str = "text"
    errors: str = "strict"  # "strict": invalid UTF-8 is an error; "replace": U+FFFD
    workers: int | None = None  # threads (native engine); None = all CPUs or RAYON_NUM_THREADS
    engine: EngineConfig = field(default_factory=EngineConfig)
    executor: ExecutorSpec = field(default_factory=ExecutorSpec)
    output: str | None = None  # also write the numbers as JSON here
    compat: CompatConfig | None = None  # as in EncodeConfig
    progress: bool | None = None  # bars (True), log lines (False), or bars only on a terminal (None)


def stdlib_sample(max_bytes: int = 3_000_000) -> list[str]:
    """The default corpus: Python's own standard library sources, present wherever Python is.

    Whole top-level ``*.py`` files in sorted order until ``max_bytes`` is reached, so the default
    job needs no download and runs in seconds.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chosen: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        if total >= max_bytes:
            break
        chosen.append(str(path))
        total += path.stat().st_size
    return chosen


def register_resolvers() -> None:
    """``${stdlib_sample:BYTES}`` for ``conf/data/default.yaml``; safe to call more than once."""
    from omegaconf import OmegaConf  # loaded by the commands only: library runs never need it

    if not OmegaConf.has_resolver("stdlib_sample"):
        OmegaConf.register_new_resolver("stdlib_sample", lambda n=3_000_000: stdlib_sample(int(n)))
    if not OmegaConf.has_resolver("unique_dir"):
        OmegaConf.register_new_resolver("unique_dir", claim_unique_dir)


def register_configs() -> None:
    """Put the schemas in Hydra's ConfigStore (the YAML files extend them by name)."""
    from hydra.core.config_store import ConfigStore  # loaded by the commands only: library runs never need it

    register_resolvers()
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    store.store(name="encode_schema", node=EncodeConfig)
    store.store(name="evaluate_schema", node=EvaluateConfig)


def to_dataclass(cfg: Any, schema: type) -> Any:
    """A composed DictConfig as the plain dataclass (interpolations resolved, types checked)."""
    from omegaconf import OmegaConf  # loaded by the commands only: library runs never need it

    if isinstance(cfg, schema):
        return cfg
    values = OmegaConf.to_container(cfg, resolve=False)
    unknown = unknown_keys(values, schema)
    if unknown:
        raise ConfigError(f"unknown config key(s): {', '.join(unknown)} (misspelt? '+' does not add keys)")
    unused = unused_options(values, schema)
    if unused:
        raise ConfigError("; ".join(unused))
    if OmegaConf.get_type(cfg) is not schema:  # untyped input: type it first (merging keeps ??? values)
        cfg = OmegaConf.merge(OmegaConf.structured(schema), cfg)
    return OmegaConf.to_object(cfg)


def check_shape(cfg: Any, prefix: str = "") -> None:
    """Refuse a config built by hand whose parts are of the wrong kind, naming the key.

    Why: the commands get this from OmegaConf's typed schema, but a library caller's
    ``DataConfig(paths="a.txt")`` was read character by character (``"/"`` is the whole filesystem),
    and ``TrainConfig(data={...})`` failed deep inside the run.
    """
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        key, value, hint = f"{prefix}{f.name}", getattr(cfg, f.name), hints[f.name]
        inner = _dataclass_in(hint)
        listed = typing.get_origin(hint) is list
        if value is None and type(None) in typing.get_args(hint):
            continue
        if listed and not isinstance(value, list | tuple):
            raise ConfigError(f"{key} takes a list, not {type(value).__name__}: {f.name}=[{value!r}]")
        if inner is None:
            continue
        for index, item in enumerate(value if listed else [value]):
            where = f"{key}[{index}]" if listed else key
            if not isinstance(item, inner):
                raise ConfigError(
                    f"{where} takes a {inner.__name__}, not {type(item).__name__}: "
                    f"{f.name}={'[' if listed else ''}{inner.__name__}(...){']' if listed else ''}"
                )
            check_shape(item, f"{where}.")


def check_schedule_knobs(schedule: ScheduleConfig) -> None:
    """Refuse a knob (``transition``, ``stage2_pattern``, ``stage2_approx_sample``) that no stage uses.

    Why: in the commands the built-in schedules' stages take the knobs through interpolations, and
    :func:`unused_options` refuses a knob they ignore; a library ``ScheduleConfig(name="superbpe",
    transition=0.8)`` kept its default single BPE stage and trained plain BPE without a word.
    """
    stages = schedule.stages
    used = {
        "transition": any(same_knob(stage.until, schedule.transition) for stage in stages),
        "stage2_pattern": any(stage.pretokenizer and stage.pretokenizer.name == schedule.stage2_pattern
                              for stage in stages),
        "stage2_approx_sample": any(same_knob(stage.approx_sample, schedule.stage2_approx_sample)
                                    for stage in stages),
    }  # fmt: skip
    pattern = schedule.stage2_pattern
    if used["stage2_pattern"] and splits_into_words(pattern):
        raise ConfigError(
            f"schedule.stage2_pattern={pattern} splits text into words, so stage 2 would make no "
            "superwords; it takes a pattern whose pieces cross words: superbpe or superbpe-paper"
        )
    defaults = ScheduleConfig()
    for knob, is_used in used.items():
        value = getattr(schedule, knob)
        if value != getattr(defaults, knob) and not is_used:
            raise ConfigError(
                f"schedule.{knob}={value} is used by none of the schedule's stages "
                f"({', '.join(stage.name for stage in stages)}); SuperBPE: ScheduleConfig.superbpe(...)"
            )


def same_knob(stage_value: Any, knob: Any) -> bool:
    """Whether a stage's value is the knob's: NaN counts as itself, since ``schedule.transition=nan``
    reaches the stage through its interpolation like any value, and the stage's own check names what
    is wrong with it (a NaN equals nothing: by ``==`` the knob would seem unused, with a library hint)."""
    nan = isinstance(stage_value, float) and isinstance(knob, float) and stage_value != stage_value
    return nan and knob != knob or stage_value == knob


def unknown_keys(values: Any, schema: type, prefix: str = "") -> list[str]:
    """Dotted keys in ``values`` (a plain nested dict) that ``schema`` (a dataclass) has no field for.

    Why: Hydra's ``+key=value`` adds a key even to a typed config, and converting to the dataclass
    then drops it without a word, so a misspelt ``+vocab_sise=100`` would train with the default.
    """
    if not isinstance(values, dict):
        return []
    hints = typing.get_type_hints(schema)
    fields = {f.name for f in dataclasses.fields(schema)}
    found: list[str] = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if key not in fields:
            found.append(name)
            continue
        inner = _dataclass_in(hints[key])
        if inner is None:
            continue
        items = value if isinstance(value, list) else [value]
        for index, item in enumerate(items):
            where = f"{name}[{index}]." if isinstance(value, list) else f"{name}."
            found.extend(unknown_keys(item, inner, where))
    return found


#: Schedule keys that only the stages use, through interpolations such as ``${schedule.transition}``.
SCHEDULE_KNOBS = ("transition", "stage2_pattern", "stage2_approx_sample")
_INTERPOLATED = re.compile(r"\$\{\s*schedule\.(\w+)")


def unused_options(values: Any, schema: type) -> list[str]:
    """Messages for options set to something other than their default that the chosen config groups
    never read, each naming the group option that would use it.

    Why: ``schedule.transition=0.5`` under the default ``schedule=bpe`` trained plain BPE without a
    word; a setting that does nothing must be an error, not a surprise in ``metrics.json``. ``values`` is
    the composed config, unresolved (interpolations still visible), as a plain dict.
    """
    if not isinstance(values, dict):
        return []
    found = _unused_executor_keys(values.get("executor"))
    if schema is TrainConfig:
        found += _unused_schedule_knobs(values.get("schedule"))
        pretokenizer = values.get("pretokenizer") or {}
        name = pretokenizer.get("name")
        if pretokenizer.get("pattern") is not None and name != "custom":
            if name in PATTERNS:
                found.append(
                    f"pretokenizer.pattern is used only by pretokenizer=custom (this run has "
                    f"pretokenizer={name}, a built-in pattern; a sweep over built-in and custom patterns "
                    "names each by pretokenizer.name: -m \"pretokenizer.name=gpt2,'custom:<regex>'\")"
                )
            else:  # a config file of the user's own, named after its pattern
                found.append(
                    f"pretokenizer name {name!r} is no built-in pattern: a config file of your own pattern "
                    "keeps name: custom beside its pattern"
                )
        schedule = values.get("schedule") or {}
        source = next((key for key in ("from_run", "from_tokenizer") if schedule.get(key)), None)
        paths = (values.get("data") or {}).get("paths")
        if source is not None and isinstance(paths, str) and paths.startswith("${stdlib_sample"):
            found.append(
                f"schedule.{source} continues a tokenizer on data.paths, which is still the built-in demo "
                "corpus: give the corpus to train on (data.paths=[...], the source run's own for its recipe)"
            )
        if values.get("cache_max_gib") is not None and values.get("cache_dir") is None:
            found.append(f"cache_max_gib={values['cache_max_gib']} caps cache_dir, which is null (no cache)")
        engine = (values.get("engine") or {}).get("name")
        if engine == "python" and values.get("memory_limit") is not None:
            found.append(
                f"memory_limit={values['memory_limit']} is used only by the native engine (engine=native or "
                "engine=auto): engine=python does not estimate memory"
            )
    return found


def _unused_schedule_knobs(schedule: Any) -> list[str]:
    """Knobs set on a schedule whose stages do not refer to them (``schedule=bpe`` has no transition).

    A stage refers to a knob through an interpolation (``until: ${schedule.transition}``), or holds its
    value itself (a schedule written out by hand, which still records its transition in the metrics).
    """
    if not isinstance(schedule, dict):
        return []
    stages = schedule.get("stages")
    referred = set(_INTERPOLATED.findall(repr(stages)))
    held = _scalars(stages)
    defaults = ScheduleConfig()
    name = schedule.get("name", "?")
    # schedule=superbpe's stages refer to every knob: one they no longer refer to was set in a stage by hand.
    why = "its stages do not refer to it; it is a knob of schedule=superbpe"
    if name == "superbpe":
        why = "a stage's own value (schedule.stages.N...) replaced it; set schedule.{knob} instead"
    return [
        f"schedule.{knob}={schedule[knob]} is not used by schedule={name}: {why.format(knob=knob)}"
        for knob in SCHEDULE_KNOBS
        if knob in schedule
        and knob not in referred
        and schedule[knob] != getattr(defaults, knob)
        and not (isinstance(schedule[knob], (str, int, float)) and schedule[knob] in held)
    ]


def _scalars(value: Any) -> set[Any]:
    """Every string and number in a nested structure of dicts and lists."""
    if isinstance(value, dict):
        return set().union(*(_scalars(item) for item in value.values()))
    if isinstance(value, list):
        return set().union(*(_scalars(item) for item in value))
    return {value} if isinstance(value, (str, int, float)) and not isinstance(value, bool) else set()


def _unused_executor_keys(executor: Any) -> list[str]:
    """``executor.address`` says where a Ray cluster is; the local executor has none."""
    if not isinstance(executor, dict) or executor.get("name") == "ray":
        return []
    address = executor.get("address", ExecutorSpec.address)
    if address == ExecutorSpec.address:
        return []
    return [f"executor.address={address} is used only by executor=ray (this command runs executor=local)"]


def dotted_keys(schema: type, prefix: str = "") -> list[str]:
    """Every key of ``schema`` (a dataclass) as an override names it, its parts' keys included; the keys
    of a list's items stand behind a ``*`` for the index (``schedule.stages.*.min_frequency``)."""
    hints = typing.get_type_hints(schema)
    keys: list[str] = []
    for f in dataclasses.fields(schema):
        keys.append(prefix + f.name)
        inner = _dataclass_in(hints[f.name])
        if inner is not None:
            index = ".*" if _is_list(hints[f.name]) else ""
            keys.extend(dotted_keys(inner, f"{prefix}{f.name}{index}."))
    return keys


def _is_list(hint: Any) -> bool:
    """Whether a field holds a list (optionally)."""
    return any(typing.get_origin(part) is list for part in (hint, *typing.get_args(hint)))


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field holds (directly, optionally, or as list items), if any."""
    if dataclasses.is_dataclass(hint):
        return hint  # type: ignore[return-value]
    for arg in typing.get_args(hint):
        found = _dataclass_in(arg)
        if found is not None:
            return found
    return None
