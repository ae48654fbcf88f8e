"""HTTP/2 on the client leg, over the ``h2`` package's state machine (the frames, HPACK, flow
control and the protocol's rules are its; the streams' requests, their limits and the
connection's defences are ours): each stream is a request the relay handles as one over
HTTP/1.1 (``stream.H2Stream``), the engine leg staying HTTP/1.1."""

from llmobs.wire.h2.connection import PREFACE, H2ServerConnection
from llmobs.wire.h2.stream import H2Stream

__all__ = ["PREFACE", "H2ServerConnection", "H2Stream"]
