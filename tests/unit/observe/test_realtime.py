"""A realtime session's observation on a scripted schedule: its turns' first deltas and gaps
are the schedule's, to the nanosecond; how turns and sessions end; what is never read."""

from __future__ import annotations

import json

import pytest

from llmobs.observe.realtime import (
    FROM_CLIENT,
    FROM_ENGINE,
    OP_CLOSE,
    OP_TEXT,
    REALTIME,
    WEBSOCKET,
    Session,
    SessionOutcome,
    Turn,
    TurnOutcome,
    api_of,
    closed_outcome,
)

MS = 1_000_000


def _event(kind: str, **fields: object) -> bytes:
    return json.dumps({"type": kind, **fields}).encode()


def _play(session: Session, script: list[tuple[int, int, bytes]]) -> list[Turn]:
    ended = []
    for side, t_ms, payload in script:
        turn = session.message(side, t_ms * MS, OP_TEXT, payload)
        if turn is not None:
            ended.append(turn)
    return ended


def test_a_turn_is_timed_from_its_commit_to_its_deltas() -> None:
    session = Session(REALTIME, 0)
    script = [
        (FROM_ENGINE, 1, _event("session.created")),
        (FROM_CLIENT, 2, _event("session.update", model="m")),
        (FROM_CLIENT, 10, _event("input_audio_buffer.commit")),
        (FROM_CLIENT, 11, _event("input_audio_buffer.append", audio="AAAA")),
        (FROM_CLIENT, 12, _event("input_audio_buffer.commit", final=True)),  # inside the turn
        (FROM_ENGINE, 60, _event("transcription.delta", delta="a")),
        (FROM_ENGINE, 75, _event("transcription.delta", delta="b")),
        (FROM_ENGINE, 115, _event("transcription.delta", delta="c")),
        (FROM_ENGINE, 120, _event("transcription.done", text="abc")),
    ]
    (turn,) = _play(session, script)
    assert turn.first_delta_s == 0.050  # exact: nanoseconds over 1e9, correctly rounded
    assert turn.gaps_s == (0.015, 0.040)
    assert turn.outcome is TurnOutcome.DONE
    assert (turn.start_ns, turn.end_ns) == (10 * MS, 120 * MS)
    assert session.model == "m"
    record, cut = session.finish(200 * MS, SessionOutcome.OK)
    assert cut is None
    assert (record.api, record.outcome, record.model) == (REALTIME, SessionOutcome.OK, "m")
    assert (record.start_ns, record.end_ns) == (0, 200 * MS)
    assert record.turns == (turn,)
    assert record.messages == (4, 5)
    assert record.duration_s == pytest.approx(0.2)


def test_openai_realtime_events_make_turns_too() -> None:
    session = Session(REALTIME, 0)
    script = [
        (FROM_ENGINE, 1, _event("session.created", session={"model": "gpt-realtime"})),
        (FROM_CLIENT, 5, _event("response.create")),
        (FROM_ENGINE, 30, _event("response.output_audio.delta", delta="...")),
        (FROM_ENGINE, 50, _event("response.output_audio_transcript.delta", delta="hi")),
        (FROM_ENGINE, 60, _event("response.done")),
    ]
    (turn,) = _play(session, script)
    assert turn.first_delta_s == 0.025
    assert turn.gaps_s == (0.020,)
    assert session.model == "gpt-realtime"


def test_an_error_ends_a_turn_and_a_close_cuts_one() -> None:
    session = Session(REALTIME, 0, model="from-query")
    errored = _play(session, [
        (FROM_CLIENT, 1, _event("input_audio_buffer.commit")),
        (FROM_ENGINE, 9, _event("error", error="boom", code="processing_error")),
        (FROM_CLIENT, 20, _event("input_audio_buffer.commit")),
        (FROM_ENGINE, 30, _event("transcription.delta", delta="x")),
    ])  # fmt: skip
    assert [t.outcome for t in errored] == [TurnOutcome.ERROR]
    assert errored[0].first_delta_s is None
    assert (errored[0].start_ns, errored[0].end_ns) == (1 * MS, 9 * MS)
    assert session.message(FROM_CLIENT, 40 * MS, OP_CLOSE, b"\x03\xe8") is None
    record, cut = session.finish(41 * MS, SessionOutcome.OK)
    assert cut is not None and cut.outcome is TurnOutcome.CUT
    assert cut.first_delta_s == 0.010
    assert (cut.start_ns, cut.end_ns) == (20 * MS, 41 * MS)
    assert record.close_code == 1000 and record.closed_by == FROM_CLIENT
    assert record.model == "from-query"


def test_deltas_without_a_commit_start_their_own_turn() -> None:
    session = Session(REALTIME, 0)
    (turn,) = _play(session, [
        (FROM_ENGINE, 5, _event("transcription.delta", delta="x")),
        (FROM_ENGINE, 8, _event("transcription.delta", delta="y")),
        (FROM_ENGINE, 9, _event("transcription.done")),
    ])  # fmt: skip
    assert turn.first_delta_s == 0.0 and turn.gaps_s == (0.003,)


@pytest.mark.parametrize(
    "payload", [b"not json", b"[1, 2]", b'{"type": 7}', b'{"type": ["x"]}', b"\xff\xfe", None]
)
def test_what_is_not_an_event_is_counted_only(payload: bytes | None) -> None:
    session = Session(REALTIME, 0)
    assert session.message(FROM_ENGINE, 1, OP_TEXT, payload) is None
    assert session.messages == [0, 1]
    assert session.turns == []


def test_a_plain_websocket_is_not_read_for_turns() -> None:
    session = Session(WEBSOCKET, 0)
    _play(session, [
        (FROM_CLIENT, 1, _event("input_audio_buffer.commit")),
        (FROM_ENGINE, 2, _event("transcription.done")),
    ])  # fmt: skip
    record, cut = session.finish(3, SessionOutcome.OK)
    assert record.turns == () and cut is None


@pytest.mark.parametrize("model", [b'"\\ud800"', b"5", b'""', b"[]"])
def test_a_model_name_that_is_not_one_is_not_kept(model: bytes) -> None:
    session = Session(REALTIME, 0)
    session.message(FROM_CLIENT, 1, OP_TEXT, b'{"type": "session.update", "model": ' + model + b"}")
    assert session.model is None


@pytest.mark.parametrize(
    ("payload", "code"),
    [(b"", 1005), (None, 1005), (b"\x03", 1005), (b"\x0f\xa0", 4000), (b"\x03\xf1bye", 1009)],
)
def test_the_first_close_frame_and_its_code(payload: bytes | None, code: int) -> None:
    session = Session(WEBSOCKET, 0)
    session.message(FROM_ENGINE, 1, OP_CLOSE, payload)
    session.message(FROM_CLIENT, 2, OP_CLOSE, b"\x03\xe8")  # the reply: not the first
    record, _ = session.finish(3, SessionOutcome.OK)
    assert (record.close_code, record.closed_by) == (code, FROM_ENGINE)


@pytest.mark.parametrize(
    ("engine_ended", "close", "outcome"),
    [
        (False, None, SessionOutcome.CLIENT_DISCONNECT),
        (True, None, SessionOutcome.UPSTREAM_ERROR),
        (False, (FROM_CLIENT, 1000), SessionOutcome.OK),
        (True, (FROM_CLIENT, 4000), SessionOutcome.OK),
        (True, (FROM_ENGINE, 1000), SessionOutcome.OK),
        (True, (FROM_ENGINE, 1001), SessionOutcome.OK),
        (True, (FROM_ENGINE, 1011), SessionOutcome.UPSTREAM_ERROR),
        (False, (FROM_ENGINE, 1005), SessionOutcome.OK),
    ],
)
def test_how_a_closed_session_ended(
    engine_ended: bool, close: tuple[int, int] | None, outcome: SessionOutcome
) -> None:
    assert closed_outcome(engine_ended, close) is outcome


def test_the_api_of_a_path() -> None:
    assert api_of("/v1/realtime") == REALTIME
    assert api_of("/openai/v1/realtime/") == REALTIME
    assert api_of("/ws") == WEBSOCKET
    assert api_of("/v1/realtimex") == WEBSOCKET
    assert api_of("/v1/realtimeX") == WEBSOCKET
