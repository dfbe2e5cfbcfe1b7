"""The python engine's encoder: text with no special tokens in it -> token ids.

Rule (the contract both engines follow): pre-tokenize; a piece whose bytes are a token is that token
(unless ``whole_pieces`` is off, as in HF's ``ignore_merges: false``); otherwise start from single bytes
and repeatedly merge the adjacent pair with the lowest merge rank, the leftmost one on ties. A vocab may
lack single bytes; a text that needs one is an error. Ids come from the vocab's bytes -> id map, so
foreign id layouts (GPT-2, HF) work.

Speed comes almost entirely from the piece cache: natural text repeats a few thousand pieces over and over,
so after warm-up encoding is one regex split plus a C-level ``map`` over the cache. Misses take one of two
exact BPE loops: for short pieces a list of pair ranks searched with C-level ``min``/``index``, for long
ones a heap over a linked list (SuperBPE pieces can be whole lines, where O(n^2) would stall).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from itertools import chain

import numpy as np

from superbpe.core.errors import ConfigError, InputError
from superbpe.core.pretokenize import Pretokenizer, SpecialSplitter
from superbpe.core.types import Merge

#: Pieces longer than this (in bytes) use the heap loop; below it the plain scan is faster.
HEAP_THRESHOLD = 400
#: Pieces longer than this (in characters) are not cached: rare and memory-hungry.
MAX_CACHED_PIECE = 256
DEFAULT_CACHE_SIZE = 200_000
_NO_RANK = 1 << 62


def missing_byte_message(byte: int) -> str:
    """The error for a text that needs a byte the vocab has no token for (both engines say this)."""
    return f"text needs byte 0x{byte:02x}, which has no token in the vocabulary"


class PythonEncoder:
    """Merge-rank BPE over a cached, pre-tokenized text (the ``EncoderCore`` of the python engine)."""

    #: The reference: every piece is merged from its bytes in one level.
    levels = 1

    def __init__(
        self,
        vocab: Mapping[bytes, int],
        merges: Sequence[Merge],
        pretokenizer: Pretokenizer,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        whole_pieces: bool = True,
        watched: Sequence[str] = (),
    ) -> None:
        # A vocab may lack single bytes (HF-trained ones keep only the bytes they saw); a text that
        # needs one is an error (see _encode_piece), any other text encodes.
        self._ids: dict[bytes, int] = dict(vocab)
        self._whole_pieces = whole_pieces
        self._ranks: dict[Merge, int] = {}
        for rank, (left, right) in enumerate(merges):
            if left + right not in self._ids:
                raise ConfigError(f"merge #{rank} ({left!r}, {right!r}) makes a token not in the vocab")
            self._ranks.setdefault((left, right), rank)
        self._split = pretokenizer.split
        self._watched = tuple(watched)
        self._cache: dict[str, tuple[int, ...]] = {}
        self._cache_size = cache_size

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids of ``text``; special tokens in it are treated as plain text."""
        pieces = self._split(text)
        try:  # the common case once the cache is warm: every piece known, all C-level
            return list(chain.from_iterable(map(self._cache.__getitem__, pieces)))
        except KeyError:
            pass
        found = list(map(self._cache.get, pieces))
        fresh: dict[str, tuple[int, ...]] = {}
        for index, ids in enumerate(found):
            if ids is None:
                piece = pieces[index]
                ids = fresh.get(piece)
                if ids is None:
                    ids = fresh[piece] = self._encode_piece(piece)
                found[index] = ids
        return list(chain.from_iterable(found))

    def encode_ordinary_array(self, text: str, dtype: str) -> np.ndarray:
        """``encode_ordinary`` as a numpy array of ``dtype``."""
        return np.array(self.encode_ordinary(text), dtype=dtype)

    def plain(self, text: object) -> list[int] | None:
        """``encode_ordinary(text)`` for a str holding none of the watched special tokens, else None."""
        if not isinstance(text, str) or any(special in text for special in self._watched):
            return None
        try:
            return self.encode_ordinary(text)
        except InputError:  # as the native engine: the caller's general path raises it
            return None

    def plain_array(self, text: object, dtype: str) -> np.ndarray | None:
        """``plain`` as a numpy array of ``dtype``."""
        ids = self.plain(text)
        return None if ids is None else np.array(ids, dtype=dtype)

    def encode_texts(self, texts: list[str], specials: Mapping[str, int], threads: int) -> list[list[int]]:
        """Ids of each text (special tokens in ``specials`` cut out first), one text after another.

        ``threads`` is accepted for the ``EncoderCore`` contract and not used: this encoder is Python code,
        which the GIL lets only one thread run at a time, so more threads would only add switching.
        """
        splitter = SpecialSplitter(list(specials))
        encode_ordinary = self.encode_ordinary
        result: list[list[int]] = []
        for index, text in enumerate(texts):
            try:
                result.append(splitter.encode(text, specials, encode_ordinary))
            except InputError as exc:
                raise InputError(f"texts[{index}]: {exc}") from None
        return result

    def encode_texts_flat(
        self, texts: list[str], specials: Mapping[str, int], threads: int, dtype: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """``encode_texts`` as one array of ids and ``len(texts) + 1`` int64 offsets (text ``i`` is
        ``ids[offsets[i]:offsets[i + 1]]``)."""
        lists = self.encode_texts(texts, specials, threads)
        offsets = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum([len(ids) for ids in lists], out=offsets[1:])
        flat = np.fromiter(chain.from_iterable(lists), dtype=np.int64, count=int(offsets[-1]))
        limit = np.iinfo(np.dtype(dtype)).max
        if flat.size and int(flat.max()) > limit:
            raise ConfigError(f"id {int(flat.max())} does not fit in {dtype}")
        return flat.astype(dtype), offsets

    def encode_utf8(self, data: bytes, specials: Mapping[str, int], dtype: str, replace: bool) -> np.ndarray:
        """``encode_texts_flat`` of the one text ``data`` decodes to."""
        text = data.decode("utf-8", "replace" if replace else "strict")
        try:
            return self.encode_texts_flat([text], specials, 1, dtype)[0]
        except InputError as exc:  # said of one text, as the native engine says it: not "texts[0]: ..."
            raise InputError(str(exc).removeprefix("texts[0]: ")) from None

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        try:
            data = piece.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = piece[exc.start]
            raise InputError(f"text has an unpaired surrogate {bad!r} (not UTF-8)") from None
        whole = self._ids.get(data) if self._whole_pieces else None
        if whole is not None:
            ids: tuple[int, ...] = (whole,)
        else:
            ids_of = self._ids
            try:
                ids = tuple(ids_of[token] for token in self.merge_bytes(data))
            except KeyError as exc:  # only a single byte can lack an id (merge results are checked)
                raise InputError(missing_byte_message(exc.args[0][0])) from None
        if len(piece) <= MAX_CACHED_PIECE:
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            self._cache[piece] = ids
        return ids

    def merge_bytes(self, data: bytes) -> list[bytes]:
        """BPE of one piece from single bytes (no whole-piece shortcut): the tokens, in order."""
        if len(data) > HEAP_THRESHOLD:
            return self._merge_with_heap(data)
        return self._merge_by_scan(data)

    def _merge_by_scan(self, data: bytes) -> list[bytes]:
        """Ranks of all adjacent pairs in a list; ``min`` + ``index`` (C loops) find the leftmost best.

        Only the two pairs next to a merge change, so each step costs two dict lookups plus the C scans.
        """
        rank_of = self._ranks.get
        parts = [data[i : i + 1] for i in range(len(data))]
        ranks = [rank_of(pair, _NO_RANK) for pair in zip(parts, parts[1:])]  # noqa: B905 - one shorter
        while ranks:
            best = min(ranks)
            if best == _NO_RANK:
                break
            at = ranks.index(best)
            merged = parts[at] + parts[at + 1]
            parts[at : at + 2] = [merged]
            del ranks[at]
            if at < len(ranks):
                ranks[at] = rank_of((merged, parts[at + 1]), _NO_RANK)
            if at > 0:
                ranks[at - 1] = rank_of((parts[at - 1], merged), _NO_RANK)
        return parts

    def _merge_with_heap(self, data: bytes) -> list[bytes]:
        """One merge at a time from a heap of (rank, position): O(n log n) for long pieces.

        Positions are byte offsets of a token's first byte, so heap order is (rank, leftmost). Entries go
        stale when a neighbour merges; a popped entry is used only if its pair is still there.
        """
        rank_of = self._ranks.get
        size = len(data)
        tokens: list[bytes | None] = [data[i : i + 1] for i in range(size)]
        nxt = list(range(1, size + 1))
        prv = list(range(-1, size - 1))
        pairs = zip(tokens, tokens[1:])  # noqa: B905 - one shorter by design
        heap = [(rank, i) for i, pair in enumerate(pairs) if (rank := rank_of(pair)) is not None]
        heapq.heapify(heap)
        while heap:
            rank, left_at = heapq.heappop(heap)
            left = tokens[left_at]
            right_at = nxt[left_at]
            if left is None or right_at >= size or rank_of((left, tokens[right_at])) != rank:
                continue
            merged = left + tokens[right_at]  # type: ignore[operator]
            tokens[left_at] = merged
            tokens[right_at] = None
            after = nxt[right_at]
            nxt[left_at] = after
            if after < size:
                prv[after] = left_at
                new_rank = rank_of((merged, tokens[after]))
                if new_rank is not None:
                    heapq.heappush(heap, (new_rank, left_at))
            before = prv[left_at]
            if before >= 0:
                new_rank = rank_of((tokens[before], merged))
                if new_rank is not None:
                    heapq.heappush(heap, (new_rank, before))
        return [token for token in tokens if token is not None]
