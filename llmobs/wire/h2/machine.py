"""The ``h2`` connection state machine, as a proxy needs it after a GOAWAY it received.

``h2`` (4.x) closes its connection state on receiving GOAWAY (python-hyper/h2#1181): any frame
after it, a PING or the DATA of a stream the peer is still finishing, raises. RFC 9113 6.8
says the streams at or below the GOAWAY's last stream id go on to their end (a graceful
drain: grpcio's ``server.stop(grace)``, a gateway's rollout), so the state stays open after a
GOAWAY received; the connection's owner takes no new stream on it (``usable``), and closes it
once its streams have ended.
"""

from __future__ import annotations

import h2.connection
from h2.connection import ConnectionInputs, ConnectionState, H2ConnectionStateMachine


class DrainingStateMachine(H2ConnectionStateMachine):
    """``h2``'s transitions, but for a GOAWAY received while open: the state stays open."""

    _transitions = {  # noqa: RUF012 - h2's own attribute, as h2 declares it
        **H2ConnectionStateMachine._transitions,
        (ConnectionState.CLIENT_OPEN, ConnectionInputs.RECV_GOAWAY): (
            None, ConnectionState.CLIENT_OPEN,
        ),
        (ConnectionState.SERVER_OPEN, ConnectionInputs.RECV_GOAWAY): (
            None, ConnectionState.SERVER_OPEN,
        ),
    }  # fmt: skip


def draining(conn: h2.connection.H2Connection) -> h2.connection.H2Connection:
    """``conn``, whose streams may end after a GOAWAY it receives."""
    conn.state_machine = DrainingStateMachine()
    return conn
