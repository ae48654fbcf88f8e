"""The roles of disaggregated prefill and decode, the join of a user's request with its legs,
and its TTFT in the phases of two pods (``observe.disagg``): pure, times passed in."""

from __future__ import annotations

from typing import Any

import pytest

from llmobs.observe.dialects.request import parse_request
from llmobs.observe.disagg import (
    LEGS,
    MAX_WAITING,
    Claim,
    Leg,
    PdJoin,
    PdRequest,
    PdRole,
    PdSettings,
    Position,
    claim_of,
    confirmed,
    context_key,
    has_prefiller,
    leg_phases,
    pd_request,
    role_of,
    split_disaggregated,
)
from llmobs.observe.phases import Phase, TtftPhases

MS = 1_000_000
TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{SPAN}-01"
DECODE = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [1, 2]}


@pytest.mark.parametrize(
    ("params", "claim"),
    [
        ({"do_remote_decode": True, "do_remote_prefill": False}, Claim.PREFILL),
        (DECODE, Claim.DECODE),
        ({**DECODE, "remote_block_ids": [[1], [2]]}, Claim.DECODE),  # per KV cache group
        (None, Claim.NONE),
        ("do_remote_decode", Claim.NONE),
        ([{"do_remote_decode": True}], Claim.NONE),
        ({"do_remote_decode": "true"}, Claim.NONE),  # a string is no bool
        ({"do_remote_decode": 1}, Claim.NONE),
        ({"do_remote_decode": False}, Claim.NONE),
        ({**DECODE, "do_remote_prefill": "yes"}, Claim.NONE),
        ({**DECODE, "remote_engine_id": 7}, Claim.NONE),
        ({**DECODE, "remote_block_ids": 5}, Claim.NONE),
        ({**DECODE, "remote_block_ids": None}, Claim.NONE),
        ({"do_remote_prefill": True}, Claim.NONE),
    ],
)
def test_a_claim_is_believed_only_in_vllms_shape(params: Any, claim: Claim) -> None:
    assert claim_of(params) is claim


def test_a_body_too_large_to_parse_still_shows_its_claim() -> None:
    filler = b'{"role":"user","content":"' + b"x" * (2 << 20) + b'"}'
    prefill = b'{"kv_transfer_params":{"do_remote_decode": true},"messages":[' + filler + b"]}"
    decode = (b'{"messages":[' + filler + b'],"kv_transfer_params":{"do_remote_prefill":true,'
              b'"remote_engine_id":"e","remote_block_ids":[1]}}')  # fmt: skip
    assert parse_request(prefill).claim is Claim.PREFILL
    assert parse_request(decode).claim is Claim.DECODE
    assert parse_request(b'{"messages":[' + filler + b"]}").claim is Claim.NONE
    assert parse_request(b'{"kv_transfer_params":{"do_remote_decode":true}}').claim is Claim.PREFILL
    assert parse_request(b'{"kv_transfer_params":"x"}').claim is Claim.NONE


def test_roles_by_where_a_request_arrived_and_what_it_carries() -> None:
    entry, decode = Position.ENTRY, Position.DECODE
    assert role_of(entry, False, Claim.NONE) is PdRole.WHOLE
    assert role_of(entry, True, Claim.NONE) is PdRole.DISAGGREGATED
    assert role_of(entry, False, Claim.PREFILL) is PdRole.PREFILL_LEG
    assert role_of(entry, True, Claim.PREFILL) is PdRole.PREFILL_LEG  # a leg keeps headers
    assert role_of(entry, False, Claim.DECODE) is PdRole.DECODE_LEG
    assert role_of(decode, True, Claim.DECODE) is PdRole.DECODE_LEG
    assert role_of(decode, False, Claim.NONE) is PdRole.LOCAL_LEG  # counted at the entry
    assert role_of(decode, True, Claim.PREFILL) is PdRole.LOCAL_LEG
    assert {PdRole.PREFILL_LEG, PdRole.DECODE_LEG, PdRole.LOCAL_LEG} == LEGS


def test_a_prefill_claim_its_engine_did_not_answer_as_one_is_a_users_request() -> None:
    assert confirmed(PdRole.PREFILL_LEG, 200, True) is PdRole.PREFILL_LEG
    assert confirmed(PdRole.PREFILL_LEG, 200, False) is PdRole.WHOLE  # no P/D engine
    assert confirmed(PdRole.PREFILL_LEG, 299, False) is PdRole.WHOLE
    assert confirmed(PdRole.PREFILL_LEG, 300, False) is PdRole.PREFILL_LEG
    assert confirmed(PdRole.PREFILL_LEG, 199, False) is PdRole.PREFILL_LEG
    assert confirmed(PdRole.PREFILL_LEG, 503, False) is PdRole.PREFILL_LEG  # a failed leg
    assert confirmed(PdRole.DECODE_LEG, 200, False) is PdRole.DECODE_LEG


def test_the_prefiller_header_in_either_of_llm_ds_names() -> None:
    assert has_prefiller({"x-prefiller-host-port": "10.0.0.1:8000"})
    assert has_prefiller({"x-prefiller-url": "http://10.0.0.1:8000"})
    assert not has_prefiller({"x-prefiller-host-port": "  "})
    assert not has_prefiller({})


@pytest.mark.parametrize(
    "value",
    [None, "", "00-" + "0" * 32 + f"-{SPAN}-01", f"00-{TRACE}-" + "0" * 16 + "-01",
     f"00-{TRACE}-{SPAN}-1", f"00-{TRACE}-{SPAN}-01x", f"00-{TRACE[:-1]}g-{SPAN}-01",
     f"00_{TRACE}-{SPAN}-01", "x" * 55, "00-" + "a" * 10_000],
)  # fmt: skip
def test_a_malformed_traceparent_joins_nothing(value: str | None) -> None:
    assert context_key(value) is None


def test_a_traceparent_gives_its_trace_and_parent() -> None:
    assert context_key(TRACEPARENT) == (TRACE, SPAN)
    assert context_key(TRACEPARENT.upper()) == (TRACE, SPAN)


def test_the_join_hands_each_leg_to_its_waiting_request_once() -> None:
    join = PdJoin()
    join.wait((TRACE, SPAN))
    assert len(join) == 1
    decode = join.post((TRACE, SPAN), PdRole.DECODE_LEG, 5)
    prefill = join.post((TRACE, SPAN), PdRole.PREFILL_LEG, 1)
    prefill.queue_s = 0.25
    assert join.take((TRACE, SPAN)) == (prefill, decode)
    assert (join.joined, join.missing, join.orphaned, len(join)) == (1, 0, 0, 0)
    assert join.take((TRACE, SPAN)) == (None, None)  # taken once
    assert (join.joined, join.missing) == (1, 1)
    assert decode.arrived_ns == 5 and decode.role is PdRole.DECODE_LEG
    assert prefill.role is PdRole.PREFILL_LEG and prefill.arrived_ns == 1


def test_a_prefill_leg_alone_is_no_join() -> None:
    join = PdJoin()
    join.wait((TRACE, SPAN))
    join.post((TRACE, SPAN), PdRole.PREFILL_LEG, 1)
    prefill, decode = join.take((TRACE, SPAN))
    assert prefill is not None and decode is None
    assert (join.joined, join.missing) == (0, 1)


def test_a_leg_no_request_waits_for_is_an_orphan_kept_nowhere() -> None:
    join = PdJoin()
    for i in range(10_000):  # a client's legs under contexts of its own: none held
        join.post((TRACE, f"{i:016x}"), PdRole.DECODE_LEG, i)
    assert (len(join), join.orphaned) == (0, 10_000)
    join.wait((TRACE, SPAN))  # a real request, its leg still found
    join.post((TRACE, SPAN), PdRole.DECODE_LEG, 1)
    assert join.take((TRACE, SPAN))[1] is not None and join.joined == 1


def test_the_join_holds_no_more_than_its_capacity_of_requests() -> None:
    join = PdJoin(capacity=2)
    for i in range(3):
        join.wait((TRACE, f"{i + 1:016x}"))
    assert len(join) == 2
    join.post((TRACE, f"{3:016x}"), PdRole.DECODE_LEG, 1)  # its request was not let wait
    assert join.orphaned == 1 and join.take((TRACE, f"{3:016x}")) == (None, None)
    join.discard((TRACE, f"{1:016x}"))
    join.discard((TRACE, f"{1:016x}"))  # idempotent, and counts nothing
    assert len(join) == 1 and (join.joined, join.missing) == (0, 1)
    assert MAX_WAITING == 65_536 and PdJoin().capacity == MAX_WAITING


def test_the_same_role_twice_keeps_the_later_leg() -> None:
    join = PdJoin()
    join.wait((TRACE, SPAN))
    join.post((TRACE, SPAN), PdRole.DECODE_LEG, 1)
    later = join.post((TRACE, SPAN), PdRole.DECODE_LEG, 2)
    assert join.orphaned == 1
    assert join.take((TRACE, SPAN))[1] is later


def reported(queue_s: float | None, prefill_s: float | None) -> Leg:
    leg = Leg(PdRole.PREFILL_LEG, 0)
    leg.queue_s, leg.prefill_s = queue_s, prefill_s
    return leg


def test_a_disaggregated_ttft_splits_across_both_pods_exactly() -> None:
    phases = split_disaggregated(500 * MS, 3 * MS, 300 * MS, reported(0.1, 0.15), 0.08, 0.02)
    assert phases == TtftPhases(
        3 * MS, None, 100 * MS, 150 * MS, 97 * MS, 50 * MS, 80 * MS, 20 * MS
    )
    assert sum(ns for _, ns in phases.present()) == 500 * MS
    assert [p for p, _ in phases.present()] == [
        Phase.BEFORE_ENGINE, Phase.QUEUE, Phase.PREFILL, Phase.REMOTE_PREFILL,
        Phase.KV_TRANSFER, Phase.FIRST_DECODE, Phase.OTHER,
    ]  # fmt: skip
    assert phases.reported == (Phase.QUEUE, Phase.PREFILL, Phase.KV_TRANSFER, Phase.FIRST_DECODE)
    assert phases.largest() is Phase.PREFILL


def test_without_its_legs_seen_here_only_what_the_stream_reports_is_split() -> None:
    # the entry alone: the decode engine's report came through the stream
    phases = split_disaggregated(500 * MS, 3 * MS, None, None, 0.2, 0.02)
    assert phases == TtftPhases(3 * MS, None, None, None, 277 * MS, None, 200 * MS, 20 * MS)
    # the decode leg seen, the prefill leg not (another pod's): the gap is remote_prefill
    phases = split_disaggregated(500 * MS, 3 * MS, 300 * MS, None, None, None)
    assert phases == TtftPhases(3 * MS, None, None, None, 197 * MS, 300 * MS, None, None)
    assert phases.largest() is Phase.REMOTE_PREFILL and phases.reported == ()
    # its prefill leg seen, its engine reporting nothing
    phases = split_disaggregated(500 * MS, 3 * MS, 300 * MS, reported(None, None))
    assert phases == TtftPhases(3 * MS, None, None, None, 197 * MS, 300 * MS, None, None)


def test_each_part_is_cut_to_what_is_left_and_none_is_negative() -> None:
    # clocks of two machines, rounding: reports longer than what was measured
    phases = split_disaggregated(100 * MS, 10 * MS, 80 * MS, reported(0.05, 0.05), 0.05, 0.05)
    assert phases == TtftPhases(10 * MS, None, 50 * MS, 30 * MS, 0, 0, 10 * MS, 0)
    phases = split_disaggregated(100 * MS, 200 * MS, 5 * MS, reported(1.0, 1.0), 1.0, 1.0)
    assert phases == TtftPhases(100 * MS, None, 0, 0, 0, 0, 0, 0)
    phases = split_disaggregated(-5, -5, -5, reported(-1.0, -1.0), -1.0, -1.0)
    assert phases == TtftPhases(0, None, 0, 0, 0, 0, 0, 0)
    phases = split_disaggregated(100 * MS, 0, 150 * MS)
    assert phases == TtftPhases(0, None, None, None, 0, 100 * MS, None, None)
    phases = split_disaggregated(100 * MS, 0, None, None, 0.0123456789)
    assert phases.kv_transfer_ns == 12_345_679 and phases.other_ns == 100 * MS - 12_345_679


def test_a_legs_own_phases() -> None:
    decode = leg_phases(100 * MS, 1 * MS, PdRole.DECODE_LEG, 0.06, 0.01)
    assert decode == TtftPhases(1 * MS, None, None, None, 29 * MS, None, 60 * MS, 10 * MS)
    prefill = leg_phases(100 * MS, 1 * MS, PdRole.PREFILL_LEG, 0.06, 0.01)
    assert prefill == TtftPhases(1 * MS, None, 60 * MS, 10 * MS, 29 * MS)
    local = leg_phases(100 * MS, 1 * MS, PdRole.LOCAL_LEG, None, None)
    assert local == TtftPhases(1 * MS, None, None, None, 99 * MS)
    assert leg_phases(10 * MS, 20 * MS, PdRole.DECODE_LEG, 1.0, 1.0) == TtftPhases(
        10 * MS, None, None, None, 0, None, 0, 0)  # fmt: skip
    assert leg_phases(-1, -1, PdRole.PREFILL_LEG, None, None) == TtftPhases(0, None, None, None, 0)


def ids_from(*values: int) -> Any:
    it = iter(values)
    return lambda: next(it)


def test_an_untraced_users_request_is_given_a_context_its_legs_bring_back() -> None:
    join = PdJoin()
    settings = PdSettings(Position.ENTRY, True, join, ids_from(0xAB, 0xCD, 0xEF), claims=False)
    request = pd_request(settings, True, None, 0)
    assert request is not None and request.role is PdRole.DISAGGREGATED
    carrier: dict[str, str] = {}
    request.inject(carrier)
    trace, span = f"{0xAB:016x}{0xCD:016x}", f"{0xEF:016x}"
    assert carrier == {"traceparent": f"00-{trace}-{span}-00"}
    assert request.key == (trace, span)


def test_an_untraced_users_request_continues_its_clients_trace() -> None:
    settings = PdSettings(Position.ENTRY, True, PdJoin(), ids_from(0), claims=False)
    request = pd_request(settings, True, TRACEPARENT, 0)
    assert request is not None
    carrier: dict[str, str] = {}
    request.inject(carrier)
    assert carrier == {"traceparent": f"00-{TRACE}-{1:016x}-01"}  # a span id is never 0


def test_a_traced_users_request_is_joined_by_its_own_spans_context() -> None:
    settings = PdSettings(Position.ENTRY, True, PdJoin(), ids_from(), claims=False)
    request = pd_request(settings, True, TRACEPARENT, 0)
    assert request is not None
    carrier = {"traceparent": f"00-{TRACE}-{'1' * 16}-01"}  # tracing injected its span
    request.inject(carrier)
    assert request.key == (TRACE, "1" * 16) and carrier["traceparent"].endswith("-01")


def test_no_context_is_added_where_no_leg_can_be_joined() -> None:
    for settings in (
        PdSettings(Position.ENTRY, True, None, ids_from()),  # one listener: nothing to join
    ):
        request = pd_request(settings, True, None, 0)
        assert request is not None
        carrier: dict[str, str] = {}
        request.inject(carrier)
        assert carrier == {} and request.key is None
    whole = PdRequest(PdSettings(Position.ENTRY, True, PdJoin(), ids_from()), False, None, 0)
    carrier = {}
    whole.inject(carrier)
    assert carrier == {}


def test_requests_without_a_part_cost_nothing() -> None:
    entry = PdSettings(Position.ENTRY, True, PdJoin())
    assert pd_request(None, True, None, 0) is None
    assert pd_request(PdSettings(Position.DECODE, False), True, None, 0) is None  # off
    assert pd_request(entry, False, TRACEPARENT, 0) is None
    leg = pd_request(entry, False, TRACEPARENT, 0, Claim.PREFILL)
    assert leg is not None and leg.role is PdRole.PREFILL_LEG and leg.key == (TRACE, SPAN)
    behind = pd_request(PdSettings(Position.DECODE, True, PdJoin()), False, TRACEPARENT, 0)
    assert behind is not None and behind.role is PdRole.LOCAL_LEG and behind.key == (TRACE, SPAN)


def test_a_decode_leg_and_a_prefill_leg_meet_their_users_request() -> None:
    join = PdJoin()
    door = PdSettings(Position.ENTRY, True, join, ids_from(1, 2, 3), claims=False)
    entry = PdSettings(Position.ENTRY, True, join)  # the prefill engine's listener
    user = pd_request(door, True, None, 0)
    assert user is not None
    carrier: dict[str, str] = {}
    user.inject(carrier)
    assert len(join) == 1  # it waits for its legs from the moment it goes upstream
    sent = carrier["traceparent"]
    prefill = pd_request(entry, False, sent, 12 * MS, Claim.PREFILL)
    assert prefill is not None
    prefill.forwarded()  # a prefill leg joins at its end, confirmed
    prefill.finished(200, True, 0.005, 0.02)
    behind = PdSettings(Position.DECODE, True, join)
    decode = pd_request(behind, False, sent, 50 * MS)
    assert decode is not None
    decode.claimed(Claim.DECODE)
    assert decode.role is PdRole.DECODE_LEG
    decode.forwarded()
    phases = user.phases((1 * MS, 10 * MS, 101 * MS, 200 * MS), 0.03, 0.004)
    assert phases == TtftPhases(
        9 * MS, None, 5 * MS, 20 * MS, 17 * MS, 15 * MS, 30 * MS, 4 * MS)  # fmt: skip
    assert (join.joined, join.orphaned, len(join)) == (1, 0, 0)
    user.release()  # nothing left to release
    assert (join.joined, join.missing) == (1, 0)
    # the decode leg's own: arrival 50, forwarded 51, first token 90
    own = decode.phases((50 * MS, 51 * MS, 90 * MS, 190 * MS), 0.03, 0.004)
    assert own == TtftPhases(1 * MS, None, None, None, 5 * MS, None, 30 * MS, 4 * MS)
    # the prefill leg's own: its whole answer (no first token: not streamed)
    own = prefill.phases((12 * MS, 13 * MS, None, 40 * MS), 0.005, 0.02)
    assert own == TtftPhases(1 * MS, None, 5 * MS, 20 * MS, 2 * MS)


def test_a_prefill_claim_its_engine_ignored_joins_nothing() -> None:
    join = PdJoin()
    join.wait((TRACE, SPAN))
    entry = PdSettings(Position.ENTRY, True, join)
    claimed = pd_request(entry, False, TRACEPARENT, 0, Claim.PREFILL)
    assert claimed is not None
    claimed.finished(200, False, None, None)
    assert claimed.role is PdRole.WHOLE and join.take((TRACE, SPAN)) == (None, None)
    assert claimed.phases((0, 1, 5, 10), None, None) == TtftPhases(
        1, None, None, None, 4, None, None, None)  # fmt: skip
    assert claimed.phases((0, 1, None, 10), None, None) is None  # no first token


def test_a_users_request_whose_decode_leg_never_came() -> None:
    join = PdJoin()
    user = pd_request(
        PdSettings(Position.ENTRY, True, join, ids_from(1, 2, 3), claims=False), True, None, 0
    )
    assert user is not None
    user.inject({})
    phases = user.phases((0, 1 * MS, 50 * MS, 60 * MS), None, None)
    assert phases == TtftPhases(1 * MS, None, None, None, 49 * MS, None, None, None)
    assert (join.joined, join.missing, len(join)) == (0, 1, 0)


def test_a_users_request_whose_end_failed_waits_no_longer() -> None:
    join = PdJoin()
    user = pd_request(
        PdSettings(Position.ENTRY, True, join, ids_from(1, 2, 3), claims=False), True, None, 0
    )
    assert user is not None
    user.inject({})
    assert len(join) == 1
    user.release()  # (its phases never asked for: what took them failed)
    user.release()
    assert (len(join), join.joined, join.missing) == (0, 0, 0)
    assert user.phases((0, 1, 5, 6), None, None) is not None and join.missing == 0


def test_where_claims_are_not_believed_a_body_makes_no_leg() -> None:
    door = PdSettings(Position.ENTRY, True, PdJoin(), ids_from(1), claims=False)
    assert pd_request(door, False, TRACEPARENT, 0, Claim.PREFILL) is None  # a user's, whole
    assert pd_request(door, False, TRACEPARENT, 0, Claim.DECODE) is None
    user = pd_request(door, True, TRACEPARENT, 0, Claim.PREFILL)
    assert user is not None and user.role is PdRole.DISAGGREGATED
    user.claimed(Claim.DECODE)
    assert user.role is PdRole.DISAGGREGATED and not user.leg
    assert PdSettings().claims


def test_the_counts_add_up_over_many() -> None:
    join = PdJoin()
    join.wait((TRACE, SPAN))
    for _ in range(3):
        join.post((TRACE, SPAN), PdRole.DECODE_LEG, 1)  # the same role thrice: 2 orphans
    for i in range(2):
        join.wait((TRACE, f"{i + 1:016x}"))
        join.post((TRACE, f"{i + 1:016x}"), PdRole.DECODE_LEG, 1)
        join.take((TRACE, f"{i + 1:016x}"))
        join.take((TRACE, f"{i + 1:016x}"))
    assert (join.joined, join.missing, join.orphaned) == (2, 2, 2)
    leg = Leg(PdRole.PREFILL_LEG, 1)
    assert leg.queue_s is None and leg.prefill_s is None
    assert PdSettings().on and PdSettings().position is Position.ENTRY


def test_zero_is_zero_and_seconds_are_whole_nanoseconds() -> None:
    assert split_disaggregated(100 * MS, 0, 0).remote_prefill_ns == 0
    assert split_disaggregated(100 * MS, 0, None, None, 0.0).kv_transfer_ns == 0
    assert split_disaggregated(2 * 10**9, 0, None, None, 1.5).kv_transfer_ns == 1_500_000_000
    assert leg_phases(100 * MS, 0, PdRole.DECODE_LEG, None, None).before_engine_ns == 0


def test_a_role_claimed_later_keeps_where_it_arrived() -> None:
    behind = PdSettings(Position.DECODE, True, PdJoin())
    request = PdRequest(behind, False, TRACEPARENT, 0)
    request.claimed(Claim.PREFILL)  # behind the routing sidecar a prefill claim is no leg's
    assert request.role is PdRole.LOCAL_LEG
    user = PdRequest(PdSettings(Position.ENTRY, True, PdJoin()), True, TRACEPARENT, 0)
    assert user.key is None  # a user's request: the context it forwards, once it does
    user.claimed(Claim.NONE)
    assert user.role is PdRole.DISAGGREGATED and user.key is None
    join = PdJoin()
    decode = PdRequest(PdSettings(Position.ENTRY, True, join), False, TRACEPARENT, 0)
    decode.claimed(Claim.DECODE)  # a decode leg at an entry: none of this process's users'
    decode.forwarded()
    assert decode.role is PdRole.DECODE_LEG and decode.key is None and join.orphaned == 0


def test_a_context_made_for_a_request_keeps_its_clients_flags_as_w3c_writes_them() -> None:
    settings = PdSettings(Position.ENTRY, True, PdJoin(), ids_from(5), claims=False)
    upper = pd_request(settings, True, f"00-{TRACE.upper()}-{SPAN}-0A", 0)
    assert upper is not None
    carrier: dict[str, str] = {}
    upper.inject(carrier)
    assert carrier["traceparent"] == f"00-{TRACE}-{5:016x}-0a"
    settings = PdSettings(Position.ENTRY, True, PdJoin(), ids_from(1, 2, 3), claims=False)
    garbage = pd_request(settings, True, "x" * 54 + "01", 0)
    assert garbage is not None
    carrier = {}
    garbage.inject(carrier)
    assert carrier["traceparent"] == f"00-{1:016x}{2:016x}-{3:016x}-00"


def test_a_users_request_with_nothing_to_join_still_splits() -> None:
    alone = PdRequest(PdSettings(Position.ENTRY, True, None), True, None, 0)
    phases = alone.phases((5 * MS, 6 * MS, 15 * MS, 20 * MS), 0.002, None)
    assert phases == TtftPhases(1 * MS, None, None, None, 7 * MS, None, 2 * MS, None)
    join = PdJoin()
    unsent = PdRequest(PdSettings(Position.ENTRY, True, join), True, None, 0)  # never injected
    assert unsent.phases((5, 6, 15, 20), None, None) == TtftPhases(
        1, None, None, None, 9, None, None, None)  # fmt: skip
    assert join.missing == 0
    # forwarded never (an error before it went upstream): nothing before the engine
    assert unsent.phases((5, None, 15, 20), None, None) == TtftPhases(
        0, None, None, None, 10, None, None, None)  # fmt: skip


def test_a_prefill_legs_arrival_reaches_its_users_request() -> None:
    join = PdJoin()
    leg = pd_request(PdSettings(Position.ENTRY, True, join), False, TRACEPARENT, 7, Claim.PREFILL)
    assert leg is not None
    join.wait((TRACE, SPAN))
    leg.finished(200, True, None, None)
    prefill, _ = join.take((TRACE, SPAN))
    assert prefill is not None and prefill.arrived_ns == 7
    assert prefill.role is PdRole.PREFILL_LEG
    own = leg.phases((7, None, None, 9), None, None)
    assert own == TtftPhases(0, None, None, None, 2)


def test_where_bodies_are_believed_a_request_waits_for_no_legs() -> None:
    """A prefill leg whose router copied the prefiller header onto it looks like a user's
    request until its body is read, after its context went upstream: only a decode pod's
    entry, where no body is believed, gives contexts and waits."""
    join = PdJoin()
    listener = PdSettings(Position.ENTRY, True, join, ids_from(1, 2, 3))
    request = pd_request(listener, True, TRACEPARENT, 0)
    assert request is not None and request.role is PdRole.DISAGGREGATED
    carrier: dict[str, str] = {}
    request.inject(carrier)
    assert carrier == {} and len(join) == 0
    request.claimed(Claim.PREFILL)
    request.release()
    assert request.leg and len(join) == 0


def test_a_legs_end_never_drops_its_users_request() -> None:
    join = PdJoin()
    door = PdSettings(Position.ENTRY, True, join, ids_from(1, 2, 3), claims=False)
    user = pd_request(door, True, None, 0)
    assert user is not None
    carrier: dict[str, str] = {}
    user.inject(carrier)
    decode = pd_request(PdSettings(Position.DECODE, True, join), False, carrier["traceparent"], 5)
    assert decode is not None
    decode.claimed(Claim.DECODE)
    decode.forwarded()
    assert decode.phases((5, 6, 9, 20), None, None) is not None
    decode.release()  # a leg waits for nothing: its end leaves its request's slot alone
    assert user.key is not None
    prefill, found = join.take(user.key)
    assert prefill is None and found is not None and join.joined == 1
    assert found.role is PdRole.DECODE_LEG and found.arrived_ns == 5


def test_a_whole_request_at_a_decode_pods_entry_adds_no_context() -> None:
    door = PdSettings(Position.ENTRY, True, PdJoin(), ids_from(1, 2, 3), claims=False)
    whole = PdRequest(door, False, None, 0)
    carrier: dict[str, str] = {}
    whole.inject(carrier)
    assert carrier == {} and whole.key is None and whole.role is PdRole.WHOLE
