"""Fixed rows of int64 words: the text and the floats of a per-rank summary, packed so
that every rank's row travels in one tensor ``all_gather`` (nothing pickled).

>>> words = text_words("node-07", 16)
>>> words_text(words, 16)
'node-07'
>>> word_float(float_word(1.5))
1.5

A text takes ``nbytes // 8 + 1`` words: its length in bytes, then its first ``nbytes``
bytes of UTF-8 packed 8 to a little-endian word; a longer text comes back cut there, at
a character boundary. A float takes one word, its IEEE-754 bits; None travels as NaN.
"""

from __future__ import annotations

import math
import struct
from functools import lru_cache
from typing import List, Optional, Sequence

from gpukeeper.base.errors import InvalidInputError

__all__ = [
    "HOSTNAME_BYTES",
    "float_word",
    "text_word_count",
    "text_words",
    "word_float",
    "words_text",
]

#: Bytes of a host name that a row carries: Linux's HOST_NAME_MAX is 64, so a Linux host
#: name travels whole.
HOSTNAME_BYTES = 64

_FLOAT = struct.Struct("<d")
_WORD = struct.Struct("<q")


@lru_cache(maxsize=None)
def _text_struct(nbytes: int) -> struct.Struct:
    if nbytes <= 0 or nbytes % 8:
        raise InvalidInputError(f"fixed_rows: a text's bytes must be a multiple of 8, got {nbytes}")
    return struct.Struct("<%dq" % (nbytes // 8))


def text_word_count(nbytes: int) -> int:
    """Words a text of ``nbytes`` bytes takes in a row: its length and its bytes."""
    return 1 + _text_struct(nbytes).size // 8


def text_words(text: str, nbytes: int) -> List[int]:
    """``text`` as :func:`text_word_count` words: its full length in bytes, then its
    first ``nbytes`` bytes (UTF-8, zero-padded)."""
    raw = text.encode("utf-8")
    return [len(raw), *_text_struct(nbytes).unpack(raw[:nbytes].ljust(nbytes, b"\0"))]


def words_text(words: Sequence[int], nbytes: int) -> str:
    """Reads back :func:`text_words`; a text longer than ``nbytes`` comes back cut, at a
    character boundary."""
    count = text_word_count(nbytes)
    if len(words) != count:
        raise InvalidInputError(
            f"fixed_rows: a text of {nbytes} bytes takes {count} words, got {len(words)}"
        )
    raw = _text_struct(nbytes).pack(*(int(w) for w in words[1:]))
    return raw[: min(int(words[0]), nbytes)].decode("utf-8", errors="ignore")


def float_word(value: Optional[float]) -> int:
    """A float's IEEE-754 bits as one signed int64 word; None as NaN."""
    return _WORD.unpack(_FLOAT.pack(math.nan if value is None else float(value)))[0]


def word_float(word: int) -> float:
    """Reads back :func:`float_word` (None comes back as NaN)."""
    return _FLOAT.unpack(_WORD.pack(int(word)))[0]
