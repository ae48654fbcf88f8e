"""Which headers cross the relay: what goes upstream, what comes back to the client.

A reverse proxy's header rules in one place (RFC 9110 section 7.6.1): hop-by-hop headers
and those ``Connection`` names stop here; ``X-Forwarded-For``/``-Proto`` and a trace context
are added upstream; nothing else is added (``upstream`` writes ``Host`` and the framing anew).
"""

from __future__ import annotations

from collections.abc import Iterable

from llmobs.relay.observing import RequestObserver
from llmobs.wire.server import Request

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)


def filter_headers(
    fields: Iterable[tuple[str, str]], drop: frozenset[str] = HOP_BY_HOP
) -> list[tuple[str, str]]:
    """``fields`` minus those named in ``drop`` (lower case; hop-by-hop ones at least) and
    those the ``Connection`` header names. One pass over the list the parser kept."""
    out: list[tuple[str, str]] = []
    named: set[str] | None = None
    for key, value in fields:
        lower = key.lower()
        if lower in drop:
            if lower == "connection":
                tokens = {token.strip().lower() for token in value.split(",")}
                named = tokens if named is None else named | tokens
            continue
        out.append((key, value))
    if named:
        out = [(key, value) for key, value in out if key.lower() not in named]
    return out


# not forwarded upstream besides the hop-by-hop ones: ``Host`` and the framing (written anew),
# ``Expect`` (the sidecar answered it), ``X-Forwarded-For`` (extended, below)
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "expect", "x-forwarded-for"}
# not passed on to the client: the framing is the client's response's own
NOT_RETURNED = HOP_BY_HOP | {"content-length"}


def upstream_headers(request: Request, grpc: bool = False) -> list[tuple[str, str]]:
    """Headers to send upstream: the client's, minus hop-by-hop ones, ``Host``, ``Expect``
    (the sidecar answered it) and the framing, plus ``X-Forwarded-For``/``-Proto``. A gRPC
    request keeps ``TE: trailers``: HTTP/2 allows it, and gRPC servers require it."""
    headers = request.headers
    out = filter_headers(request.head.fields, _NOT_FORWARDED)
    if grpc:
        out.append(("te", "trailers"))
    chain = [v for v in headers.getall("X-Forwarded-For", ()) if v.strip()]
    if request.remote:
        chain.append(request.remote)
    if chain:
        out.append(("X-Forwarded-For", ", ".join(chain)))
    if "X-Forwarded-Proto" not in headers or not any(
        k.lower() == "x-forwarded-proto" for k, _ in out
    ):
        out.append(("X-Forwarded-Proto", request.scheme))
    return out


def with_trace(obs: RequestObserver, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` with the trace context the observer injects (``traceparent`` ...), which
    replaces any the client sent under the same names."""
    carrier: dict[str, str] = {}
    obs.inject(carrier)
    if not carrier:
        return headers
    names = {name.lower() for name in carrier}
    return [(k, v) for k, v in headers if k.lower() not in names] + list(carrier.items())
