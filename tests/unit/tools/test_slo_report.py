"""``llmobs slo --by``: the per-label-set rows split by a target label, to say which pods hold
the bad requests (pure: the Prometheus answers are given)."""

from __future__ import annotations

import argparse
import io

import pytest

from llmobs.config.options import ConfigError
from llmobs.tools.slo_report import (
    add_slo_arguments,
    breakdown_from_vectors,
    render_breakdown,
    run_slo_cli,
)
from tests.support.prom import free_port

REQUESTS = "llmobs_slo_requests_total"
MISSES = "llmobs_slo_misses_total"


def sample(pod: str, **labels: str) -> dict[str, str]:
    return {"gen_ai_operation_name": "chat", "gen_ai_request_model": "m", "pod": pod, **labels}


VECTORS = {
    REQUESTS: [
        (sample("a", verdict="good"), 90.0), (sample("a", verdict="bad"), 10.0),
        (sample("b", verdict="good"), 50.0), (sample("b", verdict="bad"), 0.0),
        (sample("c", verdict="good"), 1.0), (sample("c", verdict="bad"), 30.0),
    ],
    MISSES: [(sample("a", objective="ttft"), 10.0), (sample("c", objective="error"), 30.0)],
}  # fmt: skip


def test_the_pods_that_hold_the_bad_requests_most_first() -> None:
    split = breakdown_from_vectors(VECTORS, ("pod",))
    assert {where: (row.judged, row.bad) for (_, where), row in split.items()} == {
        "a": (100, 10),
        "c": (31, 30),
    }  # b had none bad: not listed
    lines = render_breakdown(split, "pod").splitlines()
    assert lines[0].split() == ["operation", "model", "pod", "judged", "bad", "share", "bad",
                                "misses"]  # fmt: skip
    assert [line.split()[2:6] for line in lines[1:]] == [  # the most bad first, not by name
        ["c", "31", "30", "96.774%"], ["a", "100", "10", "10.000%"],
    ]  # fmt: skip
    assert lines[1].endswith("error 30") and lines[2].endswith("ttft 10")


def test_a_pod_is_its_namespace_and_name() -> None:
    """Pods of one name in two namespaces stay apart."""
    vectors = {REQUESTS: [(sample("a", namespace=ns, verdict="bad"), 1.0) for ns in "xy"]}
    split = breakdown_from_vectors(vectors, ("namespace", "pod"))
    assert sorted(where for _, where in split) == ["x/a", "y/a"]


def test_by_takes_target_label_names_and_prometheus_only() -> None:
    parser = argparse.ArgumentParser()
    add_slo_arguments(parser)
    for argv in (["--metrics-url", "http://127.0.0.1:1/metrics", "--by", "pod"],
                 ["--prometheus", "http://127.0.0.1:1", "--by", "pod name"],
                 ["--prometheus", "http://127.0.0.1:1", "--by", "pod,verdict"]):  # fmt: skip
        with pytest.raises(ConfigError, match="--by"):
            run_slo_cli(parser.parse_args(argv), io.StringIO(), {})


def test_by_namespace_and_pod_is_taken(capsys: pytest.CaptureFixture[str]) -> None:
    """Accepted, it goes on to read Prometheus: here none, so it cannot judge (2)."""
    parser = argparse.ArgumentParser()
    add_slo_arguments(parser)
    args = parser.parse_args(["--prometheus", f"http://127.0.0.1:{free_port()}",
                              "--by", "namespace,pod"])  # fmt: skip
    assert run_slo_cli(args, io.StringIO(), {}) == 2
    assert "cannot judge" in capsys.readouterr().err
