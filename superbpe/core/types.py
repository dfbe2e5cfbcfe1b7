"""Type aliases shared by every module (one definition, so they cannot drift apart)."""

from __future__ import annotations

#: A merge: the two tokens (bytes) it joins, left then right.
Merge = tuple[bytes, bytes]
