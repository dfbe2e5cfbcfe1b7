"""Bytes per token (and tokens per document) of a tokenizer on held-out text.

python scripts/evaluate.py tokenizer=outputs/DATE/TIME input=heldout.txt
"""

from __future__ import annotations

import json

import hydra
from _common import USER_ERRORS, fail, setup_logging
from omegaconf import DictConfig

from superbpe.config import EvaluateConfig, register_configs, to_dataclass

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from pathlib import Path

    from superbpe.evaluate import evaluate_dir
    from superbpe.util import atomic_write_text

    setup_logging()
    try:
        args = to_dataclass(cfg, EvaluateConfig)
        result = evaluate_dir(
            args.tokenizer,
            args.input,
            separator=args.separator,
            text_field=args.text_field,
            engine=args.engine.name,
            executor=args.executor,
        )
        if args.output:
            atomic_write_text(Path(args.output), json.dumps(result.to_json(), indent=2) + "\n")
    except USER_ERRORS as exc:
        fail(exc)
    print(
        f"bytes/token {result.bytes_per_token:.4f}  tokens/document {result.tokens_per_document:.2f}  "
        f"({result.bytes} bytes, {result.tokens} tokens, {result.documents} documents)"
    )


if __name__ == "__main__":
    main()
