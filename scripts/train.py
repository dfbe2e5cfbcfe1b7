"""Train a BPE / SuperBPE tokenizer from the Hydra configs in conf/ (see conf/train.yaml).

python scripts/train.py                                      # default job, embedded corpus
python scripts/train.py schedule=superbpe schedule.transition=0.8 data.paths=[corpus.txt]
python scripts/train.py -m vocab_size=8000,16000 schedule=superbpe schedule.transition=0.5,0.8
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from _common import USER_ERRORS, fail, remove_if_only_logs, run_hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from superbpe.config import TrainConfig, register_configs, to_dataclass
from superbpe.run import TrainingInterrupted
from superbpe.run_dirs import resume_args, resume_command

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from superbpe.run import run_training

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        result = run_training(to_dataclass(cfg, TrainConfig), run_dir=run_dir)
    except USER_ERRORS as exc:
        if not cfg.get("resume"):
            remove_if_only_logs(run_dir)
        fail(exc)
    except TrainingInterrupted as stop:
        print(f"interrupted: {stop}; continue with: {resume_command(stop.output_dir, _entry_point())}")
        raise SystemExit(130) from None
    except KeyboardInterrupt:  # before training started: nothing to keep
        if not cfg.get("resume"):
            remove_if_only_logs(run_dir)
        print("interrupted before training started")
        raise SystemExit(130) from None
    print(f"tokenizer: {result.output_dir}")


def _entry_point() -> list[str]:
    return ["python", sys.argv[0]] if sys.argv[0].endswith(".py") else [sys.argv[0]]


if __name__ == "__main__":
    try:
        sys.argv[1:] = resume_args(sys.argv[1:])
    except USER_ERRORS as exc:
        fail(exc)
    run_hydra(main)
