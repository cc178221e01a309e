"""The driver's side of a Ray child's stream: frames decoded a slice at a time, within budgets.

What a child sends reaches the driver as the engine's frames (``_ray_task``), after the node's
pool decoded and checked them; the driver decodes them again with the engine's own decoder
(``process._decode``), under the same rules as the process runner's: no frame is decoded
whole in one go (at most ``SLICE`` seconds per event-loop callback), text is valid Unicode (a
lone surrogate is refused), and the decoded size counts against ``max_buffered_bytes``:
one event or result may not decode into more, and the events nobody has read yet may not hold
more, nor be more than ``max_buffered_events``. Without a reader the oldest are dropped
(``dropped``); with one, the job stops reading the stream until the reader caught up, so the
Ray task, and then the child's ``emit``, wait.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from zett_agent.process._wire._decode import Assembler
from zett_agent.process._wire._protocol import FrameDecoder, FrameError

__all__ = ["SLICE", "Relay"]

#: longest stretch of decoding in one event-loop callback
SLICE = 0.002


class Relay:
    """The frames of one child's stream, decoded within its budgets (see the module docstring).

    ``feed`` takes the bytes of one stream item; ``step`` decodes until nothing is left or the
    slice ran out; events land in ``events`` with the memory each is counted for, the result
    in ``result``. A frame that breaks the protocol or a budget raises ``FrameError``.
    """

    def __init__(self, max_frame_bytes: int, max_buffered_events: int, max_buffered_bytes: int):
        self.max_buffered_events = max_buffered_events
        self.max_buffered_bytes = max_buffered_bytes
        self._decoder = FrameDecoder()
        self._assembler = Assembler(max_frame_bytes)
        #: events not yet read, with the memory each is counted for
        self.events: deque[tuple[Any, int]] = deque()
        self.held = 0
        #: events dropped because nobody read them and a bound was reached
        self.dropped = 0
        #: whether someone reads the events (then nothing is dropped: the stream waits)
        self.consumer = False
        #: ``(value, (cpu seconds, peak bytes, whether the worker exits))`` once it arrived
        self.result: tuple[Any, tuple[float, int, bool]] | None = None

    @property
    def pending(self) -> bool:
        """Whether bytes were fed that are not decoded yet."""
        return self._decoder.buffered > 0

    @property
    def full(self) -> bool:
        """Whether the unread events reached a bound (a reader must catch up first)."""
        return len(self.events) >= self.max_buffered_events or self.held >= self.max_buffered_bytes

    def feed(self, data: bytes) -> None:
        self._decoder.feed(data)

    def step(self, *, slice_seconds: float = SLICE) -> bool:
        """Decode until the fed bytes are used up (True) or the slice ran out (False)."""
        deadline = time.perf_counter() + slice_seconds
        assembler = self._assembler
        while True:
            frame = self._decoder.next_frame()
            if frame is None:
                return True
            message = assembler.feed(frame)
            assembler.dropped = None  # an aborted value: nothing of it is kept
            if assembler.held > self.max_buffered_bytes:
                raise FrameError(self._too_big("one event or result"))
            if message is not None:
                if message.kind == "event":
                    self._push(message.value, message.cost)
                elif message.kind == "result" and self.result is None:
                    if message.cost > self.max_buffered_bytes:
                        raise FrameError(self._too_big("the result"))
                    assert message.usage is not None
                    self.result = (message.value, message.usage)
                else:
                    raise FrameError(f"a {message.kind} message in a Ray child's stream")
            if time.perf_counter() > deadline:
                return False

    def _too_big(self, what: str) -> str:
        return (
            f"{what} decodes into more than max_buffered_bytes={self.max_buffered_bytes} "
            "bytes; send less data per event or result, or raise RayRunner(max_buffered_bytes=...)"
        )

    def _push(self, value: Any, cost: int) -> None:
        self.events.append((value, cost))
        self.held += cost
        if not self.consumer:
            while self.events and (
                len(self.events) > self.max_buffered_events or self.held > self.max_buffered_bytes
            ):
                self.pop()
                self.dropped += 1

    def pop(self) -> Any:
        """The oldest unread event (there must be one)."""
        value, cost = self.events.popleft()
        self.held -= cost
        return value

    def clear(self) -> None:
        """Forget everything not read (the job is being killed)."""
        self.events.clear()
        self.held = 0
        self._decoder = FrameDecoder()
        self._assembler.reset()
