"""The roles of disaggregated prefill and decode, the join of a user's request with its legs,
and its TTFT in the phases of two pods (``observe.disagg``): pure, times passed in."""

from __future__ import annotations

from typing import Any

import pytest

from llmobs.observe.dialects.request import parse_request
from llmobs.observe.disagg import (
    LEGS,
    MAX_AGE_NS,
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


def test_the_join_hands_each_leg_to_its_users_request_once() -> None:
    join = PdJoin()
    decode = join.post((TRACE, SPAN), PdRole.DECODE_LEG, 5, 10)
    prefill = join.post((TRACE, SPAN), PdRole.PREFILL_LEG, 1, 11)
    prefill.queue_s = 0.25
    assert len(join) == 2
    assert join.take((TRACE, SPAN), 12) == (prefill, decode)
    assert (join.joined, join.missing, join.orphaned, len(join)) == (1, 0, 0, 0)
    assert join.take((TRACE, SPAN), 13) == (None, None)  # taken once
    assert (join.joined, join.missing) == (1, 1)
    assert decode.arrived_ns == 5 and decode.role is PdRole.DECODE_LEG


def test_a_prefill_leg_alone_is_no_join() -> None:
    join = PdJoin()
    join.post((TRACE, SPAN), PdRole.PREFILL_LEG, 1, 1)
    prefill, decode = join.take((TRACE, SPAN), 2)
    assert prefill is not None and decode is None
    assert (join.joined, join.missing) == (0, 1)


def test_legs_nobody_takes_are_orphans_bounded_in_count_and_age() -> None:
    join = PdJoin(capacity=3, max_age_ns=100)
    for i in range(5):
        join.post((TRACE, f"{i:016x}"), PdRole.DECODE_LEG, i, i)
    assert (len(join), join.orphaned) == (3, 2)  # the oldest went
    assert join.take((TRACE, f"{0:016x}"), 5) == (None, None)
    join.post((TRACE, "f" * 16), PdRole.DECODE_LEG, 104, 104)  # 2, 3: older than 100
    assert (len(join), join.orphaned) == (2, 4)
    join.take((TRACE, "e" * 16), 204)  # 4 went; 104 is exactly max_age old: it stays
    assert (len(join), join.orphaned) == (1, 5)
    join.take((TRACE, "e" * 16), 205)
    assert (len(join), join.orphaned) == (0, 6)
    assert MAX_AGE_NS == 120 * 10**9


def test_the_same_context_twice_keeps_the_later_leg() -> None:
    join = PdJoin()
    join.post((TRACE, SPAN), PdRole.DECODE_LEG, 1, 1)
    later = join.post((TRACE, SPAN), PdRole.DECODE_LEG, 2, 2)
    assert join.orphaned == 1
    assert join.take((TRACE, SPAN), 3)[1] is later


def reported(queue_s: float | None, prefill_s: float | None) -> Leg:
    leg = Leg(PdRole.PREFILL_LEG, 0, 0)
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
    settings = PdSettings(Position.ENTRY, True, join, ids_from(0xAB, 0xCD, 0xEF))
    request = pd_request(settings, True, None, 0)
    assert request is not None and request.role is PdRole.DISAGGREGATED
    carrier: dict[str, str] = {}
    request.inject(carrier)
    trace, span = f"{0xAB:016x}{0xCD:016x}", f"{0xEF:016x}"
    assert carrier == {"traceparent": f"00-{trace}-{span}-00"}
    assert request.key == (trace, span)


def test_an_untraced_users_request_continues_its_clients_trace() -> None:
    settings = PdSettings(Position.ENTRY, True, PdJoin(), ids_from(0))
    request = pd_request(settings, True, TRACEPARENT, 0)
    assert request is not None
    carrier: dict[str, str] = {}
    request.inject(carrier)
    assert carrier == {"traceparent": f"00-{TRACE}-{1:016x}-01"}  # a span id is never 0


def test_a_traced_users_request_is_joined_by_its_own_spans_context() -> None:
    settings = PdSettings(Position.ENTRY, True, PdJoin(), ids_from())
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
    entry = PdSettings(Position.ENTRY, True, join, ids_from(1, 2, 3))
    user = pd_request(entry, True, None, 0)
    assert user is not None
    carrier: dict[str, str] = {}
    user.inject(carrier)
    sent = carrier["traceparent"]
    prefill = pd_request(entry, False, sent, 12 * MS, Claim.PREFILL)
    assert prefill is not None
    prefill.forwarded(13 * MS)  # a prefill leg posts at its end, confirmed
    assert len(join) == 0
    prefill.finished(40 * MS, 200, True, 0.005, 0.02)
    behind = PdSettings(Position.DECODE, True, join)
    decode = pd_request(behind, False, sent, 50 * MS)
    assert decode is not None
    decode.claimed(Claim.DECODE)
    assert decode.role is PdRole.DECODE_LEG
    decode.forwarded(51 * MS)
    assert len(join) == 2
    phases = user.phases((1 * MS, 10 * MS, 101 * MS, 200 * MS), 201 * MS, 0.03, 0.004)
    assert phases == TtftPhases(
        9 * MS, None, 5 * MS, 20 * MS, 17 * MS, 15 * MS, 30 * MS, 4 * MS)  # fmt: skip
    assert (join.joined, len(join)) == (1, 0)
    # the decode leg's own: arrival 50, forwarded 51, first token 90
    own = decode.phases((50 * MS, 51 * MS, 90 * MS, 190 * MS), 191 * MS, 0.03, 0.004)
    assert own == TtftPhases(1 * MS, None, None, None, 5 * MS, None, 30 * MS, 4 * MS)
    # the prefill leg's own: its whole answer (no first token: not streamed)
    own = prefill.phases((12 * MS, 13 * MS, None, 40 * MS), 41 * MS, 0.005, 0.02)
    assert own == TtftPhases(1 * MS, None, 5 * MS, 20 * MS, 2 * MS)


def test_a_prefill_claim_its_engine_ignored_posts_nothing() -> None:
    join = PdJoin()
    entry = PdSettings(Position.ENTRY, True, join)
    claimed = pd_request(entry, False, TRACEPARENT, 0, Claim.PREFILL)
    assert claimed is not None
    claimed.finished(10, 200, False, None, None)
    assert claimed.role is PdRole.WHOLE and len(join) == 0
    assert claimed.phases((0, 1, 5, 10), 11, None, None) == TtftPhases(
        1, None, None, None, 4, None, None, None)  # fmt: skip
    assert claimed.phases((0, 1, None, 10), 11, None, None) is None  # no first token


def test_a_users_request_whose_decode_leg_never_came() -> None:
    join = PdJoin()
    user = pd_request(PdSettings(Position.ENTRY, True, join, ids_from(1, 2, 3)), True, None, 0)
    assert user is not None
    user.inject({})
    phases = user.phases((0, 1 * MS, 50 * MS, 60 * MS), 61 * MS, None, None)
    assert phases == TtftPhases(1 * MS, None, None, None, 49 * MS, None, None, None)
    assert (join.joined, join.missing) == (0, 1)


def test_the_counts_add_up_over_many() -> None:
    join = PdJoin()
    for _ in range(3):
        join.post((TRACE, SPAN), PdRole.DECODE_LEG, 1, 1)  # the same context: 2 orphans
    for i in range(2):
        join.post((TRACE, f"{i + 1:016x}"), PdRole.DECODE_LEG, 1, 1)
        join.take((TRACE, f"{i + 1:016x}"), 2)
        join.take((TRACE, f"{i + 1:016x}"), 2)
    assert (join.joined, join.missing, join.orphaned) == (2, 2, 2)
    leg = Leg(PdRole.PREFILL_LEG, 1, 2)
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
    decode.forwarded(1)
    assert decode.role is PdRole.DECODE_LEG and decode.key is None and len(join) == 0


def test_a_context_made_for_a_request_keeps_its_clients_flags_as_w3c_writes_them() -> None:
    settings = PdSettings(Position.ENTRY, True, PdJoin(), ids_from(5))
    upper = pd_request(settings, True, f"00-{TRACE.upper()}-{SPAN}-0A", 0)
    assert upper is not None
    carrier: dict[str, str] = {}
    upper.inject(carrier)
    assert carrier["traceparent"] == f"00-{TRACE}-{5:016x}-0a"
    settings = PdSettings(Position.ENTRY, True, PdJoin(), ids_from(1, 2, 3))
    garbage = pd_request(settings, True, "x" * 54 + "01", 0)
    assert garbage is not None
    carrier = {}
    garbage.inject(carrier)
    assert carrier["traceparent"] == f"00-{1:016x}{2:016x}-{3:016x}-00"


def test_a_users_request_with_nothing_to_join_still_splits() -> None:
    alone = PdRequest(PdSettings(Position.ENTRY, True, None), True, None, 0)
    phases = alone.phases((5 * MS, 6 * MS, 15 * MS, 20 * MS), 21 * MS, 0.002, None)
    assert phases == TtftPhases(1 * MS, None, None, None, 7 * MS, None, 2 * MS, None)
    join = PdJoin()
    unsent = PdRequest(PdSettings(Position.ENTRY, True, join), True, None, 0)  # never injected
    assert unsent.phases((5, 6, 15, 20), 21, None, None) == TtftPhases(
        1, None, None, None, 9, None, None, None)  # fmt: skip
    assert join.missing == 0
    # forwarded never (an error before it went upstream): nothing before the engine
    assert unsent.phases((5, None, 15, 20), 21, None, None) == TtftPhases(
        0, None, None, None, 10, None, None, None)  # fmt: skip


def test_a_prefill_legs_arrival_reaches_its_users_request() -> None:
    join = PdJoin()
    leg = pd_request(PdSettings(Position.ENTRY, True, join), False, TRACEPARENT, 7, Claim.PREFILL)
    assert leg is not None
    leg.finished(9, 200, True, None, None)
    prefill, _ = join.take((TRACE, SPAN), 10)
    assert prefill is not None and prefill.arrived_ns == 7
    own = leg.phases((7, None, None, 9), 10, None, None)
    assert own == TtftPhases(0, None, None, None, 2)
