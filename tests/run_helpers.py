"""Training runs the tests share: the built-in SuperBPE schedule as plain config, official-recipe runs."""

from __future__ import annotations

from pathlib import Path

from superbpe.core.compat import OFFICIAL
from superbpe.core.pretokenize import PATTERNS
from superbpe.training.config import (
    DataConfig,
    EngineConfig,
    PretokenizerConfig,
    ScheduleConfig,
    TrainConfig,
)
from superbpe.training.run import run_training


def superbpe_schedule(transition: int, **source: str) -> ScheduleConfig:
    """The built-in superbpe schedule, stage 1 on the run's top-level pre-tokenizer."""
    return ScheduleConfig.superbpe(transition, stage1_pattern=None, **source)


def official_run(tmp_path: Path, corpus: Path, engine: str, schedule: ScheduleConfig, name: str) -> Path:
    """A ``compat=official`` run of ``schedule`` on ``corpus`` into ``tmp_path/name`` (vocab 1500)."""
    cfg = TrainConfig(
        data=DataConfig(paths=[str(corpus)]),
        pretokenizer=PretokenizerConfig(name="superbpe-stage1"),
        engine=EngineConfig(name=engine),
        schedule=schedule,
        compat=OFFICIAL,
        vocab_size=1500,
        special_tokens=[],
        output_dir=str(tmp_path / name),
        progress=False,
    )
    return run_training(cfg).output_dir


def hf_stage1(path: Path, vocab_size: int, out: Path) -> None:
    """Stock HF BpeTrainer as the official train_tokenizer.py sets it up (stage 1)."""
    import tokenizers

    hf = tokenizers.Tokenizer(tokenizers.models.BPE())
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Split(tokenizers.Regex(PATTERNS["superbpe-stage1"]), "isolated"),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.train([str(path)], tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False))
    hf.model.save(str(out))
