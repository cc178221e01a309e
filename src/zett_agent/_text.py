r"""Text that must be valid Unicode before it reaches a model request.

A ``str`` may hold a lone surrogate (``"\\ud800"``): Python accepts it, UTF-8 cannot encode
it, so a model request holding one fails as it is sent. Whatever a child agent, a runner or a
model hands the parent goes through ``valid_text`` before the parent puts it into a message or
a tool result.
"""

from __future__ import annotations

import re

__all__ = ["valid_json", "valid_text"]

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


def valid_json(value: object) -> object:
    """A copy of the JSON data ``value`` whose strings (keys included) went through ``valid_text``.

    Iterative: nesting of any depth is walked without recursion.
    """
    root: list[object] = [None]
    #: (container to fill, key or index in it, value to copy)
    todo: list[tuple[object, object, object]] = [(root, 0, value)]
    while todo:
        target, where, item = todo.pop()
        copy: object
        if isinstance(item, str):
            copy = valid_text(item)
        elif isinstance(item, dict):
            copy = {}
            for key, member in item.items():
                todo.append((copy, valid_text(key) if isinstance(key, str) else key, member))
        elif isinstance(item, list | tuple):
            copy = [None] * len(item)
            todo.extend((copy, index, member) for index, member in enumerate(item))
        else:
            copy = item
        target[where] = copy  # type: ignore[index]
    return root[0]
