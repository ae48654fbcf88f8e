"""The sim's settings (``sim.config``): flag over variable over default, each bad value
refused naming its flag and variable, the dialects by the names spans give them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from llmobs.config.options import ConfigError
from llmobs.observe.dialects import RESPONSES
from llmobs.sim import SimSettings, add_sim_arguments, sim_settings_from_args
from llmobs.sim.config import SIM_DIALECTS, SIM_OPTIONS, sim_source
from llmobs.sim.dialects import ALL, DIALECTS
from llmobs.sim.faults import FAULTS
from llmobs.sim.server import sim_tls
from llmobs.wire.tls import TlsError


def test_settings_from_flags_and_environment() -> None:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    args = parser.parse_args(["--max-batch", "4", "--stall-ms", "50"])
    environ = {"LLMOBS_SIM_MAX_BATCH": "2", "LLMOBS_SIM_ERROR_RATE": "0.25"}
    settings = sim_settings_from_args(args, environ)
    assert (settings.max_batch, settings.stall_ms, settings.error_rate) == (4, 50.0, 0.25)
    assert settings.decode_base == 0.015

    with pytest.raises(ConfigError, match="LLMOBS_SIM_ERROR_RATE"):
        sim_settings_from_args(parser.parse_args([]), {"LLMOBS_SIM_ERROR_RATE": "2"})
    with pytest.raises(ConfigError, match="--tokens-per-chunk"):
        sim_settings_from_args(parser.parse_args(["--tokens-per-chunk", "0"]), {})
    with pytest.raises(ConfigError, match="--output-tokens-max"):
        SimSettings(output_tokens_min=10, output_tokens_max=5)


@pytest.mark.parametrize(
    ("field", "bad", "problem"),
    [
        ("port", 65536, "port out of range"),
        ("model", " ", "must not be empty"),
        ("max_batch", 0, "must be >= 1, got 0"),
        ("output_tokens_min", 0, "must be >= 1, got 0"),
        ("prefill_base", -0.1, "must be >= 0, got -0.1"),
        ("decode_per_seq", float("nan"), "must be >= 0, got nan"),
        ("kv_capacity", -1, "must be >= 0, got -1"),
        ("spec_tokens", -1, "must be >= 0, got -1"),
        ("spec_acceptance", 1.5, "must be within [0, 1], got 1.5"),
        ("error_rate", -0.5, "must be within [0, 1], got -0.5"),
        ("dialect", "grpc", "expected one of all, openai, "),
        ("fault", "bogus", "expected one of none, header, reset-before-headers"),
        ("pd_role", "both", "expected one of none, prefill, decode, got 'both'"),
        ("kv_transfer_base", -0.001, "must be >= 0, got -0.001"),
        ("kv_transfer_per_token", float("nan"), "must be >= 0, got nan"),
    ],
)
def test_a_bad_value_names_its_flag_and_variable(field: str, bad: object, problem: str) -> None:
    source = f"--{field.replace('_', '-')} / LLMOBS_SIM_{field.upper()}: "
    with pytest.raises(ConfigError) as caught:
        SimSettings(**{field: bad})  # type: ignore[arg-type]
    assert str(caught.value).startswith(source + problem), caught.value


def test_dialect_setting_from_flags_and_environment() -> None:
    assert SimSettings.from_sources({"LLMOBS_SIM_DIALECT": " TGI "}).dialect == "tgi"
    assert SimSettings().dialect == ALL
    with pytest.raises(ConfigError, match="LLMOBS_SIM_DIALECT"):
        SimSettings.from_sources({"LLMOBS_SIM_DIALECT": "grpc"})
    assert (ALL, *DIALECTS) == SIM_DIALECTS


def test_the_responses_api_has_the_name_spans_give_it() -> None:
    assert RESPONSES.name in DIALECTS
    assert "responses" not in SIM_DIALECTS
    # the name earlier versions took is still accepted, and read as the one name
    assert SimSettings.from_sources({}, {"dialect": "Responses"}).dialect == RESPONSES.name
    assert SimSettings.from_sources({"LLMOBS_SIM_DIALECT": "responses"}).dialect == RESPONSES.name
    (dialect,) = (o for o in SIM_OPTIONS if o.field == "dialect")
    assert f"API served: {', '.join(SIM_DIALECTS)} (" in dialect.help


def test_the_fault_setting_is_validated() -> None:
    with pytest.raises(ConfigError, match="LLMOBS_SIM_FAULT"):
        SimSettings(fault="bogus")
    assert SimSettings.from_sources({"LLMOBS_SIM_FAULT": "GZIP"}).fault == "gzip"
    for fault in ("none", "header", *FAULTS):
        assert SimSettings(fault=fault).fault == fault


def test_a_certificate_needs_its_key_and_a_bad_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--tls-cert-file .* and --tls-key-file .* go together"):
        SimSettings(tls_cert_file="cert.pem")
    garbage = tmp_path / "cert.pem"
    garbage.write_text("not a certificate")
    settings = SimSettings(tls_cert_file=str(garbage), tls_key_file=str(garbage))
    with pytest.raises(TlsError) as caught:
        sim_tls(settings)
    assert caught.value.sentence(sim_source) == (
        f"--tls-cert-file / LLMOBS_SIM_TLS_CERT_FILE: {garbage} holds no PEM certificate "
        "(-----BEGIN CERTIFICATE-----)"
    )
    assert sim_tls(SimSettings()) is None


def test_the_pd_role_and_transfer_from_flags_and_environment() -> None:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    args = parser.parse_args(["--pd-role", "Decode", "--kv-transfer-per-token", "0.001"])
    environ = {"LLMOBS_SIM_PD_ROLE": "prefill", "LLMOBS_SIM_KV_TRANSFER_BASE": "0.5"}
    settings = sim_settings_from_args(args, environ)
    assert (settings.pd_role, settings.kv_transfer_base, settings.kv_transfer_per_token) == (
        "decode", 0.5, 0.001)  # fmt: skip
    defaults = SimSettings()
    assert (defaults.pd_role, defaults.kv_transfer_base, defaults.kv_transfer_per_token) == (
        "none", 0.002, 0.00001)  # fmt: skip
    with pytest.raises(ConfigError, match="LLMOBS_SIM_PD_ROLE"):
        SimSettings.from_sources({"LLMOBS_SIM_PD_ROLE": "kv_both"})
