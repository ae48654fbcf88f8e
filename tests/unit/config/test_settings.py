"""The sidecar's settings (``config.settings``): flag over variable over default, every bad
value refused at start-up naming its flag and variable, and what is derived from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmobs.config.settings import OPTIONS, ConfigError, Settings, visible_devices
from llmobs.config.tenants import DEFAULT_METRICS

GIB = 1024**3


def test_flags_override_environment_override_defaults() -> None:
    env = {"LLMOBS_PORT": "9000", "LLMOBS_READ_TIMEOUT": "7.5", "LLMOBS_MAX_BODY_BYTES": "2MiB"}
    s = Settings.from_sources(env, {"port": "9100"})
    assert (s.port, s.read_timeout, s.max_body_bytes, s.metrics_port) == (9100, 7.5, 2 << 20, 9464)


def test_the_defaults_are_valid_and_every_field_but_two_is_an_option() -> None:
    s = Settings.from_sources({})
    assert s == Settings()
    assert (s.upstream_base, s.tenant_metrics, s.log_level) == (
        "http://127.0.0.1:8000", DEFAULT_METRICS, "info")  # fmt: skip
    assert len(OPTIONS) == len(Settings.__dataclass_fields__) - 2


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"LLMOBS_PORT": "eighty"}, "LLMOBS_PORT"),
        ({"LLMOBS_UPSTREAM": "ftp://x"}, "LLMOBS_UPSTREAM"),
        ({"LLMOBS_READ_TIMEOUT": "-1"}, "LLMOBS_READ_TIMEOUT"),
        ({"LLMOBS_INSTRUMENT": "maybe"}, "LLMOBS_INSTRUMENT"),
        ({"LLMOBS_TOKEN_SPANS": "sometimes"}, "LLMOBS_TOKEN_SPANS"),
    ],
)
def test_bad_values_fail_naming_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Settings.from_sources(env)


@pytest.mark.parametrize(
    ("field", "bad", "problem"),
    [
        ("upstream", "engine:8000", "expected an http(s) URL"),
        ("port", "65536", "port out of range"),
        ("metrics_port", "-1", "port out of range"),
        ("connect_timeout", "0", "must be > 0"),
        ("upstream_idle_timeout", "nan", "must be > 0"),
        ("client_timeout", "-5", "must be > 0"),
        ("stall_factor", "0", "must be > 0"),
        ("stall_min_gap", "-0.1", "must be >= 0"),
        ("shutdown_grace", "-1", "must be >= 0"),
        ("max_body_bytes", "0", "must be >= 1"),
        ("max_models", "0", "must be >= 1"),
        ("max_line_bytes", "0", "must be >= 1"),
        ("max_tenants", "0", "must be >= 1"),
        ("ui_history", "5", "must be 10 to 3600 seconds"),
        ("event_loop", "trio", "expected one of auto, uvloop, asyncio"),
        ("log_level", "loud", "expected one of debug"),
        ("gpu_sample_interval", "-1", "must be >= 0"),
        ("engine_scrape_interval", "-5", "must be >= 0"),
        ("engine_metrics_url", "ftp://x", "expected an http(s) URL"),
        ("gpu_peak_flops", "-1", "must be > 0"),
        ("gpu_peak_bandwidth", "0", "must be > 0"),
        ("model_bytes", "0", "must be > 0"),
        ("model_params", "0", "must be > 0"),
        ("weight_dtype", "fp7", "expected one of fp32"),
        ("kv_dtype", "fp7", "expected one of auto"),
        ("model_layers", "-1", "must be >= 0"),
        ("tenant_metrics", "requests,tokenz", "unknown 'tokenz'; expected some of requests"),
        ("provider_name", "vLLM", "expected auto or a name of lower-case letters"),
        ("traces_good_ratio", "2", "must be within [0, 1]"),
    ],
)
def test_a_bad_value_names_its_flag_and_variable(field: str, bad: str, problem: str) -> None:
    flag = "--" + field.replace("_", "-")
    variable = "LLMOBS_" + field.upper()
    by_variable: tuple[dict[str, str], dict[str, str]] = ({variable: bad}, {})
    for environ, flags in (by_variable, ({}, {field: bad})):
        with pytest.raises(ConfigError) as caught:
            Settings.from_sources(environ, flags)
        assert str(caught.value).startswith(f"{flag} / {variable}: {problem}"), caught.value


def test_unset_optional_values_are_not_checked() -> None:
    s = Settings.from_sources({"LLMOBS_ENGINE_METRICS_URL": "", "LLMOBS_LOG_LEVEL": "DEBUG"})
    assert (s.engine_metrics_url, s.gpu_peak_flops, s.log_level) == ("", None, "DEBUG")


def test_the_two_ports_must_not_collide_on_one_address() -> None:
    with pytest.raises(ConfigError, match="--metrics-port / LLMOBS_METRICS_PORT: must differ"):
        Settings.from_sources({"LLMOBS_METRICS_PORT": "8080"})
    apart = Settings(host="127.0.0.1", metrics_host="127.0.0.2", metrics_port=8080)
    assert apart.port == apart.metrics_port
    assert Settings(port=0, metrics_port=0).port == 0  # each picked by the system


def test_settings_read_the_device_variables_and_check_the_new_options() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "GPU-b", "LLMOBS_GPUS": "0, MIG-x", "LLMOBS_MODEL_PARAMS": "8B",
           "LLMOBS_GPU_PEAK_BANDWIDTH": "3.35T", "LLMOBS_MODEL_BYTES": "16GiB"}  # fmt: skip
    s = Settings.from_sources(env)
    assert (s.cuda_visible_devices, s.nvidia_visible_devices, s.gpus) == (
        "GPU-b",
        None,
        ("0", "MIG-x"),
    )
    assert (s.model_params, s.gpu_peak_bandwidth, s.model_bytes) == (8e9, 3.35e12, 16 * GIB)
    for bad in ({"LLMOBS_WEIGHT_DTYPE": "fp7"}, {"LLMOBS_GPU_PEAK_FLOPS": "-1"},
                {"LLMOBS_ENGINE_SCRAPE_INTERVAL": "-5"}, {"LLMOBS_ENGINE_METRICS_URL": "ftp://x"},
                {"LLMOBS_MODEL_PARAMS": "lots"}):  # fmt: skip
        with pytest.raises(ConfigError, match=next(iter(bad))):
            Settings.from_sources(bad)
    assert visible_devices({"NVIDIA_VISIBLE_DEVICES": "all", "PATH": "/bin"}) == {
        "nvidia_visible_devices": "all"}  # fmt: skip


def test_a_provider_name_is_a_plain_bounded_label_value() -> None:
    assert Settings.from_sources({"LLMOBS_PROVIDER_NAME": "aws.bedrock"}).provider_name == (
        "aws.bedrock"
    )
    for bad in ("vLLM", "a b", "x" * 65, 'q"uote'):
        with pytest.raises(ConfigError, match="LLMOBS_PROVIDER_NAME"):
            Settings.from_sources({"LLMOBS_PROVIDER_NAME": bad})


def test_the_tenancy_and_the_prices_come_from_their_files(tmp_path: Path) -> None:
    assert Settings().prices() is None
    tenancy = Settings(tenant_header=" X-Tenant ").tenancy()
    assert (tenancy.header, tenancy.keys, tenancy.on) == ("X-Tenant", {}, True)
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  sha256:" + "a" * 64 + ": team-a\n")
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: EUR\nprices:\n  '*': {input: 1, output: 2}\n")
    s = Settings(tenant_keys=str(keys), tenant_fingerprints=True, price_file=str(prices))
    assert s.tenancy().names == frozenset({"team-a"}) and s.tenancy().fingerprints
    found = s.prices()
    assert found is not None and found.currency == "EUR"


def test_the_decode_listener_needs_roles_read() -> None:
    """Every request at the decode engine's listener is a leg of one counted at the port:
    with roles not read it would be counted twice."""
    with pytest.raises(ConfigError, match=r"--pd-decode-upstream.*--pd-roles .* off"):
        Settings(pd_decode_upstream="http://127.0.0.1:8200", pd_roles="off")
    assert Settings(pd_decode_upstream="http://127.0.0.1:8200").pd_host == "127.0.0.1"
    assert Settings(pd_prefill_upstream="http://127.0.0.1:8200", pd_roles="off").pd_roles == "off"
    with pytest.raises(ConfigError, match="--pd-decode-upstream"):
        Settings(pd_decode_upstream="ftp://x")
    with pytest.raises(ConfigError, match="--pd-roles"):
        Settings(pd_roles="sometimes")
