"""The relay against scripted upstreams: bytes unchanged, headers, errors, outcomes."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import MutableMapping

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from llmobs.relay.headers import with_trace
from llmobs.relay.observing import NULL_OBSERVER, NullObserver
from tests.support.ports import port_of, refused_port
from tests.support.scripted import Script, ScriptedUpstream, chat_chunk, sse
from tests.support.servers import AppFactory, SidecarFactory, eventually

CHAT = "/v1/chat/completions"


async def fetch(
    url: str,
    body: object = None,
    headers: dict[str, str] | None = None,
    method: str = "POST",
    skip_auto: tuple[str, ...] = (),
) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession(auto_decompress=False, skip_auto_headers=skip_auto) as s,
        s.request(method, URL(url, encoded=True), json=body, headers=headers) as r,
    ):
        return r.status, dict(r.headers), await r.read()


STREAM = Script(
    steps=tuple(
        (0.002, piece)
        for piece in [
            b'data: {"id":"x","choices":[{"delta":{"role":"assistant"}}]}\n\n',
            *sse(chat_chunk(" Hello"), chat_chunk(" world")),
            b"data: [DO",
            b"NE]\n\n",
        ]
    ),
    headers=(("Content-Type", "text/event-stream"), ("X-Engine", "scripted")),
)


async def upstream_with(start_app: AppFactory, **scripts: Script) -> tuple[ScriptedUpstream, str]:
    up = ScriptedUpstream(dict(scripts))
    return up, await start_app(up.app())


async def test_streaming_body_and_headers_are_relayed_unchanged(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    _, url = await upstream_with(start_app, default=STREAM)
    side = await start_sidecar(url)
    direct = await fetch(url + CHAT, {"model": "m", "stream": True})
    proxied = await fetch(side.url + CHAT, {"model": "m", "stream": True})
    assert proxied[0] == direct[0] == 200
    assert proxied[2] == direct[2] == STREAM.body
    assert proxied[1]["Content-Type"] == "text/event-stream"
    assert proxied[1]["X-Engine"] == "scripted"
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", outcome="ok", status_class="2xx") == 1
    assert side.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output") == 2


async def test_non_streaming_and_gzip_bodies_are_relayed_verbatim(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 7}
    payload = json.dumps({"choices": [{"message": {"content": "hi"}}], "usage": usage}).encode()
    zipped = gzip.compress(b"x" * 10_000)
    _, url = await upstream_with(
        start_app,
        default=Script(((0, payload),), headers=(("Content-Type", "application/json"),),
                       content_length=True),
        gz=Script(((0, zipped[:100]), (0.01, zipped[100:])),
                  headers=(("Content-Type", "text/plain"), ("Content-Encoding", "gzip"))),
    )  # fmt: skip
    side = await start_sidecar(url)
    status, headers, body = await fetch(side.url + CHAT, {"model": "m"})
    assert (status, body) == (200, payload)
    assert headers["Content-Length"] == str(len(payload))
    status, headers, body = await fetch(side.url + "/x", headers={"X-Script": "gz"})
    assert headers["Content-Encoding"] == "gzip"
    assert body == zipped
    assert side.value("gen_ai_client_token_usage_sum", gen_ai_token_type="input") == 5
    assert side.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output") == 7


async def test_request_is_forwarded_unchanged_with_forwarding_headers(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    up, url = await upstream_with(start_app)
    side = await start_sidecar(url)
    big = {"model": "m", "messages": [{"role": "user", "content": "y" * 300_000}]}
    status, _, _ = await fetch(
        side.url + "/v1/chat/completions?a=%2F&b=1",
        big,
        headers={
            "Authorization": "Bearer k",
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "1",
            "X-Forwarded-For": "203.0.113.7",
        },
        skip_auto=("Accept-Encoding", "User-Agent", "Accept"),
    )
    assert status == 200
    got = up.received[-1]
    assert got.path_qs == "/v1/chat/completions?a=%2F&b=1"
    assert json.loads(got.body) == big
    assert got.headers["Authorization"] == "Bearer k"  # the engine's auth is the engine's
    assert "X-Hop" not in got.headers
    assert got.headers["X-Forwarded-For"] == "203.0.113.7, 127.0.0.1"
    assert got.headers["X-Forwarded-Proto"] == "http"
    assert got.headers["Content-Length"] == str(len(got.body))
    # nothing the client did not send: no Accept-Encoding, User-Agent or Accept of our own
    assert not {"Accept-Encoding", "User-Agent", "Accept"} & set(got.headers)
    # and no Content-Type where the client sent none
    async with (
        aiohttp.ClientSession(skip_auto_headers=("Content-Type",)) as s,
        s.put(side.url + "/raw", data=b"\x00\x01") as r,
    ):
        assert r.status == 200
    assert up.received[-1].body == b"\x00\x01"
    assert "Content-Type" not in up.received[-1].headers


async def test_every_method_and_path_is_forwarded_including_metrics(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    up, url = await upstream_with(start_app)
    side = await start_sidecar(url)
    for method in ("GET", "PUT", "DELETE", "PATCH"):
        status, _, body = await fetch(side.url + "/metrics", method=method)
        assert status == 200
        assert json.loads(body)["path"] == "/metrics"
    assert [r.method for r in up.received] == ["GET", "PUT", "DELETE", "PATCH"]
    assert side.value("llmobs_requests_total", gen_ai_operation_name="other") == 4


async def test_oversized_body_is_rejected_with_413(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    up, url = await upstream_with(start_app)
    side = await start_sidecar(url, max_body_bytes=1000)
    status, _, body = await fetch(side.url + CHAT, {"x": "z" * 2000})
    assert status == 413
    assert json.loads(body)["error"]["type"] == "request_too_large"

    async def chunked() -> object:
        for _ in range(10):
            yield b"z" * 500

    async with aiohttp.ClientSession() as s, s.post(side.url + CHAT, data=chunked()) as r:
        assert r.status == 413
    assert side.value("llmobs_requests_total", outcome="rejected") == 2
    assert up.received == []


async def test_upstream_down_gives_json_502_and_the_sidecar_keeps_serving(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    with refused_port() as engine:  # held: no other socket can take its port meanwhile
        side = await start_sidecar(f"http://127.0.0.1:{port_of(engine)}", connect_timeout=1.0)
        status, headers, body = await fetch(side.url + CHAT, {"model": "m", "stream": True})
        assert status == 502
        assert headers["Content-Type"].startswith("application/json")
        error = json.loads(body)["error"]
        assert error["type"] == "upstream_error"
        assert "message" in error
        async with aiohttp.ClientSession() as s:
            async with s.get(side.metrics_url + "/readyz") as r:
                assert r.status == 503
            async with s.get(side.metrics_url + "/healthz") as r:
                assert r.status == 200
        # The engine comes up on that port: the same sidecar now relays.
        up = ScriptedUpstream({"default": STREAM})
        runner = web.AppRunner(up.app())
        await runner.setup()
        await web.SockSite(runner, engine).start()  # listening now, on the same socket
        try:
            status, _, body = await fetch(side.url + CHAT, {"model": "m", "stream": True})
            assert (status, body) == (200, STREAM.body)
            async with aiohttp.ClientSession() as s, s.get(side.metrics_url + "/readyz") as r:
                assert r.status == 200
        finally:
            await runner.cleanup()
    assert side.value("llmobs_requests_total", outcome="upstream_error", status_class="5xx") == 1
    assert side.value("llmobs_requests_total", outcome="ok") == 1
    assert side.value("llmobs_prefill_queue_depth") == 0


async def test_upstream_http_errors_pass_through_unchanged(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    err = b'{"error":{"message":"no such model","type":"invalid_request_error"}}'
    _, url = await upstream_with(
        start_app,
        e400=Script(((0, err),), status=400, headers=(("Content-Type", "application/json"),)),
        e503=Script(((0, b"overloaded"),), status=503, headers=(("Content-Type", "text/plain"),)),
    )
    side = await start_sidecar(url)
    status, _, body = await fetch(side.url + CHAT, {}, {"X-Script": "e400"})
    assert (status, body) == (400, err)
    status, _, body = await fetch(side.url + CHAT, {}, {"X-Script": "e503"})
    assert (status, body) == (503, b"overloaded")
    assert side.value("llmobs_requests_total", outcome="ok", status_class="4xx") == 1
    assert side.value("llmobs_requests_total", outcome="upstream_error", status_class="5xx") == 1


async def test_timeout_before_headers_is_a_json_504(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    _, url = await upstream_with(start_app, slow=Script(header_delay=2.0))
    side = await start_sidecar(url, read_timeout=0.3)
    status, _, body = await fetch(side.url + CHAT, {"stream": True}, {"X-Script": "slow"})
    assert status == 504
    assert json.loads(body)["error"]["type"] == "upstream_timeout"
    assert side.value("llmobs_requests_total", outcome="upstream_timeout") == 1


async def test_the_read_timeout_holds_request_after_request_on_a_pooled_connection(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    """The read-timeout timer outlives a request on its connection: idle in the pool longer
    than the timeout, the connection then carries a slow stream (gaps under the timeout: no
    504) and then a stalled one (a 504, soon after the timeout). Each gap is far from the
    timeout: a busy machine's late token is no 504."""
    slow = Script(steps=tuple((0.1, b) for b in sse(*(chat_chunk(" a") for _ in range(12)))))
    _, url = await upstream_with(
        start_app, slow=slow, stall=Script(header_delay=5.0), default=Script()
    )
    side = await start_sidecar(url, read_timeout=0.8)
    assert (await fetch(side.url + CHAT, {"stream": True}, {}))[0] == 200
    await asyncio.sleep(1.0)  # idle, pooled: the timer fires with nothing to watch
    status, _, body = await fetch(side.url + CHAT, {"stream": True}, {"X-Script": "slow"})
    assert (status, body) == (200, slow.body)  # 1.3 s in all, no gap of 0.8
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert (await fetch(side.url + CHAT, {"stream": True}, {"X-Script": "stall"}))[0] == 504
    assert 0.75 < loop.time() - start < 4.0
    assert side.value("llmobs_requests_total", outcome="ok") == 2
    assert side.value("llmobs_requests_total", outcome="upstream_timeout") == 1


@pytest.mark.parametrize(("end", "outcome"), [("reset", "upstream_error"),
                                               ("hang", "upstream_timeout")])  # fmt: skip
async def test_upstream_failure_mid_stream_truncates_the_client_stream(
    start_app: AppFactory, start_sidecar: SidecarFactory, end: str, outcome: str
) -> None:
    script = Script(steps=tuple((0.01, b) for b in sse(chat_chunk(" a"), chat_chunk(" b"))),
                    end=end)  # fmt: skip
    _, url = await upstream_with(start_app, default=script)
    side = await start_sidecar(url, read_timeout=0.5)
    received = b""
    async with aiohttp.ClientSession() as s, s.post(side.url + CHAT, json={"stream": True}) as r:
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):  # noqa: PT012 - the read loop is the act
            async for chunk in r.content.iter_any():
                received += chunk
    assert received == script.body  # everything sent before the failure arrived
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", outcome=outcome) == 1
    assert side.value("llmobs_requests_total") == 1


async def test_malformed_sse_is_relayed_unchanged_and_counted(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    bad = (
        b"data: {not json}\n\n"
        b'{"naked": "json line"}\n\n'
        + sse(chat_chunk(" ok"))[0]
        + b"data: \xff\xfe invalid utf-8\n\n"
        + b"data: [DONE]\n\n"
    )
    _, url = await upstream_with(start_app, default=Script(((0, bad[:7]), (0.01, bad[7:]))))
    side = await start_sidecar(url)
    status, _, body = await fetch(side.url + CHAT, {"stream": True})
    assert (status, body) == (200, bad)
    assert side.value("llmobs_stream_malformed_events_total") == 3
    assert side.value("llmobs_requests_total", outcome="ok") == 1
    assert side.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output") == 1
    assert side.value("llmobs_observer_errors_total") == 0


async def test_client_disconnect_closes_the_upstream_request(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    script = Script(steps=tuple((0.05, b) for b in sse(*[chat_chunk(" t")] * 100)))
    up, url = await upstream_with(start_app, default=script)
    side = await start_sidecar(url)
    async with aiohttp.ClientSession() as s, s.post(side.url + CHAT, json={"stream": True}) as r:
        await r.content.readline()
        # leaving the block without reading on closes the connection
    for _ in range(50):
        if up.disconnected:
            break
        await asyncio.sleep(0.02)
    assert up.disconnected == 1
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", outcome="client_disconnect") == 1
    assert side.value("llmobs_requests_active") == 0


async def test_client_leaving_before_response_headers_cancels_the_upstream_request(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    up, url = await upstream_with(start_app, default=Script(STREAM.steps, header_delay=2.0))
    side = await start_sidecar(url)
    async with aiohttp.ClientSession() as s:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(s.post(side.url + CHAT, json={"stream": True}), 0.3)
    await eventually(lambda: up.disconnected == 1)
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", outcome="client_disconnect") == 1
    assert side.value("llmobs_prefill_queue_depth") == 0
    assert side.value("llmobs_requests_active") == 0


async def test_json_body_without_json_content_type_is_still_read_on_llm_paths(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    _, url = await upstream_with(start_app, default=STREAM)
    side = await start_sidecar(url)
    form = {"Content-Type": "application/x-www-form-urlencoded"}  # what `curl -d` sends
    body = b'{"model":"m1","stream":true}'
    async with aiohttp.ClientSession() as s, s.post(side.url + CHAT, data=body, headers=form) as r:
        assert await r.read() == STREAM.body
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", gen_ai_request_model="m1") == 1


def test_the_trace_context_replaces_the_clients_rather_than_adding_to_it() -> None:
    """The upstream request carries one ``traceparent``: the sidecar's, whatever the case of
    the client's own; other headers keep their order."""

    class Tracing(NullObserver):
        def inject(self, headers: MutableMapping[str, str]) -> None:
            headers["traceparent"] = "00-ours-01"

    sent = [("Accept", "*/*"), ("Traceparent", "00-theirs-01"), ("X-A", "1")]
    assert with_trace(Tracing(), sent) == [
        ("Accept", "*/*"),
        ("X-A", "1"),
        ("traceparent", "00-ours-01"),
    ]
    assert with_trace(NULL_OBSERVER, sent) is sent  # not tracing: the list as it was
