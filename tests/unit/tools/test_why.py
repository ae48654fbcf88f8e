"""``llmobs why``'s arithmetic: samples of the sidecars' counters in, shares by cause out."""

from __future__ import annotations

import json

from llmobs.tools.why import ALL, PHASE_WORDS, STALL_WORDS, Why, as_json, render, shares, tally

CHAT = {"gen_ai_operation_name": "chat", "gen_ai_request_model": "llama"}
QWEN = {**CHAT, "gen_ai_request_model": "qwen"}
MISSES, STALLS = "llmobs_slo_misses_total", "llmobs_stalls_total"
PHASES = "llmobs_ttft_phase_duration_seconds_sum"


def samples() -> list[tuple[str, dict[str, str], float]]:
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


def test_shares_read_as_the_issue_asks() -> None:
    rows = tally(samples())
    assert (
        shares(rows[ALL].ttft_misses, PHASE_WORDS) == "71% queue, 22% prefill, 7% before the engine"
    )
    assert shares(rows[ALL].stalls, STALL_WORDS) == (
        "64% prefill interference, 30% engine pauses, 6% client")  # fmt: skip
    assert shares({}, STALL_WORDS) == "-"
    assert shares({"client": 1.0, "prefill": 1.0}, STALL_WORDS) == (
        "50% prefill interference, 50% client")  # ties in the causes' order  # fmt: skip


def test_the_report_for_people_and_for_tools() -> None:
    rows = tally(samples())
    text = render(rows)
    assert text.splitlines()[0] == "all requests:"
    assert "  TTFT misses (100): 71% queue, 22% prefill, 7% before the engine" in text
    assert "  stalls (100): 64% prefill interference" in text
    assert "  TTFT spent in (4 s): 75% queue, 25% other" in text
    assert text.index("chat llama:") < text.index("chat qwen:")
    report = json.loads(as_json(rows))
    assert report["label_sets"][0]["operation"] == "all"
    assert report["label_sets"][0]["stalls"]["prefill"] == 64.0
    assert json.loads(as_json({}, "nothing"))["error"] == "nothing"


def test_nothing_to_say_is_nothing() -> None:
    assert tally([(STALLS, {**CHAT, "cause": "prefill"}, 0.0)]) == {}
