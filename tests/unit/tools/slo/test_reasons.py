"""``llmobs why``'s arithmetic: samples of the sidecars' counters in, counts by cause out."""

from __future__ import annotations

from llmobs.tools.slo.reasons import ALL, Why, queries, tally
from llmobs.tools.slo.samples import Sample

CHAT = {"gen_ai_operation_name": "chat", "gen_ai_request_model": "llama"}
QWEN = {**CHAT, "gen_ai_request_model": "qwen"}
MISSES, STALLS = "llmobs_slo_misses_total", "llmobs_stalls_total"
PHASES = "llmobs_ttft_phase_duration_seconds_sum"


def samples() -> list[Sample]:
    """The sidecars' counts, as the render tests take them too."""
    return [
        (MISSES, {**CHAT, "objective": "ttft", "cause": "queue"}, 71.0),
        (MISSES, {**CHAT, "objective": "ttft", "cause": "prefill"}, 22.0),
        (MISSES, {**QWEN, "objective": "ttft", "cause": "before_engine"}, 7.0),
        (MISSES, {**CHAT, "objective": "stall", "cause": "client"}, 3.0),
        (MISSES, {**CHAT, "objective": "max_gap", "cause": "client"}, 1.0),
        (MISSES, {**CHAT, "objective": "tpot", "cause": "none"}, 5.0),  # not a why
        (MISSES, {**CHAT, "objective": "ttft", "cause": "other"}, 0.0),  # a series at 0
        (STALLS, {**CHAT, "cause": "prefill"}, 64.0),
        (STALLS, {**QWEN, "cause": "engine_pause"}, 30.0),
        (STALLS, {**QWEN, "cause": "client"}, 6.0),
        (STALLS, {**QWEN, "cause": "unknown"}, float("nan")),
        (PHASES, {**CHAT, "phase": "queue"}, 3.0),
        (PHASES, {**CHAT, "phase": "other"}, 1.0),
        ("llmobs_requests_total", CHAT, 100.0),  # another family: ignored
    ]


def test_the_causes_are_added_up_per_label_set_and_in_all() -> None:
    rows = tally(samples())
    assert set(rows) == {ALL, ("chat", "llama"), ("chat", "qwen")}
    every = rows[ALL]
    assert every.ttft_misses == {"queue": 71.0, "prefill": 22.0, "before_engine": 7.0}
    assert every.gap_misses == {"client": 4.0}
    assert every.stalls == {"prefill": 64.0, "engine_pause": 30.0, "client": 6.0}
    assert every.ttft_seconds == {"queue": 3.0, "other": 1.0}
    assert rows[("chat", "qwen")] == Why({"before_engine": 7.0}, {},
                                         {"engine_pause": 30.0, "client": 6.0})  # fmt: skip


def test_nothing_to_say_is_nothing() -> None:
    assert tally([(STALLS, {**CHAT, "cause": "prefill"}, 0.0)]) == {}
    assert Why().empty and not Why(stalls={"client": 1.0}).empty


def test_the_queries_ask_for_the_families_that_say_why() -> None:
    asked = queries("5m")
    assert set(asked) == {MISSES, STALLS, PHASES}
    assert asked[STALLS] == (
        "sum by (gen_ai_operation_name, gen_ai_request_model, cause) "
        "(increase(llmobs_stalls_total[5m]))"
    )
