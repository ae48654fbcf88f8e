"""The curve written out: the headline, the table, JSON and CSV with every level."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from llmobs.tools.capacity import report
from llmobs.tools.capacity.causes import Cause, Evidence
from llmobs.tools.capacity.figures import Level, Objectives
from llmobs.tools.capacity.report import Curve, Point


def lv(load: float, *misses: str) -> Level:
    q = {"ttft": {0.5: 0.1 * load, 0.9: 0.2 * load, 0.95: 0.21 * load, 0.99: 0.3 * load}}
    return Level(load, 20, 0, 10.0, load, 30.0 * load, load, 30.0 * load, q, misses,
                 {"ttft": 0.2 * load})  # fmt: skip


def curve() -> Curve:
    c = Curve("concurrency", "fixed:100,64", 100, 64, Objectives({"ttft": 1.0}, 0.9))
    queue = Cause("queue", "mean queue 0.800 s, prefill 0.100 s of TTFT")
    c.points = [Point(lv(8, "ttft"), Evidence(phases={"queue": 0.8}), queue),
                Point(lv(2), Evidence()), Point(lv(4), Evidence(kv_usage=0.5))]  # fmt: skip
    c.knee, c.failed, c.cause = 4, 8, queue
    return c


def test_the_headline_names_the_knee_the_bracket_and_the_cause() -> None:
    text = report.headline(curve())
    assert text.splitlines()[0] == "knee: 4 clients within ttft p90 <= 1 s (8 clients did not)"
    assert text.splitlines()[1].startswith("what bends it: queue: the batch was full")


def test_a_search_that_never_failed_or_never_held() -> None:
    c = curve()
    c.failed, c.cause = None, None
    assert "the knee is at least this" in report.headline(c)
    c.knee = None
    assert report.headline(c).startswith("no load tried held")


def test_one_level_is_said_as_one() -> None:
    c = curve()
    c.single, c.points = True, c.points[:1]
    assert report.headline(c).startswith("at 8 clients: missed ttft")
    assert json.loads(report.to_json(c))["knee"] is None


def test_the_table_in_load_order() -> None:
    lines = report.table(curve()).splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["2", "4", "8"]
    assert lines[-1].endswith("misses ttft (queue)")


def test_json_and_csv_carry_every_level() -> None:
    doc = json.loads(report.to_json(curve()))
    assert doc["kind"] == "llmobs-capacity"
    assert (doc["knee"], doc["failed"], doc["cause"]["name"]) == (4, 8, "queue")
    assert [x["load"] for x in doc["levels"]] == [2, 4, 8]
    assert doc["levels"][2]["queue_s"] == 0.8 and doc["levels"][1]["kv_usage"] == 0.5
    assert doc["levels"][0]["kv_usage"] is None  # not measured: null, never NaN
    assert doc["levels"][2]["ttft_p90_s"] == pytest.approx(1.6)
    rows = list(csv.DictReader(io.StringIO(report.to_csv(curve()))))
    assert [float(r["load"]) for r in rows] == [2, 4, 8]
    assert math.isnan(float(rows[0]["kv_usage"]))
    assert rows[2]["cause"] == "queue"


def test_the_png_or_why_not(tmp_path: Path) -> None:
    why_not = report.plot(curve(), tmp_path / "c.png")
    if why_not is None:
        assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "pip install 'llmobs[bench]'" in why_not
