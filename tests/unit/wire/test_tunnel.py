"""The tunnel between two real sockets: bytes both ways unchanged, the messages told after
they pass, the limit and the idle timeout ending it with close frames, one leg's end closing
the other, and an observer's failure leaving the bytes alone."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from wsproto.frame_protocol import FrameProtocol

from llmobs.wire.tunnel import CLIENT, ENGINE, Ending, Tunnel
from llmobs.wire.websocket import OP_CLOSE, FrameReader, Message, close_code


@dataclass
class Legs:
    """A tunnel's two transports, and the streams of the client and the engine at the ends."""

    client: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    engine: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    transports: tuple[asyncio.Transport, asyncio.Transport]
    told: list[tuple[int, Message]] = field(default_factory=list)

    def tunnel(self, limit: int = 1 << 20, idle: float = 30.0, fail: bool = False) -> Tunnel:
        def on_messages(side: int, messages: list[Message]) -> None:
            self.told.extend((side, m) for m in messages)
            if fail:
                raise RuntimeError("an observer's bug")

        readers = (FrameReader(limit, 1024), FrameReader(limit, 1024))
        return Tunnel(
            asyncio.get_running_loop(), self.transports, readers, idle_timeout=idle,
            client_timeout=5.0, on_messages=on_messages,
        )  # fmt: skip


@pytest.fixture
async def legs() -> AsyncIterator[Legs]:
    loop = asyncio.get_running_loop()
    pairs = [socket.socketpair() for _ in range(2)]
    transports = []
    for ours, _ in pairs:
        transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
        transports.append(transport)
    client = await asyncio.open_connection(sock=pairs[0][1])
    engine = await asyncio.open_connection(sock=pairs[1][1])
    yield Legs(client, engine, (transports[0], transports[1]))
    for _, writer in (client, engine):
        writer.close()
    for transport in transports:
        transport.abort()


def _frames(client: bool, *texts: str) -> bytes:
    writer = FrameProtocol(client=client, extensions=[])
    return b"".join(writer.send_data(text, fin=True) for text in texts)


async def test_bytes_pass_both_ways_and_messages_are_told_after(legs: Legs) -> None:
    tunnel = legs.tunnel()
    tunnel.start(b"", _frames(False, "hello"))  # the engine's first message came with its 101
    up = _frames(True, "a", "bb")
    legs.client[1].write(up)
    assert await asyncio.wait_for(legs.client[0].readexactly(7), 5) == _frames(False, "hello")
    assert await asyncio.wait_for(legs.engine[0].readexactly(len(up)), 5) == up
    down = _frames(False, "ccc")
    legs.engine[1].write(down)
    assert await asyncio.wait_for(legs.client[0].readexactly(len(down)), 5) == down
    assert [(side, m.payload) for side, m in legs.told] == [
        (ENGINE, b"hello"), (CLIENT, b"a"), (CLIENT, b"bb"), (ENGINE, b"ccc"),
    ]  # fmt: skip
    assert tunnel.bytes == [len(up), 7 + len(down)]


async def test_a_message_over_the_limit_ends_it_with_1009_both_ways(legs: Legs) -> None:
    tunnel = legs.tunnel(limit=100)
    tunnel.start(b"", b"")
    first = _frames(True, "ok")
    legs.client[1].write(first + _frames(True, "x" * 200))
    assert await asyncio.wait_for(tunnel.ended, 5) is Ending.TOO_LARGE
    engine_got = await asyncio.wait_for(legs.engine[0].read(), 5)
    assert engine_got.startswith(first)  # the message before it passed
    reader = FrameReader(1000, 1000)
    reader.feed(engine_got[len(first) :])
    (close,) = reader.messages
    assert close.opcode == OP_CLOSE and close_code(close.payload) == 1009
    client_got = await asyncio.wait_for(legs.client[0].read(), 5)
    assert client_got[0] == 0x88 and int.from_bytes(client_got[2:4], "big") == 1009


async def test_an_idle_tunnel_ends_with_1001(legs: Legs) -> None:
    tunnel = legs.tunnel(idle=0.2)
    tunnel.start(b"", b"")
    legs.client[1].write(_frames(True, "one"))  # activity puts the end off
    assert await asyncio.wait_for(tunnel.ended, 5) is Ending.IDLE
    client_got = await asyncio.wait_for(legs.client[0].read(), 5)
    assert int.from_bytes(client_got[2:4], "big") == 1001


@pytest.mark.parametrize(("side", "ending"), [(0, Ending.CLIENT_CLOSED), (1, Ending.ENGINE_CLOSED)])
async def test_one_leg_closing_closes_the_other(legs: Legs, side: int, ending: Ending) -> None:
    tunnel = legs.tunnel()
    tunnel.start(b"", b"")
    ends = (legs.client, legs.engine)
    last = _frames(side == 0, "last")
    ends[side][1].write(last)
    ends[side][1].close()
    assert await asyncio.wait_for(tunnel.ended, 5) is ending
    other = ends[1 - side][0]
    got = await asyncio.wait_for(other.read(), 5)  # what was sent first, then the close
    assert got == last


async def test_an_observer_that_fails_leaves_the_bytes_alone(legs: Legs) -> None:
    tunnel = legs.tunnel(fail=True)
    tunnel.start(b"", b"")
    up = _frames(True, "a", "b")
    legs.client[1].write(up)
    legs.client[1].write(up)
    assert await asyncio.wait_for(legs.engine[0].readexactly(2 * len(up)), 5) == up + up
    assert not tunnel.ended.done()


async def test_close_ends_it_going_away(legs: Legs) -> None:
    tunnel = legs.tunnel()
    tunnel.start(b"", b"")
    tunnel.close()
    assert tunnel.ended.result() is Ending.CLOSED
    got = await asyncio.wait_for(legs.engine[0].read(), 5)
    assert got[0] == 0x88 and got[1] & 0x80  # masked, as a client's must be
    assert int.from_bytes(got[6:8], "big") == 1001  # (a zero mask: the code as it is)
