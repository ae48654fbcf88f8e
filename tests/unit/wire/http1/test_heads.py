"""HTTP/1.1 heads (``http1.heads``): an engine's responses and a client's requests, parsed
strictly where two parsers could disagree; any input parses or is refused with its status."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmobs.wire.http1 import (
    MAX_REQUEST_HEADERS,
    BadRequest,
    ProtocolError,
    RequestHead,
    climbs_above_root,
    keep_alive,
    parse_request_head,
    parse_response_head,
    request_body_decoder,
    request_keep_alive,
)


def test_head_is_parsed_with_repeated_headers_and_case_kept() -> None:
    head = parse_response_head(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nSet-Cookie: a=1\r\n"
        b"Set-Cookie: b=2\r\nX-Empty:\r\nx-request-id:  abc  "
    )
    assert (head.version, head.status, head.reason) == ((1, 1), 200, "OK")
    assert head.headers.getall("set-cookie") == ["a=1", "b=2"]
    assert head.headers["X-Empty"] == ""
    assert head.headers["X-Request-Id"] == "abc"
    assert next(iter(head.headers)) == "Content-Type"  # the engine's spelling is relayed
    assert keep_alive(head.version, head.headers)


@pytest.mark.parametrize(
    ("raw", "keep"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close", False),
        (b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Upgrade", True),
        (b"HTTP/1.0 200 OK", False),
        (b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive", True),
    ],
)
def test_keep_alive_follows_version_and_connection(raw: bytes, keep: bool) -> None:
    head = parse_response_head(raw)
    assert keep_alive(head.version, head.headers) is keep


@pytest.mark.parametrize(
    "raw",
    [
        b"SSH-2.0-OpenSSH_9.0",
        b"HTTP/2 200",
        b"HTTP/1.1 2000 OK",
        b"HTTP/1.1 OK",
        b"HTTP/1.1 200 OK\r\nno colon here",
        b"HTTP/1.1 200 OK\r\n folded: continuation",
        b"HTTP/1.1 200 OK\r\n\tfolded: continuation",
        b"HTTP/1.1 200 OK\r\nBad Name : x",
        b"HTTP/1.1 200 OK\r\nX-A: a\rSet-Cookie: inj=1",  # a bare CR inside a value
        b"HTTP/1.1 200 OK\r\nX-A: a\x00b",  # a NUL inside a value
        b"HTTP/1.1 200 OK\r\nX A: b",  # a space inside a name
        b"HTTP/1.1 200 OK\r\nX(A): b",  # a name that is not a token
        b"HTTP/1.1 200 OK\r\nX-\xc9: b",
        b"HTTP/1.1 200 O\rK",  # a bare CR inside the reason phrase
        b"HTTP/1.1 200 O\x00K",
    ],
)
def test_garbage_heads_are_protocol_errors(raw: bytes) -> None:
    """Every header goes on to the client as the engine wrote it: one that would split the
    client's response (a bare CR, a NUL) or that is no header at all is refused (nginx: 502)."""
    with pytest.raises(ProtocolError):
        parse_response_head(raw)


def test_status_without_reason_is_accepted() -> None:
    head = parse_response_head(b"HTTP/1.1 204\r\n")
    assert (head.status, head.reason) == (204, "")


# -- the client leg: request heads and request body framing ---------------------------------


def request_head(*lines: bytes) -> RequestHead:
    return parse_request_head(b"\r\n".join(lines))


def test_a_request_head_is_parsed_with_order_duplicates_and_spelling_kept() -> None:
    head = request_head(
        b"POST /v1/chat/completions?stream=1 HTTP/1.1",
        b"Host: 127.0.0.1:8000",
        b"X-Tag: a",
        b"content-type:application/json",
        b"x-tag:  b \t",
        b"X-Empty:",
    )
    assert (head.method, head.target, head.version) == (
        "POST",
        "/v1/chat/completions?stream=1",
        (1, 1),
    )
    assert list(head.headers.items()) == [
        ("Host", "127.0.0.1:8000"),
        ("X-Tag", "a"),
        ("content-type", "application/json"),
        ("x-tag", "b"),
        ("X-Empty", ""),
    ]
    assert head.headers.getall("X-TAG") == ["a", "b"]
    assert head.path == "/v1/chat/completions"
    assert request_keep_alive(head)


def test_a_value_keeps_inner_whitespace_and_latin_1_bytes() -> None:
    head = request_head(b"GET / HTTP/1.1", b"X-V: a \t b\xe9")
    assert head.headers["x-v"] == "a \t b\xe9"


@pytest.mark.parametrize(
    ("target", "origin"),
    [
        (b"http://example.com/v1/models", "/v1/models"),
        (b"HTTPS://example.com:8443/a/b?c=d", "/a/b?c=d"),
        (b"http://example.com", "/"),
        (b"http://example.com/", "/"),
    ],
)
def test_an_absolute_form_target_becomes_origin_form(target: bytes, origin: str) -> None:
    head = parse_request_head(b"GET " + target + b" HTTP/1.1")
    assert head.target == origin


def test_an_absolute_form_target_without_a_path_keeps_its_query() -> None:
    """RFC 3986 3.2: the authority ends at "/", "?" or "#"; "http://h?x=1" is path "" and
    query "x=1", so its origin form is "/?x=1" (RFC 9112 3.2.1), not "/"."""
    head = parse_request_head(b"GET http://example.com?x=1 HTTP/1.1")
    assert head.target == "/?x=1"


@pytest.mark.parametrize("target", [b"ftp://example.com/x", b"example.com:443", b"*", b"v1/x"])
def test_a_target_in_no_supported_form_is_400(target: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        parse_request_head(b"GET " + target + b" HTTP/1.1")
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/a%20b?q=%20x", "/v1/a b"),
        ("/v1/%E2%82%AC", "/v1/\u20ac"),
        ("/x?y?z", "/x"),
        ("/?q", "/"),
    ],
)
def test_path_is_percent_decoded_without_the_query(target: str, path: str) -> None:
    head = parse_request_head(b"GET " + target.encode() + b" HTTP/1.1")
    assert head.target == target  # as sent
    assert head.path == path


@pytest.mark.parametrize(
    ("version", "connection", "keep"),
    [
        (b"HTTP/1.1", [], True),
        (b"HTTP/1.1", [b"close"], False),
        (b"HTTP/1.1", [b"Keep-Alive, Close"], False),
        (b"HTTP/1.1", [b"upgrade", b"CLOSE"], False),
        (b"HTTP/1.1", [b"keep-alive"], True),
        (b"HTTP/1.0", [], False),
        (b"HTTP/1.0", [b"Keep-Alive"], True),
        (b"HTTP/1.0", [b"foo, keep-alive"], True),
        (b"HTTP/1.0", [b"close"], False),
    ],
)
def test_request_keep_alive_follows_version_and_connection_tokens(
    version: bytes, connection: list[bytes], keep: bool
) -> None:
    lines = [b"GET / " + version, *(b"Connection: " + c for c in connection)]
    head = request_head(*lines)
    assert head.version == (1, int(version[-1:]))
    assert request_keep_alive(head) is keep


@pytest.mark.parametrize(
    ("target", "climbs"),
    [
        ("/../admin", True),
        ("/a/../../admin", True),
        ("/%2e%2e/admin", True),  # decoded, as an engine's router may
        ("/%2E%2E/admin", True),
        ("/a/%2e%2e/%2e%2e/b?x=1", True),
        ("/a%2f..%2f..%2fadmin", True),  # an encoded slash, decoded too (conservative)
        ("/./../x", True),
        ("/..", True),
        ("/a/../b", False),  # stays inside: the engine resolves it to /b
        ("/a//../b", False),  # an empty segment is a segment (RFC 3986 5.2.4)
        ("/v1/./models", False),
        ("/v1/models/llama-3.1..8b", False),  # dots inside a segment are no dot segment
        ("/...", False),
        ("/?q=/../../x", False),  # the query is not the path
    ],
)
def test_dot_segments_that_climb_above_the_root_are_found(target: str, climbs: bool) -> None:
    assert climbs_above_root(target) is climbs


@pytest.mark.parametrize("target", [b"/../admin", b"/v1/%2e%2e/%2e%2e/admin"])
def test_a_path_that_climbs_above_the_root_is_400(target: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        parse_request_head(b"GET " + target + b" HTTP/1.1\r\nHost: x")
    assert info.value.status == 400


@pytest.mark.parametrize("target", [b"example.com:443", b"/", b"http://example.com/"])
def test_connect_is_405(target: bytes) -> None:
    """A tunnel is no request for the engine (nginx answers 405 itself)."""
    with pytest.raises(BadRequest) as info:
        parse_request_head(b"CONNECT " + target + b" HTTP/1.1\r\nHost: x")
    assert info.value.status == 405


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET / HTTP/1.1\r\nX-A: one\r\n two", 400),  # obsolete line folding
        (b"GET / HTTP/1.1\r\nX-A: one\r\n\ttwo", 400),
        (b"GET / HTTP/1.1\r\n X-A: one", 400),  # whitespace before the first field
        (b"GET / HTTP/1.1\r\nX-A : one", 400),  # whitespace before the colon
        (b"GET / HTTP/1.1\r\nX-A\t: one", 400),
        (b"GET / HTTP/1.1\r\nX-A: a\rb", 400),  # CR inside a value
        (b"GET / HTTP/1.1\r\nX-A: a\x00b", 400),  # NUL inside a value
        (b"GET / HTTP/1.1\r\nX-A: a\nX-B: b", 400),  # bare LF
        (b"GET / HTTP/1.1\r\nno colon", 400),
        (b"GET / HTTP/1.1\r\n: empty name", 400),
        (b"GET / HTTP/1.1\r\nX(A): b", 400),  # not a token
        (b"GET /", 400),  # two parts
        (b"GET / HTTP/1.1 extra", 400),  # four parts
        (b"GET  / HTTP/1.1", 400),  # an empty part
        (b"GET  HTTP/1.1", 400),
        (b" / HTTP/1.1", 400),  # no method
        (b"G(T / HTTP/1.1", 400),  # method not a token
        (b"G\xc9T / HTTP/1.1", 400),
        (b"GET / http/1.1", 400),
        (b"GET / HTTP/11", 400),
        (b"GET / HTTP/1.10", 400),
        (b"", 400),
        (b"GET / HTTP/2.0", 505),
        (b"GET / HTTP/1.2", 505),
        (b"GET / HTTP/0.9", 505),
    ],
)
def test_a_bad_request_head_is_refused_with_its_status(raw: bytes, status: int) -> None:
    with pytest.raises(BadRequest) as info:
        parse_request_head(raw)
    assert info.value.status == status


def test_too_many_header_fields_is_431_and_the_limit_itself_is_fine() -> None:
    fields = [b"X-%d: v" % i for i in range(MAX_REQUEST_HEADERS)]
    assert len(request_head(b"GET / HTTP/1.1", *fields).headers) == MAX_REQUEST_HEADERS
    with pytest.raises(BadRequest) as info:
        request_head(b"GET / HTTP/1.1", *fields, b"X-One-More: v")
    assert info.value.status == 431


@pytest.mark.parametrize(
    "target", [b"/a\rb", b"/a\nX-Injected:\t1", b"/a\x00b", b"/a\tb", b"/a\x1fb", b"/a\x7fb"]
)
def test_a_control_character_in_the_request_target_is_400(target: bytes) -> None:
    """RFC 9112 3.2 / 2.2: a target is URI characters; a bare CR or LF in it is invalid. The
    relay writes ``target`` verbatim into the upstream request line, so one that gets through
    here injects a header (or a line) into the request the engine sees."""
    with pytest.raises(BadRequest) as info:
        parse_request_head(b"GET " + target + b" HTTP/1.1\r\nHost: x")
    assert info.value.status == 400


def test_a_target_with_bytes_beyond_ascii_is_passed_on_as_sent() -> None:
    """Not URI characters either, but not dangerous in a request line, and sent by clients
    that do not encode UTF-8 paths: relayed unchanged, as nginx does."""
    head = parse_request_head(b"GET /caf\xc3\xa9?q=\xff HTTP/1.1\r\nHost: x")
    assert head.target == "/caf\xc3\xa9?q=\xff"


@pytest.mark.parametrize(
    "fields",
    [[], [b"Host: a", b"Host: b"], [b"Host: a b"]],
    ids=["no-host", "two-hosts", "bad-host"],
)
def test_host_is_not_checked_the_relay_sends_its_own(fields: list[bytes]) -> None:
    """RFC 9112 3.2 has an origin server refuse an HTTP/1.1 request with no Host, two, or an
    invalid one. The sidecar is no origin: it routes nothing by Host and sends the engine's
    own ``Host`` upstream (``upstream.request_head``), so it passes such a request on, as
    aiohttp's server did before, rather than refuse what the engine would have served."""
    head = request_head(b"GET / HTTP/1.1", *fields)
    assert head.headers.getall("Host", []) == [f.split(b": ", 1)[1].decode() for f in fields]


_TOKEN_CHARS = "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_tokens = st.text(alphabet=_TOKEN_CHARS, min_size=1, max_size=12)
_value_chars = st.sampled_from(
    [chr(c) for c in range(0x20, 0x7F)] + ["\t"] + [chr(c) for c in range(0x80, 0x100)]
)
_values = st.text(alphabet=_value_chars, max_size=30).map(lambda v: v.strip(" \t"))
_targets = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~%!$&'()*+,;=:@/?", max_size=30
).map(lambda t: "/" + t)


@settings(max_examples=300, deadline=None)
@given(
    _tokens,
    _targets,
    st.sampled_from([b"HTTP/1.0", b"HTTP/1.1"]),
    st.lists(st.tuples(_tokens, _values), max_size=MAX_REQUEST_HEADERS),
)
def test_a_head_of_valid_tokens_and_values_round_trips(
    method: str, target: str, version: bytes, fields: list[tuple[str, str]]
) -> None:
    lines = [b"%s %s %s" % (method.encode(), target.encode(), version)]
    lines += [name.encode() + b": " + value.encode("latin-1") for name, value in fields]
    head = parse_request_head(b"\r\n".join(lines))
    assert head.method == method
    assert head.target == target
    assert head.version == (1, int(version[-1:]))
    assert list(head.headers.items()) == fields


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_tokens, st.binary(max_size=20)), max_size=6))
def test_any_request_head_either_parses_or_is_a_bad_request(
    fields: list[tuple[str, bytes]],
) -> None:
    """Whatever a client sends, the server gets a head (and a body decoder) or a
    ``BadRequest`` to answer with: never another exception."""
    raw = b"\r\n".join([b"POST / HTTP/1.1", *(n.encode() + b": " + v for n, v in fields)])
    with contextlib.suppress(BadRequest):
        request_body_decoder(parse_request_head(raw))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["Content-Length", "Transfer-Encoding"]),
    st.text(alphabet=[chr(c) for c in range(0x20, 0x100)], max_size=8),
)
def test_any_framing_header_value_gives_a_decoder_or_a_bad_request(name: str, value: str) -> None:
    raw = b"POST / HTTP/1.1\r\n" + name.encode() + b": " + value.strip(" ").encode("latin-1")
    with contextlib.suppress(BadRequest):
        request_body_decoder(parse_request_head(raw))
