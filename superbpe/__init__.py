"""superbpe: fast, exact, resumable byte-level BPE and SuperBPE tokenizers.

The library works without Hydra::

    import superbpe
    vocab, merges = superbpe.train_bpe("corpus.txt", 32000, ["<|endoftext|>"])
    tok = superbpe.Tokenizer(vocab, merges, ["<|endoftext|>"])
    vocab, merges = superbpe.train_superbpe(iter(texts), 32000, transition=0.8)  # a bare list is paths
    tok = superbpe.Tokenizer(vocab, merges, pretokenizer="superbpe")  # the stage-2 pattern makes superwords
    tok = superbpe.Tokenizer.train_superbpe(iter(texts), 32000, 0.8, ["<|endoftext|>"])  # one call, as a run

Heavy submodules are imported on first use so ``import superbpe`` stays cheap in worker processes.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "train_bpe": "superbpe.api.train",
    "train_superbpe": "superbpe.api.train",
    "count": "superbpe.api.train",
    "build_vocab": "superbpe.core.vocab",
    "Tokenizer": "superbpe.api.tokenizer",
    "PieceCounts": "superbpe.core.counts",
    "MergeRules": "superbpe.core.rules",
    "Pretokenizer": "superbpe.core.pretokenize",
    "get_pretokenizer": "superbpe.core.pretokenize",
    "PATTERNS": "superbpe.core.pretokenize",
    "get_engine": "superbpe.engines.interface",
    "SuperBPEError": "superbpe.core.errors",
    "run_training": "superbpe.training.run",
    "TrainConfig": "superbpe.training.config",
    "DataConfig": "superbpe.training.config",
    "PretokenizerConfig": "superbpe.training.config",
    "EngineConfig": "superbpe.training.config",
    "ScheduleConfig": "superbpe.training.config",
    "StageConfig": "superbpe.training.config",
    "CompatConfig": "superbpe.core.compat",
    "open_tokens": "superbpe.formats.token_files",
    "open_shards": "superbpe.formats.token_files",
}
#: Modules handed out whole: ``superbpe.compat.OFFICIAL`` names a preset.
_MODULES = {"compat": "superbpe.core.compat"}

__all__ = sorted(_EXPORTS)


def __dir__() -> list[str]:
    """What ``dir(superbpe)`` and editors' completion list: the public names, which are imported on
    first use and so are not module globals yet, not the helpers this module imports."""
    return sorted({*(name for name in globals() if name.startswith("__")), *__all__, *_MODULES})


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return import_module(_MODULES[name])
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'superbpe' has no attribute {name!r}{_did_you_mean(name)}")
    return getattr(import_module(module), name)


def _did_you_mean(name: str) -> str:
    """The public names a mistyped or shortened one may have meant (``train`` is ``train_bpe`` or
    ``train_superbpe``, further apart than Python's own suggestions reach), as the end of the error."""
    if name.startswith("__"):
        return ""
    from difflib import get_close_matches  # only for the error: not a cost of every import

    names = [*__all__, *_MODULES]
    found = [n for n in names if len(name) >= 3 and n.startswith(name)]
    found += [n for n in names if len(n) >= 4 and name.startswith(n)]
    found += get_close_matches(name, names, n=3, cutoff=0.7)
    near = list(dict.fromkeys(found))[:3]
    return f"; did you mean {' or '.join(near)}?" if near else ""
