"""superbpe: fast, exact, resumable byte-level BPE and SuperBPE tokenizers.

The library works without Hydra::

    import superbpe
    vocab, merges = superbpe.train_bpe("corpus.txt", 32000, ["<|endoftext|>"])
    vocab, merges = superbpe.train_superbpe(texts, 32000, transition=0.8)  # texts: any iterable of str
    tok = superbpe.Tokenizer(vocab, merges, ["<|endoftext|>"])

Heavy submodules are imported on first use so ``import superbpe`` stays cheap in worker processes.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "train_bpe": "superbpe.api",
    "train_superbpe": "superbpe.api",
    "count": "superbpe.api",
    "build_vocab": "superbpe.api",
    "Tokenizer": "superbpe.tokenizer",
    "PieceCounts": "superbpe.counting",
    "MergeRules": "superbpe.trainer",
    "Pretokenizer": "superbpe.pretokenize",
    "get_pretokenizer": "superbpe.pretokenize",
    "PATTERNS": "superbpe.pretokenize",
    "get_engine": "superbpe.engine",
    "SuperBPEError": "superbpe.errors",
    "run_training": "superbpe.run",
    "TrainConfig": "superbpe.config",
    "CompatConfig": "superbpe.config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'superbpe' has no attribute {name!r}")
    return getattr(import_module(module), name)
