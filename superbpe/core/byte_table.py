"""The GPT-2 byte <-> unicode table: every byte as one printable character.

Byte-level tokens are arbitrary bytes, but JSON and text files want printable strings, so tokens are
written through this table (a space is "Ġ", a newline "Ċ"). The trainers also order tokens by their
table spelling, so the table sits beside them in the core rather than with the file formats.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def byte_to_unicode() -> tuple[str, ...]:
    """Character for each byte value: printable Latin-1 bytes stand for themselves, the rest are shifted.

    The 188 bytes that are visible, non-space characters in Latin-1 keep their code point; the other 68
    (controls, space, NBSP, soft hyphen, ...) get code points 256, 257, ... in byte order. So a space is
    written as U+0120 "Ġ" and a newline as U+010A "Ċ", exactly as in GPT-2's files.
    """
    visible = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    chars: list[str] = []
    shifted = 0
    for byte in range(256):
        if byte in visible:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + shifted))
            shifted += 1
    return tuple(chars)


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """Inverse of :func:`byte_to_unicode`."""
    return {char: byte for byte, char in enumerate(byte_to_unicode())}


@lru_cache(maxsize=1)
def _encode_table() -> dict[int, str]:
    return dict(enumerate(byte_to_unicode()))


def bytes_to_token_str(token: bytes) -> str:
    """The printable form of a byte-level token."""
    return token.decode("latin-1").translate(_encode_table())


def token_str_to_bytes(text: str) -> bytes:
    """Bytes of a printable token; ``KeyError`` (the offending character) if it is not in the table."""
    try:
        return text.translate(_decode_table()).encode("latin-1")
    except UnicodeEncodeError:
        table = unicode_to_byte()
        raise KeyError(next(char for char in text if char not in table)) from None


@lru_cache(maxsize=1)
def _decode_table() -> dict[int, str]:
    """``str.translate`` table: table character -> the Latin-1 character of its byte.

    Latin-1 characters that are not table characters (space, controls) map to U+0100, which then fails
    the Latin-1 encode, so a foreign character is never silently taken for a byte.
    """
    table = {ord(char): chr(byte) for char, byte in unicode_to_byte().items()}
    for code in range(256):
        table.setdefault(code, "\u0100")
    return table
