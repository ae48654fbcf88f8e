"""The provider name: the operator's, else the engine its metrics name, else the engine whose
own API the requests speak (once the metrics have named none), else unknown; settled once.
(The switch to the newest GenAI conventions, and the name's checks: ``tests/unit/config/``.)"""

from __future__ import annotations

from llmobs.collectors.engine import PROVIDERS
from llmobs.export.metrics.catalogue import DURATION
from llmobs.export.metrics.series import HistogramFamily
from llmobs.observe.dialects import OLLAMA_CHAT
from llmobs.observe.observer import Observer, ObserveSettings
from llmobs.observe.provider import Provider
from llmobs.observe.timing import Outcome, RequestStats, TokenSource
from tests.support.recording import record_request, recording


def test_the_operators_name_is_final() -> None:
    provider = Provider("openai")
    provider.engine("vllm")
    provider.dialect("ollama")
    assert (provider.name, provider.settled) == ("openai", True)


def test_the_engines_metrics_name_it_and_it_never_changes_again() -> None:
    seen: list[str] = []
    provider = Provider()
    provider.subscribe(seen.append)
    assert (provider.name, provider.settled) == ("unknown", False)
    provider.dialect("ollama")  # the collector has not answered yet: not taken
    assert provider.name == "unknown"
    provider.engine("llama_cpp")
    provider.engine("vllm")
    provider.dialect("tgi")
    assert (provider.name, seen) == ("llama_cpp", ["llama_cpp"])


def test_every_engine_the_collector_knows_has_a_provider_name() -> None:
    assert PROVIDERS == {"vllm": "vllm", "sglang": "sglang", "tgi": "tgi",
                         "llamacpp": "llama_cpp", "trtllm": "tensorrt_llm",
                         "triton": "triton"}  # fmt: skip
    provider = Provider()
    provider.engine("dynamo")  # one a later collector might name: as it names it
    assert provider.name == "dynamo"


def test_an_api_only_one_engine_speaks_names_it_when_metrics_do_not() -> None:
    provider = Provider()
    provider.engine(None)  # the engine's /metrics: a 404, or no engine's names
    provider.dialect("openai")  # every engine speaks it: says nothing
    provider.dialect("tgi")  # SGLang serves /generate too
    assert provider.name == "unknown"
    provider.dialect("triton")
    assert provider.name == "triton"
    no_collector = Provider(engine_metrics=False)
    no_collector.dialect("ollama")
    assert no_collector.name == "ollama"


def _request(model: str = "m") -> RequestStats:
    return RequestStats(
        "chat", model, Outcome.OK, 200, True, 1.0, 0.1, 0.01, 5, 10, TokenSource.USAGE, 10,
        9.0, 0.09, 0.001, 0.02, 0, 1.0,
    )  # fmt: skip


def test_a_sink_counts_under_the_provider_from_when_it_is_known() -> None:
    sink, recorder = recording(None, 4)
    record_request(recorder, _request())
    sink.set_provider("vllm")
    record_request(recorder, _request())
    record_request(recorder, _request("n"))
    durations = sink.families[DURATION]
    assert isinstance(durations, HistogramFamily)
    counts = {key: sum(series[:-1]) for key, series in durations.series.items()}
    assert counts == {("chat", "m", "unknown"): 1, ("chat", "m", "vllm"): 1,
                      ("chat", "n", "vllm"): 1}  # fmt: skip


def test_only_a_request_the_engine_answered_names_it() -> None:
    """A client's request alone says nothing: an Ollama path the engine refused (a 404 from
    another engine, a probe) leaves it unknown; one it answered with a 2xx names it."""
    provider = Provider(engine_metrics=False)
    sink, recorder = recording(None, 4)
    provider.subscribe(sink.set_provider)
    settings = ObserveSettings(provider=provider)
    for status in (404, 500, 200):
        observer = Observer(recorder, settings, OLLAMA_CHAT, 0)
        observer.request_body(b'{"model": "m"}')
        observer.response(status, "application/x-ndjson")
        assert provider.name == ("ollama" if status == 200 else "unknown")
    assert sink.provider == "ollama"
