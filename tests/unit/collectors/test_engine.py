"""The engine collector: every engine's exposition mapped, garbage tolerated, the real sim live."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import aiohttp
import pytest
from prometheus_client import generate_latest

from llmobs.collectors.base import register_status
from llmobs.collectors.engine import (
    EngineCollector,
    EngineReading,
    adapters_of,
    read_engine,
    register_engine,
)
from llmobs.export.telemetry import build_telemetry
from tests.support import FIXTURES
from tests.support.ports import free_port
from tests.support.scripted import Script, ScriptedUpstream
from tests.support.servers import AppFactory, SimFactory

VLLM = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 3.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 2.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 16.0
vllm:num_requests_running{engine="1",model_name="llama"} 15.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.7
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="llama"} 4.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="llama"} 3.0
vllm:num_preemptions_total{engine="1",model_name="llama"} 4.0
vllm:num_preemptions_created{engine="0",model_name="llama"} 1.7e9
"""
VLLM_V0 = """\
vllm:num_requests_waiting{model_name="m"} 1
vllm:num_requests_running{model_name="m"} 4
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
"""
SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 12.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 7.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen",tp_rank="0"} 0.83
# TYPE sglang:num_retracted_requests counter
sglang:num_retracted_requests_total{model_name="qwen",tp_rank="0"} 2.0
sglang:num_retracted_reqs{model_name="qwen",tp_rank="0"} 1.0
"""
TGI = "# TYPE tgi_queue_size gauge\ntgi_queue_size 4\ntgi_batch_current_size 9\n"
LLAMACPP = """\
llamacpp:requests_processing 2
llamacpp:requests_deferred 1
llamacpp:kv_cache_usage_ratio 0.125
"""
TRTLLM = 'trtllm_num_requests_waiting{model_name="x"} 5\ntrtllm_kv_cache_utilization 0.4\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # counts summed, ratio averaged; the preemption counters summed too
        (VLLM, EngineReading("vllm", 5.0, 31.0, 0.6, 7.0)),
        (VLLM_V0, EngineReading("vllm", 1.0, 4.0, 0.25)),
        (SGLANG, EngineReading("sglang", 7.0, 12.0, 0.83, 2.0)),  # retractions: the counter
        (TGI, EngineReading("tgi", 4.0, 9.0, None)),
        (LLAMACPP, EngineReading("llamacpp", 1.0, 2.0, 0.125)),
        (TRTLLM, EngineReading("trtllm", 5.0, None, 0.4)),
    ],
)
def test_each_engine_is_recognised_and_mapped(text: str, expected: EngineReading) -> None:
    got = read_engine(text)
    assert got is not None
    assert got.engine == expected.engine
    for field in ("waiting", "running", "kv_usage", "preemptions"):
        assert getattr(got, field) == pytest.approx(getattr(expected, field)), field


ENGINE_PAGES = FIXTURES / "engines"


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        # two slots decoding, one request deferred; llama-server has no KV-cache gauge
        ("llamacpp-server.metrics.txt", EngineReading("llamacpp", 1.0, 2.0, None)),
        # TensorRT-LLM's waiting (active but not scheduled), scheduled, and KV fraction
        ("triton-trtllm.metrics.txt", EngineReading("triton", 1.0, 1.0, 0.4875)),
        ("trtllm-serve.metrics.txt", EngineReading("trtllm", 2.0, 6.0, 0.375)),
    ],
)
def test_engines_own_pages_are_read(page: str, expected: EngineReading) -> None:
    """The pages of tests/fixtures/engines/ (captured, or from the engines' docs: its README)."""
    assert read_engine((ENGINE_PAGES / page).read_text()) == expected


def test_triton_without_tensorrt_llm_or_without_the_kv_fraction() -> None:
    # Triton alone: its queue of requests not yet handed to a model, summed over models
    pending = (
        'nv_inference_pending_request_count{model="preprocessing",version="1"} 2\n'
        'nv_inference_pending_request_count{model="vllm_model",version="1"} 3\n'
    )
    assert read_engine(pending) == EngineReading("triton", 5.0, None, None)
    # a backend that publishes blocks but no fraction: used / max
    page = (ENGINE_PAGES / "triton-trtllm.metrics.txt").read_text()
    blocks = "\n".join(line for line in page.splitlines() if 'type="fraction"' not in line)
    reading = read_engine(blocks)
    assert reading is not None and reading.kv_usage == pytest.approx(1 / 6239)


def test_garbage_is_skipped_line_by_line() -> None:
    text = (
        "\x00\xff binary junk {{{\n"
        'vllm:num_requests_waiting{model_name="a"} not-a-number\n'
        'vllm:num_requests_waiting{model_name="b"} 2\n'
        'vllm:num_requests_running{model_name="b" 7\n'  # unterminated labels
        'vllm:num_requests_running{model_name="b"} 3\n'
        'vllm:kv_cache_usage_perc{model_name="b"} NaN\n'
        "<html>502 Bad Gateway</html>\n"
    )
    assert read_engine(text) == EngineReading("vllm", 2.0, 3.0, None)
    assert read_engine("<html>not metrics</html>\n\x00") is None
    assert read_engine("") is None
    assert read_engine("process_cpu_seconds_total 12\n") is None  # no engine's metric


async def poll(collector: EngineCollector, times: int = 1) -> None:
    for _ in range(times):
        await collector.collect_once()


async def until(
    collector: EngineCollector, check: Callable[[EngineReading], bool]
) -> EngineReading:
    """Poll until the reading satisfies ``check`` (at most 5 s)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while True:
        await poll(collector)
        reading = collector.snapshot
        if reading is not None and check(reading):
            return reading
        assert loop.time() < deadline, reading
        await asyncio.sleep(0.02)


async def test_the_simulated_engine_live(start_sim: SimFactory) -> None:
    sim = await start_sim(max_batch=1, decode_base=0.02, output_tokens_min=200,
                          output_tokens_max=200)  # fmt: skip
    scrapes: list[tuple[int, int, float]] = []
    collector = EngineCollector(
        sim.url + "/metrics", interval=0.05, on_preemptions=lambda *s: scrapes.append(s)
    )
    await poll(collector)
    assert collector.snapshot == EngineReading(
        "vllm", 0.0, 0.0, 0.0, 0.0, prefix_hits=0.0, prefix_queries=0.0, spec_accepted=0.0,
        spec_drafted=0.0,
    )  # fmt: skip
    # each scrape's preemption counter goes to the stall causes, asked before it was read
    ((sent, read, total),) = scrapes
    assert 0 < sent < read and total == 0.0
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}

    async def client(session: aiohttp.ClientSession) -> None:
        async with session.post(sim.url + "/v1/chat/completions", json=body) as r:
            await r.read()

    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(client(session)) for _ in range(3)]
        busy = await until(collector, lambda r: (r.waiting, r.running) == (2.0, 1.0))
        assert busy.engine == "vllm" and busy.kv_usage is not None and 0 < busy.kv_usage < 1
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert (collector.up, collector.errors) == (True, 0)
    await collector.close()


async def test_other_engines_and_failures_over_http(
    start_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    plain = (("Content-Type", "text/plain; version=0.0.4"),)
    sglang = ScriptedUpstream({"default": Script(((0, SGLANG.encode()),), headers=plain)})
    missing = ScriptedUpstream({"default": Script(status=404, headers=plain)})
    iteration_stats = ScriptedUpstream({"default": Script(
        ((0, b'[{"iter": 154, "numActiveRequests": 1}]'),),
        headers=(("Content-Type", "application/json"),),
    )})  # fmt: skip
    junk = ScriptedUpstream({"default": Script(((0, b"\x00garbage {{{\n" * 100),), headers=plain)})
    urls = [await start_app(u.app()) + "/metrics" for u in (sglang, missing, junk, iteration_stats)]
    named: list[tuple[int, str | None]] = []  # what each told the provider name
    ok = EngineCollector(urls[0], 0.05, on_engine=lambda e: named.append((0, e)))
    await poll(ok)
    assert ok.snapshot == EngineReading("sglang", 7.0, 12.0, 0.83, 2.0)

    def tell(index: int) -> Callable[[str | None], None]:
        return lambda engine: named.append((index, engine))

    down = [
        EngineCollector(url, 0.05, on_engine=tell(i))
        for i, url in enumerate((*urls[1:], f"http://127.0.0.1:{free_port()}/m"), 1)
    ]
    with caplog.at_level(logging.INFO, "llmobs.collectors"):
        for collector in down:
            await poll(collector, times=3)
    for collector in down:
        assert (collector.up, collector.snapshot, collector.errors) == (False, None, 0)
    assert len(caplog.records) == 4  # once per collector, not per poll
    assert "answered 404" in caplog.records[0].getMessage()
    # trtllm-serve's /metrics is JSON: the collector says where its Prometheus page is
    assert "/prometheus/metrics" in caplog.records[2].getMessage()
    # a 404 and junk name no engine; JSON says nothing yet, nor an engine not up (unreachable)
    assert sorted(set(named), key=str) == [(0, "sglang"), (1, None), (2, None)]
    for collector in (ok, *down):
        await collector.close()


async def test_engine_gauges_are_exposed_under_uniform_names(start_app: AppFactory) -> None:
    upstream = ScriptedUpstream({"default": Script(((0, LLAMACPP.encode()),))})
    collector = EngineCollector(await start_app(upstream.app()) + "/metrics", 0.05)
    telemetry = build_telemetry()
    register_engine(telemetry.meter, collector)
    register_status(telemetry.meter, [collector])
    text = generate_latest(telemetry.registry).decode()
    assert "llmobs_engine_requests_waiting{" not in text  # nothing before the first poll
    assert 'llmobs_collector_up{collector="engine"} 0.0' in text
    await poll(collector)
    text = generate_latest(telemetry.registry).decode()
    assert 'llmobs_engine_requests_waiting{engine="llamacpp"} 1.0' in text
    assert 'llmobs_engine_requests_running{engine="llamacpp"} 2.0' in text
    assert 'llmobs_engine_kv_cache_usage{engine="llamacpp"} 0.125' in text
    assert 'llmobs_collector_up{collector="engine"} 1.0' in text
    telemetry.shutdown()
    await collector.close()


async def test_lora_adapters_and_their_base_models(start_sim: SimFactory) -> None:
    """The engine's /v1/models, as vLLM lists LoRA adapters (each with its base model as
    ``parent``): one llmobs_model_info series each, to join adapters to their base."""
    sim = await start_sim(lora_adapters=("sql-lora", "chat-lora"))
    collector = EngineCollector(sim.url + "/metrics", 0.05, models_url=sim.url + "/v1/models")
    telemetry = build_telemetry()
    register_engine(telemetry.meter, collector)
    await poll(collector)
    assert collector.snapshot is not None
    base = sim.settings.model
    assert collector.snapshot.adapters == (("sql-lora", base), ("chat-lora", base))
    text = generate_latest(telemetry.registry).decode()
    assert f'llmobs_model_info{{base_model="{base}",gen_ai_request_model="sql-lora"}} 1.0' in text
    assert f'gen_ai_request_model="{base}"' not in text  # the base model is no adapter
    # no model list (or a broken one): no adapters, and the collector is up all the same
    collector.models_url = sim.url + "/nothing"
    await poll(collector)
    after: EngineReading | None = collector.snapshot
    assert collector.up and after is not None and not after.adapters
    telemetry.shutdown()
    await collector.close()


@pytest.mark.parametrize(
    "body",
    [b"", b"[]", b'{"data": {}}', b'{"data": [1, {"id": 2, "parent": "x"}, {"id": "a"}]}',
     b'{"data": [{"id": "a", "parent": "a"}, {"id": "b", "parent": ""}]}', b"\xff"],
)  # fmt: skip
def test_a_model_list_with_no_adapters_in_it(body: bytes) -> None:
    assert adapters_of(body) == ()


def test_adapters_are_bounded() -> None:
    cards = [{"id": f"lora-{i}", "parent": "base" * 100} for i in range(100)]
    found = adapters_of(json.dumps({"data": cards}).encode())
    assert len(found) == 64 and found[0] == ("lora-0", ("base" * 100)[:128])
    # a lone surrogate (a JSON escape the parser accepts) would break every /metrics render
    broken = b'{"data": [{"id": "a\\ud800", "parent": "b"}, {"id": "c", "parent": "b"}]}'
    assert adapters_of(broken) == (("c", "b"),)


async def test_the_prefix_cache_speculation_and_preemptions_uniform(start_sim: SimFactory) -> None:
    """The simulated engine counts them as vLLM does; the collector re-exports them under the
    uniform names, as counters (and SGLang's hit rate, a gauge, from its page)."""
    sim = await start_sim(decode_base=0.001, output_tokens_min=5, output_tokens_max=5,
                          spec_tokens=4, spec_acceptance=0.5)  # fmt: skip
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi there"}]}
    async with aiohttp.ClientSession() as session:
        for _ in range(2):  # the same prompt twice: the second finds it cached
            async with session.post(sim.url + "/v1/chat/completions", json=body) as r:
                await r.read()
    counters = sim.engine.counters
    assert counters.prefix_hits * 2 == counters.prefix_queries > 0
    assert counters.spec_drafted > 0 and counters.spec_accepted * 2 == counters.spec_drafted
    collector = EngineCollector(sim.url + "/metrics", 0.05)
    telemetry = build_telemetry()
    register_engine(telemetry.meter, collector)
    await poll(collector)
    reading = collector.snapshot
    assert reading is not None
    assert (reading.prefix_hits, reading.prefix_queries) == (
        counters.prefix_hits, counters.prefix_queries)  # fmt: skip
    assert (reading.spec_accepted, reading.spec_drafted) == (
        counters.spec_accepted, counters.spec_drafted)  # fmt: skip
    text = generate_latest(telemetry.registry).decode()
    assert (
        f'llmobs_engine_prefix_cache_hits_total{{engine="vllm"}} {counters.prefix_hits}.0' in text
    )
    assert (f'llmobs_engine_spec_decode_draft_tokens_total{{engine="vllm"}} '
            f"{counters.spec_drafted}.0") in text  # fmt: skip
    assert 'llmobs_engine_preemptions_total{engine="vllm"} 0.0' in text
    telemetry.shutdown()
    await collector.close()
    sglang = read_engine(SGLANG + 'sglang:cache_hit_rate{model_name="qwen",tp_rank="0"} 0.25\n')
    assert sglang is not None and sglang.prefix_hit_ratio == 0.25 and sglang.preemptions == 2.0
