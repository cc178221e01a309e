"""Property tests of the child-to-parent framing: whatever bytes a child writes, the parent either
gets back exactly the frames that were sent, or a ``FrameError`` naming what was wrong."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from zett_agent.process._protocol import (
    HEADER,
    KINDS,
    FrameDecoder,
    FrameError,
    decode_message,
    encode_frame,
)

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
def test_frames_split_anywhere_come_back_whole_and_in_order(
    payloads: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(encode_frame(p) for p in payloads)
    decoder = FrameDecoder(CAP)
    received: list[bytes] = []
    for chunk in chunked(stream, cuts):
        decoder.feed(chunk)
        received += drain(decoder)
    assert received == payloads
    assert decoder.buffered == 0


@settings(max_examples=300, deadline=None)
@given(
    garbage=st.binary(max_size=3 * CAP),
    cuts=st.lists(st.integers(min_value=0, max_value=3 * CAP), max_size=10),
)
def test_arbitrary_bytes_give_frames_within_the_cap_or_a_frame_error(
    garbage: bytes, cuts: list[int]
) -> None:
    decoder = FrameDecoder(CAP)
    try:
        for chunk in chunked(garbage, cuts):
            decoder.feed(chunk)
            for frame in drain(decoder):
                assert len(frame) <= CAP
                try:
                    message = decode_message(frame)
                except FrameError:
                    continue
                assert message["k"] in KINDS
    except FrameError as error:
        assert "max_frame_bytes" in str(error)
    # never more than one frame's worth (plus a header) is held back
    assert decoder.buffered <= CAP + HEADER.size + len(garbage)


@settings(deadline=None)
@given(size=st.integers(min_value=CAP + 1, max_value=2**32 - 1))
def test_a_header_over_the_cap_is_refused_before_any_body_arrives(size: int) -> None:
    decoder = FrameDecoder(CAP)
    decoder.feed(HEADER.pack(size))
    try:
        decoder.next_frame()
    except FrameError as error:
        assert f"{size} bytes exceeds max_frame_bytes={CAP}" in str(error)
    else:
        raise AssertionError("an oversized header was accepted")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(deadline=None)
@given(kind=st.sampled_from(sorted(KINDS)), value=json_values)
def test_every_json_message_of_a_known_kind_decodes_to_itself(kind: str, value: object) -> None:
    message = {"k": kind, "v": value}
    assert decode_message(json.dumps(message).encode()) == message


@settings(deadline=None)
@given(data=st.binary(max_size=512) | st.text(max_size=200).map(str.encode))
def test_any_other_bytes_decode_to_a_known_message_or_a_frame_error(data: bytes) -> None:
    try:
        message = decode_message(data)
    except FrameError:
        return
    assert isinstance(message, dict) and message["k"] in KINDS
