"""client_model's messages as built here (``export.metrics.client_model``): the same messages,
fields, numbers, types and enum as Prometheus' own ``metrics.proto`` compiled by protoc; the
bytes a scraper decodes (zigzag for the signed native fields, the enum's numbers); and a
descriptor pool of their own, apart from the default one another library may fill."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

from llmobs.export.metrics import client_model
from tests.support import FIXTURES


def _fields(message: Any) -> list[tuple[str, int, int, int, str]]:
    return [(f.name, f.number, f.label, f.type, f.type_name) for f in message.field]


def test_the_messages_are_client_models_metrics_proto(tmp_path: Path) -> None:
    """client_model's own metrics.proto, compiled by protoc, describes the same messages,
    fields, numbers, types and enum as the descriptor built here."""
    grpc_tools = pytest.importorskip("grpc_tools")
    include = Path(grpc_tools.__file__).parent / "_proto"
    source = FIXTURES / "prometheus"
    out = tmp_path / "metrics.desc"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{source}", f"-I{include}",
         f"--descriptor_set_out={out}", "metrics.proto"],
        check=True,
    )  # fmt: skip
    theirs = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    ours = client_model.file_descriptor()
    assert theirs.package == ours.package
    assert [m.name for m in theirs.message_type] == [m.name for m in ours.message_type]
    for a, b in zip(theirs.message_type, ours.message_type, strict=True):
        assert _fields(a) == _fields(b), a.name
    assert [(v.name, v.number) for v in theirs.enum_type[0].value] == [
        (v.name, v.number) for v in ours.enum_type[0].value
    ]


def test_the_type_constants_are_the_enum_s_numbers() -> None:
    enum = client_model.MetricFamily.DESCRIPTOR.fields_by_name["type"].enum_type
    assert {v.name: v.number for v in enum.values} == {
        "COUNTER": client_model.COUNTER, "GAUGE": client_model.GAUGE,
        "SUMMARY": client_model.SUMMARY, "UNTYPED": client_model.UNTYPED,
        "HISTOGRAM": client_model.HISTOGRAM, "GAUGE_HISTOGRAM": client_model.GAUGE_HISTOGRAM,
    }  # fmt: skip
    assert (client_model.COUNTER, client_model.HISTOGRAM) == (0, 4)


def test_the_bytes_are_what_a_scraper_decodes() -> None:
    gauge = client_model.MetricFamily(name="x", type=client_model.GAUGE)
    gauge.metric.add().gauge.value = 1.0
    # name (1), type (3) = GAUGE, metric (4) { gauge (2) { value (1): double 1.0 } }
    assert gauge.SerializeToString() == b'\n\x01x\x18\x01"\x0b\x12\t\t' + (
        b"\x00\x00\x00\x00\x00\x00\xf0?"
    )
    native = client_model.MetricFamily(name="h", type=client_model.HISTOGRAM)
    histogram = native.metric.add().histogram
    histogram.schema = -3
    histogram.positive_delta.extend([1, -1])
    # schema (5) and positive_delta (13) are zigzag: -3 is 5, 1 is 2, -1 is 1
    assert native.SerializeToString() == b'\n\x01h\x18\x04"\x08:\x06(\x05h\x02h\x01'
    assert client_model.MetricFamily.FromString(native.SerializeToString()) == native
    pair = client_model.LabelPair(name="a", value="b")
    assert pair.SerializeToString() == b"\n\x01a\x12\x01b"


def test_the_messages_live_in_a_pool_of_their_own() -> None:
    descriptor = client_model.MetricFamily.DESCRIPTOR
    assert descriptor.full_name == "io.prometheus.client.MetricFamily"
    assert descriptor.file.pool is not descriptor_pool.Default()
    assert client_model.LabelPair.DESCRIPTOR.file is descriptor.file
