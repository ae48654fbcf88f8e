"""The sim's dialects together (``sim.dialects``): the names a user types, the routes each
serves (and only those under ``--dialect``), each named as the sidecar names it, and the one
engine showing through every one of them over real loopback HTTP: its schedule, its
cancellation, its failures and its output.

Each dialect is only a renderer over the same engine, so the same schedule must show through
every one; the bounds are those of tests/unit/sim/test_engine.py (never early, a little late).
What each dialect writes: the test module of its name beside this one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from llmobs.observe.dialects import route_for_path
from llmobs.sim.dialects import ALL, DIALECTS, dialect_name, endpoints_for
from tests.support.servers import SimFactory, eventually
from tests.support.sim import assert_near, assert_on_schedule, gaps
from tests.support.sim_streams import (
    FAST,
    MESSAGES,
    SCHEDULE,
    STREAMS,
    collect,
    reported_tokens,
    token_frames,
    token_text,
)

# A valid non-streamed body for every route, for the routing tests.
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": MESSAGES},
    "/v1/completions": {"prompt": "hi"},
    "/api/generate": {"prompt": "hi", "stream": False},
    "/api/chat": {"messages": MESSAGES, "stream": False},
    "/generate_stream": {"inputs": "hi"},
    "/generate": {"inputs": "hi"},
    "/": {"inputs": "hi"},
    "/v1/messages": {"max_tokens": 9, "messages": MESSAGES},
    "/v1/responses": {"input": "hi"},
    "/v2/models/{model}/generate_stream": {"text_input": "hi"},
    "/v2/models/{model}/generate": {"text_input": "hi"},
    "/v2/models/{model}/versions/{version:[0-9]+}/generate_stream": {"text_input": "hi"},
    "/v2/models/{model}/versions/{version:[0-9]+}/generate": {"text_input": "hi"},
}


def url_of(route: str) -> str:
    """A path the route answers (Triton's name their model and version)."""
    return route.replace("{model}", "m").replace("{version:[0-9]+}", "2")


# --- names and routes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "name"),
    [
        ("openai", "openai"),
        (" TGI ", "tgi"),
        ("Anthropic\n", "anthropic"),
        ("responses", "openai-responses"),  # the name earlier versions took
        (" Responses", "openai-responses"),
        ("openai-responses", "openai-responses"),
        ("all", ALL),
        ("grpc", "grpc"),  # not a dialect: left for the settings to refuse, naming the flag
    ],
)
def test_a_dialect_as_typed_is_the_name_spans_give_it(typed: str, name: str) -> None:
    assert dialect_name(typed) == name


def test_all_serves_every_dialects_routes_and_one_serves_its_own() -> None:
    every = endpoints_for(ALL)
    assert every == tuple(e for api in DIALECTS.values() for e in api.endpoints)
    assert len({e.path for e in every}) == len(every) == len(BODIES)  # no route served twice
    assert [e.path for e in endpoints_for("tgi")] == ["/generate_stream", "/generate", "/"]
    assert [e.path for e in endpoints_for("anthropic")] == ["/v1/messages"]
    with pytest.raises(KeyError):
        endpoints_for("grpc")


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_every_route_is_one_the_sidecar_reads_in_the_same_dialect(dialect: str) -> None:
    """The sim and the sidecar say the same word for the same API, so a test can tell from
    a span which of the sim's dialects answered; TGI's ``POST /`` (huggingface_hub's
    compatibility route) is the one the sidecar cannot tell from any other path."""
    for endpoint in DIALECTS[dialect].endpoints:
        route = route_for_path(url_of(endpoint.path))
        assert route.name == ("none" if endpoint.path == "/" else dialect), endpoint.path


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_each_dialects_client_request_is_a_route_it_serves(dialect: str) -> None:
    """What the traffic tool sends in a dialect (its routing by the sidecar:
    tests/unit/tools/test_traffic.py) is answered by the sim in that dialect."""
    api = DIALECTS[dialect]
    served = {url_of(e.path) for e in api.endpoints}
    for chat in (True, False):
        path, _ = api.request("m", "hi", 5, chat)
        assert path in served, path


# --- over loopback: the one engine in every dialect -----------------------------------------


@pytest.mark.parametrize("dialect", list(STREAMS))
async def test_timing_follows_the_schedule_in_every_dialect(
    start_sim: SimFactory, http: aiohttp.ClientSession, dialect: str
) -> None:
    sim = await start_sim(**SCHEDULE, output_tokens_min=15, output_tokens_max=15)
    path, body = STREAMS[dialect]
    frames = await collect(http, sim.url + path, body)

    tokens = token_frames(dialect, frames)
    count = 16 if dialect == "tgi" else 15  # TGI's EOS takes a decode step of its own
    assert len(tokens) == count
    text = "".join(token_text(dialect, f) for f in tokens).removesuffix("</s>")
    assert len(text.split()) == 15 == reported_tokens(dialect, frames)
    times = [f.at for f in tokens]
    assert_on_schedule(times, [0.1 + 0.02 * i for i in range(count)])
    assert_near(times[0], 0.1)  # TTFT: one prefill step
    assert_near(sorted(gaps(times))[len(times) // 2], 0.02)  # ITL: one decode step
    # Anthropic and Responses open the stream on acceptance, before prefill ends.
    preamble = [f.event for f in frames if f.at < times[0] - 0.05]
    assert len(preamble) == {"anthropic": 3, "openai-responses": 2}.get(dialect, 0), preamble
    if dialect == "ollama":
        final = frames[-1].data
        assert abs(final["prompt_eval_duration"] - 100_000_000) <= 1_000
        assert abs(final["eval_duration"] - 14 * 20_000_000) <= 1_000


@pytest.mark.parametrize("dialect", [*STREAMS, "openai-n2"])
async def test_disconnect_cancels_in_the_engine(
    start_sim: SimFactory, http: aiohttp.ClientSession, dialect: str
) -> None:
    sim = await start_sim(
        **{**FAST, "decode_base": 0.01}, output_tokens_min=300, output_tokens_max=300
    )
    path, body = STREAMS[dialect.removesuffix("-n2")]
    choices = 2 if dialect.endswith("-n2") else 1
    extra = {"n": choices} if choices > 1 else {}
    await collect(http, sim.url + path, {**body, **extra}, limit=6)

    await eventually(lambda: sim.engine.counters.cancelled == choices)
    counters = sim.engine.counters
    assert (counters.running, counters.waiting, counters.completed) == (0, 0, 0)
    assert counters.generation_tokens < 50


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_dialect_setting_serves_only_its_routes(
    start_sim: SimFactory, http: aiohttp.ClientSession, dialect: str
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=2, output_tokens_max=2, dialect=dialect)
    own = {e.path for e in DIALECTS[dialect].endpoints}
    assert set(BODIES) == {e.path for api in DIALECTS.values() for e in api.endpoints}
    for path, body in BODIES.items():
        async with http.post(sim.url + url_of(path), json=body) as resp:
            await resp.read()
            assert resp.status == (200 if path in own else 404), (path, resp.status)
    for path in ("/health", "/v1/models", "/metrics"):
        async with http.get(sim.url + path) as resp:
            assert resp.status == 200


@pytest.mark.parametrize(
    ("dialect", "check"),
    [
        ("openai", lambda e: e["error"]["type"] == "internal_server_error"),
        ("ollama", lambda e: e == {"error": "simulated engine failure"}),
        ("tgi", lambda e: e["error_type"] == "generation"),
        ("anthropic", lambda e: e["type"] == "error" and e["error"]["type"] == "api_error"),
        ("openai-responses", lambda e: e["error"]["code"] == 500),
        ("triton", lambda e: e == {"error": "simulated engine failure"}),
    ],
)
async def test_error_rate_answers_500_in_each_dialect(
    start_sim: SimFactory,
    http: aiohttp.ClientSession,
    dialect: str,
    check: Callable[[Any], bool],
) -> None:
    sim = await start_sim(**FAST, error_rate=1.0)
    path, body = STREAMS[dialect]
    async with http.post(sim.url + path, json=body) as resp:
        assert resp.status == 500
        assert check(await resp.json())
    assert sim.engine.counters.errors == 1


async def test_one_engine_one_output_whatever_the_dialect(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST)
    requests: dict[str, tuple[dict[str, Any], Callable[[Any], str]]] = {
        "/v1/completions": ({"prompt": "hi", "seed": 9}, lambda r: r["choices"][0]["text"]),
        "/api/generate": (
            {"prompt": "hi", "stream": False, "options": {"seed": 9}},
            lambda r: r["response"],
        ),
        "/generate": ({"inputs": "hi", "parameters": {"seed": 9}}, lambda r: r["generated_text"]),
    }
    texts = []
    for path, (body, text) in requests.items():
        async with http.post(sim.url + path, json=body) as resp:
            texts.append(text(await resp.json()))
    assert len(set(texts)) == 1
    assert len(texts[0].split()) >= 32
