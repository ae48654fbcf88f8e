"""What bends the curve, from what the sidecar counted at the level that broke."""

from __future__ import annotations

import pytest

from llmobs.tools.capacity.causes import MEANINGS, Evidence, explain
from llmobs.tools.capacity.figures import Level


def broke(*misses: str, requests: int = 100, errors: int = 0) -> Level:
    return Level(8, requests, errors, 10.0, 10.0, 500.0, 5.0, 250.0, misses=misses)


def test_the_queue_when_requests_wait_longer_than_their_prefill() -> None:
    cause = explain(broke("ttft"), Evidence(phases={"queue": 0.8, "prefill": 0.1}, kv_usage=0.4))
    assert cause.name == "queue"
    assert "queue 0.800 s" in cause.figures and "KV cache 40% full" in cause.figures


def test_the_kv_cache_when_it_is_full_while_they_wait() -> None:
    ev = Evidence(phases={"queue": 0.8, "prefill": 0.1}, kv_usage=0.95)
    assert explain(broke("ttft"), ev).name == "kv_capacity"


def test_prefill_when_it_takes_most_of_ttft() -> None:
    ev = Evidence(phases={"queue": 0.3, "prefill": 1.9})
    assert explain(broke("ttft"), ev).name == "prefill"


@pytest.mark.parametrize(("waiting", "cause"), [(3.0, "queue"), (0.1, "prefill")])
def test_without_a_queue_phase_the_engine_s_waiting_gauge_decides(
    waiting: float, cause: str
) -> None:
    assert explain(broke("ttft"), Evidence(waiting=waiting)).name == cause
    # llama.cpp reports its prefill, not its queue: the gauge still decides
    reported = Evidence(phases={"prefill": 0.6, "other": 0.7}, waiting=waiting)
    assert explain(broke("ttft"), reported).name == cause


def test_neither_a_queue_phase_nor_a_gauge_is_unknown() -> None:
    cause = explain(broke("ttft"), Evidence(phases={"prefill": 0.6}))
    assert (cause.name, cause.figures) == (
        "unknown",
        "the engine reports neither its queue time nor its queue",
    )


def test_preemptions_come_first_whatever_was_missed() -> None:
    ev = Evidence(phases={"queue": 0.8}, preemptions=5, kv_usage=0.99)
    cause = explain(broke("ttft", "tpot"), ev)
    assert cause.name == "preemption"
    assert "0.05 preemptions per request" in cause.figures
    assert explain(broke("tpot"), Evidence(preemptions=1)).name == "decode"  # 1 in 100: noise


def test_a_slow_stream_by_its_stalls_causes() -> None:
    assert explain(broke("tpot"), Evidence(stalls={"prefill": 80})).name == "prefill_interference"
    assert explain(broke("max_gap"), Evidence(stalls={"engine_pause": 300})).name == "engine_pause"
    both = Evidence(stalls={"prefill": 90, "engine_pause": 60})
    assert explain(broke("tpot"), both).name == "prefill_interference"


def test_the_decode_step_when_no_stall_explains_it() -> None:
    cause = explain(broke("tpot"), Evidence(stalls={"prefill": 10}, running=14.5, mbu=0.81))
    assert cause.name == "decode"
    assert "batch 14.5" in cause.figures and "MBU 81%" in cause.figures


def test_errors_are_said_as_errors() -> None:
    cause = explain(broke("errors", requests=40, errors=9), Evidence(preemptions=10))
    assert (cause.name, cause.figures) == ("errors", "9 of 40 requests failed")


def test_every_cause_says_what_it_means() -> None:
    cause = explain(broke("ttft"), Evidence(phases={"queue": 1.0}))
    assert cause.says.startswith("queue: " + MEANINGS["queue"])
    assert explain(broke(), Evidence()).name == "unknown"


def test_counts_per_request_the_sidecar_saw_not_only_those_measured() -> None:
    # 80 prefill stalls over 100 measured requests, but the sidecar timed 200 (warm-up and
    # the requests that kept the load up): 0.4 a request, not the stream's cause
    ev = Evidence(requests=200, stalls={"prefill": 80})
    assert explain(broke("tpot"), ev).name == "decode"
    assert explain(broke("tpot"), Evidence(requests=100, stalls={"prefill": 80})).name == (
        "prefill_interference"
    )


def test_arrivals_that_outpaced_the_engine() -> None:
    level = Level(64, 40, 12, 10.0, 3.0, 90.0, 0.0, 0.0, misses=("errors",), overloaded=12)
    cause = explain(level, Evidence())
    assert cause.name == "queue"
    assert "12 requests not sent" in cause.figures
