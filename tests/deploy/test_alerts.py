"""The Prometheus rules: promtool checks and unit tests, coverage of every alert by firing and
quiet cases, names against the catalogue, runbook links and documented defaults, and a real
Prometheus evaluating the shipped rules while a stalling and a steady engine stream through
sidecars (each with a healthy fake GPU and both collectors up): the stutter alert fires for the
first and nothing fires for the second."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.fake_nvml import FakeGpu, FakeNvml
from tests.support.markdown import anchors
from tests.support.prom import (
    ALERTS,
    PROMETHEUS_DIR,
    PROMTOOL,
    ROOT,
    RULES,
    Prometheus,
    Target,
    config,
    fast_alerts,
    needs_prometheus,
    needs_promtool,
    streaming_load,
)
from tests.support.promql import SYNTHETIC, metric_names, unknown_metrics
from tests.support.servers import SidecarFactory, SimFactory

UNIT_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.test.yml"))
RUNBOOK = ROOT / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/llmobs/llmobs/blob/main/docs/runbook.md#"
SEVERITIES = {"critical", "warning", "info"}

Rule = dict[str, Any]


def rules(path: Path) -> list[Rule]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def alerts() -> dict[str, Rule]:
    return {r["alert"]: r for r in rules(ALERTS)}


def recorded() -> dict[str, list[str]]:
    """Recording rule name -> its expressions (one name may be recorded per quantile)."""
    out: dict[str, list[str]] = {}
    for r in rules(RULES):
        out.setdefault(r["record"], []).append(r["expr"])
    return out


def untested(alert_names: set[str], unit_tests: list[Path]) -> dict[str, set[str]]:
    """Alerts lacking a case where they fire, or one where they stay quiet."""
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in unit_tests:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case["exp_alerts"] else quiet).add(case["alertname"])
    return {
        "firing": alert_names - fires,
        "quiet": alert_names - quiet,
    }


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(RULES), str(ALERTS)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    assert UNIT_TESTS
    done = subprocess.run(
        [str(PROMTOOL), "test", "rules", *map(str, UNIT_TESTS)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """A wrong expectation fails: the suite above is not vacuous."""
    text = (PROMETHEUS_DIR / "tests" / "alerts.test.yml").read_text()
    broken = tmp_path / "broken.test.yml"
    broken.write_text(
        text.replace("../", str(PROMETHEUS_DIR) + "/").replace("is 2.975s", "is 2.5s")
    )
    done = subprocess.run(
        [str(PROMTOOL), "test", "rules", str(broken)], capture_output=True, check=False
    )
    assert done.returncode != 0


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    assert untested(set(alerts()), UNIT_TESTS) == {"firing": set(), "quiet": set()}
    assert untested({*alerts(), "LLMObsNew"}, UNIT_TESTS) == {
        "firing": {"LLMObsNew"},
        "quiet": {"LLMObsNew"},
    }


def test_every_recording_rule_is_tested() -> None:
    """Each recorded series is checked by a promql_expr_test, or feeds one or a tested alert."""
    pending = [name for a in alerts().values() for name in metric_names(a["expr"])]
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("promql_expr_test", []):
                pending += metric_names(case["expr"])
    records = recorded()
    covered: set[str] = set()
    while pending:
        name = pending.pop()
        if name in records and name not in covered:
            covered.add(name)
            pending += [n for expr in records[name] for n in metric_names(expr)]
    assert set(records) - covered == set()


def test_rules_use_only_catalogue_metrics() -> None:
    allowed = set(recorded()) | SYNTHETIC
    problems = {
        r.get("alert") or r["record"]: unknown_metrics(r["expr"], allowed)
        for r in rules(RULES) + rules(ALERTS)
    }
    assert {k: v for k, v in problems.items() if v} == {}
    assert unknown_metrics("rate(llmobs_stall_total[5m]) > 0", allowed) == {"llmobs_stall_total"}


def test_alerts_have_severity_summary_description_and_runbook() -> None:
    runbook = RUNBOOK.read_text()
    sections = set(re.findall(r"^## (LLMObs\w+)$", runbook, re.MULTILINE))
    assert sections == set(alerts()), "docs/runbook.md needs one section per alert, no more"
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert rule.get("for"), name
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], name
        assert notes["runbook_url"] == RUNBOOK_URL + name.lower(), name
        assert name.lower() in anchors(runbook), name


def test_runbook_table_matches_the_rules() -> None:
    """docs/runbook.md's table of defaults says what alerts.yml does (severity and for)."""
    rows = re.findall(
        r"^\| \[`(LLMObs\w+)`\]\(#\w+\) \| (\w+) \| .+ \| (\w+) \|$",
        RUNBOOK.read_text(),
        re.MULTILINE,
    )
    documented = {name: (severity, hold) for name, severity, hold in rows}
    actual = {n: (r["labels"]["severity"], r["for"]) for n, r in alerts().items()}
    assert documented == actual


def test_fast_alerts_change_only_the_hold_time() -> None:
    fast = yaml.safe_load(fast_alerts("2s"))
    shipped = yaml.safe_load(ALERTS.read_text())
    for g_fast, g in zip(fast["groups"], shipped["groups"], strict=True):
        for r_fast, r in zip(g_fast["rules"], g["rules"], strict=True):
            assert r_fast == {**r, "for": "2s"}


# --- end to end: a real Prometheus evaluates the shipped rules --------------------------------

MODEL = "sim-llama-3-8b"
# 50 ms decode steps, tiny prefill: only the injected pauses break the rhythm. A stall is a
# gap of three steps, so a token the loaded machine made late is none: the steady engine's
# streams stay steady however busy the machine (four streams share each of its hiccups).
ENGINE = {
    "model": MODEL, "max_batch": 64, "prefill_base": 0.002, "prefill_per_token": 0.0,
    "decode_base": 0.05, "output_tokens_min": 24, "output_tokens_max": 64,
}  # fmt: skip
STUTTER = "LLMObsStreamStutter"
# Collectors that poll at once and often: up from the first scrapes, so that the collector,
# GPU memory and KV-cache alerts are evaluated on real series (and must stay quiet).
COLLECTORS = {"gpu_sample_interval": 0.2, "engine_scrape_interval": 0.2}
FIRING_TIMEOUT = 45.0
MIN_TRAFFIC = 10.0  # seconds the steady engine streams while the alerts are watched


@needs_prometheus
async def test_stutter_alert_fires_for_a_stalling_engine_only(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    stalled = await start_sim(**ENGINE, stall_every=8, stall_ms=300.0)
    steady = await start_sim(**ENGINE)
    gpus = [FakeNvml([FakeGpu(f"GPU-{name}")]) for name in ("stalled", "steady")]
    side_stalled = await start_sidecar(stalled.url, nvml=gpus[0], **COLLECTORS)
    side_steady = await start_sidecar(steady.url, nvml=gpus[1], **COLLECTORS)
    targets = [
        Target("llmobs", side_stalled.metrics_url, {"namespace": "stalled", "pod": "llm-0"}),
        Target("llmobs", side_steady.metrics_url, {"namespace": "steady", "pod": "llm-0"}),
    ]
    rule_files = {"rules.yml": RULES.read_text(), "alerts.yml": fast_alerts("2s")}
    async with (
        Prometheus(tmp_path, targets, rule_files) as prom,
        streaming_load(side_stalled.url, MODEL, 4),
        streaming_load(side_steady.url, MODEL, 4, seed=1),
    ):
        loop = asyncio.get_running_loop()
        start = loop.time()
        states: set[str] = set()
        while True:
            mine = [
                a for a in await prom.alerts()
                if a["labels"]["alertname"] == STUTTER and a["labels"]["namespace"] == "stalled"
            ]  # fmt: skip
            states |= {a["state"] for a in mine}
            if "firing" in states and loop.time() - start >= MIN_TRAFFIC:
                break
            assert loop.time() - start < FIRING_TIMEOUT, (
                f"{STUTTER} never fired (states seen: {states})\n{prom.text_log()}"
            )
            await asyncio.sleep(0.5)
        # The steady engine was evaluated (its series exist) and never raised any alert.
        smooth = await prom.query(
            'namespace_job_model:llmobs_smoothness:ratio5m{namespace="steady"}'
        )
        ever = await prom.query('max_over_time(ALERTS{namespace="steady"}[5m])')
        watched = await prom.query(
            'count by (__name__) ({__name__=~"llmobs_(collector_up|gpu_memory_used_bytes|'
            'engine_kv_cache_usage)", namespace="steady"})'
        )
        stutter = await prom.query(
            'namespace_job_model:llmobs_stalls:per_1k_tokens_rate5m{namespace="stalled"}'
        )
    assert smooth and all(v > 0.8 for _, v in smooth), smooth
    assert ever == [], [labels for labels, _ in ever]
    assert {labels["__name__"] for labels, _ in watched} == {
        "llmobs_collector_up", "llmobs_gpu_memory_used_bytes", "llmobs_engine_kv_cache_usage",
    }  # fmt: skip
    assert stutter and all(v > 5 for _, v in stutter), stutter


@needs_promtool
def test_end_to_end_config_loads_the_shipped_rules(tmp_path: Path) -> None:
    """The configuration the end-to-end test gives Prometheus is valid, rules included."""
    (tmp_path / "rules.yml").write_text(RULES.read_text())
    (tmp_path / "alerts.yml").write_text(fast_alerts("2s"))
    (tmp_path / "prometheus.yml").write_text(
        config([Target("llmobs", "http://127.0.0.1:1")], ["rules.yml", "alerts.yml"])
    )
    done = subprocess.run(
        [str(PROMTOOL), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
