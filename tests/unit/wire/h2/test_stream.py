"""A stream as the handler's request (``h2.stream``), against a recording carrier (a fake of
the connection's side): its body read whole, bounded and in time; a response's head, body and
end; the relay's chunks as payloads; bodiless answers; a reset while the body comes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest
from multidict import CIMultiDict

from llmobs.wire.h2.heads import VERSION
from llmobs.wire.h2.stream import H2Stream
from llmobs.wire.http1 import RequestHead
from llmobs.wire.request import BodyTooLarge, BodyTooSlow


class Recorded:
    """What a stream sent through its connection."""

    remote, scheme, closing = "10.0.0.1", "https", False

    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []
        self.holding = False

    def send_head(
        self, stream: H2Stream, status: int, fields: Iterable[tuple[str, str]], length: int | None
    ) -> None:
        self.sent.append(("head", (status, list(fields), length)))

    def send(self, stream: H2Stream, data: bytes, end: bool) -> None:
        self.sent.append(("end" if end else "data", data))

    def send_trailers(self, stream: H2Stream, fields: Iterable[tuple[str, str]]) -> None:
        self.sent.append(("trailers", list(fields)))

    def held(self, stream: H2Stream) -> bool:
        return self.holding

    def reset(self, stream: H2Stream) -> None:
        self.sent.append(("reset", None))


def _stream(
    method: str = "POST", ended: bool = False, limit: int = 100
) -> tuple[H2Stream, Recorded]:
    conn = Recorded()
    fields = [("host", "x"), ("content-length", "5")]
    head = RequestHead(method, "/v1/chat/completions", VERSION, CIMultiDict(fields), fields)
    return H2Stream(conn, 1, head, limit, ended), conn


async def test_the_body_is_read_whole_once_the_stream_ends() -> None:
    stream, _ = _stream()
    assert (stream.has_body, stream.content_length, stream.scheme) == (True, 5, "https")
    reading = asyncio.ensure_future(stream.read_body(5))
    stream.feed(b"he")
    stream.feed(b"llo")
    await asyncio.sleep(0)
    assert not reading.done()
    stream.complete()
    assert await reading == b"hello"


async def test_a_body_too_large_too_slow_or_reset() -> None:
    big, _ = _stream(limit=4)
    big.feed(b"hello")
    big.complete()
    with pytest.raises(BodyTooLarge):
        await big.read_body(5)
    slow, _ = _stream()
    with pytest.raises(BodyTooSlow):
        await slow.read_body(0.01)
    gone, _ = _stream()
    reading = asyncio.ensure_future(gone.read_body(5))
    await asyncio.sleep(0)
    gone.tell_gone()
    with pytest.raises(ConnectionResetError):
        await reading
    assert gone.closed


def test_a_response_head_body_and_end_and_the_relays_chunks() -> None:
    stream, conn = _stream(ended=True)
    stream.begin(200, "OK", [("Content-Type", "text/event-stream")], None)
    assert stream.write_chunks is not None
    stream.write_chunks(b"5\r\nhello\r\n3\r\nabc\r\n")
    stream.write_last(b"1\r\n!\r\n0\r\n\r\n")
    stream.end()  # once only
    assert conn.sent == [  # a read's chunks in one DATA frame; the last with the end
        ("head", (200, [("Content-Type", "text/event-stream")], None)),
        ("data", b"helloabc"), ("end", b"!"),
    ]  # fmt: skip


@pytest.mark.parametrize(("method", "status"), [("HEAD", 200), ("GET", 204), ("GET", 304)])
def test_a_bodiless_answer_sends_no_data(method: str, status: int) -> None:
    stream, conn = _stream(method, ended=True)
    stream.begin(status, "", [], 10)
    stream.write(b"ignored")
    assert stream.bodyless and stream.write_chunks is None
    assert [kind for kind, _ in conn.sent] == ["head"]


def test_an_error_in_the_openai_shape_and_flow_told() -> None:
    stream, conn = _stream(ended=True)
    conn.holding = True
    told: list[str] = []
    stream.on_flow(lambda: told.append("pause"), lambda: told.append("resume"))
    assert told == ["pause"]  # held already when the relay asked
    stream.tell_resumed()
    stream.respond_error(502, "llmobs: upstream unavailable")
    kinds = [kind for kind, _ in conn.sent]
    assert kinds == ["head", "data", "end"] and b'"code": 502' in conn.sent[1][1]  # type: ignore[operator]
    assert told == ["pause", "resume"]
    stream.abort()
    assert conn.sent[-1] == ("reset", None)


def _whole_message(prefix: bytes, received: int) -> bool:
    return len(prefix) >= 5 and received >= 5 + int.from_bytes(prefix[1:5], "big")


async def test_a_grpc_streams_start_is_its_first_message_and_the_rest_follows() -> None:
    """``read_start`` hands back the body once it holds enough (a gRPC stream's first message),
    not at its end; ``follow`` then hands on each later part as it comes, and the end."""
    stream, _ = _stream()
    starting = asyncio.ensure_future(stream.read_start(5, _whole_message))
    stream.feed(b"\x00\x00\x00")
    await asyncio.sleep(0)
    assert not starting.done()  # the prefix is not whole yet
    stream.feed(b"\x00\x02ab\x00")  # the first message whole, a byte of the next
    assert await starting == b"\x00\x00\x00\x00\x02ab\x00"
    assert not stream.body_complete
    parts: list[tuple[bytes, bool]] = []
    stream.follow(lambda data, end: parts.append((data, end)))
    stream.feed(b"\x00\x00\x00\x01c")
    stream.complete()
    assert parts == [(b"\x00\x00\x00\x01c", False), (b"", True)]


async def test_a_whole_body_needs_no_follow_and_a_reset_ends_nothing_downstream() -> None:
    whole, _ = _stream()
    whole.feed(b"\x00\x00\x00\x00\x09abc")  # a message cut short ...
    whole.complete()  # ... by the body's end: the start is what came
    assert await whole.read_start(5, _whole_message) == b"\x00\x00\x00\x00\x09abc"
    ended: list[tuple[bytes, bool]] = []
    whole.follow(lambda data, end: ended.append((data, end)))
    assert ended == [(b"", True)]
    gone, _ = _stream()
    gone.feed(b"\x00\x00\x00\x00\x00")
    assert await gone.read_start(5, _whole_message) == b"\x00\x00\x00\x00\x00"
    told: list[tuple[bytes, bool]] = []
    gone.follow(lambda data, end: told.append((data, end)))
    gone.tell_gone()  # reset by the client: the relay's on_gone ends the engine's stream
    assert told == []
    slow, _ = _stream()
    with pytest.raises(BodyTooSlow):
        await slow.read_start(0.01, _whole_message)


def test_trailers_end_the_response_and_a_head_may_be_the_whole_of_it() -> None:
    stream, conn = _stream()
    stream.begin(200, "OK", [("content-type", "application/grpc")], None)
    stream.write(b"\x00\x00\x00\x00\x00")
    stream.end([("grpc-status", "0")])
    assert conn.sent[-1] == ("trailers", [("grpc-status", "0")])
    only, conn = _stream()
    only.begin(200, "OK", [("grpc-status", "5")], None, last=True)
    assert only.bodyless and conn.sent == [("head", (200, [("grpc-status", "5")], None))]
    plain, conn = _stream()
    plain.begin(200, "OK", [], None)
    plain.end()
    assert conn.sent[-1] == ("end", b"")


async def test_what_comes_between_the_start_and_follow_is_handed_on_first() -> None:
    """The relay follows the body only once its engine stream is open (a new connection
    may take a while): what came meanwhile, and an end that came with it, are not lost."""
    stream, _ = _stream()
    stream.feed(b"\x00\x00\x00\x00\x01a")
    assert await stream.read_start(5, _whole_message) == b"\x00\x00\x00\x00\x01a"
    stream.feed(b"\x00\x00\x00\x00\x01b")  # before follow ...
    stream.feed(b"\x00\x00\x00")
    stream.complete()  # ... and the client's end
    parts: list[tuple[bytes, bool]] = []
    stream.follow(lambda data, end: parts.append((data, end)))
    assert parts == [(b"\x00\x00\x00\x00\x01b\x00\x00\x00", False), (b"", True)]


async def test_a_first_message_in_tiny_frames_is_tested_by_counts() -> None:
    """A first message of 4,000 bytes in 1-byte frames: each frame's test is given the prefix
    and a count (never the body joined again), and the wait ends at the message's last."""
    stream, _ = _stream(limit=1 << 20)
    told: list[tuple[bytes, int]] = []

    def enough(prefix: bytes, received: int) -> bool:
        told.append((prefix, received))
        return _whole_message(prefix, received)

    starting = asyncio.ensure_future(stream.read_start(5, enough))
    await asyncio.sleep(0)
    wire = b"\x00" + (4000).to_bytes(4, "big") + bytes(4000)
    for i in range(len(wire)):
        stream.feed(wire[i : i + 1])
    assert await starting == wire
    assert told[-1] == (wire[:5], len(wire)) and len(told) == len(wire) + 1
