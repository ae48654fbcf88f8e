"""Where both reports read their figures: a sidecar's /metrics over HTTP (counts since it
started) or a Prometheus server's query API over a window (every sidecar it scrapes, summed).

One reading for ``llmobs slo`` and ``llmobs why``: a ``Source`` gives the samples of the
families a report asks for, or raises ``CannotJudge`` with one sentence saying where and what
to do (unreachable, a token missing or refused, an answer that is not metrics, an engine's
page instead of a sidecar's). urllib: a CLI, no event loop.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from llmobs.config.options import ConfigError
from llmobs.tools.slo.samples import Sample, page_samples

TOKEN_ENV = "LLMOBS_METRICS_TOKEN"  # the sidecar's own variable for it (``serve``)
_SIDECAR_FIX = "check that the sidecar is up and that --metrics-url is its /metrics"
_PROMETHEUS_FIX = (
    "check that Prometheus is up and that --prometheus is its base URL (http://prometheus:9090)"
)


class CannotJudge(Exception):
    """Nothing to judge by: the source unreachable, refused, not metrics, or no request judged
    (exit 2). The message says where and what to do."""


@dataclass(frozen=True)
class Source:
    """What the flags name: a sidecar's /metrics (no ``window``), or a Prometheus's base URL
    and the ``window`` up to ``end`` (unix seconds; None: now)."""

    url: str
    token: str = ""
    window: str = ""
    end: float | None = None

    @property
    def sidecar(self) -> bool:
        return not self.window

    def __str__(self) -> str:
        return self.url if self.sidecar else f"{self.url}, the last {self.window}"

    def read(self, queries: Mapping[str, str]) -> list[Sample]:
        """The samples of ``queries`` (family name -> PromQL over ``window``): from a sidecar,
        its samples of those names; from Prometheus, each query's answer."""
        if self.sidecar:
            return read_page(self.url, self.token, queries.keys())
        return query_prometheus(self.url, queries, self.end)


@dataclass(frozen=True)
class _Answer:
    status: int
    reason: str
    body: bytes


def _why(url: str, exc: BaseException, timeout: float) -> str:
    """Why ``url`` gave no answer, for people."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return f"nothing is listening at {url} (connection refused)"
    if isinstance(reason, TimeoutError):
        return f"{url} did not answer within {timeout:g} s"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve the host of {url} ({reason.strerror})"
    return f"cannot read {url} ({reason or type(reason).__name__})"


def _get(url: str, headers: Mapping[str, str], timeout: float, fix: str, name: str = "") -> _Answer:
    """GET ``url``: its answer, whatever its status; no answer at all is ``CannotJudge``
    naming ``name`` (default: the URL) and saying what to do (``fix``)."""
    request = urllib.request.Request(url, headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return _Answer(response.status, str(response.reason), response.read())
    except urllib.error.HTTPError as exc:  # a status other than 2xx: an answer too
        with exc:
            return _Answer(exc.code, str(exc.reason), _rest(exc))
    except (OSError, http.client.HTTPException) as exc:
        raise CannotJudge(f"{_why(name or url, exc, timeout)}: {fix}") from None


def _rest(response: urllib.error.HTTPError) -> bytes:
    """The body of an answer that is not a 2xx (Prometheus says there why it refused)."""
    try:
        return response.read()
    except (OSError, http.client.HTTPException):
        return b""


def check_url(flag: str, url: str) -> None:
    """An http(s) URL, or a ``ConfigError`` naming ``flag``."""
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018 (a port that is not a number raises)
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{flag}: expected an http(s) URL, got {url!r}")


def fetch_metrics(url: str, token: str = "", timeout: float = 10.0) -> str:
    """A sidecar's /metrics text; ``CannotJudge`` when it cannot be read."""
    headers = {"Accept": "text/plain"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    answer = _get(url, headers, timeout, _SIDECAR_FIX)
    if answer.status in (401, 403) and not token:
        raise CannotJudge(
            f"{url} requires a metrics token (HTTP {answer.status}): pass the sidecar's token "
            f"to llmobs slo with --metrics-token or {TOKEN_ENV}"
        )
    if answer.status in (401, 403):
        raise CannotJudge(
            f"{url} refused the metrics token given (HTTP {answer.status}): pass the one the "
            f"sidecar was started with, with --metrics-token or {TOKEN_ENV}"
        )
    if not 200 <= answer.status < 300:
        raise CannotJudge(
            f"{url} answered HTTP {answer.status} {answer.reason}: point --metrics-url at a "
            "sidecar's /metrics (on its --metrics-port)"
        )
    try:
        return answer.body.decode("utf-8")
    except UnicodeDecodeError:
        raise CannotJudge(_not_metrics(url)) from None


def _not_metrics(url: str) -> str:
    return (
        f"{url} answered with something that is not a Prometheus metrics page: point "
        "--metrics-url at a sidecar's /metrics (on its --metrics-port)"
    )


def read_page(url: str, token: str, names: Collection[str], timeout: float = 10.0) -> list[Sample]:
    """The samples named in ``names`` of a sidecar's /metrics: the one check, for both
    commands, that it is a sidecar's (an engine's page, passed through the proxy's port,
    has no llmobs series); ``CannotJudge`` when it cannot be read or is not one."""
    text = fetch_metrics(url, token, timeout)
    try:
        samples, ours = page_samples(text, names)
    except ValueError:  # the parser's word for a line that is not exposition format
        raise CannotJudge(_not_metrics(url)) from None
    if not ours:
        raise CannotJudge(
            f"{url} is not an llmobs sidecar's /metrics (no llmobs_ series): point "
            "--metrics-url at the sidecar's --metrics-port, not the engine's"
        )
    return samples


def _vector(base: str, answer: _Answer, query: str) -> list[tuple[dict[str, str], float]]:
    """The samples of a Prometheus instant query's answer; ``CannotJudge`` when it is an
    error or not the query API's."""
    try:
        data: Any = json.loads(answer.body)
        if data["status"] != "success":
            raise CannotJudge(
                f"Prometheus at {base} refused the query {query!r} (HTTP {answer.status}): "
                f"{data.get('error')}; check --range and --end"
            )
        return [(s["metric"], float(s["value"][1])) for s in data["data"]["result"]]
    except (ValueError, TypeError, KeyError, IndexError):
        raise CannotJudge(
            f"{base} answered HTTP {answer.status} {answer.reason}, not as Prometheus's query "
            f"API: {_PROMETHEUS_FIX}"
        ) from None


def query_prometheus(
    base: str, queries: Mapping[str, str], end: float | None = None, timeout: float = 30.0
) -> list[Sample]:
    """The answers to ``queries`` (family name -> PromQL) at ``end`` (unix seconds; None:
    now), each sample under its family's name; ``CannotJudge`` when Prometheus cannot
    answer."""
    out: list[Sample] = []
    for name, query in queries.items():
        params = {"query": query}
        if end is not None:
            params["time"] = f"{end:.3f}"
        url = f"{base.rstrip('/')}/api/v1/query?{urllib.parse.urlencode(params)}"
        answer = _get(url, {"Accept": "application/json"}, timeout, _PROMETHEUS_FIX, base)
        out.extend((name, labels, value) for labels, value in _vector(base, answer, query))
    return out
