"""The tokenizer a worker process keeps between shard tasks: loaded once for all the shards of one job."""

from __future__ import annotations

from superbpe.api.tokenizer import Tokenizer
from superbpe.core.compat import CompatConfig

_TOKENIZERS: dict[tuple[str, str, str, str], Tokenizer] = {}


def load_tokenizer(
    directory: str, engine: str, fingerprint: str, compat: str | CompatConfig | None
) -> Tokenizer:
    """The tokenizer, loaded once per worker process (a worker runs many shards of one job)."""
    key = (directory, engine, fingerprint, repr(compat))
    if key not in _TOKENIZERS:
        _TOKENIZERS.clear()
        _TOKENIZERS[key] = Tokenizer.load(directory, engine=engine, compat=compat)
    return _TOKENIZERS[key]
