"""``Tokenizer``: encode and decode with a trained (or loaded) byte-level BPE vocabulary.

The constructor keeps the CS336 signature ``Tokenizer(vocab, merges, special_tokens)`` so course code and
tests work unchanged; the pre-tokenizer and the engine are extra keyword arguments. Special tokens are cut
out first (longest match first) and mapped straight to their ids; everything between them goes through
the engine's encoder, which is the only part whose speed matters.
"""

from __future__ import annotations

import contextlib
import copy
import operator
import os
import re
import warnings
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from itertools import accumulate, chain, repeat, starmap
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from superbpe.api.train import train_bpe, train_superbpe
from superbpe.core.compat import (
    CompatConfig,
    check_directory_compat,
    encoding_for,
    encoding_pretokenizer,
    get_compat,
    recorded_compat,
)
from superbpe.core.counts import PieceCounts, check_errors_mode
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.pretokenize import (
    Pretokenizer,
    SpecialSplitter,
    get_pretokenizer,
    special_token_list,
    specials_shown,
)
from superbpe.core.sources import (
    Chunk,
    ChunkCutter,
    DocumentStream,
    InputSpec,
    cut_stream,
    invalid_utf8,
    is_jsonl,
    is_table,
    open_binary,
)
from superbpe.core.types import Merge
from superbpe.core.util import caller_stacklevel, import_optional, resolve_threads, user_path
from superbpe.core.vocab import check_merge_parts
from superbpe.engines.interface import EncoderCore, Engine, get_engine
from superbpe.formats.checkpoints import CHECKPOINT_FILE
from superbpe.formats.gpt2 import MERGES_FILE, VOCAB_FILE, read_gpt2_files, unmerged_tokens
from superbpe.formats.hf import (
    HF_FILE,
    hf_split_problem,
    pretokenizer_from_hf,
    read_hf_tokenizer,
    read_roles,
    read_transformers_settings,
    resolve_roles,
)
from superbpe.formats.manifest import (
    MANIFEST_FILE,
    hf_file_changed,
    hf_file_encodes_otherwise,
    manifest_pretokenizer,
    read_manifest,
)
from superbpe.formats.tiktoken_files import (
    check_ranks_follow_merges,
    check_specials_for_tiktoken,
    tiktoken_pattern,
    tiktoken_ranks,
    tiktoken_split_problem,
)
from superbpe.formats.tokenizer_dir import save_tokenizer_dir

#: Up to this many special tokens, the encoder core looks for them itself (a substring search each),
#: so a text holding none is encoded in one call; beyond it encode() first makes one regex search.
FEW_SPECIALS = 8
#: The last this many merges are looked at for tokens the pre-tokenizer splits (SuperBPE's superwords
#: come last: a stage 2 learns them after every word-level merge).
SPLIT_MERGES_CHECKED = 64
#: encode_iterable encodes once this much new text has been buffered (and a cut point exists).
STREAM_FLUSH_CHARS = 1 << 16
#: encode_file reads and encodes the file in chunks of about this many bytes.
FILE_READ_BYTES = 1 << 20


#: How many tokens no merge makes a vocabulary may hold as its special tokens before that looks like a
#: merges file cut short or from another tokenizer (Llama 3 reserves 256).
UNMADE_EXPECTED = 256


class Tokenizer:
    """Byte-level BPE encode/decode with special tokens; see the module docstring for the contract."""

    def __init__(
        self,
        vocab: Mapping[int, bytes],
        merges: Sequence[Merge],
        special_tokens: Sequence[str] | None = None,
        pretokenizer: str | Pretokenizer = "gpt2",
        engine: str | Engine = "auto",
        *,
        whole_pieces: bool = True,
    ) -> None:
        vocab, merges = _checked_vocab(vocab), _checked_merges(merges)
        check_merge_parts(set(vocab.values()), merges)
        self._build(vocab, merges, special_tokens, pretokenizer, engine, whole_pieces)
        if special_tokens is None:
            _warn_if_specials_left_out(self._vocab, self._merges, self._pretokenizer, whole_pieces)

    @classmethod
    def _from_read(
        cls,
        vocab: dict[int, bytes],
        merges: list[Merge],
        valid: bool,
        special_tokens: Sequence[str] | None,
        pretokenizer: str | Pretokenizer,
        engine: str | Engine,
        *,
        whole_pieces: bool,
        specials_unmade: bool = False,
    ) -> Tokenizer:
        """From files just read: a vocab and merges found valid as they were read are not checked (nor
        copied) again. ``specials_unmade``: the special tokens are known to be tokens no merge makes."""
        if not valid:
            return cls(vocab, merges, special_tokens, pretokenizer, engine, whole_pieces=whole_pieces)
        tokenizer = cls.__new__(cls)
        tokenizer._build(vocab, merges, special_tokens, pretokenizer, engine, whole_pieces, specials_unmade)
        return tokenizer

    def _build(
        self,
        vocab: dict[int, bytes],
        merges: list[Merge],
        special_tokens: Sequence[str] | None,
        pretokenizer: str | Pretokenizer | None,
        engine: str | Engine,
        whole_pieces: bool,
        specials_unmade: bool = False,
    ) -> None:
        """Set up from a checked vocab and merges list, which it keeps (and adds special tokens to)."""
        if not isinstance(whole_pieces, bool):  # "no" would read as True in Python; the extension refuses it
            raise ConfigError(f"whole_pieces must be True or False, not {whole_pieces!r}")
        # What the directory it is loaded from says beyond encoding (token roles, transformers settings,
        # how it was trained): `save` writes it back unless given anew, so a load and a save lose nothing.
        self._roles: dict[str, str | None] | None = None
        self._hf_settings: dict[str, Any] = {}
        # The special tokens transformers does not count as special (added with its add_tokens).
        self._plain_added: frozenset[str] = frozenset()
        self._stages: list[dict[str, Any]] = []
        self._training: dict[str, Any] | None = None
        self._vocab = vocab
        self._whole_pieces = whole_pieces
        self._merges = merges
        self._splitter = SpecialSplitter(special_token_list(special_tokens or ()))
        self._id_of = dict(zip(self._vocab.values(), self._vocab, strict=True))
        self._special_ids = self._add_special_tokens()
        # Found once, not per call (a pass over the vocab): the largest id, which arrays' default dtype
        # and token files must hold. The constructor checks its vocab's ids; a vocab.json read as it is
        # (from_files, load) is checked here, before an array of its ids overflows.
        self._max_id = max(self._vocab, default=0)
        if self._max_id >= MAX_IDS:
            token = self._vocab[self._max_id]
            raise InputError(f"token {token!r} has id {self._max_id}: ids must be below 2**32 (uint32)")
        self._max_special_len = max((len(s) for s in self._special_ids), default=0)
        self._pretokenizer = get_pretokenizer("gpt2" if pretokenizer is None else pretokenizer)
        _warn_if_the_pattern_splits_merges(self._merges, self._pretokenizer)
        self._engine = get_engine(engine, [self._pretokenizer])
        specials = self._splitter.special_tokens
        # A few special tokens are the core's to look for (one substring search each), so that the
        # common text, holding none, is encoded in one call (`EncoderCore.plain`); many are looked for
        # here with one regex search.
        few = len(specials) <= FEW_SPECIALS
        self._core: EncoderCore = self._engine.encoder(
            self._ordinary_ids(specials_unmade),
            self._merges,
            self._pretokenizer,
            whole_pieces=whole_pieces,
            watched=specials if few else (),
        )
        self._encode_ordinary = self._core.encode_ordinary
        self._encode_ordinary_array = self._core.encode_ordinary_array
        self._plain: Any = self._core.plain if few else _not_plain
        self._plain_array: Any = self._core.plain_array if few else _not_plain
        self._default_dtype = self._smallest_dtype().name

    # -- construction helpers ------------------------------------------------------------------------

    def _add_special_tokens(self) -> dict[str, int]:
        """Ids of the special tokens; one not yet in the vocab gets the next free id (as CS336 does)."""
        ids = self._id_of
        special_ids: dict[str, int] = {}
        for special in self._splitter.special_tokens:
            token = special.encode("utf-8")
            if token not in ids:
                ids[token] = max(self._vocab, default=-1) + 1
                self._vocab[ids[token]] = token
            special_ids[special] = ids[token]
        return special_ids

    def _ordinary_ids(self, specials_unmade: bool = False) -> dict[bytes, int]:
        """bytes -> id for the encoder, minus tokens that exist only as special tokens.

        A special token's bytes must never come out of ordinary text (``encode_ordinary`` treats
        ``<|endoftext|>`` as plain text, as tiktoken does), unless BPE could also make them. With
        ``specials_unmade`` (the specials are the tokens the file reader found no merge makes), that is
        known without a pass over every merge's token.
        """
        candidates = {self._vocab[token_id] for token_id in self._special_ids.values()}
        candidates = {token for token in candidates if len(token) > 1}
        if candidates and not specials_unmade:
            candidates.difference_update(starmap(operator.add, self._merges))
        if not candidates:
            return self._id_of  # the engines copy what they keep; it changes no more
        ordinary = dict(self._id_of)
        for token in candidates:
            del ordinary[token]
        return ordinary

    # -- properties -----------------------------------------------------------------------------------

    @property
    def vocab(self) -> dict[int, bytes]:
        """A copy of ``{id: token bytes}``, special tokens included."""
        return dict(self._vocab)

    @property
    def merges(self) -> list[Merge]:
        return list(self._merges)

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def __len__(self) -> int:
        """The vocabulary size, specials included (as ``len`` of an HF tokenizer)."""
        return len(self._vocab)

    @property
    def special_tokens(self) -> list[str]:
        return list(self._special_ids)

    @property
    def plain_added_tokens(self) -> list[str]:
        """Those of :attr:`special_tokens` that transformers does not count as special: HF's added tokens with
        ``"special": false`` (``tok.add_tokens([...])``), in a directory this one was loaded from. They are
        cut from text and encoded like the other special tokens, as HF does, but ``decode(...,
        skip_special_tokens=True)`` keeps them, and :meth:`save` writes them as not special again."""
        return [special for special in self._special_ids if special in self._plain_added]

    @property
    def pretokenizer(self) -> Pretokenizer:
        return self._pretokenizer

    @property
    def roles(self) -> dict[str, str]:
        """Token roles for transformers (``{"bos_token": ..., ...}``): those of the directory it was loaded
        from, else the defaults; :meth:`save` writes them unless given ``roles``."""
        return resolve_roles(self._roles, self.special_tokens)

    @property
    def transformers_settings(self) -> Mapping[str, Any]:
        """The transformers settings of the directory it was loaded from, read-only: every
        ``tokenizer_config.json`` key but the class and the special tokens (``chat_template``,
        ``model_max_length``, ``padding_side``, ``clean_up_tokenization_spaces``, ...; chat templates from
        their files too). :meth:`save` writes them back as they were, so that a directory saved by
        transformers loses none of them through superbpe; they never change how this tokenizer encodes.
        Empty for a tokenizer made here."""
        return MappingProxyType(copy.deepcopy(self._hf_settings))

    @property
    def engine(self) -> str:
        return self._engine.name

    @property
    def whole_pieces(self) -> bool:
        """Whether a piece that is itself a token maps straight to its id (HF ``ignore_merges``)."""
        return self._whole_pieces

    @property
    def encode_levels(self) -> int:
        """2 when the encoder runs SuperBPE's merges on two levels (exact; DESIGN.md "Encoding"), else 1."""
        return self._core.levels

    def token_to_id(self, token: str | bytes) -> int:
        """Id of a token given as bytes or text (UTF-8); ``KeyError`` when it is not a token.

        Anything else is an ``InputError``: ``bytes(5)`` is five zero bytes, so an id given by mistake
        would be looked up as such a token."""
        if isinstance(token, str):
            if token in self._special_ids:
                return self._special_ids[token]
            try:
                wanted = token.encode("utf-8")
            except UnicodeEncodeError:  # an unpaired surrogate: no UTF-8, so no token's text
                wanted = b""
        elif isinstance(token, (bytes, bytearray, memoryview)):
            wanted = bytes(token)
        else:
            hint = " (id_to_token takes an id)" if _is_integer_id(token) else ""
            raise InputError(f"token_to_id takes a token as str or bytes, not {type(token).__name__}{hint}")
        try:
            return self._id_of[wanted]
        except KeyError:
            raise KeyError(f"{token!r} is not a token of this tokenizer") from None

    def id_to_token(self, token_id: int) -> bytes:
        if not _is_integer_id(token_id):
            raise InputError(_not_an_integer(token_id))
        try:
            return self._vocab[token_id]
        except (KeyError, TypeError):
            raise InputError(f"unknown token id {token_id!r} (vocab size {self.vocab_size})") from None

    # -- encoding -------------------------------------------------------------------------------------

    # encode and encode_ordinary are called once per short document in a loop, where the Python
    # around the native call cost as much as encoding: a text with no special token in it (the core
    # looks for a few) is encoded in one call of the core, and only the rest comes to the checks here.

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids of ``text`` with special tokens (:attr:`plain_added_tokens` too) treated as plain text."""
        if type(text) is not str:
            _check_text(text)
        return self._encode_ordinary(text)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; special tokens in it become their own ids (longest match first)."""
        ids = self._plain(text)
        if ids is None:
            ids = self._encode_in_general(text)
        return ids  # type: ignore[no-any-return]

    def _encode_in_general(self, text: str) -> list[int]:
        """``encode`` of a text the core did not take as plain: not a str (an error), or one that may hold
        special tokens, or one that fails to encode (the error is raised here)."""
        if type(text) is not str:
            _check_text(text)
        if self._splitter.occurs_in(text):
            return self._splitter.encode(text, self._special_ids, self._encode_ordinary)
        return self._encode_ordinary(text)

    def encode_array(self, text: str, dtype: Any = None) -> np.ndarray:
        """``encode(text)`` as a numpy array: uint16 when every id fits, else uint32 (or ``dtype``).

        The array is made in Rust, without a Python int per id or a list for the garbage collector to
        walk, which on long texts cost as much as the encoding (on a sentence a list is as cheap). A
        ``dtype`` other than uint16 or uint32, or one too small for the ids, is a ``ConfigError``.
        """
        name = self._default_dtype if dtype is None else self._array_dtype(dtype)
        ids = self._plain_array(text, name)
        if ids is None:
            ids = np.array(self._encode_in_general(text), dtype=name)
        return ids  # type: ignore[no-any-return]

    def encode_ordinary_array(self, text: str, dtype: Any = None) -> np.ndarray:
        """``encode_ordinary(text)`` (special tokens are plain text) as a numpy array, as in
        :meth:`encode_array`."""
        name = self._default_dtype if dtype is None else self._array_dtype(dtype)
        if type(text) is not str:
            _check_text(text)
        return self._encode_ordinary_array(text, name)

    def encode_utf8(self, data: bytes, dtype: Any = None, *, errors: str = "strict") -> np.ndarray:
        """``encode_array(data.decode("utf-8", errors))`` without making that str: text read from a file as
        bytes is encoded as it is. The native engine checks and encodes it in Rust with the GIL released (but
        for a short text, where releasing it costs more than it frees), so threads encoding chunks side by
        side do not wait for each other. ``errors`` is
        ``"strict"`` (invalid UTF-8 raises the ``UnicodeDecodeError`` decoding would) or ``"replace"``.
        ``data`` may be any C-contiguous buffer of bytes (``bytearray``, ``memoryview``, ``mmap``, a numpy
        uint8 array), which is copied to ``bytes`` first: the encoders read ``bytes``.
        """
        if type(data) is not bytes:
            data = _utf8_bytes(data)
        if errors != "strict":
            check_errors_mode(errors)
        name = self._default_dtype if dtype is None else self._array_dtype(dtype)
        return self._core.encode_utf8(data, self._special_ids, name, errors == "replace")

    def encode_batch(self, texts: Iterable[str], threads: int | None = None) -> list[list[int]]:
        """``[encode(t) for t in texts]``, encoded in parallel over the texts.

        The native engine encodes in Rust with the GIL released, on ``threads`` threads: by default
        ``RAYON_NUM_THREADS`` when set, else every CPU this process may use; ``threads=1`` encodes on the
        calling thread alone. The python engine encodes one text after another whatever ``threads`` says
        (its encoder is Python code, which the GIL runs one thread at a time).
        """
        batch = _checked_texts(texts, "encode_batch")
        return self._core.encode_texts(batch, self._special_ids, resolve_threads(threads))

    def encode_ordinary_batch(self, texts: Iterable[str], threads: int | None = None) -> list[list[int]]:
        """``[encode_ordinary(t) for t in texts]`` (special tokens are plain text), in parallel as
        :meth:`encode_batch`."""
        batch = _checked_texts(texts, "encode_ordinary_batch")
        return self._core.encode_texts(batch, {}, resolve_threads(threads))

    def encode_batch_flat(
        self,
        texts: Iterable[str],
        threads: int | None = None,
        *,
        ordinary: bool = False,
        dtype: Any = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ids of a batch as one array plus offsets: text ``i`` has ``ids[offsets[i]:offsets[i + 1]]``.

        Equal to :meth:`encode_batch` (or :meth:`encode_ordinary_batch` with ``ordinary=True``) without a
        Python list or int per id, which is what feeding a model or writing token files wants. ``ids`` is
        ``dtype`` (uint16 or uint32; by default uint16 when every id fits), ``offsets`` is int64 and has
        ``len(texts) + 1`` entries, the first 0. ``threads`` as in :meth:`encode_batch`.
        """
        if not isinstance(ordinary, bool):  # "no" would read as True: special tokens taken as plain text
            raise ConfigError(f"ordinary must be True or False, not {ordinary!r}")
        name = self._default_dtype if dtype is None else self._array_dtype(dtype)
        batch = _checked_texts(texts, "encode_batch_flat")
        specials = {} if ordinary else self._special_ids
        return self._core.encode_texts_flat(batch, specials, resolve_threads(threads), name)

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """Stream ids for a stream of strings (e.g. an open file), identical to ``encode`` of the whole.

        A file opened in text mode reads ``\\r\\n`` as ``\\n`` unless opened with ``newline=""``: its ids then
        differ from those of :meth:`encode_file`, which reads the bytes as they are.

        Text is buffered and encoded only up to a position no later text can affect: a special-token
        boundary, or a cut of the pre-tokenizer (``Pretokenizer.last_stream_cut``: for the built-in
        patterns about every word boundary, or every line end with line units). So the buffer holds about
        ``STREAM_FLUSH_CHARS`` plus the last unfinished piece, whatever the line endings look like.
        Something that is not iterable is refused here, not when the ids are first asked for.
        """
        try:
            texts = iter(iterable)
        except TypeError:
            kind = type(iterable).__name__
            raise InputError(f"encode_iterable takes an iterable of str (a text file), not {kind}") from None
        return chain.from_iterable(self._encode_batches(texts))

    def _encode_batches(self, iterable: Iterable[str]) -> Iterator[list[int]]:
        """``encode_iterable`` in lists of ids, one per encoded stretch of the buffer.

        The buffer is kept as its texts (``parts``), not joined into one string between cuts, so that a bad
        character can be named by the text it is in (:meth:`_encode_stretch`) at no cost per text: a list of
        where each text starts cost about a tenth of a fast engine's time on short lines.
        """
        parts: list[str] = []  # whole texts, but for the first: the end of one a cut went through
        first = skipped = 0  # the number of the text parts[0] is of, and how much of it was encoded
        pending = 0  # characters received since the last attempt to cut
        wait_for = STREAM_FLUSH_CHARS
        for number, text in enumerate(iterable):
            if not isinstance(text, str):
                hint = " (open the file in text mode)" if isinstance(text, bytes) else ""
                raise InputError(f"encode_iterable takes str, not {type(text).__name__}{hint}")
            parts.append(text)
            pending += len(text)
            if pending < wait_for:
                continue
            buffer = "".join(parts)
            cut = self._stream_cut(buffer)
            if cut:
                yield self._encode_stretch(buffer[:cut], parts, first, skipped)
                ends = list(accumulate(map(len, parts)))
                held = bisect_right(ends, cut)  # the first part the cut leaves characters of
                begin = ends[held - 1] if held else 0
                skipped = cut - begin + (skipped if held == 0 else 0)
                first = number + 1 if held == len(parts) else first + held
                parts = [parts[held][cut - begin :], *parts[held + 1 :]] if held < len(parts) else []
            pending = 0
            # A long stretch without a cut point is rescanned only after it doubles: linear time overall.
            wait_for = max(STREAM_FLUSH_CHARS, len(buffer) - cut)
        buffer = "".join(parts)
        if buffer:
            yield self._encode_stretch(buffer, parts, first, skipped)

    def _encode_stretch(self, stretch: str, parts: Sequence[str], first: int, skipped: int) -> list[int]:
        """``encode`` of the start of the buffer ``parts`` (text ``first`` on, less its ``skipped``
        characters); a lone surrogate in it is named by the text it is in and its place there, as in a
        JSON-lines record, where ``encode`` alone could only say that the stretch holds one."""
        try:
            return self.encode(stretch)
        except InputError:
            try:
                stretch.encode("utf-8")
            except UnicodeEncodeError as exc:
                ends = list(accumulate(map(len, parts)))
                held = bisect_right(ends, exc.start)
                at = exc.start - (ends[held - 1] if held else 0) + (skipped if held == 0 else 0)
                raise InputError(
                    f"encode_iterable: text {first + held}: unpaired surrogate {stretch[exc.start]!r} at "
                    f"character {at} (not UTF-8)"
                ) from None
            raise

    def _stream_cut(self, buffer: str) -> int:
        """The last position in ``buffer`` where encoding may stop without knowing what comes next.

        Every special token that starts before ``horizon`` fits in the buffer whatever its length, so the
        buffer's special-token split agrees with the final one up to there; a cut is then the end of a
        special token or a pre-tokenizer's cut inside an ordinary segment, never inside a special token.
        """
        last_cut = self._pretokenizer.last_stream_cut
        if not self._splitter:
            return last_cut(buffer)
        horizon = len(buffer) - self._max_special_len + 1
        best = 0
        start = 0
        for segment, is_special in self._splitter.split(buffer):
            if start >= horizon:
                break
            end = start + len(segment)
            if is_special:  # it starts before the horizon, so it is complete and final
                best = end
            else:
                cut = last_cut(segment[: horizon - start])
                if cut:
                    best = start + cut
            start = end
        return best

    def encode_file(
        self, path: str | os.PathLike[str], dtype: Any = None, *, errors: str = "strict"
    ) -> np.ndarray:
        """All ids of a UTF-8 (or gzip) text file, streamed; uint16 when every id fits, else uint32 (or
        ``dtype``, which must be one of the two, as for ``encode_array``). ``errors="replace"`` reads bytes
        that are not UTF-8 as U+FFFD (by default they are an error)."""
        check_errors_mode(errors)
        if not isinstance(path, (str, os.PathLike)):
            raise InputError(f"encode_file takes a path (str or Path), not {type(path).__name__}")
        path = user_path(path)
        if is_jsonl(path) or is_table(path):  # its documents are records, not the file's bytes
            raise InputError(
                f"{path}: encode_file reads one text; encode a JSON-lines or table file's documents with "
                "encode_batch of their texts, or into a token file with the superbpe-encode command"
            )
        chosen = np.dtype(self._array_dtype(dtype)) if dtype is not None else self._smallest_dtype()
        # Chunks of bytes cut where no piece or special token crosses, as the encoding jobs cut them, each
        # encoded without a str: the ids of the whole text, at the speed of `encode_utf8`.
        cutter = ChunkCutter(self.special_tokens, self._pretokenizer.safe_cuts_hold, self._pretokenizer)
        with open_binary(path) as raw:
            chunks = cut_stream(raw, str(path), False, cutter, FILE_READ_BYTES)
            parts = [encode_text_chunk(self, chunk, errors=errors) for chunk in chunks]
        return np.concatenate(parts or [np.zeros(0, self._default_dtype)]).astype(chosen, copy=False)

    def _array_dtype(self, dtype: Any) -> str:
        """The name of ``dtype`` when it is uint16 or uint32 and holds every id; else a ``ConfigError``."""
        try:
            chosen = np.dtype(dtype)
        except (TypeError, ValueError):
            chosen = None
        if chosen not in (np.dtype(np.uint16), np.dtype(np.uint32)):
            raise ConfigError(f"dtype must be uint16 or uint32, not {chosen or dtype}")
        if np.iinfo(chosen).max < self._max_id:
            raise ConfigError(f"dtype {chosen} cannot hold ids up to {self._max_id}")
        return chosen.name

    def _smallest_dtype(self) -> np.dtype:
        return np.dtype(np.uint16) if self._max_id < 1 << 16 else np.dtype(np.uint32)

    # -- decoding -------------------------------------------------------------------------------------

    def decode_bytes(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> bytes:
        """The raw bytes of ``ids`` (no UTF-8 decoding); ``skip_special_tokens`` as in :meth:`decode`."""
        if not isinstance(ids, (list, tuple)):
            if isinstance(ids, str):
                raise InputError("decode takes token ids, not a str (encode takes text)")
            if not isinstance(ids, Iterable):
                raise InputError(f"decode takes token ids (a list), not {type(ids).__name__}")
            # A set has no order (its text would come out shuffled) and a dict iterates its keys.
            if isinstance(ids, Set | Mapping):
                raise InputError(f"decode takes token ids in order (a list), not a {type(ids).__name__}")
            if isinstance(ids, np.ndarray) and ids.ndim > 1:
                raise InputError(
                    f"decode takes one sequence of token ids, not a {ids.ndim}-D array (for a batch, decode "
                    "each row)"
                )
            if isinstance(ids, np.ndarray) and ids.ndim == 0:  # iterable by type, but iterating it fails
                raise InputError(
                    "decode takes a sequence of token ids, not a 0-D array (one id: decode([id]))"
                )
            if isinstance(ids, np.ndarray) and ids.ndim == 1 and ids.dtype.kind in "iu":
                ids = ids.tolist()  # Python ints, which the vocab looks up fastest
            else:
                ids = list(ids)
        # A float or bool id hashes as the integer it equals, so the vocab lookup alone would take
        # 65.0 or True: ids that almost always mean the caller passed something other than token ids.
        if not set(map(type, ids)) <= {int}:
            bad = next((i for i in ids if not _is_integer_id(i)), None)
            if bad is not None:
                raise InputError(_not_an_integer(bad))
        if skip_special_tokens is not False:
            ids = self._without_special_ids(ids, skip_special_tokens)
        try:
            return b"".join(map(self._vocab.__getitem__, ids))
        except (KeyError, TypeError):
            bad = next(i for i in ids if _unknown(i, self._vocab))
            raise InputError(f"unknown token id {bad!r} (vocab size {self.vocab_size})") from None

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; byte sequences that are not valid UTF-8 become U+FFFD. ``skip_special_tokens``
        leaves out the special tokens but :attr:`plain_added_tokens`, as transformers' ``decode`` does."""
        data = self.decode_bytes(ids, skip_special_tokens=skip_special_tokens)
        return data.decode("utf-8", errors="replace")

    def _without_special_ids(self, ids: Sequence[Any], skip: object) -> list[Any]:
        """``ids`` less those of special tokens but :attr:`plain_added_tokens` (``skip`` must be True: a
        "no" would read as a wish to skip them)."""
        if not isinstance(skip, bool | np.bool_):
            raise InputError(f"skip_special_tokens must be True or False, not {skip!r}")
        if not skip:
            return list(ids)
        plain = self._plain_added
        skipped = {token_id for special, token_id in self._special_ids.items() if special not in plain}
        return [token_id for token_id in ids if token_id not in skipped]

    # -- training -------------------------------------------------------------------------------------

    @classmethod
    def train_bpe(
        cls,
        input_path: InputSpec | DocumentStream | PieceCounts,
        vocab_size: int,
        special_tokens: Sequence[str] = (),
        *,
        pretokenizer: str | Pretokenizer | None = None,
        engine: str | Engine = "auto",
        compat: str | CompatConfig | None = None,
        **options: Any,
    ) -> Tokenizer:
        """:func:`superbpe.train_bpe` (the same arguments, the same merges) as a tokenizer that encodes as it
        was trained: with the pieces' pattern (``pretokenizer``, or the one piece counts were made with) and
        the special tokens, under ``compat`` as a run's files do.

        Why beside the function: building the tokenizer from ``(vocab, merges)`` means naming the pattern
        and the specials again, and a pattern other than the training one encodes without complaint.
        """
        vocab, merges = train_bpe(
            input_path, vocab_size, special_tokens, pretokenizer=pretokenizer, engine=engine, compat=compat,
            **options,
        )  # fmt: skip
        made = input_path.meta.get("pretokenizer") if isinstance(input_path, PieceCounts) else None
        if pretokenizer is None and made:
            pieces = Pretokenizer.from_spec(made)
        else:
            pieces = get_pretokenizer(pretokenizer or "gpt2")
        return cls._trained(vocab, merges, special_tokens, pieces, engine, compat)

    @classmethod
    def train_superbpe(
        cls,
        input_path: InputSpec | DocumentStream,
        vocab_size: int,
        transition: int | float = 0.8,
        special_tokens: Sequence[str] = (),
        *,
        stage2_pretokenizer: str | Pretokenizer = "superbpe",
        engine: str | Engine = "auto",
        compat: str | CompatConfig | None = None,
        **options: Any,
    ) -> Tokenizer:
        """:func:`superbpe.train_superbpe` (the same arguments, the same merges) as a tokenizer that encodes
        with the stage-2 pattern, which makes its superwords (a tokenizer built with a word-level pattern
        never would), and with the special tokens, under ``compat`` as a run's files do."""
        vocab, merges = train_superbpe(
            input_path, vocab_size, transition, special_tokens, stage2_pretokenizer=stage2_pretokenizer,
            engine=engine, compat=compat, **options,
        )  # fmt: skip
        pieces = get_pretokenizer(stage2_pretokenizer)
        return cls._trained(vocab, merges, special_tokens, pieces, engine, compat)

    @classmethod
    def _trained(
        cls,
        vocab: Mapping[int, bytes],
        merges: Sequence[Merge],
        special_tokens: Sequence[str],
        pieces: Pretokenizer,
        engine: str | Engine,
        compat: str | CompatConfig | None,
    ) -> Tokenizer:
        """The tokenizer of merges trained on ``pieces``, encoding as a run under ``compat`` writes it."""
        chosen = get_compat(compat)
        encoding = encoding_pretokenizer(pieces, chosen)
        specials = special_token_list(special_tokens)
        return cls(vocab, merges, specials, encoding, engine, whole_pieces=chosen.whole_pieces)

    # -- files ----------------------------------------------------------------------------------------

    @classmethod
    def from_files(
        cls,
        vocab_filepath: str | os.PathLike[str],
        merges_filepath: str | os.PathLike[str],
        special_tokens: Sequence[str] | None = None,
        pretokenizer: str | Pretokenizer = "gpt2",
        engine: str | Engine = "auto",
        *,
        whole_pieces: bool = True,
    ) -> Tokenizer:
        """From GPT-2 style ``vocab.json`` and ``merges.txt`` (with or without the ``#version`` line).

        Ids are kept as the files give them, and the vocab may lack single bytes. Without
        ``special_tokens``, the tokens that no merge makes (GPT-2's ``<|endoftext|>``) are the special
        tokens: BPE could never produce them, so that is the only way they are ever used.
        """
        unmade = special_tokens is None
        files = read_gpt2_files(vocab_filepath, merges_filepath, special_tokens or (), unmade=unmade)
        specials = files.unmade if unmade else special_tokens
        if unmade and len(files.unmade) > max(UNMADE_EXPECTED, len(files.vocab) // 100):
            warnings.warn(
                f"{vocab_filepath}: {len(files.unmade)} tokens that no merge of {merges_filepath} makes "
                f"are taken as special tokens ({specials_shown(files.unmade)}); if merges.txt is cut short "
                "or from another tokenizer, texts holding them get wrong ids: give special_tokens= to name "
                "the specials",
                stacklevel=caller_stacklevel(),
            )
        return cls._from_read(
            files.vocab, files.merges, files.valid, specials, pretokenizer, engine, whole_pieces=whole_pieces,
            specials_unmade=unmade,
        )  # fmt: skip

    @classmethod
    def load(
        cls,
        directory: str | os.PathLike[str],
        engine: str | Engine = "auto",
        *,
        compat: str | CompatConfig | None = None,
    ) -> Tokenizer:
        """A saved tokenizer directory: manifest first, else ``tokenizer.json``, else GPT-2 style files.

        ``compat="official"`` reads a bare ``vocab.json`` + ``merges.txt`` (e.g. the released SuperBPE
        tokenizers) as the official SuperBPE encoder uses them: the stage-2 pattern over the whole text and
        no whole-piece shortcut. A manifest or ``tokenizer.json`` says how to encode, so it wins, and a
        ``compat`` that contradicts it (another recorded preset, other encoding choices) is an error.
        """
        directory = user_path(directory)
        if compat is not None:
            get_compat(compat)  # a bad value is named now, whatever the directory holds
        tokenizer = cls._load_files(directory, engine, compat)
        tokenizer._roles = read_roles(directory, tokenizer.special_tokens)
        tokenizer._hf_settings = read_transformers_settings(directory)
        return tokenizer

    @classmethod
    def _load_files(
        cls, directory: Path, engine: str | Engine, compat: str | CompatConfig | None
    ) -> Tokenizer:
        """The tokenizer a directory's files make (see :meth:`load`)."""
        manifest_path = directory / MANIFEST_FILE
        vocab_path, merges_path = directory / VOCAB_FILE, directory / MERGES_FILE
        hf_path = directory / HF_FILE
        if manifest_path.exists():
            return cls._from_manifest(manifest_path, engine, compat)
        if hf_path.exists():
            data = read_hf_tokenizer(hf_path)
            pre = pretokenizer_from_hf(data)
            if compat is not None:
                check_directory_compat(str(hf_path), compat, pre, data.ignore_merges)
            vocab, merges, specials = data.vocab, data.merges, data.special_tokens
            tokenizer = cls._from_read(
                vocab, merges, data.valid, specials, pre, engine, whole_pieces=data.ignore_merges
            )
            tokenizer._plain_added = frozenset(data.plain_added)
            return tokenizer
        if vocab_path.exists() or merges_path.exists():
            if compat is not None:
                pre, whole_pieces = encoding_for(compat)
                return cls.from_files(vocab_path, merges_path, None, pre, engine, whole_pieces=whole_pieces)
            return cls.from_files(vocab_path, merges_path, engine=engine)
        if directory.is_file():
            parent = directory.parent
            raise InputError(f"{directory} is a file: load takes the tokenizer's directory ({parent})")
        if not directory.is_dir():
            raise InputError(f"{directory}: tokenizer directory not found")
        missing = f"{directory}: none of {MANIFEST_FILE}, {HF_FILE}, {VOCAB_FILE}"
        raise InputError(missing + _what_is_there(directory))

    @classmethod
    def _from_manifest(
        cls, manifest_path: Path, engine: str | Engine, compat: str | CompatConfig | None
    ) -> Tokenizer:
        """A directory with our manifest: it says how to encode (and, from a run, under which compat)."""
        directory = manifest_path.parent
        manifest = read_manifest(manifest_path)
        # A tokenizer.json saved again by transformers (save_pretrained) is rewritten in its own layout even
        # when nothing changed: only one that encodes otherwise is refused (it is read to find out).
        hf_changed = hf_file_changed(manifest, directory / HF_FILE)
        pre = manifest_pretokenizer(manifest_path, manifest)
        if compat is not None:
            recorded = recorded_compat(manifest.training)
            check_directory_compat(str(directory), compat, pre, manifest.whole_pieces, recorded)
        vocab_path, hf_path = directory / VOCAB_FILE, directory / HF_FILE
        specials, whole_pieces = manifest.special_tokens, manifest.whole_pieces
        if vocab_path.exists() or not hf_path.exists():
            files = read_gpt2_files(vocab_path, directory / MERGES_FILE, specials)
            vocab, merges, valid = files.vocab, files.merges, files.valid
        else:
            data = read_hf_tokenizer(hf_path)
            vocab, merges, valid = data.vocab, data.merges, data.valid
        tokenizer = cls._from_read(vocab, merges, valid, specials, pre, engine, whole_pieces=whole_pieces)
        if hf_changed and not tokenizer._encodes_as_hf_file(hf_path):
            raise hf_file_encodes_otherwise(hf_path)
        if tokenizer.vocab_size != manifest.vocab_size:
            found, stated = tokenizer.vocab_size, manifest.vocab_size
            raise InputError(f"{manifest_path}: vocab_size {stated}, but the files hold {found}")
        if manifest.num_merges is not None and len(tokenizer._merges) != manifest.num_merges:
            read_from = MERGES_FILE if vocab_path.exists() or not hf_path.exists() else HF_FILE
            raise InputError(
                f"{directory / read_from}: {len(tokenizer._merges)} merges, but {MANIFEST_FILE} says "
                f"{manifest.num_merges} (cut short or from another tokenizer): save or copy the directory "
                "again"
            )
        tokenizer._stages, tokenizer._training = manifest.stages, manifest.training or None
        tokenizer._plain_added = frozenset(manifest.plain_added_tokens)
        return tokenizer

    def _encodes_as_hf_file(self, hf_path: Path) -> bool:
        """Whether the ``tokenizer.json`` at ``hf_path`` holds this tokenizer: the same vocab, merges, special
        tokens, pattern and whole-piece rule (one this library cannot read encodes otherwise)."""
        try:
            data = read_hf_tokenizer(hf_path)
        except InputError:
            return False
        pre = pretokenizer_from_hf(data)
        return (
            data.vocab == self._vocab
            and data.merges == self._merges
            and set(data.special_tokens) == set(self._special_ids)
            and (pre.pattern, pre.line_units) == (self._pretokenizer.pattern, self._pretokenizer.line_units)
            and data.ignore_merges == self._whole_pieces
        )

    def save(
        self,
        directory: str | os.PathLike[str],
        manifest_extra: Mapping[str, Any] | None = None,
        *,
        stages: Sequence[Mapping[str, Any]] = (),
        training: Mapping[str, Any] | None = None,
        roles: Mapping[str, str | None] | None = None,
        tiktoken: bool = False,
    ) -> Path:
        """Write vocab.json, merges.txt, tokenizer.json (+ tokenizer_config.json, special_tokens_map.json for
        transformers, with ``roles``: ``{"bos_token": ..., "eos_token": ..., "pad_token": ..., "unk_token":
        ...}``) and superbpe.json, each atomically; ``tiktoken=True`` adds tokenizer.tiktoken + tiktoken.json
        (without it, those of an earlier save into the directory are removed). A tokenizer loaded from a
        directory writes that directory's roles and training record (stages, training) unless given others,
        and its other transformers settings (:attr:`transformers_settings`: chat templates, ...) as read.

        A pattern of the user's own is tried in HF ``tokenizers`` (and tiktoken, when asked for) first: one
        they read otherwise would give other ids there, a warning for tokenizer.json (this tokenizer is still
        whole) and an error for the tiktoken files, which exist only to give the same ids."""
        if not isinstance(tiktoken, bool):  # "no" or 0.0 would read as a wish for the files, or against it
            raise ConfigError(f"tiktoken must be True or False, not {tiktoken!r}")
        if tiktoken:
            check_specials_for_tiktoken(self.special_tokens)
            if problem := tiktoken_split_problem(self._pretokenizer):
                raise ConfigError(f"tiktoken files cannot give the same ids: {problem}")
        if problem := hf_split_problem(self._pretokenizer):
            warnings.warn(f"tokenizer.json will not encode as this tokenizer does: {problem}",
                          UserWarning, stacklevel=caller_stacklevel())  # fmt: skip
        return save_tokenizer_dir(
            directory,
            self._vocab,
            self._merges,
            self.special_tokens,
            self._pretokenizer,
            stages=stages or self._stages,
            training=training if training is not None else self._training,
            extra=manifest_extra,
            whole_pieces=self._whole_pieces,
            roles=roles if roles is not None else self._roles,
            settings=self._hf_settings,
            plain_added=self._plain_added,
            tiktoken=tiktoken,
        )

    def to_tiktoken(self, name: str | None = None) -> Any:
        """This tokenizer as a ``tiktoken.Encoding`` that gives the same ids (``allowed_special="all"`` for
        specials in text). Needs ``tiktoken`` (``pip install "superbpe[tiktoken]"``)."""
        if name is not None and not isinstance(name, str):  # tiktoken keeps any object as the name
            raise ConfigError(f"name must be a str (or None), not {type(name).__name__}")
        tiktoken = import_optional("tiktoken", "tiktoken", "to_tiktoken()")
        ranks = tiktoken_ranks(self._vocab, self.special_tokens, self._merges)
        check_ranks_follow_merges(ranks, self._merges)
        check_specials_for_tiktoken(self.special_tokens)
        if problem := tiktoken_split_problem(self._pretokenizer):
            raise ConfigError(f"tiktoken cannot give this tokenizer's ids: {problem}")
        return tiktoken.Encoding(
            name=name or self._pretokenizer.name,
            pat_str=tiktoken_pattern(self._pretokenizer),
            mergeable_ranks=ranks,
            special_tokens={special: self.token_to_id(special) for special in self.special_tokens},
        )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as what rebuilds it (the native encoder is not picklable): ``datasets.map`` hashes the
        functions it caches by pickling them, and spawned worker processes receive their tokenizer so."""
        state = (self._vocab, self._merges, self.special_tokens, self._pretokenizer, self.engine,
                 self._whole_pieces, self._roles, self._stages, self._training,
                 self._hf_settings, self._plain_added)  # fmt: skip
        return _unpickled, state

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self._merges)}, "
            f"special_tokens=[{specials_shown(self.special_tokens)}], "
            f"pretokenizer={self._pretokenizer.name!r}, engine={self.engine!r})"
        )


def _unpickled(
    vocab: dict[int, bytes],
    merges: list[Merge],
    special_tokens: list[str],
    pretokenizer: Pretokenizer,
    engine: str,
    whole_pieces: bool,
    roles: dict[str, str | None] | None,
    stages: list[dict[str, Any]],
    training: dict[str, Any] | None,
    hf_settings: dict[str, Any] | None = None,
    plain_added: frozenset[str] = frozenset(),
) -> Tokenizer:
    """The tokenizer ``Tokenizer.__reduce__`` describes (its vocab and merges were checked when made). The
    settings kept since have defaults, so a tokenizer pickled by an earlier version still loads."""
    tokenizer = Tokenizer._from_read(vocab, merges, True, special_tokens, pretokenizer, engine,
                                     whole_pieces=whole_pieces)  # fmt: skip
    tokenizer._roles, tokenizer._stages, tokenizer._training = roles, stages, training
    tokenizer._hf_settings, tokenizer._plain_added = hf_settings or {}, plain_added
    return tokenizer


def _warn_if_the_pattern_splits_merges(merges: Sequence[Merge], pretokenizer: Pretokenizer) -> None:
    """Warn when one of the last merges makes a token a built-in word-level pattern cuts in two:
    encoding never makes it. That is what SuperBPE merges under the default ``gpt2`` pattern come to:
    they encode as their stage 1 would, silently. Only tokens with a space between other bytes are split
    to find out, so a tokenizer whose pattern fits its merges costs no regex. The stage-2 patterns and
    custom ones are left alone (tokens they split are the trainer's business, not a wrong pattern)."""
    if not pretokenizer.word_level:
        return
    for left, right in merges[-SPLIT_MERGES_CHECKED:]:
        token = left + right
        if b" " not in token.strip():
            continue
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if len(pretokenizer.split(text)) > 1:
            warnings.warn(
                f"merge {text!r} makes a token that pretokenizer {pretokenizer.name!r} splits, so encoding "
                "never uses it: SuperBPE merges need the stage-2 pattern, pretokenizer='superbpe' (the "
                "official SuperBPE files: load them with compat=official)",
                stacklevel=caller_stacklevel(),
            )
            return


def _warn_if_specials_left_out(
    vocab: Mapping[int, bytes], merges: Sequence[Merge], pretokenizer: Pretokenizer, whole_pieces: bool
) -> None:
    """Warn when a tokenizer made without ``special_tokens`` has tokens that encoding never gives: ones no
    merge makes and that are no whole piece of the pattern (the ``<|endoftext|>`` of ``train_bpe(...,
    ["<|endoftext|>"])``). Such a text is encoded byte by byte, and a corpus encoded so has no document
    separators, without a word. ``special_tokens=[]`` says there are none and warns not."""
    unmade = unmerged_tokens(vocab, merges)
    unreached = [t for t in unmade if not whole_pieces or len(pretokenizer.split(t)) > 1]
    if unreached:
        warnings.warn(
            f"the vocab holds {len(unreached)} token(s) that no merge makes, such as {unreached[0]!r}, but "
            "no special_tokens were given, so encoding never gives them: give "
            f"special_tokens={unreached[:3]!r} (or special_tokens=[] when they are not special)",
            stacklevel=caller_stacklevel(),
        )


def _not_plain(*_: object) -> None:
    """``EncoderCore.plain`` for a tokenizer with many special tokens: no text is taken as plain."""
    return None


def _check_text(text: object) -> None:
    if not isinstance(text, str):
        hint = " (decode bytes to str first)" if isinstance(text, (bytes, bytearray)) else ""
        raise InputError(f"encode takes a str, not {type(text).__name__}{hint}")


#: Buffer formats whose items are single bytes (unsigned, signed, char), as ``bytes(buffer)`` reads them.
BYTE_FORMATS = frozenset({"B", "b", "c"})


def _utf8_bytes(data: object) -> bytes:
    """The bytes of a bytes-like ``data`` for ``encode_utf8``. Only a C-contiguous buffer of single bytes
    is taken: the bytes of wider items (an int32 array) or of a strided view are not a text's bytes in
    order, and ``bytes()`` would take them silently. The view is released at once, so an ``mmap`` given
    can still be closed."""
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise InputError(f"encode_utf8 takes bytes, not {type(data).__name__}") from None
    with view:
        kind, form, size = type(data).__name__, view.format, view.itemsize
        if size != 1 or form.lstrip("@=<>!") not in BYTE_FORMATS:  # ctypes says "<B"
            raise InputError(
                f"encode_utf8 takes a buffer of bytes, not {kind} of format {form!r} ({size}-byte items): "
                "give it the text's UTF-8 bytes"
            )
        if not view.c_contiguous:
            raise InputError(f"encode_utf8 takes a contiguous buffer, not a strided {kind}: copy it to bytes")
        return view.tobytes()


def _checked_texts(texts: Iterable[str], method: str) -> list[str]:
    """The batch as a list of str; one str (not a batch), a non-iterable or a non-str item is an error."""
    if isinstance(texts, (str, bytes, bytearray)):
        kind = type(texts).__name__
        raise InputError(f"{method} takes a list of str, not a {kind} (encode takes one text)")
    if isinstance(texts, Mapping):  # iterated, it would be its keys
        raise InputError(f"{method} takes a list of str, not a {type(texts).__name__}")
    if not isinstance(texts, Iterable):
        raise InputError(f"{method} takes a list of str, not {type(texts).__name__}")
    batch = texts if type(texts) is list else list(texts)
    if not all(map(isinstance, batch, repeat(str))):
        index, bad = next((i, t) for i, t in enumerate(batch) if not isinstance(t, str))
        hint = " (decode bytes to str first)" if isinstance(bad, (bytes, bytearray)) else ""
        raise InputError(f"{method}: texts[{index}] is of type {type(bad).__name__}, not str{hint}")
    return batch


def encode_text_chunk(
    tokenizer: Tokenizer, chunk: Chunk, dtype: Any = None, errors: str = "strict"
) -> np.ndarray:
    """The ids of a text chunk's bytes (``Tokenizer.encode_utf8``), a bad byte named by its file and offset:
    how ``encode_file`` and the encoding jobs encode a file's chunks."""
    try:
        with naming_chunk(chunk):
            return tokenizer.encode_utf8(chunk.data, dtype, errors=errors)
    except UnicodeDecodeError as exc:
        raise invalid_utf8(chunk.path, chunk.offset + exc.start) from None


_MISSING_BYTE = re.compile(r"needs byte 0x([0-9a-f]{2})")
_TEXT_INDEX = re.compile(r"texts\[(\d+)\]: ")


@contextlib.contextmanager
def naming_chunk(chunk: Chunk) -> Iterator[None]:
    """An ``InputError`` from encoding ``chunk`` (a byte the vocabulary lacks) says where it is: its file,
    and the byte offset in a text or the line of a JSON-lines record; the encoder itself knows only the
    text (or its index in a batch) it was given."""
    try:
        yield
    except InputError as exc:
        message = str(exc)
        where = chunk.path
        index = _TEXT_INDEX.match(message)
        missing = _MISSING_BYTE.search(message)
        if index is not None:
            message = message[index.end() :]
        if index is not None and chunk.jsonl and chunk.table_parts is None and chunk.documents is None:
            where += f": line {_record_line(chunk, int(index.group(1)))}"
        elif missing is not None and chunk.is_text:
            at = chunk.data.find(bytes([int(missing.group(1), 16)]))
            where += f": byte {chunk.offset + at}" if at >= 0 else ""
        raise InputError(f"{where}: {message}") from None


def _record_line(chunk: Chunk, index: int) -> int:
    """The line of the chunk's ``index``-th record (blank lines hold none)."""
    seen = 0
    for number, line in enumerate(chunk.data.split(b"\n")):
        if line.strip():
            if seen == index:
                return chunk.first_line + number
            seen += 1
    return chunk.first_line


#: Ids are 32-bit (the encoders' and the token files' widest type).
MAX_IDS = 1 << 32


def _checked_vocab(vocab: Mapping[int, bytes]) -> dict[int, bytes]:
    """Ids must be non-negative ints and tokens unique bytes (holes in the ids are fine, clashes are not).

    A vocab that passes is copied after whole-list checks, which run at C speed (a 200K vocab is
    loaded before anything is encoded); one that does not is walked entry by entry to name the fault.
    """
    if not isinstance(vocab, Mapping):
        raise ConfigError(f"vocab must map ids to bytes (a dict), not {type(vocab).__name__}")
    ids, tokens = list(vocab.keys()), list(vocab.values())
    if (
        set(map(type, ids)) <= {int}
        and set(map(type, tokens)) <= {bytes}
        and (not ids or (min(ids) >= 0 and max(ids) < MAX_IDS))
        and all(tokens)
        and len(set(tokens)) == len(tokens)
    ):
        return dict(zip(ids, tokens, strict=True))
    checked: dict[int, bytes] = {}
    seen: dict[bytes, int] = {}
    for token_id, token in vocab.items():
        if isinstance(token_id, str) and isinstance(token, int):
            raise ConfigError(
                "vocab maps ids to bytes; this one maps strings to ids, as a vocab.json does: load such "
                "files with Tokenizer.from_files(vocab_json, merges_txt)"
            )
        if isinstance(token_id, np.integer):  # ids read from an array: the values are what count
            token_id = int(token_id)
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < MAX_IDS:
            raise ConfigError(f"vocab ids must be non-negative integers, got {token_id!r} (below 2**32)")
        if not isinstance(token, (bytes, bytearray)) or not token:
            raise ConfigError(f"vocab id {token_id} must map to non-empty bytes, got {token!r}")
        token = bytes(token)
        if token in seen:
            raise ConfigError(f"token {token!r} is in the vocab twice (ids {seen[token]} and {token_id})")
        seen[token] = token_id
        checked[token_id] = token
    return checked


def _checked_merges(merges: Sequence[Merge]) -> list[Merge]:
    """The merges as a list of ``(bytes, bytes)`` (other byte types copied to bytes)."""
    if isinstance(merges, str | bytes) or not isinstance(merges, Iterable):
        raise ConfigError(f"merges must be a list of (bytes, bytes) pairs, not {type(merges).__name__}")
    listed = list(merges)
    pairs = set(map(type, listed)) <= {tuple} and set(map(len, listed)) <= {2}
    if pairs and set(map(type, chain.from_iterable(listed))) <= {bytes}:
        return listed
    checked = []
    for index, merge in enumerate(listed):
        parts = tuple(merge) if isinstance(merge, tuple | list) else ()
        if len(parts) != 2 or not all(isinstance(part, bytes | bytearray) and part for part in parts):
            raise ConfigError(f"merge #{index} must be two non-empty bytes objects, not {merge!r}")
        checked.append((bytes(parts[0]), bytes(parts[1])))
    return checked


def _is_integer_id(token_id: Any) -> bool:
    """Whether ``token_id`` is an integer (a Python or numpy one), and not a bool."""
    return isinstance(token_id, int | np.integer) and not isinstance(token_id, bool)


def _not_an_integer(token_id: Any) -> str:
    return f"unknown token id {token_id!r}: token ids are integers, not {type(token_id).__name__}"


def _unknown(token_id: Any, vocab: Mapping[int, bytes]) -> bool:
    try:
        return token_id not in vocab
    except TypeError:  # unhashable
        return True


def _what_is_there(directory: Path) -> str:
    """Why a directory without tokenizer files was named, when it shows: a run that has not finished
    (its checkpoint, no tokenizer yet), or a sweep's directory, whose runs are its subdirectories."""
    if (directory / CHECKPOINT_FILE).exists():
        return f" (a run that has not finished: superbpe-train resume={directory} finishes it)"
    try:
        runs = [sub.name for sub in directory.iterdir() if (sub / MANIFEST_FILE).is_file()]
    except OSError:
        return ""
    if not runs:
        return ""
    runs.sort(key=lambda name: (not name.isdigit(), name.zfill(12)))
    if len(runs) == 1:
        return f" (its subdirectory {runs[0]} holds a tokenizer: {directory / runs[0]})"
    shown = ", ".join(runs[:3]) + (", ..." if len(runs) > 3 else "")
    return f" (its subdirectories {shown} hold tokenizers: name one, such as {directory / runs[0]})"
