"""A whole tokenizer directory: every file a trained tokenizer is saved as, written together."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from superbpe.core.errors import ConfigError, InputError
from superbpe.core.pretokenize import Pretokenizer
from superbpe.core.types import Merge
from superbpe.core.util import atomic_write_texts, user_path
from superbpe.formats.gpt2 import MERGES_FILE, VOCAB_FILE, merges_to_text, vocab_to_json_text
from superbpe.formats.hf import (
    CHAT_TEMPLATE_DIR,
    CHAT_TEMPLATE_FILE,
    HF_FILE,
    chat_template_texts,
    hf_tokenizer_json,
    resolve_roles,
    transformers_documents,
)
from superbpe.formats.json_files import json_text
from superbpe.formats.manifest import MANIFEST_FILE, Manifest
from superbpe.formats.tiktoken_files import TIKTOKEN_FILE, TIKTOKEN_META_FILE, tiktoken_texts

#: The files a save writes only when asked for or when the tokenizer has them (a chat template; the
#: other templates are the ``.jinja`` files of ``CHAT_TEMPLATE_DIR``): one left from an earlier save into the
#: same directory is removed.
STALE_IF_UNWRITTEN = (TIKTOKEN_FILE, TIKTOKEN_META_FILE, CHAT_TEMPLATE_FILE)


def save_tokenizer_dir(
    directory: str | Path,
    vocab: Mapping[int, bytes],
    merges: Sequence[Merge],
    special_tokens: Sequence[str],
    pretokenizer: Pretokenizer,
    *,
    stages: Sequence[Mapping[str, Any]] = (),
    training: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    whole_pieces: bool = True,
    vocab_style: str = "lines",
    roles: Mapping[str, str | None] | None = None,
    settings: Mapping[str, Any] | None = None,
    plain_added: Collection[str] = (),
    tiktoken: bool = False,
) -> Path:
    """Write ``vocab.json``, ``merges.txt``, ``tokenizer.json`` (+ the two transformers files) and
    ``superbpe.json`` into ``directory``; with ``tiktoken``, also ``tokenizer.tiktoken`` + ``tiktoken.json``.

    ``roles`` maps transformers' ``bos_token`` / ``eos_token`` / ``pad_token`` / ``unk_token`` to special
    tokens (default: ``<|endoftext|>`` as bos and eos when it is a special token); ``settings`` are the
    other transformers settings (``hf.read_transformers_settings``), chat templates written as their own
    files; ``plain_added`` the special tokens transformers is to take as added tokens that are not special.
    ``whole_pieces`` is how
    the tokenizer encodes (see :class:`Manifest`); ``vocab_style`` the ``vocab.json`` layout. Every
    document is built (and so validated) before the first file is written; tiktoken files an earlier save
    left that this one does not write are removed. No file is replaced until every one is written, so a save
    that fails part way (a full disk) leaves the directory as it was. A directory that cannot be written is
    an ``InputError``.
    """
    # "" is Path("."): an unset variable would write the files into the working directory.
    if not isinstance(directory, (str, os.PathLike)) or not str(directory):
        raise InputError(f"the tokenizer is saved into a directory; give its path (\".\" for this one), "
                         f"not {directory!r}")  # fmt: skip
    directory = user_path(directory)
    if directory.exists() and not directory.is_dir():
        raise InputError(f"{directory}: exists and is not a directory; the tokenizer needs a directory")
    hf_document = hf_tokenizer_json(vocab, merges, special_tokens, pretokenizer, whole_pieces, plain_added)
    hf_text = json_text(hf_document, indent=1)
    texts = {
        VOCAB_FILE: vocab_to_json_text(vocab, vocab_style),
        MERGES_FILE: merges_to_text(merges),
        HF_FILE: hf_text,
        MANIFEST_FILE: _manifest_text(merges, hf_text, stages, training, extra, len(vocab), special_tokens,
                                      pretokenizer, whole_pieces, plain_added),  # fmt: skip
    }
    hf_roles = resolve_roles(roles, special_tokens)
    documents = transformers_documents(vocab, special_tokens, hf_roles, settings, plain_added)
    for name, document in documents.items():
        texts[name] = json_text(document, indent=2)
    texts.update(chat_template_texts(settings or {}))
    if tiktoken:
        texts.update(tiktoken_texts(vocab, merges, special_tokens, pretokenizer))
    try:
        atomic_write_texts({directory / name: text for name, text in texts.items()})
        # Files of an earlier save that this one does not write would describe another tokenizer.
        for path in _optional_files(directory):
            if path.relative_to(directory).as_posix() not in texts:
                path.unlink(missing_ok=True)
    except OSError as exc:
        raise InputError(f"{directory}: cannot write the tokenizer there ({exc.strerror or exc})") from None
    return directory


def _optional_files(directory: Path) -> list[Path]:
    """The files in ``directory`` that a save writes only for some tokenizers (:data:`STALE_IF_UNWRITTEN`,
    chat templates): one that this save does not write was left by another tokenizer, and transformers
    (and a load here) would take it as this one's."""
    templates = directory / CHAT_TEMPLATE_DIR
    found = sorted(templates.glob("*.jinja")) if templates.is_dir() else []
    return [directory / name for name in STALE_IF_UNWRITTEN] + found


def _manifest_text(
    merges: Sequence[Merge],
    hf_text: str,
    stages: Sequence[Mapping[str, Any]],
    training: Mapping[str, Any] | None,
    extra: Mapping[str, Any] | None,
    vocab_size: int,
    special_tokens: Sequence[str],
    pretokenizer: Pretokenizer,
    whole_pieces: bool,
    plain_added: Collection[str],
) -> str:
    """``superbpe.json``'s text. The caller's records (``stages``, ``training``, ``extra``) must be JSON
    objects: anything else is a one-line ``ConfigError`` here, before a file is written."""
    try:
        manifest = Manifest(
            pretokenizer=pretokenizer.spec(),
            special_tokens=list(special_tokens),
            vocab_size=vocab_size,
            stages=[dict(stage) for stage in stages],
            training=dict(training or {}),
            extra=dict(extra or {}),
            whole_pieces=whole_pieces,
            hf_sha256=hashlib.sha256(hf_text.encode("utf-8")).hexdigest(),
            num_merges=len(merges),
            plain_added_tokens=[special for special in special_tokens if special in plain_added],
        )
        return json_text(manifest.to_json(), indent=2)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            "the manifest's records (manifest_extra, stages: a list of dicts, training) must be JSON "
            f"objects of JSON values: {exc}"
        ) from None


def states_its_pattern(path: Path) -> bool:
    """Whether a tokenizer at ``path`` says which pattern made its merges (a run's manifest, a
    ``tokenizer.json``), where bare ``vocab.json`` + ``merges.txt`` do not."""
    if path.is_dir():
        return (path / MANIFEST_FILE).is_file() or not (path / MERGES_FILE).is_file()
    return path.is_file()


#: The files a tokenizer directory holds that a save writes over (a directory's other files are left).
WRITTEN_FILES = (VOCAB_FILE, MERGES_FILE, HF_FILE, MANIFEST_FILE, TIKTOKEN_FILE)


def tokenizer_files_in(directory: Path) -> list[str]:
    """The names of the tokenizer files in ``directory`` that saving a tokenizer there would replace."""
    return [name for name in WRITTEN_FILES if (directory / name).is_file()]


def tokenizer_file_digests(directory: Path) -> dict[str, str]:
    """Each tokenizer file in ``directory`` (:func:`tokenizer_files_in`) by name: a digest of its bytes,
    which tells a file changed since it was written from one that was not."""
    return {
        name: hashlib.sha256((directory / name).read_bytes()).hexdigest()[:32]
        for name in tokenizer_files_in(directory)
    }
