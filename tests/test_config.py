"""The Hydra configs, through Hydra's compose API: every group composes, typos and bad values fail clearly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException

from superbpe.core.compat import OFFICIAL
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.pretokenize import PATTERNS
from superbpe.training.config import (
    DataConfig,
    EncodeConfig,
    EvaluateConfig,
    PretokenizerConfig,
    ScheduleConfig,
    TrainConfig,
    register_configs,
    to_dataclass,
)
from superbpe.training.run import prepare, run_training
from superbpe.training.stages import plan_stages, resolve_pretokenizer

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = {
    "data": ["default", "files"],
    "pretokenizer": [*PATTERNS, "custom"],
    "engine": ["python", "native", "auto"],
    "schedule": ["bpe", "superbpe"],
}


@pytest.fixture(autouse=True)
def hydra_conf():
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield


def train_config(*overrides: str) -> TrainConfig:
    return to_dataclass(compose("train", overrides=list(overrides)), TrainConfig)


def test_every_group_option_has_a_file():
    for group, options in GROUPS.items():
        on_disk = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
        assert on_disk == sorted(options), group


def test_defaults_compose_to_a_runnable_default_job():
    cfg = train_config()
    assert cfg.vocab_size == 8192
    assert cfg.special_tokens == ["<|endoftext|>"]
    assert cfg.schedule.name == "bpe" and cfg.engine.name == "auto" and cfg.pretokenizer.name == "gpt2"
    assert cfg.checkpoint.every_merges > 0 and cfg.checkpoint.every_seconds > 0
    assert cfg.resume is None and cfg.eval is None
    paths = [Path(p) for p in cfg.data.paths]
    assert paths and all(p.suffix == ".py" and p.is_file() for p in paths)
    size = sum(p.stat().st_size for p in paths)
    assert 1_000_000 < size < 6_000_000  # a few MB: the default job stays well under a minute


@pytest.mark.parametrize("name", list(PATTERNS))
def test_builtin_pretokenizers_compose(name):
    cfg = train_config(f"pretokenizer={name}")
    pre = resolve_pretokenizer(cfg.pretokenizer)
    assert pre.name == name and pre.pattern == PATTERNS[name]


def test_custom_pretokenizer_takes_a_pattern():
    cfg = train_config("pretokenizer=custom", r"pretokenizer.pattern='\p{L}+|\p{N}+'")
    pre = resolve_pretokenizer(cfg.pretokenizer)
    assert pre.name == "custom" and pre.split("ab12 c") == ["ab", "12", " ", "c"]


def test_custom_pretokenizer_without_pattern_is_an_error():
    cfg = train_config("pretokenizer=custom")
    with pytest.raises(ConfigError, match="pretokenizer=custom needs its pattern: pretokenizer.pattern="):
        resolve_pretokenizer(cfg.pretokenizer)


@pytest.mark.parametrize("engine", GROUPS["engine"])
def test_engines_compose(engine):
    assert train_config(f"engine={engine}").engine.name == engine


def test_data_paths_override_and_files_group(tmp_path):
    corpus = tmp_path / "a.txt"
    corpus.write_text("hello")
    assert train_config(f"data.paths=[{corpus}]").data.paths == [str(corpus)]
    assert train_config("data=files", f"data.paths=[{corpus}]").data.paths == [str(corpus)]
    with pytest.raises(InputError, match="set data.paths"):
        prepare(train_config("data=files"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_bpe_schedule_is_one_stage_to_vocab_size():
    cfg = train_config("vocab_size=1000")
    plans = plan_stages(cfg.schedule, cfg.pretokenizer, 743)
    assert [(p.name, p.pretokenizer.name, p.end) for p in plans] == [("bpe", "gpt2", 743)]


@pytest.mark.parametrize(("transition", "end"), [("0.5", 372), ("100", 100)])
def test_superbpe_schedule_stages(transition, end):
    cfg = train_config(
        "schedule=superbpe", f"schedule.transition={transition}", "pretokenizer=superbpe-stage1"
    )
    first, second = plan_stages(cfg.schedule, cfg.pretokenizer, 743)
    assert (first.pretokenizer.name, first.end, first.rules.max_words_per_token) == (
        "superbpe-stage1",
        end,
        None,
    )
    assert second.pretokenizer.name == "superbpe" and second.pretokenizer.line_units
    assert second.end == 743
    assert second.rules.max_words_per_token == 4 and second.rules.forbidden_substrings == (b": ",)


def test_superbpe_paper_stage2_pattern():
    cfg = train_config("schedule=superbpe", "schedule.stage2_pattern=superbpe-paper")
    assert plan_stages(cfg.schedule, cfg.pretokenizer, 743)[1].pretokenizer.name == "superbpe-paper"


def test_a_schedule_is_a_list_of_stages_users_can_write():
    cfg = train_config(
        "schedule=bpe",
        "schedule.stages=[{name: a, until: 100},{name: b, until: 0.5, max_token_bytes: 8},{name: c}]",
    )
    plans = plan_stages(cfg.schedule, cfg.pretokenizer, 1000)
    assert [(p.name, p.end) for p in plans] == [("a", 100), ("b", 500), ("c", 1000)]
    assert plans[1].rules.max_token_bytes == 8


def test_unknown_key_is_an_error_naming_it():
    with pytest.raises(ConfigCompositionException, match="vocab_sise"):
        train_config("vocab_sise=1000")
    with pytest.raises(ConfigCompositionException, match="transitoin"):
        train_config("schedule=superbpe", "schedule.transitoin=0.5")


#: (command, overrides, what the error names): an option the chosen group option does not use, for
#: every group with such options. The groups data, engine (beyond memory_limit) and compat have
#: none: each of their keys is read by every option of the group.
UNUSED = [
    ("train", ["schedule.transition=0.5"], ["schedule.transition=0.5", "schedule=bpe", "schedule=superbpe"]),
    ("train", ["schedule.stage2_pattern=superbpe-paper"], ["schedule.stage2_pattern", "schedule=superbpe"]),
    # A stage's end set by hand: the transition the user never set was named as a knob of its own schedule.
    ("train", ["schedule=superbpe", "schedule.stages.0.until=300"],
     ["schedule.transition=0.8 is not used by schedule=superbpe: a stage's own", "set schedule.transition"]),
    ("train", ["schedule.stage2_approx_sample=0.25"], ["schedule.stage2_approx_sample", "schedule=superbpe"]),
    ("train", ["pretokenizer.pattern='\\w+'"], ["pretokenizer.pattern", "pretokenizer=custom"]),
    # As a job of a sweep over pretokenizer=gpt2,custom: the way to sweep both kinds is named.
    ("train", ["pretokenizer=gpt2", "pretokenizer.pattern='\\w+'"],
     ["pretokenizer.pattern", "pretokenizer.name=gpt2,'custom:<regex>'"]),
    ("train", ["pretokenizer.name=words", "pretokenizer.pattern='\\w+'"],  # a config file of the user's own
     ["pretokenizer name 'words' is no built-in pattern", "name: custom"]),
    ("train", ["engine=python", "memory_limit=8GB"], ["memory_limit=8GB", "engine=native"]),
    ("train", ["executor.address=auto"], ["executor.address=auto", "executor=ray"]),
    ("train", ["cache_dir=null", "cache_max_gib=20"], ["cache_max_gib=20", "cache_dir, which is null"]),
    ("encode", ["executor.address=auto"], ["executor.address=auto", "executor=ray"]),
    ("evaluate", ["executor.address=auto"], ["executor.address=auto", "executor=ray"]),
]
REQUIRED = {
    "train": [],
    "encode": ["tokenizer=t", "input=a", "output=o"],
    "evaluate": ["tokenizer=t", "input=a"],
}
SCHEMAS = {"train": TrainConfig, "encode": EncodeConfig, "evaluate": EvaluateConfig}


@pytest.mark.parametrize(("command", "overrides", "named"), UNUSED)
def test_an_option_the_chosen_group_does_not_use_is_an_error_naming_the_group(command, overrides, named):
    with pytest.raises(ConfigError) as info:
        to_dataclass(compose(command, overrides=[*REQUIRED[command], *overrides]), SCHEMAS[command])
    for fragment in named:
        assert fragment in str(info.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["schedule=superbpe", "schedule.transition=0.5", "schedule.stage2_approx_sample=0.25"],
        ["schedule=superbpe", "schedule.stage2_pattern=superbpe-paper"],
        ["schedule.stages=[{name: a, until: '${schedule.transition}'},{name: b}]", "schedule.transition=100"],
        ["pretokenizer=custom", "pretokenizer.pattern='\\w+'"],
        ["engine=auto", "memory_limit=8GB"],
        ["executor=ray", "executor.address=auto"],
        ["cache_max_gib=20"],
    ],
)
def test_the_same_options_are_fine_where_they_are_used(overrides):
    train_config(*overrides)


def test_typo_in_a_yaml_like_stage_key_is_an_error():
    with pytest.raises(ConfigCompositionException):
        train_config("schedule.stages=[{name: a, untill: 100}]")


@pytest.mark.parametrize("override", ["vocab_size=lots", "checkpoint.every_merges=often", "workers=[1]"])
def test_bad_value_type_is_an_error(override):
    with pytest.raises(ConfigCompositionException, match=override.split("=")[0]):
        train_config(override)


def test_unknown_group_option_lists_the_known_ones():
    with pytest.raises(MissingConfigException) as info:
        train_config("pretokenizer=gtp2")
    assert "gpt2" in str(info.value) and "superbpe-paper" in str(info.value)


@pytest.mark.parametrize(
    ("transition", "message"),
    [("1.5", "in \\(0, 1\\)"), ("743", "must be below"), ("5000", "a larger vocab_size leaves more"),
     ("abc", "merge count"), ("null", "schedule.transition is not set")],  # fmt: skip
)
def test_bad_transition_is_a_one_line_error(transition, message):
    cfg = train_config("schedule=superbpe", f"schedule.transition={transition}")
    with pytest.raises(ConfigError, match=message) as info:
        plan_stages(cfg.schedule, cfg.pretokenizer, 743)
    assert "schedule.transition" in str(info.value) and "\n" not in str(info.value)


def test_a_transition_of_one_merge_is_said_to_be_a_merge_count(caplog) -> None:
    """``schedule.transition=1`` (meant as all of them, as 1.0 is plain BPE in the summary's plot) trained a
    stage 1 of one merge without a word; a fraction and a count above 1 say nothing."""
    import logging

    caplog.set_level(logging.WARNING, logger="superbpe")
    for transition in ("0.5", "2"):
        cfg = train_config("schedule=superbpe", f"schedule.transition={transition}")
        plan_stages(cfg.schedule, cfg.pretokenizer, 743)
    assert not caplog.records
    cfg = train_config("schedule=superbpe", "schedule.transition=1")
    plans = plan_stages(cfg.schedule, cfg.pretokenizer, 743)
    assert [plan.end for plan in plans] == [1, 743]
    (record,) = caplog.records
    assert record.getMessage().startswith("schedule.transition 1 is a merge count: the stage makes 1 merge")


def test_a_fraction_beyond_the_merges_is_named_with_the_count_it_gives():
    """0.9 of a vocabulary with one merge was told "0.9 must be below the 1 merges", comparing the
    fraction itself with the merges."""
    cfg = train_config("schedule=superbpe", "schedule.transition=0.9", "vocab_size=258")
    with pytest.raises(ConfigError) as info:
        plan_stages(cfg.schedule, cfg.pretokenizer, 1)
    expected = "schedule.transition 0.9 gives 1 merge, which must be below the merge"
    assert str(info.value).startswith(expected), str(info.value)


def test_a_float_transition_past_one_is_not_called_a_fraction_under_compat_official():
    """``1000.0`` under compat=official was told that fractions wait for the count, not that it is no
    fraction (what the default preset says)."""
    cfg = train_config("schedule=superbpe", "schedule.transition=1000.0")
    with pytest.raises(ConfigError, match=r"1000.0 is a fraction and must be in \(0, 1\); use an int"):
        plan_stages(cfg.schedule, cfg.pretokenizer, 743, OFFICIAL)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["schedule=superbpe", "schedule.stage2_pattern=custom"],
         "schedule.stage2_pattern=custom needs its pattern: schedule.stage2_pattern='custom:<regex>'"),
        (["pretokenizer=custom"], "pretokenizer=custom needs its pattern: pretokenizer.pattern='<regex>'"),
    ],
)  # fmt: skip
def test_a_custom_pattern_left_out_is_asked_for_where_it_is_set(overrides, message):
    """``schedule.stage2_pattern=custom`` was told to set ``pretokenizer.pattern``, which is then refused."""
    cfg = train_config(*overrides)
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve_pretokenizer(cfg.pretokenizer)
        plan_stages(cfg.schedule, cfg.pretokenizer, 743)


def test_unknown_pretokenizer_name_in_a_stage_is_an_error():
    cfg = train_config("schedule=superbpe", "schedule.stage2_pattern=superbpe2")
    with pytest.raises(ConfigError, match="unknown pre-tokenizer 'superbpe2'"):
        plan_stages(cfg.schedule, cfg.pretokenizer, 743)


def test_encode_and_evaluate_configs_compose():
    enc = to_dataclass(
        compose("encode", overrides=["tokenizer=t", "input=a.txt", "output=o.bin"]), EncodeConfig
    )
    assert (enc.tokenizer, enc.input, enc.output, enc.separator) == ("t", "a.txt", "o.bin", "<|endoftext|>")
    ev = to_dataclass(compose("evaluate", overrides=["tokenizer=t", "input=[a,b]"]), EvaluateConfig)
    assert ev.input == ["a", "b"]
    with pytest.raises(ConfigCompositionException, match="outptu"):
        compose("encode", overrides=["tokenizer=t", "input=a", "outptu=o"])


def test_superbpe_schedule_defaults_stage1_to_the_official_pattern_but_the_command_line_wins():
    assert train_config("schedule=superbpe").pretokenizer.name == "superbpe-stage1"
    assert train_config("schedule=superbpe", "pretokenizer=gpt2").pretokenizer.name == "gpt2"
    assert train_config("pretokenizer=o200k", "schedule=superbpe").pretokenizer.name == "o200k"
    assert train_config("schedule=bpe").pretokenizer.name == "gpt2"


@pytest.mark.parametrize(
    "knobs",
    [{}, {"transition": 100, "stage2_pattern": "superbpe-paper", "stage2_approx_sample": 0.25}],
)
def test_the_library_superbpe_schedule_is_the_commands(knobs):
    overrides = [f"schedule.{key}={value}" for key, value in knobs.items()]
    composed = train_config("schedule=superbpe", *overrides).schedule
    assert ScheduleConfig.superbpe(**knobs, stage1_pattern=None) == composed
    assert ScheduleConfig.superbpe().stages[0].pretokenizer == PretokenizerConfig(name="superbpe-stage1")


def test_a_library_config_of_the_wrong_shape_is_refused_by_name(tmp_path):
    corpus = str(tmp_path / "a.txt")
    cases = {
        "data.paths takes a list, not str": TrainConfig(data=DataConfig(paths="/")),
        "data takes a DataConfig, not dict": TrainConfig(data={"paths": [corpus]}),  # type: ignore[arg-type]
        "schedule.stages[0] takes a StageConfig": TrainConfig(
            schedule=ScheduleConfig(stages=[{"name": "x"}])  # type: ignore[list-item]
        ),
        "schedule.transition=0.8 is used by none": TrainConfig(
            schedule=ScheduleConfig(name="superbpe", transition=0.8)
        ),
        "special_tokens takes a list": TrainConfig(special_tokens="<|endoftext|>"),  # type: ignore[arg-type]
        "stage2_pattern=o200k splits text into words": TrainConfig(
            schedule=ScheduleConfig.superbpe(stage2_pattern="o200k")
        ),
        # NaN equals nothing, yet it is the stage's value: its own check names it, not "used by none".
        "schedule.transition nan is a fraction": TrainConfig(
            schedule=ScheduleConfig.superbpe(transition=float("nan"))
        ),
        "approx_sample nan: give a fraction": TrainConfig(
            schedule=ScheduleConfig.superbpe(stage2_approx_sample=float("nan"))
        ),
    }
    for message, cfg in cases.items():
        cfg.output_dir = str(tmp_path / "out")
        with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
            run_training(cfg)
        assert not (tmp_path / "out").exists()
