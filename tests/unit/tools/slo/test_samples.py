"""A /metrics page into samples: only the families asked for, and whether it is a sidecar's."""

from __future__ import annotations

import pytest

from llmobs.tools.slo.samples import page_samples

SIDECAR = """\
# TYPE llmobs_slo_requests counter
llmobs_slo_requests_total{gen_ai_operation_name="chat",verdict="good"} 3.0
llmobs_slo_requests_total{gen_ai_operation_name="chat",verdict="bad"} 1.0
# TYPE llmobs_requests counter
llmobs_requests_total{gen_ai_operation_name="chat"} 9.0
"""
ENGINE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2.0
"""


def test_the_samples_asked_for_in_page_order() -> None:
    samples, ours = page_samples(SIDECAR, {"llmobs_slo_requests_total"})
    assert ours
    assert [(name, dict(labels), value) for name, labels, value in samples] == [
        ("llmobs_slo_requests_total", {"gen_ai_operation_name": "chat", "verdict": "good"}, 3.0),
        ("llmobs_slo_requests_total", {"gen_ai_operation_name": "chat", "verdict": "bad"}, 1.0),
    ]


def test_a_page_without_llmobs_series_is_not_a_sidecars() -> None:
    assert page_samples(ENGINE, {"vllm:num_requests_running"})[1] is False
    assert page_samples("", set()) == ([], False)
    # a sidecar's page with none of the families asked for is still a sidecar's
    assert page_samples(SIDECAR, {"llmobs_stalls_total"}) == ([], True)


@pytest.mark.parametrize("text", ['{"object": "list"}', "<html>hi</html>", "Not Found"])
def test_what_is_not_exposition_text_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match=r"\S"):  # the parser's own words, whatever they are
        page_samples(text, {"llmobs_slo_requests_total"})
