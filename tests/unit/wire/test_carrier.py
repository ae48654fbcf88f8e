"""A client connection's state as its request's response moves it (``wire/carrier.py``): what
a response head may promise, an end written once, the writing paused and resumed, an illegal
step reported and the connection closed. Against a fake transport: the live connection is
``tests/unit/wire/server/``'s."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from llmobs.wire.carrier import Carrier
from llmobs.wire.states import ClientState, WriteEvent, WriteState

C = ClientState


class _Transport:
    """What a ``Carrier`` does to its transport: closes it, or aborts it."""

    def __init__(self) -> None:
        self.closed = self.aborted = False

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


def _carrier(state: ClientState) -> tuple[Carrier, _Transport]:
    carrier, transport = Carrier(), _Transport()
    carrier.transport = transport  # type: ignore[assignment]
    carrier.state = state
    return carrier, transport


@pytest.mark.parametrize(
    ("state", "wish", "keeps", "after"),
    [
        (C.HANDLING, True, True, C.SENDING),
        (C.HANDLING, False, False, C.SENDING_LAST),  # the client asked, or its framing
        (C.HANDLING_LAST, True, False, C.SENDING_LAST),  # a shutdown came
        (C.RECEIVING, True, False, C.RECEIVING_SENDING),  # the body still coming
        (C.REFUSED, True, False, C.REFUSED_SENDING),
        (C.CLOSING, True, False, C.CLOSING),  # the client went away
    ],
)
def test_what_a_response_head_may_promise_is_the_states(
    state: ClientState, wish: bool, keeps: bool, after: ClientState
) -> None:
    carrier, transport = _carrier(state)
    assert carrier.began(wish) is keeps
    assert carrier.state is after
    assert not transport.aborted


@pytest.mark.parametrize(
    ("state", "after"),
    [
        (C.SENDING, C.SENT),
        (C.SENDING_LAST, C.SENT_LAST),
        (C.RECEIVING_SENDING, C.RECEIVING_SENT),
        (C.REFUSED_SENDING, C.REFUSED_SENT),
    ],
)
def test_a_response_ends_once(state: ClientState, after: ClientState) -> None:
    """The end is written once: a second ``ending`` (the relay wrote the last chunk, then
    the handler ends the response) has nothing to write and moves nothing."""
    carrier, transport = _carrier(state)
    assert carrier.ending()
    assert carrier.state is after
    assert not carrier.ending()
    assert (carrier.state, transport.aborted) == (after, False)


@pytest.mark.parametrize("state", [C.HANDLING, C.RECEIVING, C.CLOSING, C.CLOSED])
def test_nothing_ends_before_a_response_begins_or_once_closing(state: ClientState) -> None:
    carrier, _ = _carrier(state)
    assert not carrier.ending()
    assert carrier.state is state


def test_the_writing_pauses_and_resumes(illegal: Callable[[str], int]) -> None:
    """The writing's state moves in turn; a resume with nothing paused is a bug: reported,
    the connection aborted."""
    carrier, transport = _carrier(C.SENDING)
    seen = [carrier.writing]
    for event in (WriteEvent.PAUSE, WriteEvent.RESUME):
        assert carrier.flow(event)
        seen.append(carrier.writing)
    assert seen == [WriteState.FLOWING, WriteState.PAUSED, WriteState.FLOWING]
    assert illegal("client") == 0
    assert not carrier.flow(WriteEvent.RESUME)
    assert (illegal("client"), carrier.state, transport.aborted) == (1, C.CLOSING, True)


def test_an_illegal_step_closes_the_connection(illegal: Callable[[str], int]) -> None:
    """A second response head: reported once, the connection aborted, the head told to say
    close."""
    carrier, transport = _carrier(C.SENDING)
    assert not carrier.began(True)
    assert (illegal("client"), carrier.state, transport.aborted) == (1, C.CLOSING, True)


def test_close_closes_the_transport_and_moves_the_state() -> None:
    carrier, transport = _carrier(C.IDLE)
    carrier.close()
    assert (carrier.state, transport.closed, transport.aborted) == (C.CLOSING, True, False)
