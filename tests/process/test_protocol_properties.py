"""Property tests of the child-to-parent wire: whatever a child writes, the parent either gets
back exactly what was sent, or a ``FrameError`` naming what was wrong; and what it holds while
decoding stays within the bound it counts."""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zett_agent.process import _strbuild
from zett_agent.process._decode import Assembler, json_cost
from zett_agent.process._encode import Encoder, check_value
from zett_agent.process._protocol import CHUNK, HEADER, FrameDecoder, FrameError, decode_json

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

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
    # long strings, ASCII and not, lone surrogates included: these go as text frames
    | st.text(min_size=60, max_size=400)
    | st.text(alphabet=st.characters(codec="utf-8"), min_size=60, max_size=400)
    | st.text(alphabet="ab\udc80\U0001f600", min_size=60, max_size=200)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=12) | st.dictionaries(st.text(max_size=8), inner, max_size=12)
    ),
    max_leaves=80,
)

#: protocol sizes shrunk so that small values are streamed, sliced and batched
SMALL = {"chunk": 256, "text_slice": 64, "text_min": 50}


def round_trip(kind: str, value: Any, **sizes: int) -> tuple[Any, list[bytes]]:
    frames: list[bytes] = []
    usage = {"cpu": 0.5, "maxrss": 1024} if kind == "result" else None
    Encoder(frames.append, 1 << 24, **sizes).message(kind, value, usage)
    assembler = Assembler(1 << 24, chunk=sizes.get("chunk", CHUNK))
    done = None
    for i, frame in enumerate(frames):
        message = assembler.feed(frame)
        if message is not None:
            assert i == len(frames) - 1, "a message completed before its last frame"
            done = message
    assert done is not None and done.kind == kind
    if kind == "result":
        assert done.usage == (0.5, 1024)
    return done.value, frames


@settings(max_examples=400, deadline=None)
@given(value=json_values, kind=st.sampled_from(["event", "result"]))
def test_json_values_come_back_equal_however_they_are_streamed(value: Any, kind: str) -> None:
    got, frames = round_trip(kind, value, **SMALL)
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


def test_a_cycle_is_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(TypeError, match="Circular"):
        Encoder(lambda frame: None, 1 << 20).message("event", {"a": loop})


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
