"""Property tests of the child-to-parent wire: whatever a child writes, the parent either gets
back exactly what was sent, as valid Unicode, or a ``FrameError`` naming what was wrong; and
what it holds while decoding stays within the bound it counts."""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zett_agent.process._wire import _strbuild
from zett_agent.process._wire._decode import Assembler, json_cost
from zett_agent.process._wire._encode import Encoder, check_value
from zett_agent.process._wire._protocol import CHUNK, HEADER, FrameDecoder, FrameError, decode_json

CAP = 4096


def drain(decoder: FrameDecoder) -> list[bytes]:
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(bytes(frame))
    return frames


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=300, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=CAP), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=12 * (CAP + 4)), max_size=30),
)
def test_frames_split_anywhere_come_back_whole(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(HEADER.pack(len(p)) + p for p in payloads)
    decoder = FrameDecoder(CAP)
    got: list[bytes] = []
    for piece in chunked(stream, cuts):
        decoder.feed(piece)
        got += drain(decoder)
    assert got == payloads
    assert decoder.buffered == 0


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=3 * CAP))
def test_any_bytes_give_frames_within_the_cap_or_a_frame_error(data: bytes) -> None:
    decoder = FrameDecoder(CAP)
    decoder.feed(data)
    try:
        frames = drain(decoder)
    except FrameError as exc:
        assert "bytes" in str(exc)
        return
    assert all(len(frame) <= CAP for frame in frames)
    assert decoder.buffered <= CAP + HEADER.size


# -- whole values through the encoder and the assembler ----------------------------------------

#: characters of valid Unicode text (what may travel): everything but the surrogates
unicode = st.characters(codec="utf-8")

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=unicode, max_size=40)
    # long strings, ASCII and not: these go as text frames
    | st.text(alphabet=unicode, min_size=60, max_size=400)
    | st.text(alphabet="ab\xe9\u4e2d\U0001f600\\", min_size=60, max_size=200)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=12)
        | st.dictionaries(st.text(alphabet=unicode, max_size=8), inner, max_size=12)
    ),
    max_leaves=80,
)

#: protocol sizes shrunk so that small values are streamed, sliced and batched
SMALL = {"chunk": 256, "text_slice": 64, "text_min": 50}


def round_trip(
    kind: str, value: Any, as_json: bool = False, **sizes: int
) -> tuple[Any, list[bytes]]:
    frames: list[bytes] = []
    usage = {"cpu": 0.5, "maxrss": 1024} if kind == "result" else None
    Encoder(frames.append, 1 << 24, **sizes).message(kind, value, usage, as_json=as_json)
    assembler = Assembler(1 << 24, chunk=sizes.get("chunk", CHUNK))
    done = None
    for i, frame in enumerate(frames):
        message = assembler.feed(frame)
        if message is not None:
            assert i == len(frames) - 1, "a message completed before its last frame"
            done = message
    assert done is not None and done.kind == kind
    if kind == "result":
        assert done.usage == (0.5, 1024, False)
    return done.value, frames


@settings(max_examples=400, deadline=None)
@given(value=json_values, kind=st.sampled_from(["event", "result"]), as_json=st.booleans())
def test_json_values_come_back_equal_however_they_are_streamed(
    value: Any, kind: str, as_json: bool
) -> None:
    got, frames = round_trip(kind, value, as_json, **SMALL)
    assert got == value
    assert json.dumps(got) == json.dumps(value)  # same order of keys too
    for frame in frames:
        assert len(frame) <= max(SMALL["chunk"], SMALL["text_slice"])


@settings(max_examples=100, deadline=None)
@given(value=json_values)
def test_tuples_arrive_as_lists(value: Any) -> None:
    got, _frames = round_trip("event", (value, [value]), **SMALL)
    assert got == [value, [value]]


def test_large_values_stream_in_frames_of_the_protocols_sizes() -> None:
    value = {
        "rows": [{"i": i, "name": f"row {i}"} for i in range(20_000)],
        "report": "x" * 3_000_000,
        "wide": "\u4e2d" * 500_000 + "\U0001f600",
        "nested": [[list(range(50))] * 50] * 10,
    }
    got, frames = round_trip("result", value)
    assert got == value
    assert len(frames) > 10
    assert max(len(frame) for frame in frames) <= 1 << 20


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({1: "a", "1": "b"}, "[1]"),
        ({"ok": [{True: 1}]}, "['ok'][0][True]"),
        ({None: 2}, "[None]"),
        ({"x": object()}, "['x']"),
        ([1, {2.5: 3}], "[1][2.5]"),
        ({"s": {1, 2}}, "['s']"),
    ],
)
def test_what_json_would_change_is_refused_with_its_path(value: Any, path: str) -> None:
    with pytest.raises(TypeError) as raised:
        check_value(value)
    assert f"at {path}:" in str(raised.value)
    with pytest.raises(TypeError):
        Encoder(lambda frame: None, 1 << 20).message("event", value)


@pytest.mark.parametrize(
    ("value", "path"),
    [({"x": object()}, "['x']"), ({"s": {1, 2}}, "['s']"), ([1, [2, {"y": b"z"}]], "[1][1]['y']")],
)
@pytest.mark.parametrize("sizes", [{}, SMALL])
def test_as_json_what_json_refuses_is_refused_with_its_path(
    value: Any, path: str, sizes: dict[str, int]
) -> None:
    frames: list[bytes] = []
    with pytest.raises(TypeError) as raised:
        Encoder(frames.append, 1 << 20, **sizes).message("event", value, as_json=True)
    assert f"at {path}:" in str(raised.value)
    assert frames == []  # refused before anything was sent


@pytest.mark.parametrize("sizes", [{}, SMALL])
def test_as_json_a_key_arrives_as_json_makes_it(sizes: dict[str, int]) -> None:
    """A value that becomes JSON anyway may have keys JSON turns into strings (``as_json``)."""
    value = {1: "a", "b": [{True: None, 2.5: 3}]}
    if sizes:  # too long for one frame of the small sizes: walked and refused as by default
        value["long"] = "x" * 300
        with pytest.raises(TypeError, match=r"at \[1\]:"):
            Encoder(lambda frame: None, 1 << 20, **sizes).message("event", value, as_json=True)
        return
    got, _frames = round_trip("event", value, True)
    assert got == json.loads(json.dumps(value)) == {"1": "a", "b": [{"true": None, "2.5": 3}]}


@pytest.mark.parametrize("as_json", [False, True])
def test_a_cycle_is_refused(as_json: bool) -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(TypeError, match="Circular"):
        Encoder(lambda frame: None, 1 << 20).message("event", {"a": loop}, as_json=as_json)


def test_a_message_over_max_bytes_is_refused_and_aborted() -> None:
    frames: list[bytes] = []
    with pytest.raises(ValueError, match="max_frame_bytes"):
        Encoder(frames.append, 100_000, **SMALL).message("event", ["y" * 40] * 10_000)
    assembler = Assembler(1 << 24, chunk=SMALL["chunk"])
    for frame in frames:
        assert assembler.feed(frame) is None
    # the abort frame left the parent ready for the next message
    assert not assembler.busy and assembler.held == 0
    assert assembler.feed(b'{"k":"event","v":1}') is not None


# -- hostile frame sequences -----------------------------------------------------------------

ops = st.sampled_from(
    [
        b'{"k":"begin","m":"event"}',
        b'{"k":"begin","m":"result"}',
        b'{"k":"open","t":"list"}',
        b'{"k":"open","t":"dict"}',
        b'{"k":"close"}',
        b'{"k":"key","v":"a"}',
        b'{"k":"val","v":[1,2,{}]}',
        b'{"k":"items","v":[1,2,3]}',
        b'{"k":"fields","v":{"x":1}}',
        b'{"k":"text","n":3,"c":3,"w":1,"a":true}',
        b"abc",
        b'{"k":"end"}',
        b'{"k":"end","u":{"cpu":1,"maxrss":2}}',
        b'{"k":"abort"}',
        b'{"k":"event","v":[{},{},{}]}',
        b'{"k":"result","v":null,"u":{"cpu":0,"maxrss":0}}',
        b"[]",
        b'{"k":5}',
        b"\xff",
    ]
)


@settings(max_examples=500, deadline=None)
@given(frames=st.lists(ops, max_size=40))
def test_any_frame_sequence_gives_messages_or_a_frame_error(frames: list[bytes]) -> None:
    assembler = Assembler(1 << 20)
    counted = 0
    try:
        for frame in frames:
            message = assembler.feed(frame)
            counted += json_cost(frame)
            # what is held for a partial message never exceeds what was counted for it
            assert assembler.held <= counted + 64
            if message is not None:
                assert message.kind in ("event", "result", "error")
                counted = 0
            if not assembler.busy:
                counted = 0
    except FrameError:
        return


def test_amplifying_json_is_counted_at_no_less_than_its_decoded_size() -> None:
    for text in ("[" + ",".join(["{}"] * 10_000) + "]", "[" + ",".join(["[]"] * 10_000) + "]"):
        frame = ('{"k":"event","v":' + text + "}").encode()
        value = decode_json(frame)["v"]
        decoded = sys.getsizeof(value) + sum(sys.getsizeof(item) for item in value)
        assert json_cost(frame) >= decoded


def _deep_size(value: object) -> int:
    """Bytes the objects of a decoded JSON value take (each object once)."""
    seen: set[int] = set()
    total, todo = 0, [value]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return total


@pytest.mark.parametrize(
    "text",
    [
        "a" * 15_000 + "\U0001f600",  # one astral character: every character 4 bytes wide
        "a" * 15_000 + "\u0101",  # one 2-byte-wide character
        "\U0001f600" * 1_300,
    ],
    ids=["one-astral", "one-wide", "all-astral"],
)
@pytest.mark.parametrize("ensure_ascii", [True, False], ids=["escaped", "utf8"])
def test_wide_text_is_counted_at_no_less_than_its_decoded_size(
    text: str, ensure_ascii: bool
) -> None:
    """A string one wide character makes wide (every character then takes 2 or 4 bytes) is
    counted as such, written as UTF-8 or as ``\\u`` escapes."""
    frame = json.dumps({"k": "event", "v": [text, {"t": text}]}, ensure_ascii=ensure_ascii)
    data = frame.encode()
    assert len(data) <= CHUNK
    assert json_cost(data) >= _deep_size(decode_json(data)["v"])


@pytest.mark.parametrize("builder", [True, False], ids=["built-in-place", "joined"])
def test_text_frames_must_match_their_announcement(
    builder: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # both ways a text is put together check it the same way (the joined one where the C API
    # cannot be reached)
    monkeypatch.setattr(_strbuild, "available", builder and _strbuild.available)

    def feed(*frames: bytes) -> None:
        assembler = Assembler(1 << 20)
        for frame in frames:
            assembler.feed(frame)

    begin = b'{"k":"begin","m":"event"}'
    with pytest.raises(FrameError, match="UTF-8"):
        feed(begin, b'{"k":"text","n":2,"c":2,"w":1,"a":true}', b"\xc3\xa9")
    with pytest.raises(FrameError, match="announcement"):
        feed(begin, b'{"k":"text","n":2,"c":1,"w":2,"a":false}', b"\xc3\xa9")  # too narrow
    with pytest.raises(FrameError, match="announcement"):
        feed(begin, b'{"k":"text","n":4,"c":2,"w":2,"a":false}', b"\xc3\xa9\xc3\xa9")
    with pytest.raises(FrameError, match="past the announced"):
        feed(begin, b'{"k":"text","n":1,"c":1,"w":1,"a":true}', b"ab")
    with pytest.raises(FrameError, match="malformed text"):
        feed(begin, b'{"k":"text","n":1,"c":5,"w":1,"a":true}')


def test_the_width_of_a_string_is_its_storage_width() -> None:
    # one-character strings may be shared singletons whose size includes a cached UTF-8 copy
    for text, expected in [
        ("\xe9", 1),
        ("\xe9\xe9", 1),
        (str(b"\xc3\xa9", "utf-8"), 1),
        ("\u0100", 2),
        ("a\u4e2d", 2),
        ("\U0001f600", 4),
        ("x\U0010ffff", 4),
    ]:
        assert _strbuild.width(text) == expected, text


# -- text that is not valid Unicode --------------------------------------------------------------


def valid_unicode(value: Any) -> bool:
    """Whether every string of ``value`` (keys included) encodes to UTF-8, as a model request
    that holds it must."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def feed_all(frames: list[bytes], **options: int) -> list[Any]:
    assembler = Assembler(1 << 20, **options)
    return [m.value for frame in frames if (m := assembler.feed(frame)) is not None]


#: what a hostile child may put into a JSON string: escapes of surrogates (lone, paired, in
#: either case, split by an escaped backslash), other escapes, raw UTF-8 (a surrogate's three
#: bytes included, which strict UTF-8 refuses)
string_pieces = st.sampled_from(
    [
        b"\\ud800",
        b"\\uDBFF",
        b"\\udc00",
        b"\\uDFFF",
        b"\\ud83d\\ude00",
        b"\\uD83D\\uDE00",
        b"\\ud83d\\\\ude00",
        b"\\\\ud800",
        b"\\\\\\ud800",
        b"\\u00e9",
        b"\\u4e2d",
        b"\\n",
        b"\\\\",
        b"\\/",
        b"\\u",
        "\xe9\U0001f600".encode(),
        b"\xed\xa0\x80",
        b"\xff",
        b"plain",
        b"ud800",
    ]
)
hostile_strings = st.lists(string_pieces, max_size=8).map(
    lambda parts: b'"' + b"".join(parts) + b'"'
)


@settings(max_examples=500, deadline=None)
@given(
    strings=st.lists(hostile_strings, min_size=1, max_size=4),
    shape=st.sampled_from(["event", "list", "key", "val", "items", "fields", "error"]),
)
def test_any_json_frame_decodes_into_valid_unicode_or_a_frame_error(
    strings: list[bytes], shape: str
) -> None:
    first, rest = strings[0], b",".join(strings)
    usage = b'"u":{"cpu":0,"maxrss":0}'
    frames = {
        "event": [b'{"k":"event","v":' + first + b"}"],
        "list": [b'{"k":"result","v":[' + rest + b"]," + usage + b"}"],
        "key": [b'{"k":"event","v":{' + first + b":1}}"],
        "val": [b'{"k":"begin","m":"event"}', b'{"k":"val","v":[' + rest + b"]}", b'{"k":"end"}'],
        "items": [
            b'{"k":"begin","m":"event"}',
            b'{"k":"open","t":"list"}',
            b'{"k":"items","v":[' + rest + b"]}",
            b'{"k":"close"}',
            b'{"k":"end"}',
        ],
        "fields": [
            b'{"k":"begin","m":"event"}',
            b'{"k":"open","t":"dict"}',
            b'{"k":"key","v":' + first + b"}",
            b'{"k":"val","v":1}',
            b'{"k":"fields","v":{"a":' + first + b"}}",
            b'{"k":"close"}',
            b'{"k":"end"}',
        ],
        "error": [
            b'{"k":"error","type":' + first + b',"message":"m","traceback":"t",' + usage + b"}"
        ],
    }[shape]
    try:
        values = feed_all(frames)
    except FrameError as exc:
        assert "UTF-8" in str(exc) or "surrogate" in str(exc) or "JSON" in str(exc), exc
        return
    for frame in frames:
        decode_json(frame)  # each frame on its own decodes too
    assert all(valid_unicode(value) for value in values)
    if shape == "error":
        assembler = Assembler(1 << 20)
        message = assembler.feed(frames[0])
        assert message is not None and message.error is not None
        assert valid_unicode(list(message.error))


@pytest.mark.parametrize("builder", [True, False], ids=["built-in-place", "joined"])
@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=24) | st.lists(string_pieces, max_size=6).map(b"".join))
def test_any_text_frame_decodes_into_valid_unicode_or_a_frame_error(
    builder: bool, data: bytes
) -> None:
    # whatever the announcement, the bytes of a text frame are strict UTF-8 or refused
    text = str(data, "utf-8", "surrogatepass") if _decodes(data) else ""
    length = len(text) if text else len(data)
    width = 1 if not text or text.isascii() else _strbuild.width(text)
    saved = _strbuild.available
    _strbuild.available = builder and saved
    try:
        announce = json.dumps(
            {"k": "text", "n": len(data), "c": length, "w": width, "a": not text or text.isascii()}
        ).encode()
        values = feed_all([b'{"k":"begin","m":"event"}', announce, data, b'{"k":"end"}'])
    except FrameError as exc:
        if _decodes(data) and not _decodes(data, strict=True):
            # valid but for a surrogate's bytes: named as such
            assert "lone surrogate" in str(exc), exc
        return
    finally:
        _strbuild.available = saved
    assert values == [text]
    assert valid_unicode(values)


def _decodes(data: bytes, *, strict: bool = False) -> bool:
    try:
        str(data, "utf-8", "strict" if strict else "surrogatepass")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize(
    ("escape", "lone"),
    [
        ("\\ud800", True),
        ("\\uDFFF", True),
        ("\\ud83d", True),  # a high surrogate not followed by a low one
        ("\\ud83d x", True),
        ("\\ud83d\\ud83d\\ude00", True),  # the first high one is alone
        ("\\ude00\\ud83d", True),  # a low one before a high one: both alone
        ("\\ud83d\\\\ude00", True),  # an escaped backslash between: no pair
        ("\\\\\\ud800", True),  # an escaped backslash, then the escape
        ("\\ud83d\\ude00", False),  # a valid pair: one emoji
        ("\\uD83D\\uDE00", False),
        ("\\udbff\\udfff", False),  # U+10FFFF
        ("\\\\ud800", False),  # an escaped backslash and the text "ud800"
        ("\\u00e9\\u4e2d\\n", False),
    ],
)
def test_json_escapes_of_lone_surrogates_are_refused_and_pairs_accepted(
    escape: str, lone: bool
) -> None:
    for template in (
        '{"k":"event","v":"%s"}',
        '{"k":"event","v":{"%s":1}}',
        '{"k":"items","v":["a","%s"]}',
        '{"k":"error","type":"T","message":"%s","traceback":"","u":{"cpu":0,"maxrss":0}}',
        # many values: looked at through a search of the bytes, then the whole value
        '{"k":"items","v":[' + "1," * 100 + '"%s"]}',
        '{"k":"items","v":[' + '{"i":1},' * 100 + '{"s":["%s"]}]}',
        '{"k":"fields","v":{' + "".join(f'"f{i}":{i},' for i in range(100)) + '"%s":1}}',
    ):
        frame = (template % escape).encode()
        if lone:
            with pytest.raises(FrameError, match="lone surrogate"):
                decode_json(frame)
        else:
            assert valid_unicode(decode_json(frame))


@pytest.mark.parametrize("builder", [True, False], ids=["built-in-place", "joined"])
def test_a_text_frame_with_a_lone_surrogate_is_refused_naming_it(
    builder: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_strbuild, "available", builder and _strbuild.available)
    begin = b'{"k":"begin","m":"event"}'
    # the announcement fits the text (three bytes, one character of width 2): only its bytes
    # are wrong
    with pytest.raises(FrameError, match=r"lone surrogate \(U\+D800 at byte 1\)"):
        feed_all([begin, b'{"k":"text","n":4,"c":2,"w":2,"a":false}', b"a\xed\xa0\x80"])
    with pytest.raises(FrameError, match="not valid UTF-8"):
        feed_all([begin, b'{"k":"text","n":2,"c":2,"w":1,"a":false}', b"\xc3("])


#: strings holding a lone surrogate somewhere (and valid text around it)
bad_strings = st.builds(
    lambda before, lone, after: before + lone + after,
    st.text(alphabet=unicode, max_size=30),
    st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]),
    # long ones travel as text frames when streamed (with SMALL sizes)
    st.text(alphabet=unicode, max_size=30) | st.just("x" * 300) | st.just("\u4e2d" * 100),
)


@settings(max_examples=300, deadline=None)
@given(
    value=json_values,
    bad=bad_strings,
    where=st.integers(min_value=0, max_value=50),
    as_key=st.booleans(),
    sizes=st.sampled_from([{}, SMALL]),
    as_json=st.booleans(),
)
def test_a_value_with_a_lone_surrogate_is_refused_in_the_worker_with_its_path(
    value: Any, bad: str, where: int, as_key: bool, sizes: dict[str, int], as_json: bool
) -> None:
    # put the bad string somewhere into the value: as a leaf, or as a dict key
    holder: Any = {bad: 1} if as_key else [bad]
    inside: list[Any] = [bad] if as_key else [0]
    containers = _containers(value)
    if containers:
        target, path = containers[where % len(containers)]
        if isinstance(target, list):
            at: Any = where % (len(target) + 1)
            target.insert(at, holder)
        else:
            at = f"k{where}"
            target[at] = holder
        path = [*path, at, *inside]
    else:
        value, path = [value, holder], [1, *inside]
    frames: list[bytes] = []
    with pytest.raises(TypeError, match="lone surrogate") as raised:
        Encoder(frames.append, 1 << 24, **sizes).message("event", value, as_json=as_json)
    where_named = "".join(f"[{key!r}]" for key in path)
    assert str(raised.value).startswith(f"at {where_named}: a "), (str(raised.value), path)
    # nothing of it reached the parent: a streamed part was aborted
    assembler = Assembler(1 << 24, chunk=sizes.get("chunk", CHUNK))
    for frame in frames:
        assert assembler.feed(frame) is None
    assert not assembler.busy


def _containers(value: Any) -> list[tuple[Any, list[Any]]]:
    """Every list and dict of ``value``, with its path."""
    found, stack = [], [(value, [])]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict | list):
            found.append((item, path))
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((child, [*path, key]) for key, child in pairs)
    return found


def test_an_exception_with_a_lone_surrogate_reaches_the_parent_escaped() -> None:
    from zett_agent.process._wire._encode import without_surrogates

    assert without_surrogates("plain") == "plain"
    assert without_surrogates("caf\xe9 \U0001f600") == "caf\xe9 \U0001f600"
    assert without_surrogates("bad \ud800 text") == "bad \\ud800 text"


def test_the_width_test_never_skips_a_string_that_may_hold_a_surrogate() -> None:
    from zett_agent.process._wire._protocol import _narrow, surrogate_in

    assert _narrow("caf\xe9") and _narrow("\xff" * 100) and _narrow("\xe9")
    for wide in ("\u0100", "a\u4e2d", "\U0001f600 x", "x\ud800"):
        assert not _narrow(wide)
    cached = "caf\xe9 " * 10
    import ctypes

    ctypes.pythonapi.PyUnicode_AsUTF8.restype = ctypes.c_char_p
    ctypes.pythonapi.PyUnicode_AsUTF8.argtypes = [ctypes.py_object]
    ctypes.pythonapi.PyUnicode_AsUTF8(cached)  # a cached UTF-8 copy: looks wider, is scanned
    assert surrogate_in(cached) is None
    assert surrogate_in("caf\xe9 \ud800") == "\ud800"
    assert surrogate_in("\U0001f600" * 3 + "\udfff") == "\udfff"
