"""Encode a corpus into a flat uint16/uint32 token file (+ JSON sidecar) for LM training.

python scripts/encode.py tokenizer=outputs/DATE/TIME input=corpus.txt output=corpus.bin
python scripts/encode.py tokenizer=... 'input=[a.jsonl,b/*.txt]' output=train.bin separator=null
"""

from __future__ import annotations

import hydra
from _common import USER_ERRORS, fail, setup_logging
from omegaconf import DictConfig

from superbpe.config import EncodeConfig, register_configs, to_dataclass

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="encode")
def main(cfg: DictConfig) -> None:
    from superbpe.token_files import encode_corpus

    setup_logging()
    try:
        args = to_dataclass(cfg, EncodeConfig)
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
        )
    except USER_ERRORS as exc:
        fail(exc)
    print(f"{result.output}: {result.tokens} tokens ({result.dtype}), {result.documents} documents")


if __name__ == "__main__":
    main()
