"""A stream's header block as a request head (``h2.heads``), refused where HTTP/1.1 would."""

from __future__ import annotations

import pytest

from llmobs.wire.h2.heads import request_head
from llmobs.wire.http1 import BadRequest

BASE = [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"engine:8000")]


def test_pseudo_headers_become_the_method_target_and_host() -> None:
    head = request_head([*BASE, (b":path", b"/v1/chat/completions?x=1"), (b"x-a", b"1")])
    assert (head.method, head.target, head.path, head.version) == (
        "POST",
        "/v1/chat/completions?x=1",
        "/v1/chat/completions",
        (2, 0),
    )
    assert head.fields == [("host", "engine:8000"), ("x-a", "1")]
    assert head.headers["Host"] == "engine:8000"


@pytest.mark.parametrize(
    ("block", "status"),
    [
        ([(b":method", b"CONNECT"), (b":authority", b"x:443")], 405),
        ([*BASE, (b":path", b"/../admin")], 400),
        ([*BASE, (b":path", b"/a/%2e%2e/%2e%2e/b")], 400),
        ([*BASE], 400),
        ([*BASE, (b":path", b"/")] + [(b"x-%d" % i, b"v") for i in range(200)], 431),
        ([*BASE, (b":path", b"/a\x01b")], 400),
    ],
)
def test_refused_as_http1_refuses(block: list[tuple[bytes, bytes]], status: int) -> None:
    with pytest.raises(BadRequest) as caught:
        request_head(block)
    assert caught.value.status == status
