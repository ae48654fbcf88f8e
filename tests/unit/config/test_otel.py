"""The standard ``OTEL_*`` variables (``config.otel``), read as the specification says, a bad
value refused naming its variable."""

from __future__ import annotations

import pytest

from llmobs.config.options import ConfigError
from llmobs.config.otel import OtelSettings, genai_latest, otel_settings


def test_otel_environment_is_read_by_the_spec() -> None:
    s = otel_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
                       "OTEL_SERVICE_NAME": "chat-pod",
                       "OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=p-1,team=ml%20infra",
                       "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                       "OTEL_TRACES_SAMPLER_ARG": "0.25",
                       "OTEL_EXPORTER_OTLP_HEADERS": "api-key=abc"})  # fmt: skip
    assert s.traces_endpoint == "http://collector:4318/v1/traces"
    assert s.metrics_endpoint == "http://collector:4318/v1/metrics"
    assert s.service_name == "chat-pod"
    assert dict(s.resource_attributes) == {"k8s.pod.name": "p-1", "team": "ml infra"}
    assert (s.sampler, s.sampler_arg) == ("parentbased_traceidratio", 0.25)
    assert dict(s.traces_headers) == {"api-key": "abc"}
    grpc_settings = otel_settings({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                                   "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"})  # fmt: skip
    assert grpc_settings.traces_endpoint == "http://c:4317"
    specific = otel_settings({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9/x"})
    assert specific.traces_endpoint == "http://t:9/x"
    assert not otel_settings({}).tracing
    assert not otel_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_SDK_DISABLED":
                              "true"}).tracing  # fmt: skip
    with pytest.raises(ConfigError, match="OTEL_TRACES_SAMPLER"):
        otel_settings({"OTEL_TRACES_SAMPLER": "sometimes"})
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP"):
        otel_settings({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_no_variable_means_the_defaults() -> None:
    s = otel_settings({})
    assert s == OtelSettings()
    assert (s.metrics_exporters, s.timeout_s, s.metric_export_interval_s) == (
        ("prometheus",), 10.0, 60.0)  # fmt: skip


def test_times_are_milliseconds_and_exporters_a_list() -> None:
    s = otel_settings({"OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_METRIC_EXPORT_INTERVAL": "500",
                       "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_BSP_MAX_QUEUE_SIZE": "64",
                       "OTEL_METRICS_EXPORTER": "Prometheus, otlp, none",
                       "OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c",
                       "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "k=v"})  # fmt: skip
    assert (s.timeout_s, s.metric_export_interval_s, s.bsp_schedule_delay_s) == (2.5, 0.5, 0.1)
    assert s.bsp_max_queue_size == 64
    assert s.metrics_exporters == ("prometheus", "otlp")
    assert not s.tracing and s.metrics_endpoint == "http://c/v1/metrics"
    assert (dict(s.metrics_headers), s.traces_headers) == ({"k": "v"}, ())


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, "OTEL_EXPORTER_OTLP_TIMEOUT: invalid number"),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "-1"}, "OTEL_BSP_MAX_QUEUE_SIZE: must be >= 0"),
        ({"OTEL_TRACES_SAMPLER_ARG": "1.5"}, "OTEL_TRACES_SAMPLER_ARG: a ratio"),
        ({"OTEL_METRICS_EXPORTER": "console"}, "OTEL_METRICS_EXPORTER: unsupported"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "a=1,b"}, "OTEL_RESOURCE_ATTRIBUTES: expected key=value"),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "=v"}, "OTEL_EXPORTER_OTLP_HEADERS: expected key=value"),
        ({"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json"},
         "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL"),
    ],
)  # fmt: skip
def test_a_bad_value_names_its_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        otel_settings(env)


def test_the_spec_variable_is_read_and_checked() -> None:
    name = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"
    assert otel_settings({}).exponential_histograms
    assert otel_settings({name: "BASE2_exponential_bucket_histogram"}).exponential_histograms
    assert not otel_settings({name: " explicit_bucket_histogram "}).exponential_histograms
    with pytest.raises(ConfigError, match=name):
        otel_settings({name: "exponential"})


def test_the_opt_in_is_one_value_of_a_list_of_categories() -> None:
    assert genai_latest({"OTEL_SEMCONV_STABILITY_OPT_IN": "http/dup, gen_ai_latest_experimental"})
    assert not genai_latest({"OTEL_SEMCONV_STABILITY_OPT_IN": "http,database"})
    assert not genai_latest({})
    disabled = {"OTEL_SDK_DISABLED": "true",
                "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental"}  # fmt: skip
    assert otel_settings(disabled).genai_latest  # the names on /metrics switch all the same
