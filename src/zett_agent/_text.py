"""Text that must be valid Unicode before it reaches a model request.

A ``str`` may hold a lone surrogate (``"\\ud800"``): Python accepts it, UTF-8 cannot encode
it, so a model request holding one fails as it is sent. Whatever a child agent, a runner or a
model hands the parent goes through ``valid_text`` before the parent puts it into a message or
a tool result.
"""

from __future__ import annotations

import re

__all__ = ["valid_text"]

_SURROGATE = re.compile("[\ud800-\udfff]")
#: characters checked at a time (a temporary copy of 4 bytes each, kept small)
_PIECE = 1 << 14


def valid_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (the replacement character).

    ASCII text is returned as it is at constant cost; other text is checked at about the speed
    of a copy (a UTF-32 encoding, which refuses surrogates, piece by piece) and only rewritten
    when it holds one.
    """
    if text.isascii():
        return text
    try:
        for start in range(0, len(text), _PIECE):
            text[start : start + _PIECE].encode("utf-32-le")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text
